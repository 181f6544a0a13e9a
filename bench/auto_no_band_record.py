"""Record-level `auto` with no declared band: designs for the one fit that answers 25 m – 5 km squares,
chosen on PUBLIC data, then the held-out Gowalla NYC table (issue 35 item 4; decision 0016, "No declared
band").

`auto` without a band runs AG (α 0.2, c 7, level-1 cells ≤ 850 m: min_m1 24 on a 20 km region) at record
level (bench/auto_no_band.py chose it among 48 AG settings). On held-out NYC it missed one cell: ε 1,
25–100 m, ×1.20 PrivTree. This script measures, on the public training sets of bench/fit_grid_rule.py
(the Gowalla 1,000-user sample's cities except New York, three synthetic cities; never NYC), record level,
ε 0.2 and 1, 300 data-centred squares per band, seed 0, designs aimed at small squares:

- AG with finer level-1 cells (min_m1 48, 64) or finer leaves (c 3, 5);
- PrivTree itself and with a higher split threshold θ, another tree share, coarser leaves (min_leaf_m);
- split releases: PrivTree on s·ε answers squares smaller than a side, AG (auto's setting) on (1 − s)·ε
  the rest (each part keeps its own noise);
- a PrivTree + coarse-grid prototype (bench-only): PrivTree on (1 − a)·ε and an m1 × m1 noisy grid on a·ε,
  each grid cell's total combined with the tree's by inverse variance and the difference spread over the
  cell, so large squares read the grid's few noisy counts instead of many leaves'.

It prints each design's cells within 10% of the best of ag, ug, hb, privtree (defaults) per band and a
leave-one-dataset-out check (the design best on eight sets, scored on the ninth). ``--held-out`` then runs
the held-out table once (bench_accuracy.py: auto with its no-band default, ag, ug, hb, privtree on Gowalla
NYC, record and user level, ε 0.2 and 1, with the hindsight grid and answering 0).

    nice -n 10 .venv/bin/python bench/auto_no_band_record.py --queries 300 --trials 1 [--held-out]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from fit_grid_rule import OUT, datasets  # noqa: E402

from dpcore.evaluation.metrics import psi_for, relative_error  # noqa: E402
from dpcore.evaluation.range import fit_and_scale, make_fit_input, protocol_workloads, region_data  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.grid.histogram import block_sum, expand  # noqa: E402
from dpcore.grid.size_rule import BANDS  # noqa: E402
from dpcore.mechanisms import PointsInput, get_mechanism  # noqa: E402
from dpcore.mechanisms.auto_rule import NO_BAND, band_params  # noqa: E402
from dpcore.privacy.noise import NoiseSource  # noqa: E402
from dpcore.synopsis.base import GridSynopsis  # noqa: E402

ROWS = OUT / "auto_no_band_record_rows.json"
EPSILONS = (0.2, 1.0)
REFERENCES = ("ag", "ug", "hb", "privtree")
#: auto's record-level no-band setting before this search (two-level AG; min_m1 = ⌈20 km / 850 m⌉ on the
#: 20 km public regions), and the one it runs now (dpcore.mechanisms.auto_rule.WIDE_PICKS)
AUTO_BEFORE = {"alpha": 0.2, "c": 7.0, "min_m1": 24}
AUTO_NOW = band_params(NO_BAND, "ag", 20_000.0, "record")
DESIGNS: dict[str, tuple[str, dict]] = {
    "auto before: ag a=0.2 c=7 min_m1=24": ("ag", AUTO_BEFORE),
    "ag a=0.2 c=7 min_m1=48": ("ag", {"alpha": 0.2, "c": 7.0, "min_m1": 48}),
    "ag a=0.2 c=5 min_m1=48": ("ag", {"alpha": 0.2, "c": 5.0, "min_m1": 48}),
    "ag a=0.2 c=5 min_m1=64": ("ag", {"alpha": 0.2, "c": 5.0, "min_m1": 64}),
    "ag a=0.3 c=7 min_m1=64": ("ag", {"alpha": 0.3, "c": 7.0, "min_m1": 64}),
    "ag a=0.2 c=3 min_m1=24": ("ag", {"alpha": 0.2, "c": 3.0, "min_m1": 24}),
    "privtree theta=2": ("privtree", {"theta": 2.0}),
    "privtree theta=10": ("privtree", {"theta": 10.0}),
    "privtree theta=40": ("privtree", {"theta": 40.0}),
    "privtree tree_fraction=0.3": ("privtree", {"tree_fraction": 0.3}),
    "privtree tree_fraction=0.7": ("privtree", {"tree_fraction": 0.7}),
    "privtree min_leaf_m=20": ("privtree", {"min_leaf_m": 20.0}),
}
#: split releases: (PrivTree's share of ε, the square side below which PrivTree answers)
SPLITS = ((0.3, 100.0), (0.5, 100.0), (0.5, 1000.0), (0.7, 1000.0))
#: PrivTree + coarse grid: (the grid's share of ε, its side in cells; a power of two, PrivTree's raster is 2^D)
HYBRIDS = tuple((a, m) for a in (0.1, 0.2, 0.3) for m in (16, 32, 64))


#: three-level AG (``levels=3``): ((level-1 share, level-2 share) of ε after the total, c (level 2), c3, merge_unsplit)
AG3 = (tuple((sh, c2, c3, True) for sh in ((0.2, 0.3), (0.3, 0.2), (0.2, 0.4), (0.3, 0.3)) for c2 in (14.0, 20.0)
             for c3 in (7.0, 10.0))
       + (((0.2, 0.3), 20.0, 10.0, False), ((0.2, 0.3), 14.0, 10.0, False)))


def ag3_params(shares: tuple[float, float], c2: float, c3: float, merge: bool) -> dict:
    return {"alpha": shares[0], "c": c2, "levels": 3, "level2_fraction": round(shares[1] / (1 - shares[0]), 4),
            "c3": c3, "merge_unsplit": merge, "min_m1": AUTO_BEFORE["min_m1"]}


def ag3_name(shares: tuple[float, float], c2: float, c3: float, merge: bool) -> str:
    return f"ag3 {shares[0]:g}/{shares[1]:g} c={c2:g} c3={c3:g}" + ("" if merge else " unmerged")


def split_name(share: float, side: float) -> str:
    return f"split: privtree {share:g}·ε below {side:g} m"


def hybrid_name(share: float, m1: int) -> str:
    return f"privtree + {m1}x{m1} grid on {share:g}·ε"


def hybrid_fits(fit_input: PointsInput, eps: float, share: float, sides: list[int],
                seed: int) -> dict[int, GridSynopsis]:
    """PrivTree on (1 − share)·ε and per side m1 a noisy m1 × m1 grid on share·ε (a prototype: one grid per
    side, not a release), combined per grid cell by inverse variance (the tree's cell variance from its
    leaves, each leaf's share of the cell squared), the difference spread uniformly over the cell."""
    noise = NoiseSource.seeded(seed)
    tree = get_mechanism("privtree").fit(fit_input, (1 - share) * eps, noise)
    raster = tree.values
    depth = int(np.log2(raster.shape[0]))
    var_leaf = 2.0 * tree._extra["leaf_noise_scale"] ** 2
    leaf_depth = tree.arrays["leaf_depth"].astype(int)
    leaf_index = tree.arrays["leaf_index"].astype(np.int64)
    out = {}
    for m1 in sides:
        dc = int(np.log2(m1))
        var_tree = np.zeros((m1, m1))
        for d in range(depth + 1):
            g = np.zeros((2 ** d, 2 ** d))
            g.ravel()[leaf_index[leaf_depth == d]] = var_leaf
            var_tree += block_sum(g, 2 ** (d - dc)) if d >= dc else expand(g, 2 ** (dc - d)) * 16.0 ** (d - dc)
        grid = fit_input.add_count_noise(fit_input.grid_counts(m1, m1), share * eps, noise).astype(float)
        var_grid = 2.0 / (share * eps) ** 2
        b = raster.shape[0] // m1
        tree_cell = block_sum(raster, b)
        shift = var_tree / (var_tree + var_grid) * (grid - tree_cell)
        out[m1] = GridSynopsis(raster + expand(shift / (b * b), b), fit_input.region, None, {})
    return out


def rows_for(points, city: str, queries: int, trials: int, have: dict[str, float]) -> dict[str, float]:
    """The errors of every design not in ``have`` (a cached row), merged into it."""
    done = {k.rsplit('|', 1)[1] for k in have}
    data = region_data(points, city_region(city))
    psi = psi_for(data.n_points)
    bands = list(BANDS.values())
    workloads = protocol_workloads(data, bands, queries, 0)
    fit_input = make_fit_input(data, "record", 1, np.random.default_rng(0))
    out: dict[str, float] = dict(have)
    for eps in EPSILONS:
        errs: dict[tuple[str, int], list[float]] = {}
        for trial in range(trials):
            def fit(mech: str, params: dict, e: float, seed: int, trial: int = trial) -> list[np.ndarray]:
                noise = NoiseSource.seeded(1000 * trial + seed)
                syn = fit_and_scale(mech, params, fit_input, e, noise, data.n_points)
                return [syn.answer(b) for _, b, _ in workloads]

            answers = {name: fit(name, {}, eps, 7) for name in REFERENCES}
            answers |= {name: fit(mech, params, eps, 7) for name, (mech, params) in DESIGNS.items()
                        if name not in done}
            for share in sorted({s for s, _ in SPLITS if split_name(s, _) not in done}):
                small, large = fit("privtree", {}, share * eps, 11), fit("ag", AUTO_BEFORE, (1 - share) * eps, 13)
                for side in (sd for s, sd in SPLITS if s == share):
                    answers[split_name(share, side)] = [
                        np.where(np.sqrt((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])) < side, small[w], large[w])
                        for w, (_, b, _) in enumerate(workloads)]
            for g in (g for g in AG3 if ag3_name(*g) not in done):
                answers[ag3_name(*g)] = fit("ag", ag3_params(*g), eps, 7)
            for share in sorted({a for a, m in HYBRIDS if hybrid_name(a, m) not in done}):
                sides = [m for a, m in HYBRIDS if a == share]
                for m1, syn in hybrid_fits(fit_input, eps, share, sides, 1000 * trial + 17).items():
                    answers[hybrid_name(share, m1)] = [syn.answer(b) for _, b, _ in workloads]
            for name, per in answers.items():
                for w, (_, _, truth) in enumerate(workloads):
                    errs.setdefault((name, w), []).append(float(relative_error(per[w], truth, psi).mean()))
        for (name, w), e in errs.items():
            out[f"{eps:g}|{'-'.join(f'{v:g}' for v in bands[w])}|{name}"] = float(np.mean(e))
    return out


