"""Served runs that cannot succeed fail at once, and runs with nothing to do finish without a cluster:
`geodp serve` runs against the session's real Prefect server; runs of its release deployment are read
back through the Prefect client (state, message, run counts, logs, task runs), as the UI shows them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.test_platform_deployment import _wait_for_deployment, _wait_for_runs

ROOT = Path(__file__).resolve().parents[1]
DAY = "2024-03-02"
CLUSTER_STARTED = "Dask dashboard"  # the line dask_for_run logs when it starts a cluster


@pytest.fixture(scope="module")
def served(prefect_harness, tmp_path_factory):
    """A serving process with a 0.6 budget and the store as the configured ledger home, a data file and
    the store holding one committed release (ε = 0.5, made in-process): yields (data, store, config)."""
    base = tmp_path_factory.mktemp("served")
    data = base / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=200, days=3, seed=4, start=DAY).to_parquet(data)
    config = base / "geodp.toml"
    store = base / "store"
    config.write_text(f'ledger = "{store}"\n[budget]\ndefault_cap = 0.6\n')  # every store charges this one
    run_geodp("release", data, "--city", "new-york", "--period", DAY, "--epsilon", "0.5",
              "--max-points-per-user", "5", "--store", store, "--no-prefect", "--config", config, "--publish-anyway")
    log = open(base / "serve.log", "w")
    env = {**os.environ, "PREFECT_API_URL": prefect_harness, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--config", str(config)], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_deployment("release/release", proc, config)
        yield data, store, config
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _params(data, store, **change) -> dict:
    return {"data": str(data), "cities": ["new-york"], "period": DAY, "epsilon": 0.5, "max_points_per_user": 5,
            "store": str(store), "n_workers": 1, **change}


def _served_run(params: dict):
    """Run the served release deployment once; (flow run, its task runs, its log text) when it ends."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment

    from tasks.runtime import _drain_logs

    run = run_deployment("release/release", parameters={"params": params}, timeout=0)
    _wait_for_runs([str(run.id)], timeout_s=300)
    _drain_logs()
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(run.id)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        deadline = time.monotonic() + 60
        while True:  # the run's process ships its logs after its state: wait for its last line
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            text = "\n".join(entry.message for entry in logs)
            if "Finished in state" in text or time.monotonic() > deadline:
                return flow_run, tasks, text
            time.sleep(1)


def _refused_at_once(flow_run, tasks, logs: str) -> str:
    """The run failed with a one-line message, no traceback, no retry, before any cluster or task."""
    assert flow_run.state.type.value == "FAILED", (flow_run.state, logs)
    message = flow_run.state.message
    assert "\n" not in message and "Traceback" not in message and "Traceback" not in logs, logs
    assert flow_run.run_count == 1 and flow_run.empirical_policy.retries in (0, None)
    assert CLUSTER_STARTED not in logs
    assert tasks == []  # nothing was read, charged or fitted
    return message


def test_a_budget_refusal_is_one_line_at_once(served):
    data, store, _ = served
    entries = len(DatasetLedger(ReleaseStore(str(store)), "checkins").entries())
    # another config of the same day: a person would lose 0.5 + 0.5 > 0.6
    flow_run, tasks, logs = _served_run(_params(data, store, mechanism_params={"cell_width_m": 500}))
    message = _refused_at_once(flow_run, tasks, logs)
    assert message.startswith("budget exceeded") and "0.6" in message
    assert len(DatasetLedger(ReleaseStore(str(store)), "checkins").entries()) == entries


def test_a_second_store_charges_the_configured_ledger(served, tmp_path):
    data, store, _ = served
    entries = len(DatasetLedger(ReleaseStore(str(store)), "checkins").entries())
    # the same release into another store: the configured ledger already holds its 0.5 of 0.6
    other = tmp_path / "other-store"
    flow_run, tasks, logs = _served_run(_params(data, other))
    message = _refused_at_once(flow_run, tasks, logs)
    assert message.startswith("budget exceeded") and "0.6" in message
    assert len(DatasetLedger(ReleaseStore(str(store)), "checkins").entries()) == entries
    assert ReleaseStore(str(other)).list_releases() == [] and not (other / "datasets").exists()


def test_a_missing_input_is_one_line_at_once(served, tmp_path):
    _, store, _ = served
    missing = tmp_path / "nowhere" / "checkins.parquet"
    flow_run, tasks, logs = _served_run(_params(missing, store))
    message = _refused_at_once(flow_run, tasks, logs)
    # the UI says what the terminal says (before: "failed on the data's content"): a path is public
    assert str(missing) in message and "input file not found" in message, message


def test_a_run_with_every_key_committed_starts_no_cluster(served):
    data, store, _ = served
    flow_run, tasks, logs = _served_run(_params(data, store))
    assert flow_run.state.type.value == "COMPLETED", (flow_run.state, logs)
    assert "1 already committed, 0 to release" in logs and CLUSTER_STARTED not in logs
    assert not [t.name for t in tasks if t.name.startswith(("read-bound-count", "privatize", "charge-ledger"))]
    assert len(ReleaseStore(str(store)).list_releases()) == 1
