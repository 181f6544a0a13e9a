"""Benchmark of DP heatmaps and sparse 1-D histograms. Prints numbers; asserts nothing.

1. Heatmap quality on check-in data: EMD / KL / Pearson of dpheatmap vs Laplace and Laplace-top-t%
   (several t, the best one is the "best thresholded baseline"), ε ∈ {0.2, 1, 5}, n users sampled per
   trial, Δ ∈ {64, 128, 256}; prints, at Δ = 256, EMD, KL and Pearson of dpheatmap, of its reconstruction
   alone (no output background), of Laplace and of the best top-t%, and whether dpheatmap beats both.
2. Reconstruction time at Δ = 256 (LP with HiGHS and NNLS), default and large w.
3. Sparse 1-D on venue counts: total absolute error of plain Laplace vs noise-then-threshold vs top-t%.

    nice -n 10 .venv/bin/python bench/bench_heatmap.py [--data PATH --city SLUG] [--trials 5] [--quick]
        [--resolutions 64,128] [--users 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcore.data.points import load_points
from dpcore.evaluation.heatmap import HeatmapEvalConfig, evaluate_heatmap, format_table
from dpcore.geo import city_region
from dpcore.heatmap.quadtree import level_epsilons, measure_quadtree, reconstruct, user_normalised_grid
from dpcore.privacy.noise import NoiseSource

SHARED = Path(os.environ.get("GEODP_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
TOPS = (0.02, 0.05, 0.2, 1.0)
#: dpheatmap without its output background (the reconstruction alone, as released before 2026-11-28)
BARE = "dpheatmap:smooth_weight=0:floor_weight=0"


def heatmap_quality(path: Path, city: str, trials: int, users: list[int], resolutions: list[int],
                    epsilons: list[float]) -> None:
    pts = load_points(path).points
    region = city_region(city)
    mechs = ["dpheatmap", BARE, "laplace", *[f"laplace-top:top_percent={t:g}" for t in TOPS]]
    cfg = HeatmapEvalConfig(mechanisms=mechs, epsilons=epsilons, resolutions=resolutions, users=users,
                            trials=trials, seed=0)
    t0 = time.perf_counter()
    report = evaluate_heatmap(pts, region, cfg)
    print(f"\n## heatmaps: {path.name}, {city}, {trials} trials ({time.perf_counter() - t0:.0f}s)")
    print(format_table(report))
    by = {(r["mechanism"], r["epsilon"], r["resolution"], r["users"]): r for r in report["results"]}
    for n in users:
        for d in resolutions:
            print(f"\nchecks (n = {n}, Δ = {d}):")
            print("| ε | metric | dpheatmap | reconstruction alone | laplace | best laplace-top (t %) | dpheatmap ≤/≥ both |")
            print("|---|---|---|---|---|---|---|")
            for eps in epsilons:
                dp, bare, lap = (by[(m, eps, d, n)] for m in ("dpheatmap", BARE, "laplace"))
                tops = [by[(f"laplace-top:top_percent={t:g}", eps, d, n)] for t in TOPS]
                for key, better in (("emd", min), ("kl", min), ("pearson", max)):
                    top = better(tops, key=lambda r, key=key: r[key])
                    ok = better(dp[key], lap[key], top[key]) == dp[key]
                    print(f"| {eps:g} | {key} | {dp[key]:.4f} | {bare[key]:.4f} | {lap[key]:.4f} | {top[key]:.4f} "
                          f"({top['mechanism'].split('=')[1]}) | {'yes' if ok else '**no**'} |")
    n = 200 if 200 in users else users[0]
    if len(resolutions) > 1:
        print(f"\nEMD vs Δ (n = {n}):")
        for eps in epsilons:
            row = "  ".join(f"Δ={r}: dp {by[('dpheatmap', eps, r, n)]['emd']:.3f} lap {by[('laplace', eps, r, n)]['emd']:.3f}"
                            for r in resolutions)
            print(f"  ε={eps:g}: {row}")


def reconstruction_time() -> None:
    print("\n## reconstruction time at Δ = 256 (synthetic clustered masses, full depth, ε = 5)")
    rng = np.random.default_rng(0)
    n_pts = 50_000
    centres = rng.uniform(-9000, 9000, (200, 2))
    c = rng.integers(0, 200, n_pts)
    xy = centres[c] + rng.normal(0, 300, (n_pts, 2))
    user = rng.integers(0, 2000, n_pts)
    units = user_normalised_grid(xy[:, 0], xy[:, 1], user, (-10000, -10000, 10000, 10000), 256)
    for w in (30, 300, 3000):
        for method in ("lp", "nnls"):
            tree = measure_quadtree(units, w, level_epsilons(5.0, 8, 1.3), 1 << 20, NoiseSource.seeded(1))
            t0 = time.perf_counter()
            reconstruct(tree, method)
            print(f"  w={w:5d} {method:4s}: {sum(k.shape[0] for k in tree.kept):6d} kept nodes, "
                  f"{time.perf_counter() - t0:6.2f}s")


def sparse_venues(path: Path, domain: int, bin_column: str, trials: int, epsilons: list[float], k: int) -> None:
    from flows.cli.heatmap import sparse_errors, venue_counts

    keys, counts = venue_counts(str(path), bin_column, domain, k, np.random.default_rng(0))
    print(f"\n## sparse 1-D: {path.name} {bin_column}, domain {domain:,} bins, k = {k}, "
          f"{int(counts.sum()):,} records in {keys.size:,} occupied bins, {trials} trials; "
          f"releasing all zeros would have total error {int(counts.sum()):,}")
    print(f"  {'eps':>5s} {'laplace':>14s} {'thr η=0.5':>11s} {'thr η=1':>11s} {'thr η=2':>11s} {'top-0.1%':>11s}")
    for eps in epsilons:
        acc: dict[str, list[float]] = {}
        for trial in range(trials):
            for eta in (0.5, 1.0, 2.0):
                e = sparse_errors(keys, counts, domain, eps, k, eta, 0.1 if eta == 1.0 else None,
                                  NoiseSource.seeded(100 * trial + int(eta * 10)))
                acc.setdefault("laplace", []).append(e["laplace"])
                acc.setdefault(f"thr{eta:g}", []).append(e["threshold"])
                if "top_percent" in e:
                    acc.setdefault("top", []).append(e["top_percent"])
        m = {k2: float(np.mean(v)) for k2, v in acc.items()}
        print(f"  {eps:5g} {m['laplace']:14,.0f} {m['thr0.5']:11,.0f} {m['thr1']:11,.0f} {m['thr2']:11,.0f} "
              f"{m['top']:11,.0f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=SHARED / "gowalla_nyc_checkins.tsv.gz")
    ap.add_argument("--city", default="new-york")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="only n = 200, Δ = 256")
    ap.add_argument("--resolutions", default=None, help="Δ values, e.g. 64,128 (default: 256 with --quick, else 64,128,256)")
    ap.add_argument("--users", default=None, help="people per trial, e.g. 200 (default: 200 with --quick, else 50,200,500)")
    ap.add_argument("--quality-only", action="store_true", help="skip the reconstruction time and sparse 1-D parts")
    args = ap.parse_args()
    if not args.data.exists():
        print(f"missing {args.data}: give --data PATH (check-in data with user_id, timestamp, lat, lon)")
        return 1
    eps = [0.2, 1.0, 5.0]
    users = [int(u) for u in args.users.split(",")] if args.users else ([200] if args.quick else [50, 200, 500])
    res = ([int(r) for r in args.resolutions.split(",")] if args.resolutions
           else ([256] if args.quick else [64, 128, 256]))
    heatmap_quality(args.data, args.city, args.trials, users, res, eps)
    if args.quality_only:
        return 0
    reconstruction_time()
    nyc = SHARED / "gowalla_nyc_checkins.tsv.gz"
    if nyc.exists():
        sparse_venues(nyc, 6_000_000, "location_id", 3, eps, 10)
    sample = SHARED / "gowalla_sample_1000users.parquet"
    if sample.exists():
        sparse_venues(sample, 25_000, "venue_id", 3, eps, 10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
