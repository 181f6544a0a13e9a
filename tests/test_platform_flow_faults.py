"""A failure outside geodp in a release flow run (a backend's or a library's exception in a step on the
Dask workers), read back from the session's real Prefect server as the UI shows it: the run's final
state is Failed with a one-line message and no traceback, it was not retried, and its charge is given
back (nothing was committed)."""

from __future__ import annotations

import uuid

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests import faults
from tests.faults import ledger_and_committed

#: what a backend's exception may carry in its text: a remote traceback over several lines
REMOTE_ERROR = ("backend lost its connection\nTraceback (most recent call last):\n"
                '  File "backend.py", line 1, in fit\nConnectionResetError: peer reset')


def _one_city_flow(tmp_path):
    """One city's release flow (New York, identity, ε 0.1) on a one-worker cluster of threads in this process,
    so a patch of this process reaches its tasks: (the run's final state, the store)."""
    from distributed import LocalCluster

    from flows.release import release_flow
    from tasks.config import ReleaseParams

    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(data)
    store = tmp_path / "store"
    params = ReleaseParams(data=str(data), cities=["new-york"], period="2024-01-01", epsilon=0.1,
                           mechanism="identity", mechanism_params={"cell_width_m": 2000}, store=str(store),
                           dataset=f"fault-{uuid.uuid4().hex[:8]}")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        state = release_flow(params.model_copy(update={"dask_address": cluster.scheduler_address}),
                             return_state=True)
    return state, store


def test_a_non_geodp_failure_is_one_line_in_the_flow_state_and_not_retried(prefect_harness, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    module, name = faults.PRIVATIZE

    def broken(*args, **kwargs):
        raise RuntimeError(REMOTE_ERROR)

    # worker threads in this process: the privatize task's fit input (built after the charge) fails. Its
    # function reaches the worker pickled with the globals it names: patched where they are defined and
    # where the task module imported them, whichever the pickling keeps
    monkeypatch.setattr(f"{module}.{name}", broken)
    monkeypatch.setattr(f"tasks.release_tasks.{name}", broken)
    state, store = _one_city_flow(tmp_path)
    assert state.is_failed()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        history = [s.type.value for s in client.read_flow_run_states(run.id)]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    message = run.state.message
    assert run.state.type.value == "FAILED", message
    assert "\n" not in message and "Traceback" not in message, message
    assert "RuntimeError" in message and "nothing was committed" in message, message
    assert run.run_count == 1 and "AWAITINGRETRY" not in history and history.count("RUNNING") == 1, history
    (fit,) = [t for t in tasks if t.name.startswith("privatize")]
    assert fit.state.type.value == "FAILED" and fit.run_count == 1  # the patched step failed, once
    charged, committed = ledger_and_committed(store)
    # the fit's charge is given back; the contribution profile, paid alone before it, stays charged
    assert committed == 0.0 and charged == pytest.approx(0.01)


def test_a_failure_between_the_charge_and_the_commit_gives_the_charge_back(prefect_harness, tmp_path, monkeypatch):
    """Issue 46: the Prefect form gave a charge back only where a fit's or a persist's own result failed; any
    other failure after the charge (here the cluster refusing the fits' submission) left the charge held
    until the next run of the release. The charge and the steps it pays for are one Prefect transaction,
    and the charge task's rollback hook gives it back (flows/release_executors.py)."""
    from tasks.release_tasks import privatize

    def refused(*args, **kwargs):
        raise RuntimeError("the scheduler refused the task\nTraceback (most recent call last): ...")

    monkeypatch.setattr(privatize, "submit", refused)  # the flow's process submits the fits
    state, store = _one_city_flow(tmp_path)
    assert state.is_failed()
    charged, committed = ledger_and_committed(store)
    # the cities' charge is given back; the contribution profile, paid alone before it, stays charged
    assert committed == 0.0 and charged == pytest.approx(0.01)
    assert "\n" not in state.message and "nothing was committed" in state.message, state.message
