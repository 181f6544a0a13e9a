"""Scale benchmark of a release end to end on local Parquet: points/s and per-process peak memory.

Data: a synthetic Parquet dataset (`geodp synth --partitions N`, one city) made once under
/tmp/geodp-bench-scale/. Each run is its own process, so each VmHWM (peak resident memory) is that
process's alone: the in-process form (`--out`, local threaded scheduler) and the Prefect release flow
on a LocalCluster of 1 and 2 worker processes, at record level and at user level (shuffle on the user
key + k-sampling). Worker peaks are sampled from /proc/PID/status every 0.2 s while the flow runs.

    nice -n 10 .venv/bin/python bench/bench_scale.py [--users 40000 --days 30 --files 30]
        [--forms inproc,1,2] [--units record,user]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.gettempdir()) / "geodp-bench-scale"


def _hwm_mib(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024


def _cpu_s(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process, all its threads (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _watch(stop: threading.Event, peaks: dict, cpu: dict) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                cmd = " ".join(child.cmdline())
                hwm, used = _hwm_mib(child.pid), _cpu_s(child.pid)
            except (OSError, StopIteration, psutil.Error):
                continue
            if "multiprocessing" in cmd and "resource_tracker" not in cmd:  # LocalCluster's worker processes
                peaks[child.pid] = max(peaks.get(child.pid, 0.0), hwm)
                cpu[child.pid] = max(cpu.get(child.pid, 0.0), used)
        time.sleep(0.1)


def one(data: str, form: str, unit: str, days: int) -> dict:
    """Run one release in this process and return its measurements."""
    from flows.release import release_cities, run_release
    from tasks.config import ReleaseParams
    from tasks.runtime import local_prefect

    store = tempfile.mkdtemp(prefix="geodp-bench-store-")
    params = ReleaseParams(data=data, cities=["new-york"], period=f"2024-01-01..2024-01-{days:02d}",
                           epsilon=1.0, mechanism="identity", mechanism_params={"cell_width_m": 100},
                           privacy_unit=unit, max_points_per_user=50, store=store,
                           n_workers=1 if form == "inproc" else int(form), budget_cap=1000)
    peaks: dict[int, float] = {}
    cpu: dict[int, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(stop, peaks, cpu), daemon=True)
    watcher.start()
    t0, c0 = time.perf_counter(), _cpu_s()
    data_pass = {}
    if form == "inproc":
        import tasks.release_tasks as rt

        counts = rt.release_counts

        def timed(*args, **kwargs):  # the data pass alone: read, validate, (bound,) count
            w, c = time.perf_counter(), _cpu_s()
            try:
                return counts(*args, **kwargs)
            finally:
                data_pass.update(pass_wall_s=time.perf_counter() - w, pass_cpu_s=_cpu_s() - c)

        rt.release_counts = timed
        release_cities(params, in_process=True, artifacts=False)
    else:
        with local_prefect():
            # the Prefect server's start is not the release's
            t0, c0 = time.perf_counter(), _cpu_s()
            run_release(params)
            wall, flow_cpu = time.perf_counter() - t0, _cpu_s() - c0
    if form == "inproc":
        wall, flow_cpu = time.perf_counter() - t0, _cpu_s() - c0
    stop.set()
    watcher.join()
    workers = sorted(peaks.values(), reverse=True)
    return {"wall_s": wall, "flow_hwm_mib": _hwm_mib(), "child_hwm_mib": workers,
            "cpu_s": flow_cpu + sum(cpu.values()), "flow_cpu_s": flow_cpu, "workers_cpu_s": sum(cpu.values()),
            **data_pass}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=1700000)
    ap.add_argument("--days", type=int, default=28)
    ap.add_argument("--files", type=int, default=28)
    ap.add_argument("--forms", default="inproc,1,2")
    ap.add_argument("--units", default="record,user")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        data, form, unit = args.one.split("|")
        print(json.dumps(one(data, form, unit, args.days)))
        return 0
    data = WORK / f"synth-u{args.users}-d{args.days}-f{args.files}"
    if not data.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "flows.cli", "synth", str(data), "--users", str(args.users), "--days",
                        str(args.days), "--partitions", str(args.files)], check=True, cwd=ROOT)
    import pyarrow.parquet as pq

    n = sum(pq.ParquetFile(f).metadata.num_rows for f in data.rglob("*.parquet"))
    size = sum(f.stat().st_size for f in data.rglob("*.parquet")) / 2**20
    print(f"data: {data} ({n:,} points, {args.files} files, {size:.0f} MiB); {os.cpu_count()} CPU cores", flush=True)
    rows = []
    for unit in args.units.split(","):
        for form in args.forms.split(","):
            out = subprocess.run([sys.executable, __file__, "--days", str(args.days), "--one", f"{data}|{form}|{unit}"],
                                 capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if out.returncode:
                print(out.stderr[-3000:])
                return 1
            r = {"unit": unit, "form": form, **json.loads(out.stdout.strip().splitlines()[-1])}
            r["points_per_s"] = n / r["wall_s"]
            r["points_per_cpu_s"] = n / r["cpu_s"]
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\n{n:,} points in {args.files} Parquet files, one city, identity 100 m, k = 50 at user level\n")
    print("Per CPU-core = points / CPU-seconds (user + system, all threads) of the flow process and its workers "
          "(a worker's from its start: the LocalCluster starts with the release). Data pass = the in-process "
          "release_counts call alone.\n")
    print("| privacy unit | form | wall (s) | points/s wall | CPU (s) | points/s per CPU-core | data pass CPU (s) "
          "| data pass points/s per CPU-core | peak flow process (MiB) | peak workers (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        form = "in-process (`--out`, threads)" if r["form"] == "inproc" else f"Prefect + LocalCluster, {r['form']} worker(s)"
        workers = ", ".join(f"{v:.0f}" for v in r["child_hwm_mib"]) or "–"
        pass_cpu = r.get("pass_cpu_s")
        data_pass = f"{pass_cpu:.1f} | {n / pass_cpu / 1e6:.1f} M" if pass_cpu else "– | –"
        print(f"| {r['unit']} | {form} | {r['wall_s']:.1f} | {r['points_per_s'] / 1e6:.2f} M | {r['cpu_s']:.1f} | "
              f"{r['points_per_cpu_s'] / 1e6:.2f} M | {data_pass} | "
              f"{r['flow_hwm_mib']:.0f} | {workers} |")
    print(SCALING)
    return 0


SCALING = """
Expected on a larger machine: record level is one read-and-count task per file (only the lat/lon
columns are decoded when the file's statistics prove the user and time valid) and a tree sum of sparse
counts, so it scales with cores at the per-core rate above until storage binds: Parquet at ~28 bytes a
point means ~1 GB/s per core at 35 M points/s, so a local NVMe disk (3-7 GB/s) binds at 3-7 cores, and
object storage at its bandwidth per worker. User level adds one shuffle of 12 bytes per in-region row
(user key + int32 cell): 16 cores at ~5 M rows/s each move ~1 GB/s, which is what a 10 Gb/s network
carries, so it scales with workers up to about that, then with the network. Each LocalCluster worker
process costs ~3 CPU-s to start and import the release code, plus Prefect's task machinery, which a
30 M-point release on 2 cores does not amortise.
On this 2-core machine shared with other work, a second worker process competes for the same cores."""


if __name__ == "__main__":
    sys.exit(main())