def names() -> list[str]:
    return [*DESIGNS, "privtree", *(split_name(s, side) for s, side in SPLITS),
            *(hybrid_name(a, m) for a, m in HYBRIDS), *(ag3_name(*g) for g in AG3)]


def cells(rows: dict[str, dict[str, float]], which: list[str]) -> dict[str, np.ndarray]:
    """Per design: its error ÷ the best reference's, cells ordered (set, ε, band)."""
    out: dict[str, list[float]] = {n: [] for n in which}
    for r in rows.values():
        for eps in EPSILONS:
            for a, b in BANDS.values():
                best = min(r[f"{eps:g}|{a:g}-{b:g}|{x}"] for x in REFERENCES)
                for n in which:
                    out[n].append(r[f"{eps:g}|{a:g}-{b:g}|{n}"] / best)
    return {n: np.array(x) for n, x in out.items()}


def score(r: np.ndarray) -> tuple[int, float]:
    """Most cells within 10% of the best reference first, then the least mean log-ratio."""
    return -int((r <= 1.1).sum()), float(np.log(r).mean())


def report(rows: dict[str, dict[str, float]]) -> None:
    every = cells(rows, names())
    nb = len(BANDS)
    print(f"\nrecord level, {len(rows)} public sets × ε {', '.join(f'{e:g}' for e in EPSILONS)} × {nb} bands: "
          f"÷ the best of {', '.join(REFERENCES)} (within 10%, max)")
    for n in sorted(names(), key=lambda n: score(every[n])):
        r = every[n]
        per = " | ".join(f"{int((r[w::nb] <= 1.1).sum()):>2}/{r[w::nb].size} ×{r[w::nb].max():.2f}" for w in range(nb))
        print(f"  {n:<38} {int((r <= 1.1).sum()):>2}/{r.size}, geo-mean ×{np.exp(np.log(r).mean()):.3f} | {per}")
    print("  (bands: " + ", ".join(f"{a:g}-{b:g} m" for a, b in BANDS.values()) + ")")
    held, picks = [], []
    for left in rows:
        rest = cells({d: v for d, v in rows.items() if d != left}, names())
        pick = min(names(), key=lambda n: score(rest[n]))
        picks.append(pick)
        held.append(cells({left: rows[left]}, [pick])[pick])
    h = np.concatenate(held)
    now = [ag3_name(*g) for g in AG3 if ag3_params(*g) == AUTO_NOW]
    print(f"  auto with no band runs: {now[0] if now else AUTO_NOW}")
    print(f"  leave-one-dataset-out: within 10% in {int((h <= 1.1).sum())}/{h.size}, max ×{h.max():.2f}; picks "
          + ", ".join(f"{p} ×{picks.count(p)}" for p in sorted(set(picks), key=picks.count, reverse=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--held-out", action="store_true",
                    help="then run the held-out Gowalla NYC table once (bench_accuracy.py, auto's no-band default)")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = json.loads(ROWS.read_text()) if ROWS.exists() else {}
    for name, city, points in datasets():
        key = f"{name}/{args.queries}x{args.trials}"
        if key not in rows or any(f"|{n}" not in "".join(rows[key]) for n in names()):
            rows[key] = rows_for(points, city, args.queries, args.trials, rows.get(key, {}))
            ROWS.write_text(json.dumps(rows))
            print(f"{name} done", flush=True)
    report({k.rsplit("/", 1)[0]: v for k, v in rows.items() if k.endswith(f"/{args.queries}x{args.trials}")})
    if args.held_out:
        import bench_accuracy

        print("\nheld out: Gowalla NYC", flush=True)
        bench_accuracy.main(["auto", "ag", "ug", "hb", "privtree", "--datasets", "gowalla-nyc", "--units",
                             "record,user", "--epsilons", "0.2,1", "--queries", str(args.queries), "--trials",
                             str(args.trials), "--auto-band", f"{NO_BAND[0]:g}:{NO_BAND[1]:g}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
