"""What a test's Dask LocalCluster costs while it starts and while it idles, with Dask's defaults and with
the diagnostics settings tests/conftest.py gives every cluster of the suite (DASK_QUIET), and how much a
forkserver saves on worker start-ups (tests/test_release_lost_worker.py). CPU-seconds of the whole
process tree (this process, its live and reaped descendants), one configuration per fresh interpreter,
interleaved over --repeat rounds; the median is printed.

    .venv/bin/python bench/bench_test_dask_idle.py [--workers 4] [--idle 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, logging, os, resource, sys, time
import psutil

def tree():
    t = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        t += r.ru_utime + r.ru_stime
    for p in psutil.Process().children(recursive=True):
        try:
            c = p.cpu_times()
            t += c.user + c.system + c.children_user + c.children_system
        except psutil.Error:
            pass
    return t

def main():
    from distributed import Client, LocalCluster
    n, idle = int(sys.argv[1]), float(sys.argv[2])
    c0 = tree()
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.WARNING) as cluster, Client(cluster) as client:
        c1 = tree()
        client.run(lambda: __import__("flows.release") and None)  # what a release task imports on a worker
        c2 = tree()
        time.sleep(idle)
        c3 = tree()
    print(json.dumps({"start": c1 - c0, "imports": c2 - c1, "idle_per_s": (c3 - c2) / idle}))

if __name__ == "__main__":
    main()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.conftest import DASK_QUIET

    base = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    base["PYTHONPATH"] = str(ROOT)
    configs = {"Dask defaults (spawn)": {}, "tests' DASK_QUIET (spawn)": DASK_QUIET,
               "DASK_QUIET + forkserver": {**DASK_QUIET, "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "forkserver"}}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(a.repeat):
        for name, extra in configs.items():
            out = subprocess.run([sys.executable, "-c", CHILD, str(a.workers), str(a.idle)], env={**base, **extra},
                                 capture_output=True, text=True, check=True, cwd=ROOT).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{a.workers}-worker LocalCluster, {a.idle:.0f} s idle, median of {a.repeat}\n")
    print("| configuration | start CPU-s | workers import flows.release CPU-s | idle CPU-s per second |")
    print("|---|---:|---:|---:|")
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {name} | {med['start']:.2f} | {med['imports']:.2f} | {med['idle_per_s']:.4f} |")


if __name__ == "__main__":
    main()
