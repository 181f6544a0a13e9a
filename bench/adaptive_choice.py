"""Adaptive grids against every uniform size where people are, on PUBLIC data only: the evidence for the
AG settings of auto's band rule (dpcore.mechanisms.auto_rule.BAND_RULE).

For every public training set of bench/fit_grid_rule.py (the Gowalla 1,000-user sample's cities except
New York, three synthetic cities; never the held-out Gowalla NYC or SF cabs), record level ε 0.05 and
0.2 and user level k = 10 (k-sample) ε 1, the script runs through the evaluation protocol's data-centred
workloads (500 squares per band, seed 0; 2 trials, the same noise seed per trial for every
configuration): the identity grid at every side 32…2048 (×√2; the best of them is the cell's
"hindsight" uniform grid, chosen with the truth), ug sized by the data-centred rule for each band, PrivTree,
AG with its ICDE defaults, and AG over the searched grid of (α, c, min_m1). Per band it prints each
configuration's geometric-mean ratio to the hindsight grid and a leave-one-dataset-out check of the
choice: the configuration with the least mean log-ratio on the other eight sets, scored on the ninth.

    nice -n 10 .venv/bin/python bench/adaptive_choice.py            # rows cached in bench/out/adaptive_rows.json
    nice -n 10 .venv/bin/python bench/adaptive_choice.py --refined  # 25-100 m: refined rule-sized grids
    nice -n 10 .venv/bin/python bench/adaptive_choice.py --weights  # the band rule's AG under weights
"""

from __future__ import annotations

import argparse
import itertools
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
from dpcore.grid.size_rule import BANDS  # noqa: E402
from dpcore.mechanisms.auto_rule import band_choice, band_params  # noqa: E402
from dpcore.privacy.noise import NoiseSource  # noqa: E402

ROWS = OUT / "adaptive_rows.json"
REFINED_ROWS = OUT / "adaptive_refined_rows.json"
WEIGHT_ROWS = OUT / "adaptive_weight_rows.json"
SETTINGS = (("record", 1, 0.05), ("record", 1, 0.2), ("user", 10, 1.0))
UNIFORM = tuple(int(round(32 * 2 ** (i / 2))) for i in range(13))  # 32 … 2048
#: The searched AG settings: a first pass over α, c and two level-1 floors, then a finer one around
#: its best (larger c, more floors).
AG_GRID = sorted(set(itertools.product((0.1, 0.2, 0.3), (2.0, 3.0, 5.0), (10, 32)))
                 | set(itertools.product((0.2, 0.3), (5.0, 8.0, 12.0), (10, 20, 32, 48))))
REFERENCES = ("ug-data", "privtree", "ag")
#: ``--refined``: a rule-sized grid refined where its noisy counts are high, i.e. AG whose level 1 is
#: fixed at the data-centred rule's 25–100 m size divided by ``div``: (α, c, div).
REFINED = ((0.8, 10.0, 1), (0.8, 40.0, 1), (0.6, 10.0, 1), (0.8, 10.0, 2), (0.6, 5.0, 2), (0.5, 5.0, 4))


def ag_name(alpha: float, c: float, m1: int) -> str:
    return f"ag a={alpha:g} c={c:g} min_m1={m1}"


def refined_name(alpha: float, c: float, div: int) -> str:
    return f"refined a={alpha:g} c={c:g} m1=rule/{div}"


def configs(refined: bool = False) -> list[tuple[str, str, dict, list[int] | None]]:
    """(name, mechanism, params, bands it answers: None for all)."""
    out: list[tuple[str, str, dict, list[int] | None]] = [(f"u{m}", "identity", {"grid_size": m}, None) for m in UNIFORM]
    out += [("ug-data", "ug", {"size_rule": "data", "query_sides_m": band}, [w])
            for w, band in enumerate(BANDS.values())]
    if refined:
        return out + [(refined_name(a, c, d), "ag", {"alpha": a, "c": c, "m1_div": d}, [0]) for a, c, d in REFINED]
    out += [("privtree", "privtree", {}, None), ("ag", "ag", {}, None)]
    out += [(ag_name(a, c, m), "ag", {"alpha": a, "c": c, "min_m1": m}, None) for a, c, m in AG_GRID]
    return out


def with_m1(params: dict, fit_input, eps: float) -> dict:
    """A refined grid's level 1: the data-centred rule's 25–100 m size for this release's signal (the
    ε a user-level grid gets after the scaling estimate), divided by ``m1_div``."""
    if "m1_div" not in params:
        return params
    from dpcore.grid.size_rule import data_grid_size
    from dpcore.privacy.scaling import DEFAULT_SCALE_FRACTION

    rest = dict(params)
    eps_grid = eps * (1 - DEFAULT_SCALE_FRACTION) if fit_input.privacy_unit == "user" else eps
    m = data_grid_size(fit_input.mass, eps_grid, fit_input.sensitivity, BANDS["25-100"], fit_input.privacy_unit)
    rest["m1"] = max(1, round(m / rest.pop("m1_div")))
    return rest


#: ``--weights``: the band rule's AG settings against AG's ICDE one and the rule-sized grid under weighted
#: bounding (user level), which the search above does not cover.
WEIGHT_SETTINGS = (("user", 10, 1.0), ("user", 10, 0.5))
WEIGHT_CONFIGS = (("ag", "ag", {}, None), (ag_name(0.3, 5.0, 10), "ag", {"alpha": 0.3, "c": 5.0, "min_m1": 10}, None),
                  (ag_name(0.2, 5.0, 32), "ag", {"alpha": 0.2, "c": 5.0, "min_m1": 32}, None))


