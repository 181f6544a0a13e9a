"""A served backfill, timed end to end: `prefect server start`, `geodp serve --config`, then
`geodp release backfill … --deployment NAME` (docs/operations.md, "Serving on a schedule"), waiting for
the submitted flow runs to finish.

Prints the wall time from submission to the last run's final state, the flow runs' own durations, and
the CPU-seconds of the whole process tree (the Prefect server, the serve process with its flow-run
subprocesses and their Dask clusters, the CLI's submission), each process stopped and waited for so its
children's time is counted. Run it under ``nice``; it uses a fresh PREFECT_HOME and store.

    nice -n 10 python bench/bench_served_backfill.py [--deployment backfill/backfill] [--days 3]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _geodp(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], env=env, cwd=ROOT, **kw)


def _stop(proc: subprocess.Popen) -> tuple[float, float]:
    """SIGTERM ``proc``, wait for it, and return its (user, sys) CPU-seconds including waited children."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        return 0.0, 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime, usage.ru_stime


def _wait_runs(api: str, ids: list[str], timeout: float) -> list[dict]:
    import asyncio

    from prefect.client.orchestration import get_client

    async def poll() -> list[dict]:
        async with get_client() as client:
            while True:
                runs = [await client.read_flow_run(i) for i in ids]
                if all(r.state is not None and r.state.is_final() for r in runs):
                    return [{"id": str(r.id), "state": r.state.name, "seconds": r.total_run_time.total_seconds(),
                             "start": r.start_time, "end": r.end_time} for r in runs]
                await asyncio.sleep(1.0)

    return asyncio.run(asyncio.wait_for(poll(), timeout))


def _wait_deployment(name: str, timeout: float) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            try:
                client.read_deployment_by_name(name)
                return
            except ObjectNotFound:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name} was not served within {timeout:.0f} s") from None
                time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deployment", default="backfill/backfill")
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="geodp-served-backfill-"))
    port = _port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    os.environ.update({k: env[k] for k in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED")})
    data = work / "data"
    for city in ("new-york", "boston"):  # the worked example of docs/operations.md
        subprocess.run([sys.executable, "-m", "flows.cli", "synth", str(data / f"{city}.parquet"), "--city", city,
                        "--start", "2010-05-01", "--days", "7"], env=env, cwd=ROOT, check=True,
                       capture_output=True)
    config = work / "geodp.toml"
    config.write_text(f'store = "{work / "store"}"\n')
    log = open(work / "processes.log", "w")
    server = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host",
                               "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=log)
    serve = None
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"prefect server did not start; see {work / 'processes.log'}") from None
                time.sleep(0.5)
        serve = _geodp("serve", "--config", str(config), env=env, stdout=log, stderr=log)
        _wait_deployment(a.deployment, 300)  # `geodp serve` registers its deployments
        last = f"2010-05-{a.days:02d}"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        submit = subprocess.run([sys.executable, "-m", "flows.cli", "release", "backfill", str(data), "--cities",
                                 "new-york,boston", "--period", f"2010-05-01..{last}", "--epsilon", "1",
                                 "--mechanism", "auto", "--max-points-per-user", "5", "--deployment",
                                 a.deployment], env=env, cwd=ROOT, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(submit.stdout + submit.stderr, end="")
        ids = re.findall(r"flow run ([0-9a-f-]{36})", submit.stdout)
        runs = _wait_runs(api, ids, a.timeout)
        wall = time.monotonic() - t0
    finally:
        serve_cpu = _stop(serve) if serve is not None else (0.0, 0.0)
        server_cpu = _stop(server)
    submit_cpu = (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
    for r in runs:
        print(f"flow run {r['id']}: {r['state']}, {r['seconds']:.1f} s run time ({r['start']} .. {r['end']})")
    print(f"wall from submission to the last final state: {wall:.1f} s")
    for name, (u, s) in (("serve (flow runs, Dask clusters)", serve_cpu), ("prefect server", server_cpu),
                         ("submission (geodp release backfill --deployment)", submit_cpu)):
        print(f"CPU {name}: {u + s:.1f} s (user {u:.1f}, sys {s:.1f})")
    total = sum(serve_cpu) + sum(server_cpu) + sum(submit_cpu)
    print(f"CPU whole process tree: {total:.1f} s; work folder {work}")


if __name__ == "__main__":
    main()
