"""Where flows run: the LocalCluster that `tasks.runtime.dask_task_runner` asks for."""

import urllib.request

from distributed import LocalCluster

from tasks.runtime import dask_task_runner


def test_local_clusters_serve_their_dashboard_on_free_loopback_ports():
    """Two clusters at once (two flows, or a flow beside a test) each get their own port, and the
    dashboard link the run log prints serves the real Dask dashboard, not a 404."""
    kwargs = {**dask_task_runner(n_workers=1).cluster_kwargs, "n_workers": 1}
    with LocalCluster(**kwargs) as first, LocalCluster(**kwargs) as second:
        links = [first.dashboard_link, second.dashboard_link]
        assert all(link.startswith("http://127.0.0.1:") for link in links)
        assert len(set(links)) == 2 and not any(":8787/" in link for link in links)
        for link in links:
            with urllib.request.urlopen(link, timeout=30) as page:
                assert page.status == 200 and b"Dask" in page.read()