def weighted_report(rows: dict[str, dict[str, float]]) -> None:
    pairs = (("1000-5000", ag_name(0.3, 5.0, 10), "ag"), ("100-1000", ag_name(0.2, 5.0, 32), "ug-data"))
    for band, mine, other in pairs:
        wins = [v[f"{u}|{e:g}|{band}|{mine}"] <= v[f"{u}|{e:g}|{band}|{other}"]
                for v in rows.values() for u, _, e in WEIGHT_SETTINGS]
        print(f"weighted bounding, {band} m: {mine} at or below {other} in {sum(wins)} of {len(wins)} cells")


def rows_for(points, city: str, queries: int, trials: int, refined: bool = False,
             weights: bool = False) -> dict[str, float]:
    data = region_data(points, city_region(city))
    psi = psi_for(data.n_points)
    bands = list(BANDS.values())
    workloads = protocol_workloads(data, bands, queries, 0)
    out: dict[str, float] = {}
    todo = configs(refined)
    if weights:
        todo = [c for c in todo if c[0].startswith("u") or c[0] == "ug-data"] + list(WEIGHT_CONFIGS)
    for unit, k, eps in WEIGHT_SETTINGS if weights else SETTINGS:
        errs: dict[tuple[str, int], list[float]] = {}
        for trial in range(trials):
            for name, mech, params, answers in todo:
                noise = NoiseSource.seeded(1000 * trial + 7)
                fit_input = make_fit_input(data, unit, k, noise.rng, "weight" if weights else "sample")
                syn = fit_and_scale(mech, with_m1(params, fit_input, eps), fit_input, eps, noise, data.n_points)
                for w in answers if answers is not None else range(len(bands)):
                    _, boxes, truth = workloads[w]
                    errs.setdefault((name, w), []).append(float(relative_error(syn.answer(boxes), truth, psi).mean()))
        for (name, w), e in errs.items():
            out[f"{unit}|{eps:g}|{'-'.join(f'{v:g}' for v in bands[w])}|{name}"] = float(np.mean(e))
    return out


def cells(rows: dict[str, dict[str, float]], band: str) -> dict[tuple[str, str], dict[str, float]]:
    """(dataset, setting) → {configuration: error / hindsight error} for one band."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for dataset, r in rows.items():
        for key, err in r.items():
            unit, eps, b, name = key.split("|")
            if b == band:
                out.setdefault((dataset, f"{unit} ε={eps}"), {})[name] = err
    for errs in out.values():
        hind = min(errs[f"u{m}"] for m in UNIFORM)
        for name in list(errs):
            errs[name] /= hind
    return out


def report(rows: dict[str, dict[str, float]], refined: bool = False) -> None:
    ag_names = [refined_name(*r) for r in REFINED] if refined else [ag_name(a, c, m) for a, c, m in AG_GRID]
    refs = ("ug-data",) if refined else REFERENCES
    for band_name, band in BANDS.items():
        if refined and band_name != "25-100":
            continue
        by_cell = cells(rows, band_name)
        log = {name: {cell: float(np.log(v[name])) for cell, v in by_cell.items()} for name in (*refs, *ag_names)}
        print(f"\n{band_name} m (ratios to the hindsight uniform grid over sizes {UNIFORM[0]}…{UNIFORM[-1]}):")
        ranked = sorted(ag_names, key=lambda n: np.mean(list(log[n].values())))
        for name in [*refs, *ranked[:5]]:
            r = np.exp(np.array(list(log[name].values())))
            print(f"  {name:<28} geo-mean ×{np.exp(np.log(r).mean()):.3f}  max ×{r.max():.2f}  ≤ ×0.8 in {np.mean(r <= 0.8):.0%}")
        lodo = []
        for held in sorted(rows):
            pick = min(ag_names, key=lambda n: np.mean([v for (d, _), v in log[n].items() if d != held]))
            held_cells = [v for (d, _), v in log[pick].items() if d == held]
            lodo += held_cells
            print(f"  leave out {held:<30} pick {pick:<28} held-out ×"
                  + " ×".join(f"{np.exp(v):.2f}" for v in held_cells))
        print(f"  leave-one-dataset-out: geo-mean ×{np.exp(np.mean(lodo)):.3f}, max ×{np.exp(np.max(lodo)):.2f}")
        if refined:
            continue
        pick = band_choice(band, ("ug", "ag", "privtree"))
        params = band_params(band, pick, 20_000.0)
        if pick == "ag":
            name = ag_name(params.get("alpha", 0.5), params.get("c", 10.0), params.get("min_m1", 10))
            if name in log:
                r = np.exp(np.array(list(log[name].values())))
                print(f"  auto's band rule: {name}: geo-mean ×{np.exp(np.log(r).mean()):.3f}, max ×{r.max():.2f}")
        else:
            print(f"  auto's band rule: {pick} sized by the data-centred rule")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--refined", action="store_true",
                    help="25-100 m: the rule-sized grid refined where its noisy counts are high (REFINED)")
    ap.add_argument("--weights", action="store_true", help="the band rule's AG settings under weighted bounding")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    path = REFINED_ROWS if args.refined else WEIGHT_ROWS if args.weights else ROWS
    rows = json.loads(path.read_text()) if path.exists() else {}
    for name, city, points in datasets():
        key = f"{name}/{args.queries}x{args.trials}"
        if key not in rows:
            rows[key] = rows_for(points, city, args.queries, args.trials, args.refined, args.weights)
            path.write_text(json.dumps(rows))
            print(f"{name} done", flush=True)
    mine = {k.rsplit("/", 1)[0]: v for k, v in rows.items() if k.endswith(f"/{args.queries}x{args.trials}")}
    if args.weights:
        weighted_report(mine)
    else:
        report(mine, args.refined)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
