"""A backfill submitted to a served deployment: `geodp serve` runs in its own process against the
session's Prefect server; one flow run per day, and idempotency keys make a re-submission reuse them.
The CLI's submissions go through the forked CLI runner (tests/cli_runner.py), from another folder."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.backfill import submit_to_deployment
from tasks.config import BackfillParams, ReleaseParams
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp

pytestmark = pytest.mark.shared_data
DASK_WORKERS = 1  # the session's one-worker cluster (tests/conftest.py): these runs need no second worker
ROOT = Path(__file__).resolve().parents[1]
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _wait_for_deployment(name: str, proc: subprocess.Popen, config: Path, timeout_s: float = 120):
    """The deployment as ``proc`` (serving ``config``) registered it. An earlier serving process of the
    session's Prefect server left a deployment of the same name with its own config_path: a run
    submitted before this process updates it would be planned with that other config."""
    from prefect.client.orchestration import get_client

    want = str(Path(config).resolve())
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "geodp serve exited early"
            try:
                deployment = client.read_deployment_by_name(name)
            except Exception:  # not registered yet
                deployment = None
            if deployment is not None and (deployment.parameters or {}).get("config_path") == want:
                return deployment
            time.sleep(1)
    raise AssertionError(f"deployment {name} of {want} never appeared")


def _wait_for_runs(ids: list[str], timeout_s: float = 400) -> dict[str, str]:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = {i: client.read_flow_run(i).state for i in ids}
            states = {i: s.type.value for i, s in runs.items()}
            if all(s in FINAL for s in states.values()):
                failed = [f"{i}: {s.message}" for i, s in runs.items() if s.type.value != "COMPLETED"]
                if failed:  # the runs' own one-line state messages say why, before the serving log
                    print("\n".join(failed))
                return states
            time.sleep(2)
    raise AssertionError(f"flow runs did not finish: {states}")


@pytest.mark.slow
def test_backfill_through_the_served_deployment(prefect_harness, dask_cluster, gowalla_sample_path, tmp_path):
    config = tmp_path / "geodp.toml"
    served_store = tmp_path / "served-store"  # the served configuration's store (issue 45 item 3)
    config.write_text(f'store = "{served_store}"\n[budget]\ndefault_cap = 5.0\n')
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "PREFECT_API_URL": prefect_harness, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--config", str(config)], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_deployment("release/release", proc, config)
        store_url = str(tmp_path / "store")
        # every served run uses the session's Dask cluster, not one of its own (~6 CPU-s a run);
        # tests/test_platform_schedule.py covers a served run that starts its own
        rp = ReleaseParams(data=str(gowalla_sample_path), cities=["austin"], epsilon=0.5, store=store_url,
                           max_points_per_user=10, dask_address=dask_cluster,
                           publish_anyway=True)
        bp = BackfillParams(release=rp, start="2010-05-01", end="2010-05-02")
        first = submit_to_deployment(bp, "release/release")
        again = submit_to_deployment(bp, "release/release")
        ids = [r["flow_run_id"] for r in first]
        assert [r["period"] for r in first] == ["2010-05-01", "2010-05-02"]
        assert len(set(ids)) == 2 and [r["flow_run_id"] for r in again] == ids  # one run per day
        states = _wait_for_runs(ids)
        assert set(states.values()) == {"COMPLETED"}, (tmp_path / "serve.log").read_text()[-3000:]
        store = ReleaseStore(store_url)
        assert sorted(r.period for r in store.list_releases()) == ["2010-05-01", "2010-05-02"]
        # a run scheduled for 2010-05-04 02:30 UTC that releases "yesterday" releases 2010-05-03, however
        # late it actually runs (the nightly's period comes from its scheduled start, not the wall clock);
        # it runs on a Dask scheduler the served process did not start (dask_address), whose workers must
        # import the flow's tasks by their module (they failed with "No module named 'release'" when the
        # deployments were loaded from a file path)
        from datetime import UTC, datetime

        from prefect.deployments import run_deployment

        nightly = rp.model_copy(update={"period": "yesterday"})
        late = run_deployment("release/release", parameters={"params": nightly.model_dump(mode="json")},
                              scheduled_time=datetime(2010, 5, 4, 2, 30, tzinfo=UTC), timeout=0)
        assert _wait_for_runs([str(late.id)]) == {str(late.id): "COMPLETED"}, (tmp_path / "serve.log").read_text()[-3000:]
        assert sorted(r.period for r in store.list_releases()) == ["2010-05-01", "2010-05-02", "2010-05-03"]
        from tasks.storage.ledger import DatasetLedger

        ledger = DatasetLedger(store, gowalla_sample_path.name.split(".")[0])
        assert len(ledger.held()) == 6  # per day the contribution profile, charged alone, and the rest of ε
        assert ledger.policy().budget == 5.0  # the serving process's config reached the served runs
        # `geodp backfill --deployment` from another folder with relative paths: the serving process
        # (its own working directory) gets absolute ones and finds the file and the store
        work = tmp_path / "elsewhere"
        work.mkdir()
        (work / "checkins.parquet").symlink_to(gowalla_sample_path)
        sub = run_geodp("backfill", "checkins.parquet", "--cities", "austin", "--start", "2010-05-05", "--end",
                        "2010-05-05", "--epsilon", "0.5", "--max-points-per-user", "10", "--store", "rel-store",
                        "--dask-address", dask_cluster, "--deployment", "release/release", "--publish-anyway",
                        cwd=work, env=env,
                        timeout=120)
        run_id = sub.stdout.split("flow run ")[1].split()[0]
        assert _wait_for_runs([run_id]) == {run_id: "COMPLETED"}, (tmp_path / "serve.log").read_text()[-3000:]
        assert [r.period for r in ReleaseStore(str(work / "rel-store")).list_releases()] == ["2010-05-05"]
        # `--deployment backfill/backfill` without --store: one served run for every day, into the served
        # configuration's store; the same submission again says it is the earlier run
        cmd = ["release", "backfill", "checkins.parquet", "--cities", "austin", "--period", "2010-05-06..2010-05-07",
               "--epsilon", "0.5", "--max-points-per-user", "10", "--dask-address", dask_cluster, "--deployment",
               "backfill/backfill", "--publish-anyway"]
        sub = run_geodp(*cmd, cwd=work, env=env, timeout=120)
        (line,) = sub.stdout.splitlines()
        assert line.startswith("2010-05-06..2010-05-07: flow run ")
        run_id = line.split("flow run ")[1].split()[0]
        assert _wait_for_runs([run_id]) == {run_id: "COMPLETED"}, (tmp_path / "serve.log").read_text()[-3000:]
        assert sorted(r.period for r in ReleaseStore(str(served_store)).list_releases()) == ["2010-05-06", "2010-05-07"]
        again = run_geodp(*cmd, cwd=work, env=env, timeout=120)
        assert again.returncode == 0 and f"flow run {run_id} (submitted before with the same parameters" in again.stdout
        # a backfill the budget refuses, submitted again: the same failed run, and it says so (exit 2)
        over = [*cmd[:5], "--period", "2010-05-08..2010-05-08", "--epsilon", "9", *cmd[9:]]
        first = run_geodp(*over, cwd=work, env=env, ok=False, timeout=120)
        failed_id = first.stdout.split("flow run ")[1].split()[0]
        assert _wait_for_runs([failed_id]) == {failed_id: "FAILED"}
        refused = run_geodp(*over, cwd=work, env=env, ok=False, timeout=120)
        assert refused.returncode == 2 and "submitted before with the same parameters and failed" in refused.stderr
        assert "budget exceeded" in refused.stderr and refused.stderr.count("error:") == 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
