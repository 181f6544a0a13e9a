"""User-level releases scaled by the paid contribution profile (no public total): how often the 95%
intervals of full counts cover the truth, and how far the estimates are, on data-centred squares.

For each dataset, k and ε: ``--releases`` releases drawn as a release draws them (a k-sample per
person, the profile with PROFILE_FRACTION of ε, an identity grid with the rest, scaled by 1/κ̂), each
asked ``--queries`` squares of the band centred on data points; the truth is the full data's count.
Prints per row: the coverage of the 95% intervals (over all releases × squares), the mean relative
error of the estimate, the median relative half-width of the interval, and the coverage of the
noise-only interval (what the scaled release said before: N·û/n̂ with the true κ, noise only).
Runs on one core in a minute or two at the defaults (a subsample of releases and squares).

    .venv/bin/python bench/bench_profile.py --datasets gowalla-nyc --k 10,20,50 --epsilon 1
    .venv/bin/python bench/bench_profile.py --k 20 --epsilon 1 --plan 0.1,0.5,2 --releases 3   # the plan
    .venv/bin/python bench/bench_profile.py --choose-k 0.5,1 --k 10,20,50 --releases 3   # k = auto
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.data.points import Points, load_points  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.grid.histogram import grid_counts  # noqa: E402
from dpcore.mechanisms import FitInput, get_mechanism  # noqa: E402
from dpcore.privacy.bounding import bound_contributions  # noqa: E402
from dpcore.privacy.noise import NoiseSource  # noqa: E402
from dpcore.privacy.profile import PROFILE_FRACTION, noisy_profile, profile_counts  # noqa: E402
from dpcore.privacy.scaling import fit_profiled  # noqa: E402
from dpcore.synopsis.uncertainty import query_intervals  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
DATASETS = {
    "gowalla-nyc": ("gowalla_nyc_checkins.tsv.gz", "new-york"),
    "gowalla-sample-sf": ("gowalla_sample_1000users.parquet", "san-francisco"),
    "gowalla-sample-austin": ("gowalla_sample_1000users.parquet", "austin"),
}


def region_points(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, object]:
    file, city = DATASETS[name]
    pts: Points = load_points(SHARED / file).points
    region = city_region(city)
    x, y = region.project(pts.lat, pts.lon)
    inside = region.contains_m(x, y)
    return x[inside], y[inside], pts.user[inside], region


def squares(x: np.ndarray, y: np.ndarray, band: tuple[float, float], n: int,
            rng: np.random.Generator) -> np.ndarray:
    centre = rng.integers(0, x.size, n)
    side = rng.uniform(band[0], band[1], n)
    cx, cy = x[centre], y[centre]
    return np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)


def true_counts(x: np.ndarray, y: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Exact counts of points in each half-open box (sorted by x, then a vectorised scan per box)."""
    order = np.argsort(x)
    xs, ys = x[order], y[order]
    lo = np.searchsorted(xs, boxes[:, 0], "left")
    hi = np.searchsorted(xs, boxes[:, 2], "left")
    return np.array([np.count_nonzero((ys[a:b] >= box[1]) & (ys[a:b] < box[3]))
                     for a, b, box in zip(lo, hi, boxes, strict=True)])


def run(name: str, ks: list[int], epsilon: float, band: tuple[float, float], releases: int, queries: int,
        cell_m: float, seed: int) -> list[dict]:
    x, y, user, region = region_points(name)
    rng = np.random.default_rng(seed)
    cells = int(round(region.side_m / cell_m))
    rows = []
    for k in ks:
        cover, err, width = [], [], []
        for r in range(releases):
            keep = bound_contributions(user, k, rng).keep
            fine = grid_counts(x[keep], y[keep], region.bounds_m, cells)
            noise = NoiseSource.seeded(seed * 1000 + r)
            counts = profile_counts(np.bincount(user)[np.bincount(user) > 0])
            profile = noisy_profile(counts, PROFILE_FRACTION * epsilon, noise.spawn(1))
            data = FitInput(np.empty(0), np.empty(0), region, "user", k, fine=fine.astype(np.int64))
            syn = fit_profiled(get_mechanism("identity", cell_width_m=region.side_m / cells), data, epsilon, noise.spawn(2),
                               profile)
            boxes = squares(x, y, band, queries, rng)
            truth = true_counts(x, y, boxes)
            est = syn.answer(boxes)
            lo, hi, _ = query_intervals(syn, boxes)
            cover.append((lo <= truth) & (truth <= hi))
            err.append(np.abs(est - truth) / np.maximum(truth, 1))
            width.append((hi - lo) / 2 / np.maximum(truth, 1))
        cover, err, width = (np.concatenate(v) for v in (cover, err, width))
        rows.append({"dataset": name, "k": k, "epsilon": epsilon, "coverage": float(cover.mean()),
                     "mean_rel_error": float(err.mean()), "median_rel_half_width": float(np.median(width)),
                     "releases": releases, "queries": queries})
    return rows


