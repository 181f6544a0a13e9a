"""Answering throughput per mechanism: boxes per CPU-second without intervals (the answer alone) and with
95% intervals (the Python API's answer table: estimates, intervals, unit and what they cover, all boxes at
once), in-process; optionally a CSV of boxes through the CLI for every mechanism, --csv and --json (CPU-seconds of
the child process).

    nice -n 10 python bench/bench_intervals.py [--boxes 1000000] [--cli]

Prints one row per mechanism. Synthetic New York check-ins; the default user-level release (k = 10, ε = 1,
scaled to full counts by the paid contribution profile, as `geodp release` draws it); the release itself
is not timed. Numbers go to a dated file in bench/results/.
"""

from __future__ import annotations

import argparse
import resource
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
from dpcore.privacy.profile import PROFILE_FRACTION, noisy_profile, profile_counts
from dpcore.privacy.scaling import fit_profiled
from dpcore.queries.answers import answer_table

MECHANISMS = {"identity": {"cell_width_m": 250.0}, "ug": {}, "privtree": {}, "hb": {}, "ag": {}, "auto": {}}


def _boxes(region, n: int, rng: np.random.Generator) -> np.ndarray:
    side = rng.uniform(25.0, 5000.0, n)
    cx, cy = rng.uniform(-region.half_m, region.half_m, (2, n))
    return np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)


REPEAT = 1


def _cpu(fn) -> float:
    """The median CPU-seconds of this process over REPEAT runs of fn."""
    times = []
    for _ in range(REPEAT):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return float(np.median(times))


def _rate(fn, n: int) -> float:
    """n per CPU-second of this process (median of REPEAT runs)."""
    return n / _cpu(fn)


def _child_run(cmd: list[str]) -> float:
    """The median CPU-seconds of REPEAT runs of a child process."""
    times = []
    for _ in range(REPEAT):
        t0 = _child_cpu()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(_child_cpu() - t0)
    return float(np.median(times))


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boxes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the median is printed")
    ap.add_argument("--api", action=argparse.BooleanOptionalAction, default=True,
                    help="time the in-process answers (--no-api: the CLI alone)")
    ap.add_argument("--cli", action="store_true",
                    help="also time `geodp query range --boxes CSV` with --csv and --json, every mechanism")
    args = ap.parse_args()
    global REPEAT
    REPEAT = args.repeat
    region = city_region("new-york")
    pts = generate_checkins(region, n_users=2000, days=7, seed=1)
    x, y = region.project(pts["lat"].to_numpy(), pts["lon"].to_numpy())
    data = FitInput(x, y, region, "user", 10, user=pts["user_id"].to_numpy())
    boxes = _boxes(region, args.boxes, np.random.default_rng(0))
    per_user = np.bincount(np.unique(data.user, return_inverse=True)[1])
    profile = noisy_profile(profile_counts(per_user), PROFILE_FRACTION, NoiseSource.seeded(2))
    boxes_ll = np.column_stack([*region.unproject(boxes[:, 0], boxes[:, 1]),
                                *region.unproject(boxes[:, 2], boxes[:, 3])])
    print(f"{args.boxes} boxes of 25–5000 m, uniform centres; boxes per CPU-second (median of {REPEAT})")
    print("| mechanism | answer | with intervals (Synopsis.intervals) | answer table (Python API) | answer table CPU-s "
          "| setup CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, params in MECHANISMS.items() if args.api else ():
        syn = fit_profiled(get_mechanism(name, **params), data, 1.0, NoiseSource.seeded(3), profile)
        plain = _rate(lambda s=syn: s.answer(boxes), len(boxes))
        t0 = time.process_time()
        syn.intervals(boxes[:1])  # models built once per loaded release (a bootstrap re-draws its noise)
        setup = time.process_time() - t0
        with_iv = _rate(lambda s=syn: s.intervals(boxes), len(boxes))
        table = _rate(lambda s=syn: answer_table(s, boxes_ll), len(boxes))
        print(f"| {name} | {plain:,.0f} | {with_iv:,.0f} | {table:,.0f} | {len(boxes) / table:.2f} | {setup:.2f} |",
              flush=True)
    if args.cli:
        print("\nCLI: `geodp query range RELEASE --boxes CSV` (CPU-s of the child: process start, fetch with sha256, "
              "read CSV, answer, write); one --box: the same for a single box")
        print("| mechanism | --csv --out FILE CPU-s | boxes/CPU-s | --json FILE CPU-s | boxes/CPU-s | one --box CPU-s |")
        print("|---|---:|---:|---:|---:|---:|")
        with tempfile.TemporaryDirectory() as tmp:
            data_file = Path(tmp) / "d.parquet"
            pts.to_parquet(data_file)
            ll = np.column_stack([*region.unproject(boxes[:, 0], boxes[:, 1]), *region.unproject(boxes[:, 2],
                                                                                               boxes[:, 3])])
            csv = Path(tmp) / "boxes.csv"
            np.savetxt(csv, ll, delimiter=",", header="min_lat,min_lon,max_lat,max_lon", comments="", fmt="%.6f")
            for name, params in MECHANISMS.items():
                rel = Path(tmp) / name
                subprocess.run([sys.executable, "-m", "flows.cli", "release", str(data_file), "--city", "new-york",
                                "--epsilon", "1", "--max-points-per-user", "10", "--mechanism", name,
                                *[a for k, v in params.items() for a in ("--param", f"{k}={v:g}")],
                                "--out", str(rel), "--no-prefect"], check=True, capture_output=True)
                row = [name]
                for fmt, out in (("--csv", "--out"), ("--json", "")):
                    cmd = [sys.executable, "-m", "flows.cli", "query", "range", str(rel), "--boxes", str(csv), fmt,
                           *([out] if out else []), str(Path(tmp) / "answers")]
                    cpu = _child_run(cmd)
                    row += [f"{cpu:.2f}", f"{args.boxes / cpu:,.0f}"]
                # the fixed cost: process start, imports, fetch and models, for one box
                one = _child_run([sys.executable, "-m", "flows.cli", "query", "range", str(rel), "--box",
                                  ",".join(f"{v:.6f}" for v in ll[0])])
                row.append(f"{one:.2f}")
                print("| " + " | ".join(row) + " |", flush=True)

if __name__ == "__main__":
    main()
