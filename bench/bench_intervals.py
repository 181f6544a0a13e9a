"""Answering throughput per mechanism: boxes/s without intervals (the answer alone) and with 95% intervals
(Synopsis.intervals, all boxes at once), in-process; optionally a CSV of boxes through the CLI.

    python bench/bench_intervals.py [--boxes 1000000] [--cli]

Prints one row per mechanism. Synthetic New York check-ins, user level, ε = 1 (the release itself is not
timed). Numbers go to bench/README.md with the date and the command.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource

MECHANISMS = {"identity": {"cell_width_m": 250.0}, "ug": {}, "privtree": {}, "hb": {}, "ag": {}}


def _boxes(region, n: int, rng: np.random.Generator) -> np.ndarray:
    side = rng.uniform(25.0, 5000.0, n)
    cx, cy = rng.uniform(-region.half_m, region.half_m, (2, n))
    return np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)


def _rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boxes", type=int, default=1_000_000)
    ap.add_argument("--cli", action="store_true", help="also time `geodp query range --boxes CSV --csv`")
    args = ap.parse_args()
    region = city_region("new-york")
    pts = generate_checkins(region, n_users=2000, days=7, seed=1)
    x, y = region.project(pts["lat"].to_numpy(), pts["lon"].to_numpy())
    data = FitInput(x, y, region, "user", 10, user=pts["user_id"].to_numpy())
    boxes = _boxes(region, args.boxes, np.random.default_rng(0))
    print(f"{args.boxes} boxes of 25–5000 m, uniform centres; boxes/s")
    print(f"{'mechanism':<10} {'answer':>12} {'with intervals':>16} {'setup s':>8}  method")
    for name, params in MECHANISMS.items():
        syn = get_mechanism(name, **params).fit(data, 1.0, NoiseSource.seeded(3))
        plain = _rate(lambda s=syn: s.answer(boxes), len(boxes))
        t0 = time.perf_counter()
        syn.intervals(boxes[:1])  # a bootstrap model re-draws its noise once per loaded release
        setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, iv = syn.intervals(boxes)
        with_iv = len(boxes) / (time.perf_counter() - t0)
        print(f"{name:<10} {plain:>12,.0f} {with_iv:>16,.0f} {setup:>8.2f}  {iv.method.split(',')[0][:60]}")
    if args.cli:
        with tempfile.TemporaryDirectory() as tmp:
            data_file = Path(tmp) / "d.parquet"
            pts.to_parquet(data_file)
            rel = Path(tmp) / "rel"
            subprocess.run([sys.executable, "-m", "flows.cli", "release", str(data_file), "--city", "new-york",
                            "--epsilon", "1", "--param", "cell_width_m=250", "--out", str(rel)], check=True,
                           capture_output=True)
            ll = np.column_stack([*region.unproject(boxes[:, 0], boxes[:, 1]), *region.unproject(boxes[:, 2],
                                                                                               boxes[:, 3])])
            csv = Path(tmp) / "boxes.csv"
            np.savetxt(csv, ll, delimiter=",", header="min_lat,min_lon,max_lat,max_lon", comments="", fmt="%.6f")
            for fmt, out in (("--csv", "--out"), ("--json", "")):
                cmd = [sys.executable, "-m", "flows.cli", "query", "range", str(rel), "--boxes", str(csv), fmt,
                       *([out] if out else []), str(Path(tmp) / "answers")]
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                print(f"CLI identity {fmt}: {args.boxes} boxes in {time.perf_counter() - t0:.1f} s "
                      "(process start, fetch with sha256, read CSV, answer, write)")


if __name__ == "__main__":
    main()
