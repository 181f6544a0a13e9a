"""Shared fixtures. Tests that need ../shared/data skip with a visible reason when it is missing,
unless GEODP_REQUIRE_SHARED_DATA=1 (set by .ci/run), which turns that skip into a failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

#: Dask's diagnostics, off or slower for every cluster the suite starts (the fixtures', a flow's own, a
#: CLI command's, `geodp serve`'s): the process environment carries them to every worker, CLI and flow
#: process. An idle 4-worker LocalCluster spends 0.17 CPU-s a second on them (the statistical profiler
#: every 10 ms, the event-loop tick every 20 ms, the memory monitor every 100 ms, the system monitor every
#: 500 ms) and 0.022 without; clusters idle through most of a flow test's wall time. No test reads a
#: profile or a system-monitor figure; the tick still warns of a blocked event loop, the memory monitor
#: still acts, once a second. A variable already set (by whoever runs the suite) is kept.
DASK_QUIET = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
              "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1000ms",
              "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s",
              "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s"}
for _k, _v in DASK_QUIET.items():
    os.environ.setdefault(_k, _v)
if "dask" in sys.modules:  # a plugin imported dask before this file: its config read the environment already
    import dask.config

    dask.config.refresh()

SHARED_DATA = Path(os.environ.get("GEODP_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


def _shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        msg = f"real public data {path} is missing (../shared/data is absent outside this workplace)"
        if os.environ.get("GEODP_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(msg + "; GEODP_REQUIRE_SHARED_DATA=1 requires it", pytrace=False)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def gowalla_nyc_path() -> Path:
    return _shared_file("gowalla_nyc_checkins.tsv.gz")


@pytest.fixture(scope="session")
def gowalla_sample_path() -> Path:
    return _shared_file("gowalla_sample_1000users.parquet")


@pytest.fixture(scope="session")
def sf_cabs_path() -> Path:
    return _shared_file("sf_cabs.parquet")


# -- platform fixtures: Prefect server, S3 ----------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The test server's automation triggers, off: no test or flow defines an automation, and the service reads
#: every event and wakes every few seconds (the idle server 0.023 CPU-s a second with it, 0.014 without).
#: Flow runs, task runs, logs and artifacts are recorded as before.
HARNESS_TRIGGERS = "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One real Prefect API server for the session, in a temporary PREFECT_HOME. Its URL is also
    exported to the environment so Dask worker processes report to the same server."""
    home = tmp_path_factory.mktemp("prefect-home")
    old = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED",
                                          HARNESS_TRIGGERS)}
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.setdefault(HARNESS_TRIGGERS, "false")
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings({PREFECT_HOME: str(home)}), prefect_test_harness(server_startup_timeout=300):
        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
        try:
            yield PREFECT_API_URL.value()
        finally:
            from tasks.runtime import _drain_logs

            _drain_logs()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _local_cluster(n_workers: int):
    import logging

    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                        silence_logs=logging.WARNING)


@pytest.fixture(scope="session")
def _shared_dask_cluster(prefect_harness):
    """The one-worker LocalCluster that every module with ``DASK_WORKERS = 1`` shares: its worker imports
    the project, and what the tasks use (torch, statsmodels, scipy), once per session instead of once per
    module (3-8 CPU-s each), and idles at ~0.006 CPU-s a second in between (DASK_QUIET). Its worker has the
    environment of its start (the Prefect harness's): a module whose tasks need other variables in the
    worker (S3's endpoint, a fault hook) keeps a cluster of its own."""
    with _local_cluster(1) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def dask_cluster(request, prefect_harness):
    """A real Dask LocalCluster (worker processes) for a module's flow tests, started after the Prefect
    harness so its workers report to the same server. Yields the scheduler address: pass it as
    ``dask_address`` (``--dask-address``) instead of ``n_workers``, so a flow does not start its own
    cluster and import the project into fresh workers (~6 CPU-s a flow). A module whose flows need no
    second worker sets ``DASK_WORKERS = 1`` and gets the session's one-worker cluster, shared with every
    such module; any other gets two workers of its own, for its module only. A test that kills, slows or
    patches workers, or changes the environment they read, keeps a cluster of its own (no DASK_WORKERS = 1)."""
    n_workers = getattr(request.module, "DASK_WORKERS", 2)
    if n_workers == 1:
        yield request.getfixturevalue("_shared_dask_cluster")
        return
    with _local_cluster(n_workers) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="session")
def moto_s3():
    """A real S3 endpoint over HTTP: moto's server on 127.0.0.1 and a free port, stopped by its PID.
    Yields the endpoint URL; AWS credentials are dummies set for the session."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    port = _free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"moto_server did not start on {url}")
            time.sleep(0.2)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "GEODP_S3_ENDPOINT_URL": url}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def new_s3_store(endpoint: str) -> str:
    """A fresh bucket on the moto endpoint, as a store URL."""
    import uuid

    import boto3

    bucket = "geodp-" + uuid.uuid4().hex[:10]
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/prefix"


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path):
    """A new, empty release store: a local folder, then a bucket on moto's S3 server."""
    if request.param == "local":
        return str(tmp_path / "store")
    return new_s3_store(request.getfixturevalue("moto_s3"))


def pytest_collection_modifyitems(config, items):
    """Modules run in order of how many `slow` tests they hold, most first (file order otherwise): under
    `-n 2 --dist loadfile` (scripts/test.sh) the long modules start at once and the short ones fill in
    behind them, instead of one worker running a long module alone at the end."""
    from collections import Counter

    slow = Counter(item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])


# -- CPU accounting: GEODP_TEST_CPU_LOG=DIR writes each test's CPU-seconds (setup + call + teardown, this
# process and every descendant, live or reaped) to DIR/<worker>.jsonl, for scripts/test_cpu.py to sum.
def _tree_cpu() -> float:
    import resource

    import psutil

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get("GEODP_TEST_CPU_LOG")
    if not log:
        yield
        return
    import json
    import time

    c0, t0 = _tree_cpu(), time.monotonic()
    yield
    c1, t1 = _tree_cpu(), time.monotonic()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(log).mkdir(parents=True, exist_ok=True)
    with open(Path(log) / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(c1 - c0, 3), "wall_s": round(t1 - t0, 3)}) + "\n")
