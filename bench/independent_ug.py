"""An independent uniform grid (UG, Qardaji, Yang, Li, ICDE 2013), and the check that dpcore's ``ug``
is within 10% of it on the same protocol.

The reference below is written from the paper alone, in plain numpy, and shares no code with
dpcore's mechanisms, histogram or noise modules: it bins with ``np.histogram2d``, draws two-sided
geometric noise from ``Generator.geometric``, and answers a box as Aᵢ·G·Bᵢᵀ with per-axis overlap
fractions (dpcore uses prefix sums). Grid size m = ⌈sqrt(N·ε/(c·s))⌉, c = 10, s the count
sensitivity (1 at record level, k at user level); N is either given (public) or estimated with 5%
of ε, exactly the two options dpcore's ``ug`` offers, so both run the same protocol.

Run (numbers go to stdout; timings depend on machine load):

    .venv/bin/python bench/independent_ug.py --data ../shared/data/gowalla_nyc_checkins.tsv.gz --city new-york
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np


def two_sided_geometric(scale: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Integer noise with P(z) ∝ exp(−|z|/scale): difference of two geometrics on {0, 1, …}."""
    p = 1.0 - math.exp(-1.0 / scale)
    return rng.geometric(p, shape) - rng.geometric(p, shape)


def reference_ug(x: np.ndarray, y: np.ndarray, bounds: tuple[float, float, float, float], epsilon: float,
                 rng: np.random.Generator, sensitivity: float = 1.0, n_public: float | None = None,
                 total_fraction: float = 0.05, c: float = 10.0, max_grid: int = 2048) -> np.ndarray:
    """Noisy m × m grid (indexed [ix, iy]) over bounds, UG size rule, ε-DP for the given sensitivity."""
    eps_cells = epsilon
    if n_public is None:
        eps_n = total_fraction * epsilon
        eps_cells = epsilon - eps_n
        n_est = max(1.0, x.size + float(two_sided_geometric(sensitivity / eps_n, (1,), rng)[0]))
    else:
        n_est = max(1.0, float(n_public))
    m = min(max_grid, max(1, math.ceil(math.sqrt(n_est * eps_cells / (c * sensitivity)))))
    xmin, ymin, xmax, ymax = bounds
    hist, _, _ = np.histogram2d(x, y, bins=[np.linspace(xmin, xmax, m + 1), np.linspace(ymin, ymax, m + 1)])
    return hist + two_sided_geometric(sensitivity / eps_cells, hist.shape, rng)


def axis_overlap(lo: np.ndarray, hi: np.ndarray, axis_lo: float, axis_hi: float, m: int) -> np.ndarray:
    """(q, m) fraction of each of m equal cells covered by each interval [lo, hi)."""
    edges = np.linspace(axis_lo, axis_hi, m + 1)
    covered = np.clip(np.minimum(hi[:, None], edges[None, 1:]) - np.maximum(lo[:, None], edges[None, :-1]), 0, None)
    return covered / (edges[1:] - edges[:-1])[None, :]


def reference_answer(grid: np.ndarray, bounds: tuple[float, float, float, float], boxes: np.ndarray) -> np.ndarray:
    """Range counts under uniformity inside cells: Σ_ij A[q, i]·G[i, j]·B[q, j]."""
    xmin, ymin, xmax, ymax = bounds
    a = axis_overlap(boxes[:, 0], boxes[:, 2], xmin, xmax, grid.shape[0])
    b = axis_overlap(boxes[:, 1], boxes[:, 3], ymin, ymax, grid.shape[1])
    return np.einsum("qi,qi->q", a @ grid, b)


def _load_points(path: str) -> object:
    from dpcore.data.points import load_points

    return load_points(path).points


