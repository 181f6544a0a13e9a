"""Fit the spread of a cut cell (β of bench/spread_variants.PowerShare, and FACTORS["grid"]) against its own
error on held-out public data: the truth of a square less the noise-free answer of a uniform grid of true
counts (no release, no noise: the spread term alone, as bench/decompose_coverage.py splits an interval).

The Gowalla 1,000-user sample's Austin and San Francisco (whole file, and single busy days for sparse data),
grids of 100 m – 4 km (record-level fine grids up to user-level coarse cells), squares of the three bands
centred on data points. For each β, each factor set's coverage per (data, grid, band) cell; printed: the
best by root mean square distance from 0.95, and the coverage of today's (β 1) factors.

    nice -n 10 .venv/bin/python bench/fit_cut_spread.py --datasets austin,san-francisco
"""

from __future__ import annotations

import argparse
import itertools
import resource
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_coverage as bc
from spread_variants import PowerShare

from dpcore.grid.histogram import answer_boxes, prefix_sums
from dpcore.queries.range import true_counts

WIDTHS = (100.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0)
BETAS = (1.0, 1.25, 1.5, 1.75, 2.0)


def grid_counts(x, y, region, n):
    xmin, ymin, xmax, ymax = region.bounds_m
    ix = np.clip(((x - xmin) * n / (xmax - xmin)).astype(int), 0, n - 1)
    iy = np.clip(((y - ymin) * n / (ymax - ymin)).astype(int), 0, n - 1)
    return np.bincount(ix * n + iy, minlength=n * n).reshape(n, n).astype(float)


def cells(datasets: str, queries: int, days: int, seed: int):
    """Per (dataset, source, width, band): squares' spread errors and the grid's CellSpread."""
    out = []
    for d in datasets.split(","):
        x, y, _, t, region = bc.load(d)
        day = t // 86400
        dd, n = np.unique(day, return_counts=True)
        busy = dd[n >= np.quantile(n, 0.75)]
        picks = [("full", np.ones(x.size, bool))] + [
            (f"day{i}", day == v) for i, v in enumerate(busy[np.linspace(0, len(busy) - 1, days).astype(int)])]
        rng = np.random.default_rng(seed)
        for src, m in picks:
            for w in WIDTHS:
                g = int(round(region.side_m / w))
                counts = grid_counts(x[m], y[m], region, g)
                cs = PowerShare([counts], region.bounds_m, "grid")
                for band in bc.BANDS:
                    boxes = bc.squares(x[m], y[m], band, queries, rng)
                    err = true_counts(x[m], y[m], boxes) - answer_boxes(prefix_sums(counts), region.bounds_m, boxes)
                    out.append({"key": (d, src, w, band), "boxes": boxes, "err": err, "cs": cs})
    return out


def sums(case, beta):
    cs, b = case["cs"], case["boxes"]
    cs.beta = beta
    v, w, e, r, _ = (np.zeros(len(b)) for _ in range(5))
    rows, parts = cs._sums(b, *cs.grids[0])
    for tot, p in zip((v, w, e, r), parts[:4], strict=True):
        tot[rows] += p
    inv_m = np.where(v > 0, w / np.where(v > 0, v * v, 1.0), 0.0)
    return np.sqrt(np.maximum(v, 0)), inv_m * inv_m, e, r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="austin,san-francisco")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--seed", type=int, default=301)
    a = ap.parse_args()
    z = NormalDist().inv_cdf(0.975)
    data = cells(a.datasets, a.queries, a.days, a.seed)
    grid0 = np.array([0.2, 0.3, 0.45, 0.6, 0.8, 1.0])
    grid1 = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    results = []
    for beta in BETAS:
        pre = [(sums(c, beta), c["err"]) for c in data]
        for a0, b0, b1 in itertools.product(grid0, grid0, grid1):
            cov = []
            for (sd, im2, e, r), err in pre:
                lo, hi = np.minimum(z * sd * a0, e), np.minimum(z * sd * (b0 + b1 * im2), r)
                cov.append(np.mean((err >= -lo) & (err <= hi)))
            cov = np.array(cov)
            results.append((float(np.sqrt(np.mean((cov - 0.95) ** 2))), beta, a0, b0, b1, cov))
    results.sort(key=lambda t: t[0])
    keys = [c["key"] for c in data]
    today = next(t for t in results if t[1:5] == (1.0, 0.45, 0.45, 4.0))
    for rms, beta, a0, b0, b1, cov in [*results[:5], today]:
        print(f"β {beta:g}, (a0, b0, b1) = ({a0:g}, {b0:g}, {b1:g}): rms from 0.95 {rms:.3f}; "
              f"in 0.93–0.97: {int(np.sum((cov >= 0.93) & (cov <= 0.97)))} of {cov.size}; "
              f"min {cov.min():.3f} max {cov.max():.3f}")
    for beta in BETAS:
        best = min((t for t in results if t[1] == beta), key=lambda t: t[0])
        print(f"best at β {beta:g}: {best[2:5]} rms {best[0]:.3f}")
    print("\nbest per cell width (β 1), rms over its cells:")
    for w in WIDTHS:
        sel = np.array([k[2] == w for k in keys])
        per = min((t for t in results if t[1] == 1.0), key=lambda t: float(np.sqrt(np.mean((t[5][sel] - 0.95) ** 2))))
        rms = float(np.sqrt(np.mean((per[5][sel] - 0.95) ** 2)))
        now = float(np.sqrt(np.mean((today[5][sel] - 0.95) ** 2)))
        print(f"  {w:6g} m: (a0, b0, b1) = ({per[2]:g}, {per[3]:g}, {per[4]:g}) rms {rms:.3f} (today's {now:.3f})")
    print("\nper cell (best, today's):")
    best = results[0]
    for k, c1, c0 in zip(keys, best[5], today[5], strict=True):
        print(f"  {k[0]:14s} {k[1]:5s} {k[2]:6g} m {k[3][0]:g}–{k[3][1]:g} m: {c1:.3f}  {c0:.3f}")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"# {ru.ru_utime + ru.ru_stime:.0f} CPU-s")


if __name__ == "__main__":
    main()
