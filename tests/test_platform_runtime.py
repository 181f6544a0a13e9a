"""Where flows run: the LocalCluster that `tasks.runtime.dask_task_runner` asks for."""

import urllib.request

from distributed import LocalCluster

from tasks.runtime import dask_task_runner, reachable_dashboard


def test_local_clusters_serve_their_dashboard_on_free_loopback_ports():
    """Two clusters at once (two flows, or a flow beside a test) each get their own port, and the
    dashboard link the run log prints serves the real Dask dashboard, not a 404. The flow's default
    cluster is one of threads, which Dask names by the machine's address (not where it listens)."""
    kwargs = {**dask_task_runner(n_workers=1, processes=False).cluster_kwargs, "n_workers": 1}
    with LocalCluster(**kwargs) as first, LocalCluster(**kwargs) as second:
        links = [reachable_dashboard(c.dashboard_link, c.scheduler_address) for c in (first, second)]
        assert all(link.startswith("http://127.0.0.1:") for link in links)
        assert len(set(links)) == 2 and not any(":8787/" in link for link in links)
        for link in links:
            with urllib.request.urlopen(link, timeout=30) as page:
                assert page.status == 200 and b"Dask" in page.read()


def test_kill_9_of_a_command_leaves_no_prefect_server_behind(tmp_path):
    """`kill -9` reaches no handler, so the local Prefect server a command serves must end with it: no
    API answers at its address and no process it started outlives it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.cli_runner import ROOT, answers, local_prefect_api, run_geodp

    run_geodp("synth", tmp_path / "pts.parquet", "--city", "new-york", "--users", "50", "--days", "1")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    command = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "release", str(tmp_path / "pts.parquet"), "--cities", "new-york",
         "--epsilon", "1", "--mechanism", "identity", "--store", str(tmp_path / "store")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family: list = []
    try:
        api = None
        deadline = time.monotonic() + 180
        while api is None and time.monotonic() < deadline and command.poll() is None:
            api = local_prefect_api(command.pid)
            time.sleep(0.2)
        assert api is not None, "the command never served its local Prefect API"
        family = psutil.Process(command.pid).children(recursive=True)
        command.send_signal(signal.SIGKILL)
        command.wait(timeout=30)
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, f"{[p.pid for p in alive]} outlived their killed parent"
        assert not answers(api), f"the Prefect API at {api} outlived its killed command"
    finally:
        if command.poll() is None:
            command.kill()
        for p in family:  # the orphans this test exists to catch; never left behind
            if p.is_running():
                p.kill()
