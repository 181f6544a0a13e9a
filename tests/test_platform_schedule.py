"""The served platform as an operator runs it: a real `prefect server start` (its own scheduler service)
and `geodp serve` with an every-minute cron. The schedule alone must commit a release; the run's tasks
must have run on Dask worker processes, with the dashboard link in its log and summary; the config's
per-dataset cap must be the policy the served run charged against."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flows.cli import main
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prefect server exited: {log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"prefect server not healthy after {timeout_s} s: {log.read_text()[-3000:]}")


def _pause_once_a_run_started(api: str) -> bool:
    """Pause release/nightly once the scheduler's first run of it has left the Scheduled state: the server
    deletes the runs it scheduled for the following minutes, which would each start a flow process (and,
    while the first has not committed, a Dask cluster) that this test never reads. True once paused."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name("release/nightly")
        except Exception:  # not registered yet
            return False
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
        if not any(r.state is not None and not r.state.is_scheduled() for r in runs):
            return False
        client.pause_deployment(deployment.id)
        return True


@pytest.mark.slow
def test_schedule_alone_commits_a_release_on_dask(tmp_path):
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env = {**base, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false",
           # the scheduler and the runner look every few seconds instead of every minute
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "3",
           "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    today = datetime.now(UTC).date()
    data = tmp_path / "served.parquet"
    assert main(["synth", str(data), "--users", "60", "--days", "3",
                 "--start", (today - timedelta(days=2)).isoformat()]) == 0
    store_url = str(tmp_path / "store")
    config = tmp_path / "geodp.toml"
    config.write_text(f'[budget.caps]\nserved = 0.6\n\n[nightly]\ncron = "* * * * *"\n\n[nightly.release]\n'
                      f'data = "{data}"\ncities = ["new-york"]\nperiod = "yesterday"\nepsilon = 0.2\n'
                      f'max_points_per_user = 5\nstore = "{store_url}"\nn_workers = 1\n'
                          # 169 points a day: the profile's verdict refuses them; the test is the schedule
                          'publish_anyway = true\n')
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    server = serve = None
    try:
        with open(server_log, "w") as out:
            server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                       "--port", str(port)], env=env, cwd=tmp_path, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        _wait_healthy(api, server, server_log)
        with open(serve_log, "w") as out:
            serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--config", str(config)],
                                     env={**env, "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        store = ReleaseStore(store_url)
        deadline = time.monotonic() + 240
        releases: list[dict] = []
        paused = False
        while not releases and time.monotonic() < deadline:
            assert serve.poll() is None, f"geodp serve exited: {serve_log.read_text()[-3000:]}"
            time.sleep(3)
            paused = paused or _pause_once_a_run_started(api)
            releases = store.list_releases()
        logs = f"server:\n{server_log.read_text()[-2500:]}\nserve:\n{serve_log.read_text()[-2500:]}"
        assert "Can't evaluate bulk DML" not in server_log.read_text(), logs
        assert releases, f"no release committed by the schedule within 4 minutes\n{logs}"

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            ArtifactFilter,
            ArtifactFilterFlowRunId,
            ArtifactFilterKey,
            LogFilter,
            LogFilterFlowRunId,
        )
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("release/nightly")
            runs: list = []
            # the release is committed before its run finishes (artifacts, cluster shutdown): wait for the state
            finish_by = time.monotonic() + 90
            while not runs and time.monotonic() < finish_by:
                runs = sorted((r for r in client.read_flow_runs() if r.deployment_id == deployment.id
                               and r.state is not None and r.state.is_completed()),
                              key=lambda r: r.expected_start_time)
                if not runs:
                    time.sleep(2)
            assert runs, logs
            run = runs[0]  # the first one committed; a later one finds its day already committed
            assert run.auto_scheduled  # created by the server's scheduler, not by this test
            # the period is the day before the run's scheduled start, and the config binds
            expected_day = (run.expected_start_time.astimezone(UTC).date() - timedelta(days=1)).isoformat()
            assert expected_day in {r.period for r in store.list_releases()}
            assert DatasetLedger(store, "served").policy().budget == pytest.approx(0.6)
            lines = [entry.message for entry in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
            (dash,) = [m for m in lines if m.startswith("Dask dashboard: ")]
            assert re.fullmatch(r"Dask dashboard: http://127\.0\.0\.1:\d+/status", dash), dash
            (summary,) = client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[f"release-served-{expected_day}-summary"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
            # the UI's form and the API send cities as one comma-separated string; the server's check of
            # the deployment's parameter schema and the flow both take it
            manual = client.read_deployment_by_name("release/release")
            params = {**deployment.parameters["params"], "cities": "new-york, chicago", "period": "all"}
            form_run = client.create_flow_run_from_deployment(manual.id, parameters={"params": params})
            deadline = time.monotonic() + 120
            while not (state := client.read_flow_run(form_run.id).state).is_final() and time.monotonic() < deadline:
                time.sleep(2)
            assert state.is_completed(), f"{state}\n{serve_log.read_text()[-3000:]}"
        assert sorted(r.city for r in store.list_releases(period="all")) == ["chicago", "new-york"]
        text = summary.data
        assert dash.removeprefix("Dask dashboard: ") in text
        flow_pid = int(re.search(r"flow process pid (\d+)", text).group(1))
        ran = re.findall(r"(\S+) \(pid (\d+)\)", text.split("tasks ran on: ", 1)[1].splitlines()[0])
        # the run's own LocalCluster: worker threads of the flow's process (tasks.runtime.worker_processes)
        assert ran and all(w.startswith("inproc://") and int(pid) == flow_pid for w, pid in ran), text
    finally:
        for proc in (serve, server):
            if proc is not None:
                _stop(proc)
