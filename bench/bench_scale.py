"""Scale benchmark of the release flow: wall time and peak memory, 1 Dask worker vs 2.

Cases: the whole SF cabs file (11.2 M points, one city) and several cities of Gowalla check-ins.
Each case runs the Prefect release flow on a LocalCluster into a fresh local store. Peak memory is
the peak RSS of the flow process (ru_maxrss of this process) and the peak RSS of each Dask worker
(sampled every 0.2 s with psutil).

    nice -n 10 .venv/bin/python bench/bench_scale.py [--cases sf,gowalla] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("GEODP_SHARED_DATA", ROOT.parent / "shared" / "data"))

CASES = {
    "sf": dict(data=DATA / "sf_cabs.parquet", cities=["san-francisco"], period="2008-05-17..2008-06-10",
               k=200, label="SF cabs, whole file (11.2 M points), 1 city"),
    "gowalla": dict(data=DATA / "gowalla_sample_1000users.parquet",
                    cities=["austin", "san-francisco", "new-york", "kansas-city", "chicago", "boston",
                            "los-angeles"], period=None, k=50, label="Gowalla sample, 7 cities"),
}


def _watch_workers(stop: threading.Event, peaks: dict) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                rss = child.memory_info().rss
            except psutil.Error:
                continue
            peaks[child.pid] = max(peaks.get(child.pid, 0), rss)
        time.sleep(0.2)


def run_case(name: str, workers: int) -> dict:
    from flows.release import run_release
    from tasks.config import ReleaseParams

    case = CASES[name]
    store = tempfile.mkdtemp(prefix="geodp-bench-store-")
    params = ReleaseParams(data=str(case["data"]), cities=case["cities"], period=case["period"], epsilon=1.0,
                           mechanism="identity", mechanism_params={"cell_width_m": 100},
                           max_points_per_user=case["k"], store=store, n_workers=workers, budget_cap=100)
    peaks: dict[int, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_workers, args=(stop, peaks), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    summary = run_release(params)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    return {"case": case["label"], "workers": workers, "wall_s": wall, "flow_s": summary["seconds"],
            "releases": len(summary["releases"]),
            "flow_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_mib": max(peaks.values()) / 2**20 if peaks else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="sf,gowalla")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    from tasks.runtime import local_prefect

    rows = []
    with local_prefect():
        for name in args.cases.split(","):
            if not CASES[name]["data"].exists():
                print(f"skip {name}: {CASES[name]['data']} missing")
                continue
            for w in (int(x) for x in args.workers.split(",")):
                r = run_case(name, w)
                rows.append(r)
                print(f"{r['case']}: {w} worker(s): wall {r['wall_s']:.1f} s (flow {r['flow_s']:.1f} s), "
                      f"{r['releases']} releases, peak RSS flow {r['flow_peak_mib']:.0f} MiB, "
                      f"largest child {r['worker_peak_mib']:.0f} MiB", flush=True)
    print("\n| case | Dask workers | wall (s) | flow body (s) | releases | peak RSS flow (MiB) | peak RSS child (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['workers']} | {r['wall_s']:.1f} | {r['flow_s']:.1f} | {r['releases']} | "
              f"{r['flow_peak_mib']:.0f} | {r['worker_peak_mib']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
