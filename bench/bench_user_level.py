"""CPU-seconds of an in-process release (`geodp release run … --out DIR`) at two input sizes, and the
marginal rate: points per CPU-second between the sizes (the fixed start-up cost drops out).

Each run is its own `geodp` process; CPU is user + system seconds of it and all its children
(resource.getrusage(RUSAGE_CHILDREN) around the run): the whole process tree. Runs are interleaved
(size by size, tree by tree) and the median of ``--repeat`` is kept. ``--trees`` compares checkouts
side by side (each is put first on PYTHONPATH): e.g. the code before a change and after it.

Data: `geodp synth --partitions N` folders, one city (new-york), made once under /tmp/geodp-bench-user/
(about 0.34 M points per 1,000 … users: ``--users 860000`` gives 10 M points, 2580000 gives 30 M).

    nice -n 10 .venv/bin/python bench/bench_user_level.py --sizes 860000:10,2580000:30 \
        [--units user,record] [--repeat 3] [--trees /path/before,/path/after] [--numpy-floor]

``--sf-cabs PATH`` instead runs one real input per tree and unit: the SF cabs file (11.2 M points, 536
cabs, one Parquet file), San Francisco, 2008-05-18..2008-06-08; its whole-run CPU-s and points per CPU-s.

``--numpy-floor`` adds a plain numpy/pyarrow script per size that does the user-level job with no
platform around it (read the four columns, keep the window's points in the region, one factorize of
the users, a k-sample per person by random keys and one sort, a bincount of the kept cells): what a
hand-written pass costs on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(tempfile.gettempdir()) / "geodp-bench-user"
DAYS = 30
K = 50

FLOOR = r"""
import sys, glob
import numpy as np, pandas as pd, pyarrow.parquet as pq
from dpcore.geo import city_region
files, k = sorted(glob.glob(sys.argv[1] + "/**/*.parquet", recursive=True)), int(sys.argv[2])
region = city_region("new-york")
n_cells = int(2 * region.half_m // 100)
users, cells = [], []
for f in files:
    t = pq.read_table(f, columns=["user_id", "lat", "lon"])
    lat, lon = t["lat"].to_numpy(), t["lon"].to_numpy()
    x, y = region.project(lat, lon)
    m = region.contains_m(x, y)
    xmin, ymin, xmax, ymax = region.bounds_m
    ix = ((x[m] - xmin) * (n_cells / (xmax - xmin))).astype(np.int64)
    iy = ((y[m] - ymin) * (n_cells / (ymax - ymin))).astype(np.int64)
    cells.append(np.minimum(ix, n_cells - 1) * n_cells + np.minimum(iy, n_cells - 1))
    users.append(t["user_id"].to_numpy()[m])
user, cell = np.concatenate(users), np.concatenate(cells)
codes, uniq = pd.factorize(user)
counts = np.bincount(codes)
key = np.random.default_rng().random(codes.size)
order = np.lexsort((key, codes))
starts = np.cumsum(counts) - counts
rank = np.arange(order.size) - np.repeat(starts, counts)
kept = order[rank < k]
grid = np.bincount(cell[kept], minlength=n_cells * n_cells)
print(int(grid.sum()))
"""


def data_for(users: int, files: int) -> Path:
    path = WORK / f"synth-u{users}-d{DAYS}-f{files}"
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "flows.cli", "synth", str(path), "--users", str(users), "--days",
                        str(DAYS), "--partitions", str(files)], check=True, cwd=ROOT)
    return path


def n_points(path: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in path.rglob("*.parquet"))


def run_tree(cmd: list[str], tree: str) -> float:
    """CPU-seconds (user + system) of ``cmd`` and every process it starts."""
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def release_cmd(data: Path, unit: str, city: str = "new-york",
                period: str = f"2024-01-01..2024-01-{DAYS:02d}") -> list[str]:
    store = tempfile.mkdtemp(prefix="geodp-bench-user-store-")
    return [sys.executable, "-m", "flows.cli", "release", "run", str(data), "--city", city,
            "--period", period, "--epsilon", "1", "--mechanism", "identity",
            "--param", "cell_width_m=100", "--privacy-unit", unit, "--max-points-per-user", str(K),
            "--budget-cap", "1000", "--out", store]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="860000:10,2580000:30", help="users:files,users:files")
    ap.add_argument("--units", default="user,record")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trees", default=str(ROOT), help="checkouts to compare, comma-separated")
    ap.add_argument("--numpy-floor", action="store_true")
    ap.add_argument("--sf-cabs", help="the SF cabs Parquet file: run it instead of the synthetic sizes")
    args = ap.parse_args()
    if args.sf_cabs:
        return sf_cabs(Path(args.sf_cabs), args.trees.split(","), args.units.split(","), args.repeat)
    sizes = [tuple(int(v) for v in s.split(":")) for s in args.sizes.split(",")]
    datasets = [(data_for(u, f), 0) for u, f in sizes]
    datasets = [(d, n_points(d)) for d, _ in datasets]
    trees = args.trees.split(",")
    jobs = [(tree, unit) for tree in trees for unit in args.units.split(",")]
    if args.numpy_floor:
        jobs.append((str(ROOT), "numpy"))
    cpu: dict[tuple, list[float]] = {}
    for _ in range(args.repeat):
        for data, n in datasets:
            for tree, unit in jobs:
                if unit == "numpy":
                    cmd = [sys.executable, "-c", FLOOR, str(data), str(K)]
                else:
                    cmd = release_cmd(data, unit)
                c = run_tree(cmd, tree)
                cpu.setdefault((tree, unit, n), []).append(c)
                print(json.dumps({"tree": tree, "unit": unit, "points": n, "cpu_s": round(c, 2)}), flush=True)
    n0, n1 = datasets[0][1], datasets[-1][1]
    print(f"\nk = {K} at user level; identity at 100 m, ε 1, one city; median of {args.repeat} runs; "
          "CPU-s = user + system of the whole process tree\n")
    print(f"| tree | unit | CPU-s at {n0 / 1e6:.1f} M | CPU-s at {n1 / 1e6:.1f} M | marginal CPU-s per M points "
          "| marginal M points per CPU-s | whole-run M points per CPU-s at the larger size |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for tree, unit in jobs:
        a, b = statistics.median(cpu[(tree, unit, n0)]), statistics.median(cpu[(tree, unit, n1)])
        slope = (b - a) / ((n1 - n0) / 1e6)
        print(f"| {tree} | {unit} | {a:.2f} | {b:.2f} | {slope:.3f} | {1 / slope:.1f} | {n1 / 1e6 / b:.1f} |")
    return 0


def sf_cabs(path: Path, trees: list[str], units: list[str], repeat: int) -> int:
    """Whole-run CPU-s of the SF cabs release per tree and unit, the median of ``repeat`` interleaved runs."""
    n = n_points(path) if path.is_dir() else __import__("pyarrow.parquet").parquet.ParquetFile(path).metadata.num_rows
    cpu: dict[tuple, list[float]] = {}
    for _ in range(repeat):
        for tree in trees:
            for unit in units:
                c = run_tree(release_cmd(path, unit, "san-francisco", "2008-05-18..2008-06-08"), tree)
                cpu.setdefault((tree, unit), []).append(c)
                print(json.dumps({"tree": tree, "unit": unit, "points": n, "cpu_s": round(c, 2)}), flush=True)
    print(f"\nSF cabs, {n / 1e6:.1f} M rows; k = {K} at user level; median of {repeat} runs\n")
    print("| tree | unit | CPU-s | M rows per CPU-s (whole run) |")
    print("|---|---|---:|---:|")
    for (tree, unit), v in cpu.items():
        print(f"| {tree} | {unit} | {statistics.median(v):.2f} | {n / 1e6 / statistics.median(v):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
