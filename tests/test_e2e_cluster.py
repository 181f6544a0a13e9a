"""End to end with separate processes on loopback, each stopped by its PID: a Dask scheduler and two
workers that report to the session's Prefect server (a process of its own; tests/test_platform_schedule.py
runs `prefect server start` as an operator does), and moto's S3 server. A release of two cities from
../shared/data goes through the CLI to S3, is read back through the CLI, and the ledger is checked. Then a worker is
killed in the middle of a release (while it sleeps in a step tests/faults.py slowed in the worker
processes): the release still completes, exactly once."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests import faults
from tests.cli_runner import run_geodp
from tests.conftest import _free_port

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # own process group: the server's children stop too
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, prefect_harness):
    tmp = tmp_path_factory.mktemp("e2e")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []

    def start(cmd, log):
        p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(tmp / log, "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        return p

    try:
        dport = _free_port()
        sched = start([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(dport),
                       "--no-dashboard"], "scheduler.log")
        address = f"tcp://127.0.0.1:{dport}"
        workers = [start([str(BIN / "dask"), "worker", address, "--nthreads", "1", "--no-dashboard",
                          "--name", f"w{i}", "--host", "127.0.0.1"], f"worker{i}.log") for i in range(2)]
        from distributed import Client

        deadline = time.time() + 120
        with Client(address, timeout=60) as c:
            while len(c.scheduler_info()["workers"]) < 2:
                if time.time() > deadline or sched.poll() is not None:
                    raise RuntimeError("dask workers did not register")
                time.sleep(0.5)
        yield {"env": env, "address": address, "workers": workers, "tmp": tmp, "s3": moto_s3}
    finally:
        for p in reversed(procs):
            _stop(p)


def geodp(cluster, *args, ok=True, extra_env=None):
    return run_geodp(*args, ok=ok, env={**cluster["env"], **(extra_env or {})}, timeout=400)


def _bucket(cluster) -> str:
    import boto3

    name = "e2e-" + uuid.uuid4().hex[:8]
    boto3.client("s3", endpoint_url=cluster["s3"]).create_bucket(Bucket=name)
    return f"s3://{name}/geodp"


@pytest.mark.slow
def test_release_two_cities_to_s3_then_read_back(cluster, gowalla_sample_path):
    store = _bucket(cluster)
    # published anyway: the sample's thin month at ε 0.5 with 100 m cells is a release the verdict refuses
    r = geodp(cluster, "release", gowalla_sample_path, "--cities", "austin,san-francisco", "--period", "2010-05",
              "--epsilon", "0.5", "--mechanism", "identity", "--max-points-per-user", "10", "--store", store,
              "--dask-address", cluster["address"], "--budget-cap", "2", "--publish-anyway")
    assert "austin 2010-05 v1: release written to s3://" in r.stdout
    listed = json.loads(geodp(cluster, "releases", "list", store, "--json").stdout)
    assert sorted((x["city"], x["version"], x["epsilon"]) for x in listed) == [("austin", 1, 0.5),
                                                                               ("san-francisco", 1, 0.5)]
    austin = next(x for x in listed if x["city"] == "austin")
    q = json.loads(geodp(cluster, "query", austin["url"], "--box", "30.25,-97.76,30.28,-97.73", "--json").stdout)
    assert len(q) == 1 and isinstance(q[0]["estimate"], float)
    (row,) = json.loads(geodp(cluster, "ledger", store, "--json").stdout)
    # two disjoint cities bounded together: a person loses ε=0.5 of the budget of 2, not 1.0
    # each city: its contribution profile, charged alone first, and the rest of its ε
    assert row["charges"] == 4 and row["loss"]["lifetime"] == pytest.approx(0.5)
    assert row["policy"]["budget"] == 2.0
    # the same command again is a no-op: no new version, no new charge
    again = geodp(cluster, "release", gowalla_sample_path, "--cities", "austin,san-francisco", "--period",
                  "2010-05", "--epsilon", "0.5", "--max-points-per-user", "10", "--store", store,
                  "--dask-address", cluster["address"], "--budget-cap", "2", "--publish-anyway")
    assert again.stdout.count("already committed") == 2
    assert json.loads(geodp(cluster, "ledger", store, "--json").stdout)[0]["charges"] == 4


def _release_killing_a_worker(cluster, args: list[str], target: tuple[str, str], seconds: float):
    """Run ``geodp ARGS`` with ``target`` (tests/faults.py) slowed in every worker process, and SIGKILL the
    first worker process seen inside a slowed call. Returns (killed pid or None, the finished process, its
    stdout, its stderr). The command runs through the forked CLI in a thread (no fresh interpreter)."""
    from distributed import Client

    module, name = target
    marks = Path(tempfile.mkdtemp(dir=cluster["tmp"]))
    with Client(cluster["address"], timeout=60) as c:
        c.wait_for_workers(2, timeout=60)  # a worker an earlier test killed is back under its nanny
        # the slow step runs in the worker processes, so the patch goes there, and is checked there
        pids = set(c.run(faults.slow_down, module, name, seconds, str(marks)).values())
        assert len(pids) == 2 and set(c.run(faults.is_slowed, module, name).values()) == {True}
    done: list[subprocess.CompletedProcess] = []
    run = threading.Thread(target=lambda: done.append(geodp(cluster, *args, ok=False)))
    run.start()
    killed = None
    deadline = time.time() + 180
    while killed is None and time.time() < deadline and run.is_alive():
        inside = faults.marked_pids(marks, name)  # a worker process that is sleeping in the slowed call now
        if inside:
            assert inside[0] in pids, (inside, pids)
            os.kill(inside[0], signal.SIGKILL)
            killed = inside[0]
        time.sleep(0.2)
    run.join(timeout=400)
    with Client(cluster["address"], timeout=60) as c:
        c.run(faults.restore, module, name)
    (release,) = done
    return killed, release, release.stdout, release.stderr


@pytest.mark.slow
def test_killing_a_worker_mid_release_still_commits_exactly_once(cluster, gowalla_sample_path):
    store = _bucket(cluster)
    cmd = ["release", str(gowalla_sample_path), "--cities",
           "austin,new-york", "--period", "2010-06", "--epsilon", "0.5", "--store", store,
           "--dask-address", cluster["address"], "--json", "--publish-anyway"]
    killed, release, out, err = _release_killing_a_worker(cluster, cmd, faults.PRIVATIZE, 6)
    assert killed is not None, f"no worker entered the slowed privatize step; release said: {err[-2000:]}"
    assert release.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert sorted(r["city"] for r in summary["releases"]) == ["austin", "new-york"]
    listed = json.loads(geodp(cluster, "releases", "list", store, "--json").stdout)
    assert sorted((x["city"], x["version"]) for x in listed) == [("austin", 1), ("new-york", 1)]
    assert json.loads(geodp(cluster, "ledger", store, "--json").stdout)[0]["charges"] == 4  # profiles and fits


@pytest.mark.slow
def test_killing_a_worker_mid_read_of_s3_files_still_commits_once(cluster, gowalla_sample_path):
    """The input is six Parquet files on S3; a worker is killed while it reads one. The data pass is
    recomputed where needed, and the release commits once with one charge."""
    import boto3
    import pandas as pd

    store = _bucket(cluster)
    bucket = store.split("/")[2]
    frame = pd.read_parquet(gowalla_sample_path)
    s3 = boto3.client("s3", endpoint_url=cluster["s3"])
    bounds = np.linspace(0, len(frame), 7).astype(int)
    for i in range(6):
        part = frame.iloc[bounds[i]:bounds[i + 1]]
        s3.put_object(Bucket=bucket, Key=f"input/part-{i}.parquet", Body=part.to_parquet())
    cmd = ["release", f"s3://{bucket}/input/", "--cities", "new-york",
           "--period", "2010-06", "--epsilon", "0.5", "--store", store, "--dataset", "gowalla-s3",
           "--dask-address", cluster["address"], "--json", "--publish-anyway"]
    killed, release, out, err = _release_killing_a_worker(cluster, cmd, faults.READ, 3)
    assert killed is not None, f"no worker entered the slowed read; release said: {err[-2000:]} {out[-1500:]}"
    assert release.returncode == 0, err[-3000:]
    listed = json.loads(geodp(cluster, "releases", "list", store, "--json").stdout)
    assert [(x["city"], x["version"]) for x in listed] == [("new-york", 1)]
    assert json.loads(geodp(cluster, "ledger", store, "--json").stdout)[0]["charges"] == 2  # profile and fit
