"""Load + validate speed of dataset inputs: one Parquet file, a folder of K files, a hive folder by day
(all of it, and pruned to a few days), and a folder of CSV files for reference.

    .venv/bin/python bench/bench_load.py [--points 10000000] [--files 10] [--days 10] [--window-days 2]

The data is `geodp synth --partitions` output (same generator, same seed, so every layout holds the
same rows). Each case runs in a fresh subprocess so that its peak RSS is its own; the figures are
rows per wall second, rows per CPU second (the per-core rate, the one to compare on a shared
machine), both from the best of --repeat loads, and the child's peak RSS before the first load
(interpreter and libraries) and at the end. "threads 1" pins pyarrow to one thread.
Goal: tens of millions of rows per second per core for Parquet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, time
import pyarrow as pa
if {one_thread}:
    pa.set_cpu_count(1); pa.set_io_thread_count(1)
from dpcore.data.points import load_points

def hwm_mb():
    # VmHWM is this process's own peak; getrusage's ru_maxrss would carry the parent's across exec.
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024

rss0 = hwm_mb()
best = None
for _ in range({repeat}):
    w, c = time.perf_counter(), time.process_time()
    res = load_points({src!r}, window={window!r})
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    best = (wall, cpu) if best is None or cpu < best[1] else best
    del res
    res = None
res = load_points({src!r}, window={window!r})
print(json.dumps({{"rows": res.report.rows_read, "kept": res.report.rows_kept, "files": res.n_files,
                  "pruned": res.n_pruned, "wall": best[0], "cpu": best[1], "rss0_mb": rss0,
                  "peak_mb": hwm_mb()}}))
"""


def run_case(src: str, window: tuple[int, int] | None, one_thread: bool, repeat: int) -> dict:
    code = CHILD.format(src=src, window=window, one_thread=one_thread, repeat=repeat)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_layouts(root: Path, points: int, files: int, days: int, csv_files: int) -> dict[str, str]:
    import pandas as pd

    from dpcore.data.synthetic import generate_checkin_chunks, write_partitioned
    from dpcore.geo import city_region

    region = city_region("new-york")
    users = max(1, int(points / 11.7))  # the generator keeps ≈ 11.7 points per user

    def chunks():
        return generate_checkin_chunks(region, n_users=users, start="2024-03-01", days=days, seed=0)

    layouts = {"single": (1, root / "single"), "folder": (files, root / "folder"), "hive": ("day", root / "hive")}
    for name, (parts, path) in layouts.items():
        t = time.perf_counter()
        stats = write_partitioned(chunks(), path, "2024-03-01", days, parts)
        print(f"wrote {name:<7} {stats['rows']:>12,} rows in {stats['files']:>3} files "
              f"({time.perf_counter() - t:.1f}s)", flush=True)
    # A CSV folder of the first few parquet files of `folder`, for scale against the text path.
    for i, f in enumerate(sorted((root / "folder").glob("*.parquet"))[:csv_files]):
        (root / "csv").mkdir(exist_ok=True)
        pd.read_parquet(f).to_csv(root / "csv" / f"part-{i:05d}.csv", index=False)
    return {name: str(path) for name, (_, path) in layouts.items()} | {"csv": str(root / "csv")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=10_000_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--window-days", type=int, default=2)
    ap.add_argument("--csv-files", type=int, default=1, help="files of the folder also written as CSV")
    ap.add_argument("--repeat", type=int, default=2, help="loads per case; the one with least CPU is shown")
    ap.add_argument("--dir", help="keep the data here (default: a temporary folder)")
    args = ap.parse_args()

    import pandas as pd

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        paths = write_layouts(Path(tmp), args.points, args.files, args.days, args.csv_files)
        t0 = int(pd.Timestamp("2024-03-01", tz="UTC").timestamp()) + 86400 * (args.days // 2)
        window = (t0, t0 + 86400 * args.window_days)
        cases = [("single file", paths["single"], None), (f"folder of {args.files}", paths["folder"], None),
                 (f"hive by day ({args.days})", paths["hive"], None),
                 (f"hive pruned to {args.window_days} days", paths["hive"], window),
                 (f"CSV folder ({args.csv_files})", paths["csv"], None)]
        print(f"\n{'case':<26} {'threads':>7} {'rows':>12} {'files':>5} {'wall s':>7} {'M rows/s':>9} "
              f"{'cpu s':>7} {'M rows/cpu-s':>12} {'RSS0 MB':>8} {'peak MB':>8}")
        for name, src, win in cases:
            for one_thread in (True, False):
                r = run_case(src, win, one_thread, args.repeat)
                print(f"{name:<26} {'1' if one_thread else 'all':>7} {r['rows']:>12,} {r['files']:>5} "
                      f"{r['wall']:>7.2f} {r['rows'] / r['wall'] / 1e6:>9.1f} {r['cpu']:>7.2f} "
                      f"{r['rows'] / r['cpu'] / 1e6:>12.1f} {r['rss0_mb']:>8.0f} {r['peak_mb']:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