def fit(x, y, user, region, k: int, epsilon: float, cells: int, seed: int, rng: np.random.Generator):
    """One release as a release draws it (k-sample, profile, identity grid, scaled by 1/κ̂)."""
    keep = bound_contributions(user, k, rng).keep
    fine = grid_counts(x[keep], y[keep], region.bounds_m, cells).astype(np.int64)
    counts = profile_counts(np.bincount(user)[np.bincount(user) > 0])
    noise = NoiseSource.seeded(seed)
    profile = noisy_profile(counts, PROFILE_FRACTION * epsilon, noise.spawn(1))
    data = FitInput(np.empty(0), np.empty(0), region, "user", k, fine=fine)
    return fit_profiled(get_mechanism("identity", grid_size=cells), data, epsilon, noise.spawn(2), profile)


def plan_vs_measured(name: str, k: int, epsilons: list[float], basis_epsilon: float, releases: int, queries: int,
                     cell_m: float, seed: int) -> list[dict]:
    """The plan's expected |error| per band (from one published basis release at ``basis_epsilon``) against
    the mean |error| measured on fresh releases at each ε, on data-centred squares of the band."""
    from dpcore.privacy.profile import ContributionProfile
    from dpcore.synopsis.expected_error import PlanInputs, expected_errors, typical_counts
    from dpcore.synopsis.uncertainty import DEFAULT_BANDS

    x, y, user, region = region_points(name)
    rng = np.random.default_rng(seed)
    cells = int(round(region.side_m / cell_m))
    basis = fit(x, y, user, region, k, basis_epsilon, cells, seed, rng)
    typical = typical_counts(basis)
    profile = ContributionProfile.from_dict(basis.profile)
    rows = []
    for eps in epsilons:
        predicted = expected_errors(PlanInputs(eps, k, region.side_m / cells), typical, profile)
        errs = {b: [] for b in DEFAULT_BANDS}
        truth_med = {}
        for r in range(releases):
            syn = fit(x, y, user, region, k, eps, cells, seed + 1 + r, rng)
            for band in DEFAULT_BANDS:
                boxes = squares(x, y, band, queries, rng)
                truth = true_counts(x, y, boxes)
                errs[band].append(np.abs(syn.answer(boxes) - truth))
                truth_med.setdefault(band, []).append(np.median(truth))
        for band, p in zip(DEFAULT_BANDS, predicted, strict=True):
            rows.append({"dataset": name, "k": k, "epsilon": eps, "band": band,
                         "predicted": p["expected_abs_error"], "typical_predicted": p["typical_count"],
                         "measured": float(np.mean(np.concatenate(errs[band]))),
                         "median_truth": float(np.median(truth_med[band]))})
    return rows


HINDSIGHT_WIDTHS_M = (100.0, 250.0, 500.0, 1000.0, 2000.0)


