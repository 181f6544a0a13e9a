"""Which mechanism wins where people are, on PUBLIC data only: the evidence for auto's choice.

Runs the evaluation protocol (dpcore.evaluation.range, data-centred squares) on public training sets
(the Gowalla 1,000-user sample's larger cities and synthetic cities, as bench/fit_grid_rule.py; never
the held-out Gowalla NYC or SF cabs) for ug with the data-centred size rule, ag, privtree and auto, at
record level (ε 0.05, 0.2) and user level (k = 10, k-sample, ε 1), and prints per cell each mechanism's
ratio to the cell's best and to the hindsight grid, with the release's signal n·ε/k.

    nice -n 10 .venv/bin/python bench/public_choice.py          # reports cached in bench/out/
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

from dpcore.evaluation.range import EvalConfig, evaluate  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.grid.size_rule import BANDS  # noqa: E402
from dpcore.mechanisms.auto_rule import band_choice, band_params  # noqa: E402

SETS = ("gowalla-sample/austin", "gowalla-sample/san-francisco", "synthetic/miami-8000", "synthetic/houston-20000")
SETTINGS = (("record", [0.05, 0.2]), ("user", [1.0]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mechanisms", nargs="*", default=["ug", "ag", "privtree", "auto"])
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args(argv)
    cache = OUT / "public_choice.json"
    reports = json.loads(cache.read_text()) if cache.exists() else {}
    for name, city, points in datasets():
        if name not in SETS:
            continue
        for unit, eps in SETTINGS:
            key = f"{name}/{unit}/{','.join(args.mechanisms)}/{args.queries}x{args.trials}"
            if key in reports:
                continue
            config = EvalConfig(mechanisms=list(args.mechanisms), epsilons=eps, privacy_unit=unit,
                                max_points_per_user=args.k, query_sides_m=list(BANDS.values()),
                                n_queries=args.queries, trials=args.trials,
                                mechanism_params={"ug": {"size_rule": "data"}})
            chosen: list[dict] = []

            def on_fit(mech: str, eps: float, trial: int, syn, chosen=chosen) -> None:
                if mech == "auto":
                    p = syn.privacy.params
                    chosen.append({"epsilon": eps, "band": p["query_sides_m"], "mechanism": p["chosen"]["mechanism"],
                                   "grid_size": getattr(syn, "inner", syn).extra_meta().get("grid_size")})

            reports[key] = evaluate(points, city_region(city), config, on_fit=on_fit)
            reports[key]["auto_chose"] = chosen
            cache.write_text(json.dumps(reports))
            print(f"{key} done", flush=True)
    policy: dict[str, list[float]] = {}
    for key, rep in reports.items():
        print(f"\n{key}: n = {rep['n_points']:,}")
        cells: dict[tuple, dict[str, float]] = {}
        for r in rep["results"]:
            cells.setdefault((r["epsilon"], tuple(r["query_sides_m"])), {})[r["mechanism"]] = r
        for (eps, band), rows in cells.items():
            best = min(v["mean_relative_error"] for v in rows.values())
            text = "  ".join(f"{m} {v['mean_relative_error']:.3f} (b{v['mean_relative_error'] / best:.2f} "
                             f"g{v['ratio_to_hindsight_grid']:.2f})" for m, v in rows.items())
            hs = rows[next(iter(rows))]["hindsight_grid_size"]
            picks = sorted({f"{c['mechanism']}{'' if c['grid_size'] is None else ' m=' + str(c['grid_size'])}"
                            for c in rep.get("auto_chose", []) if c["epsilon"] == eps and tuple(c["band"]) == band})
            print(f"  ε={eps:g} {band[0]:g}-{band[1]:g}: {text}  [hindsight m={hs}; auto chose {', '.join(picks)}]")
            rule_pick = band_choice(band, tuple(rows))
            # where the band rule gives its pick parameters (AG's), the plain row is not the rule's release;
            # auto's row is (when it was run)
            rule_row = rows.get("auto") if rule_pick and band_params(band, rule_pick, 20_000.0) else rows.get(rule_pick)
            for name, v in [("band rule", rule_row), *rows.items()]:
                if v is not None:
                    policy.setdefault(name, []).append(v["mean_relative_error"] / best)
    print("\nratio to the best of the mechanisms run, over every cell above (mean, share within 5%):")
    for name, ratios in policy.items():
        r = np.array(ratios)
        print(f"  {name:<10} mean ×{r.mean():.3f}, within 5% of the best in {np.mean(r <= 1.05):.0%} of {r.size} cells")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