def compare(x: np.ndarray, y: np.ndarray, region, epsilons: list[float], sides: list[tuple[float, float]],
            sensitivity: int, n_queries: int, trials: int, seed: int, public_total: bool) -> list[dict]:
    """Mean relative error of dpcore ug and the reference on identical data, workloads and ε."""
    from dpcore.mechanisms import FitInput, get_mechanism
    from dpcore.privacy.noise import NoiseSource

    bounds = region.bounds_m
    psi = max(1.0, 0.001 * x.size)
    wl_rng = np.random.default_rng(seed)
    h = region.half_m
    workloads = []
    for a, b in sides:
        s = wl_rng.uniform(a, b, n_queries)
        c = wl_rng.uniform(-h, h, (n_queries, 2))
        boxes = np.c_[c - s[:, None] / 2, c + s[:, None] / 2]
        # Truth by brute force over chunks of queries (independent of dpcore.queries.range).
        truth = np.concatenate([
            ((x[None, :] >= bx[:, :1]) & (x[None, :] < bx[:, 2:3]) & (y[None, :] >= bx[:, 1:2])
             & (y[None, :] < bx[:, 3:4])).sum(axis=1) for bx in np.array_split(boxes, max(1, n_queries // 50))])
        workloads.append(((a, b), boxes, truth))
    unit = "user" if sensitivity > 1 else "record"
    data = FitInput(x, y, region, unit, sensitivity if unit == "user" else None,
                    public_total=float(x.size) if public_total else None)
    rows = []
    for eps in epsilons:
        err_dp = [[] for _ in workloads]
        err_ref = [[] for _ in workloads]
        for t in range(trials):
            syn = get_mechanism("ug").fit(data, eps, NoiseSource.seeded(seed * 1000 + t))
            grid = reference_ug(x, y, bounds, eps, np.random.default_rng([seed, t, 7]), sensitivity,
                                float(x.size) if public_total else None)
            for w, (_, boxes, truth) in enumerate(workloads):
                err_dp[w].append(np.abs(syn.answer(boxes) - truth) / np.maximum(truth, psi))
                err_ref[w].append(np.abs(reference_answer(grid, bounds, boxes) - truth) / np.maximum(truth, psi))
        for w, (ab, _, _) in enumerate(workloads):
            d, r = float(np.mean(err_dp[w])), float(np.mean(err_ref[w]))
            rows.append({"epsilon": eps, "sides": ab, "dpcore_ug": d, "reference_ug": r, "ratio": d / r})
    return rows


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dpcore.data.points import clip_to_region
    from dpcore.geo import resolve_region
    from dpcore.privacy.bounding import bound_contributions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/gowalla_nyc_checkins.tsv.gz"))
    ap.add_argument("--city", default="new-york")
    ap.add_argument("--epsilons", default="0.05,0.1,0.2,0.4,0.8,1.6")
    ap.add_argument("--sides", default="25:100,100:1000,1000:5000")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--k", type=int, default=0, help="user-level with this k (bounded sample); 0 = record level")
    ap.add_argument("--public-total", action="store_true", help="both take N as public instead of paying 5%% of ε")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    region = resolve_region(city=args.city)
    points = _load_points(args.data)
    idx, x, y = clip_to_region(points, region)
    if args.k > 0:
        keep = bound_contributions(points.user[idx], args.k, np.random.default_rng(args.seed)).keep
        x, y = x[keep], y[keep]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    sides = [tuple(float(v) for v in s.split(":")) for s in args.sides.split(",")]
    rows = compare(x, y, region, epsilons, sides, max(1, args.k), args.queries, args.trials, args.seed,
                   args.public_total)
    print(f"{x.size} points in {region.name}; {'user-level k=' + str(args.k) if args.k else 'record-level'}; "
          f"N {'public' if args.public_total else 'estimated with 5% of ε'}; {args.trials} trials × {args.queries} queries")
    print(f"{'ε':>6} {'sides (m)':>12} {'dpcore ug':>10} {'reference':>10} {'ratio':>7}")
    worst = 0.0
    for r in rows:
        a, b = r["sides"]
        worst = max(worst, abs(r["ratio"] - 1))
        print(f"{r['epsilon']:>6g} {f'{a:g}-{b:g}':>12} {r['dpcore_ug']:>10.4f} {r['reference_ug']:>10.4f} {r['ratio']:>7.3f}")
    print(f"largest |ratio − 1| = {worst:.3f} ({'within' if worst <= 0.10 else 'OUTSIDE'} 10%)")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