def choose_k_vs_fixed(name: str, epsilons: list[float], bases: int, releases: int, queries: int, cell_m: float,
                      seed: int, fixed: tuple[int, ...] = (10, 20, 50)) -> list[dict]:
    """``--max-points-per-user auto`` as a release makes it: the plan chooses k from a published basis
    release (drawn at the default k = 20 and the same ε, ``bases`` times) and the identity grid of
    ``cell_m`` releases at that k; against fixed k, answering 0 and the hindsight uniform grid (the k
    and cell width of those tried whose error, measured with the true answers, is smallest per band)."""
    from dpcore.privacy.profile import ContributionProfile
    from dpcore.synopsis.expected_error import PlanInputs, choose_k, typical_counts
    from dpcore.synopsis.uncertainty import DEFAULT_BANDS

    x, y, user, region = region_points(name)
    rng = np.random.default_rng(seed)
    cells = int(round(region.side_m / cell_m))
    boxes = {b: squares(x, y, b, queries, rng) for b in DEFAULT_BANDS}
    truth = {b: true_counts(x, y, q) for b, q in boxes.items()}

    def error(k: int, n_cells: int, s: int) -> dict:
        """Mean relative error per band over ``releases`` releases at k on an n_cells² identity grid."""
        errs = {b: [] for b in DEFAULT_BANDS}
        for r in range(releases):
            syn = fit(x, y, user, region, k, eps, n_cells, s + r, rng)
            for b in DEFAULT_BANDS:
                errs[b].append(np.abs(syn.answer(boxes[b]) - truth[b]) / np.maximum(truth[b], 1))
        return {b: float(np.mean(np.concatenate(v))) for b, v in errs.items()}

    rows = []
    for eps in epsilons:
        chosen = []
        for i in range(bases):
            basis = fit(x, y, user, region, 20, eps, cells, seed + 100 + i, rng)
            k, _ = choose_k(PlanInputs(eps, 20, region.side_m / cells), typical_counts(basis),
                            ContributionProfile.from_dict(basis.profile))
            chosen.append(k)
        ks = sorted(set(fixed) | set(chosen))
        widths = sorted(set(HINDSIGHT_WIDTHS_M) | {cell_m})
        at = {(k, w): error(k, int(round(region.side_m / w)), seed + 1000) for k in ks for w in widths}
        for b in DEFAULT_BANDS:
            best = min(at, key=lambda kw: at[kw][b])
            rows.append({"dataset": name, "epsilon": eps, "band": b, "chosen": chosen,
                         "auto": [at[(k, cell_m)][b] for k in chosen],
                         "fixed": {k: at[(k, cell_m)][b] for k in fixed},
                         "zero": float(np.mean(truth[b] / np.maximum(truth[b], 1))),
                         "hindsight": (at[best][b], best)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="gowalla-nyc")
    ap.add_argument("--k", default="10,20,50")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--band", default="1000,5000", help="square sides in metres, LO,HI")
    ap.add_argument("--releases", type=int, default=10)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--cell-m", type=float, default=250.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--plan", metavar="EPSILONS", help="instead: the plan's predicted against measured |error| "
                    "per band at these ε (comma-separated), predicted from a basis release at --epsilon")
    ap.add_argument("--choose-k", metavar="EPSILONS", help="instead: k = auto (chosen from --bases basis releases) "
                    "against fixed k, answering 0 and the hindsight grid, at these ε (comma-separated)")
    ap.add_argument("--bases", type=int, default=3, help="basis releases auto chooses from (--choose-k)")
    a = ap.parse_args()
    if a.choose_k:
        fixed = tuple(int(v) for v in a.k.split(","))
        print("| data | ε | band (m) | auto's k (per basis) | auto | " + " | ".join(f"k = {k}" for k in fixed)
              + " | answer 0 | hindsight grid (k, cell) |")
        print("|---" * (7 + len(fixed)) + "|")
        for name in a.datasets.split(","):
            for r in choose_k_vs_fixed(name, [float(e) for e in a.choose_k.split(",")], a.bases, a.releases,
                                       a.queries, a.cell_m, a.seed, fixed):
                err, (k, w) = r["hindsight"]
                print(f"| {r['dataset']} | {r['epsilon']:g} | {r['band'][0]:g}–{r['band'][1]:g} | "
                      f"{' / '.join(map(str, r['chosen']))} | {' / '.join(f'{v:.3f}' for v in r['auto'])} | "
                      + " | ".join(f"{r['fixed'][k]:.3f}" for k in fixed)
                      + f" | {r['zero']:.3f} | {err:.3f} (k = {k}, {w:g} m) |", flush=True)
        return
    if a.plan:
        print("| data | k | ε | band (m) | plan: expected abs. error | measured mean abs. error | plan: typical "
              "count | median true count |")
        print("|---|---|---|---|---|---|---|---|")
        for name in a.datasets.split(","):
            for k in (int(v) for v in a.k.split(",")):
                for r in plan_vs_measured(name, k, [float(e) for e in a.plan.split(",")], a.epsilon, a.releases,
                                          a.queries, a.cell_m, a.seed):
                    print(f"| {r['dataset']} | {r['k']} | {r['epsilon']:g} | {r['band'][0]:g}–{r['band'][1]:g} | "
                          f"{r['predicted']:.3g} | {r['measured']:.3g} | "
                          f"{'hidden' if r['typical_predicted'] is None else format(r['typical_predicted'], '.3g')} | "
                          f"{r['median_truth']:.3g} |", flush=True)
        return
    band = tuple(float(v) for v in a.band.split(","))
    print("| data | k | ε | coverage of 95% intervals | mean rel. error | median rel. half-width | releases × squares |")
    print("|---|---|---|---|---|---|---|")
    for name in a.datasets.split(","):
        t0 = time.perf_counter()
        for row in run(name, [int(k) for k in a.k.split(",")], a.epsilon, band, a.releases, a.queries, a.cell_m,
                       a.seed):
            print(f"| {row['dataset']} | {row['k']} | {row['epsilon']:g} | {row['coverage']:.3f} | "
                  f"{row['mean_rel_error']:.3f} | {row['median_rel_half_width']:.3f} | "
                  f"{row['releases']} × {row['queries']} |", flush=True)
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f} s -->")


if __name__ == "__main__":
    main()
