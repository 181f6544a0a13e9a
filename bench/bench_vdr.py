"""VDR vs the noisy identity 3-D grid on real and synthetic data: range counts, hotspots, forecasts.

Prints a markdown table per dataset (and writes the JSON reports), e.g.

    nice -n 10 .venv/bin/python bench/bench_vdr.py --dataset sf-cabs --epsilon 0.1,0.2,0.5,1
    nice -n 10 .venv/bin/python bench/bench_vdr.py --dataset gowalla-nyc
    nice -n 10 .venv/bin/python bench/bench_vdr.py --dataset synthetic

Datasets (windows and slots are public configuration):
- sf-cabs: ../shared/data/sf_cabs.parquet, San Francisco 20 km box, 2008-05-18 .. 2008-06-08
  (3 weeks), daily slots, 256² cells (the issue's default configuration);
- gowalla-nyc: ../shared/data/gowalla_nyc_checkins.tsv.gz, New York 20 km box, 2010-06-01 ..
  2010-08-30 (13 weeks), weekly slots, k = 20 (35 k check-ins of 2.6 k users: daily slots would
  leave ~400 points per slot);
- synthetic: dpcore.data.synthetic check-ins (skewed hotspots, power-law users, weekly rhythm), 3 weeks.
Held-out tuning sets (bench/tune_vdr.py picks VDR's post-processing defaults on these, never on the sets above):
- synthetic-large: the same generator with 300,000 users (3.5 M points), SF-cabs-like counts per
  cell at record level;
- gowalla-austin, gowalla-sf: ../shared/data/gowalla_sample_1000users.parquet in the Austin / San
  Francisco boxes, 2010-05-31 .. 2010-08-30, weekly slots, k = 20.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from dpcore.data.points import load_points, validate_frame
from dpcore.evaluation.spatiotemporal import STEvalConfig, evaluate_st
from dpcore.geo import city_region, parse_slot
from dpcore.mechanisms import Mechanism, MechanismTags, SpatioTemporalInput, register
from dpcore.mechanisms.identity3d import IdentityGrid3D
from dpcore.mechanisms.st_resolution import DEFAULT_QUERY_SIDES_M
from dpcore.synopsis.spatiotemporal import SpatioTemporalSynopsis


class UniformST(Mechanism):
    """Bench-only reference: the public total N spread evenly over cells and slots.

    It reads no private data; the ε is charged only because every mechanism must record a charge.
    Any mechanism that does not beat it has learned nothing from the data.
    """

    name = "uniform3d"
    tags = MechanismTags(input_type=SpatioTemporalInput, scales_to_public_total=True)

    def __init__(self, *, grid_size: int = 256):
        self.grid_size = grid_size

    def _fit(self, data, acct, noise):
        acct.spend_rest("none (data-independent)", data.sensitivity, note="reads nothing private")
        m, t = self.grid_size, int(data.n_slots)
        total = float(data.public_total if data.public_total is not None else 0.0)
        acct.describe(["uniform reference"])
        return SpatioTemporalSynopsis(np.full((m, m, t), total / (m * m * t)), data.region, None,
                                      slot_seconds=data.slot_seconds, window_start_s=data.window_start_s)


class IdentityRule(IdentityGrid3D):
    """Bench-only name for identity3d at the resolution rule's grid and slots (resolution="rule"), so a
    run can hold it beside identity3d at the fixed grid."""

    name = "identity3d-rule"

    def __init__(self, *, grid_size: int = 256, slot_signal: float | None = None,
                 rule_query_sides_m: tuple[float, float] = DEFAULT_QUERY_SIDES_M):
        IdentityGrid3D.__init__(self, grid_size=grid_size, resolution="rule", slot_signal=slot_signal,
                                rule_query_sides_m=rule_query_sides_m)

    def get_params(self) -> dict:
        return {"grid_size": self.grid_size, "slot_signal": self.slot_signal,
                "rule_query_sides_m": list(self.rule_query_sides_m)}


register(UniformST)
register(IdentityRule)

#: Cells per side of the hindsight grids: identity3d at each fixed size, the best per metric picked with the
#: truth (NOT a DP mechanism: a yardstick for what a well-sized plain grid achieves).
HINDSIGHT_CELLS = (8, 16, 32, 64, 128, 256)


def _fixed_identity(m: int) -> type:
    class Fixed(IdentityGrid3D):
        name = f"identity3d-{m}"

        def __init__(self, *, grid_size: int = m):
            IdentityGrid3D.__init__(self, grid_size=grid_size)

        def get_params(self) -> dict:
            return {"grid_size": self.grid_size}

    return Fixed


for _m in HINDSIGHT_CELLS:
    register(_fixed_identity(_m))

SHARED = Path(os.environ.get("GEODP_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))

PRESETS = {
    "sf-cabs": {"file": "sf_cabs.parquet", "city": "san-francisco", "window": ("2008-05-18", "2008-06-08"), "k": 200},
    "gowalla-nyc": {"file": "gowalla_nyc_checkins.tsv.gz", "city": "new-york",
                    "window": ("2010-05-31", "2010-08-30"), "k": 20, "slot": "1w"},
    "synthetic": {"file": None, "city": "new-york", "window": ("2024-01-01", "2024-01-22"), "k": 50},
    # held-out tuning data (never the evaluation sets above): the 1,000-user Gowalla sample's cities
    # and a large synthetic set whose record-level grid has SF-cabs-like signal per cell
    "gowalla-austin": {"file": "gowalla_sample_1000users.parquet", "city": "austin",
                       "window": ("2010-05-31", "2010-08-30"), "k": 20, "slot": "1w"},
    "gowalla-sf": {"file": "gowalla_sample_1000users.parquet", "city": "san-francisco",
                   "window": ("2010-05-31", "2010-08-30"), "k": 20, "slot": "1w"},
    "synthetic-large": {"file": None, "city": "new-york", "window": ("2024-01-01", "2024-01-22"), "k": 50,
                        "users": 300_000},
}


def load_preset_points(preset: dict):
    """The preset's points (all of them; the caller cuts the window)."""
    if preset["file"] is None:
        from dpcore.data.synthetic import generate_checkins

        frame = generate_checkins(city_region(preset["city"]), n_users=preset.get("users", 5000),
                                  start=preset["window"][0], days=21, seed=11)
        return validate_frame(frame, source="synthetic")[0]
    return load_points(SHARED / preset["file"]).points


def _ts(text: str) -> int:
    return int(pd.Timestamp(text, tz="UTC").timestamp())


def rule_cells(points, region, start: int, end: int, preset: dict, args, sides: tuple[float, float]) -> int:
    """The resolution rule's cells per side for the run's one ε: n̂ = the bounded sample's size plus the
    discrete Laplace noise a release adds with 5% of ε (seeded), so every mechanism's hotspots are asked
    on the grid the rule picks."""
    from dpcore.data.points import clip_to_region
    from dpcore.geo import time_slots
    from dpcore.mechanisms.st_resolution import st_resolution
    from dpcore.privacy.bounding import bound_contributions
    from dpcore.privacy.noise import NoiseSource

    eps = [float(e) for e in args.epsilon.split(",")]
    if len(eps) != 1:
        raise SystemExit("--hotspot-grid rule needs one --epsilon")
    k = args.k or preset["k"]
    slot_s = parse_slot(preset.get("slot", "1d"))
    n_slots = -(-(end - start) // slot_s)
    idx, _, _ = clip_to_region(points, region)
    inside = time_slots(points.ts[idx], start, slot_s, n_slots) >= 0
    noise = NoiseSource.seeded(7)
    n = bound_contributions(points.user[idx][inside], k, noise.rng).keep.size
    n_hat = n + int(noise.discrete_laplace(k / (0.05 * eps[0]), 1)[0])
    res = st_resolution(n_hat, 0.95 * eps[0], k, n_slots, sides)
    print(f"resolution rule at ε={eps[0]:g}: {res.record()}", file=sys.stderr)
    return res.cells


def refused_epsilons(points, region, start: int, end: int, preset: dict, args, vdr_params: dict,
                     mechanisms: list[str]) -> list[float]:
    """The run's ε values whose slots the rule-sized mechanisms carry: for each other ε, print the one-line
    refusal a release gives (the check reads the evaluation's public total N, as evaluate_st passes it)."""
    from dpcore.data.points import clip_to_region
    from dpcore.geo import time_slots
    from dpcore.mechanisms.st_resolution import SLOT_SIGNAL, slot_refusal

    eps = [float(e) for e in args.epsilon.split(",")]
    if args.privacy_unit != "user" or not {"vdr", "identity3d-rule"} & set(mechanisms) or "grid_size" in vdr_params:
        return eps
    slot_s = parse_slot(preset.get("slot", "1d"))
    n_slots = -(-(end - start) // slot_s)
    idx, _, _ = clip_to_region(points, region)
    total = int((time_slots(points.ts[idx], start, slot_s, n_slots) >= 0).sum())
    keep = []
    for e in eps:
        why = slot_refusal(total, 0.95 * e, args.k or preset["k"], n_slots, slot_s, "the public total",
                           float(vdr_params.get("slot_signal", SLOT_SIGNAL)))
        if why is None:
            keep.append(e)
        else:
            print(f"ε={e:g}: refused: {why}")
    return keep


#: True-count classes (all points, one slot, one hotspot-grid cell) of the --peaks table.
PEAK_CLASSES = ((0.0, 10.0), (10.0, 40.0), (40.0, np.inf))


def _row(report: dict, mechanism: str, eps: float) -> dict:
    return next(r for r in report["results"] if r["mechanism"] == mechanism and r["epsilon"] == eps)


def mean_report(reports: list[dict]) -> dict:
    """The first report with every result's metrics averaged over all reports (one per seed)."""
    if len(reports) == 1:
        return reports[0]
    out = json.loads(json.dumps(reports[0], default=float))
    out["seeds"] = len(reports)
    keys = ("mean_relative_error", "hotspot_regret", "hotspot_distance_error", "forecast_smape", "fit_seconds")
    for r in out["results"]:
        rows = [_row(rep, r["mechanism"], r["epsilon"]) for rep in reports]
        for key in keys:
            r[key] = float(np.mean([x[key] for x in rows]))
        for i, w in enumerate(r["range_workloads"]):
            w["mean_relative_error"] = float(np.mean([x["range_workloads"][i]["mean_relative_error"] for x in rows]))
    for name in ("reference_answer_zero",):
        for i, z in enumerate(out[name]):
            z["mean_relative_error"] = float(np.mean([rep[name][i]["mean_relative_error"] for rep in reports]))
    nothing = out["reference_report_nothing"]
    for key in ("hotspot_distance_error", "hotspot_regret"):
        nothing[key] = float(np.mean([rep["reference_report_nothing"][key] for rep in reports]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=sorted(PRESETS), default="sf-cabs")
    ap.add_argument("--epsilon", default="0.1,0.2,0.5,1")
    ap.add_argument("--mechanisms", default="identity3d,vdr",
                    help="also uniform3d: a data-independent reference (public N spread evenly), and "
                         "identity3d-rule: identity3d at the resolution rule's grid and slots")
    ap.add_argument("--privacy-unit", choices=["user", "record"], default="user")
    ap.add_argument("--k", type=int, default=None, help="max points per user (default: the preset's)")
    ap.add_argument("--grid", type=int, default=None,
                    help="cells per side of identity3d, uniform3d and the hotspot grid (default 256); given, "
                         "also vdr's grid_size (a fixed grid); not given, vdr keeps its default resolution")
    ap.add_argument("--hotspot-grid", default=None,
                    help="cells per side of the hotspot queries' grid (default --grid), or 'rule': the resolution "
                         "rule's cells for one ε, from a noisy n̂ drawn as a release draws it")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1,
                    help="repeat the whole protocol (new query locations, forecast boxes and noise) with seeds "
                         "0..S-1; tables give the mean over seeds and, for vdr against identity3d-rule, the "
                         "paired difference ± its standard error")
    ap.add_argument("--hotspot-queries", type=int, default=300, help="hotspot queries per threshold")
    ap.add_argument("--peaks", action="store_true",
                    help="also print, per mechanism, released ÷ true mass on the hotspot grid's cells by their true "
                         "count per slot (under 10, 10–40, 40 and more): how much of the dense cells' mass a release keeps")
    ap.add_argument("--forecast-queries", type=int, default=20, help="forecast series (1–5 km boxes)")
    ap.add_argument("--vdr-param", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--workload", default="data",
                    help="query locations: data (default: drawn points of the window, hotspots in their own "
                         "slot), uniform, or public:PATH")
    ap.add_argument("--window", default=None, help="START,END dates (default: the preset's)")
    ap.add_argument("--slot", default=None, help="slot width, e.g. 1d, 5d, 1w (default: the preset's)")
    ap.add_argument("--hindsight", nargs="?", const=",".join(map(str, HINDSIGHT_CELLS)), default=None,
                    metavar="CELLS", help=f"add the hindsight grid: identity3d at each of CELLS cells per side "
                                          f"(default {HINDSIGHT_CELLS}), the best per metric")
    ap.add_argument("--json", default=None, help="write the report here (default bench/results/vdr_<dataset>.json)")
    args = ap.parse_args()

    preset = dict(PRESETS[args.dataset])
    if args.window:
        preset["window"] = tuple(args.window.split(","))
    if args.slot:
        preset["slot"] = args.slot
    region = city_region(preset["city"])
    start, end = (_ts(t) for t in preset["window"])
    t0 = time.perf_counter()
    if preset["file"] is not None and not (SHARED / preset["file"]).exists():
        print(f"{SHARED / preset['file']} is missing; this benchmark needs ../shared/data", file=sys.stderr)
        return 2
    points = load_preset_points(preset).between(start, end)
    print(f"loaded {len(points):,} points in the window ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)

    vdr_params: dict = {} if args.grid is None else {"grid_size": args.grid}
    args.grid = args.grid or 256
    for item in args.vdr_param:
        key, value = item.split("=", 1)
        try:
            vdr_params[key] = json.loads(value)
        except json.JSONDecodeError:
            vdr_params[key] = value
    hot_grid = args.grid if args.hotspot_grid is None else args.hotspot_grid
    if hot_grid == "rule":
        hot_grid = rule_cells(points, region, start, end, preset, args,
                              tuple(vdr_params.get("rule_query_sides_m", DEFAULT_QUERY_SIDES_M)))
    hot_grid = int(hot_grid)
    mechanisms = args.mechanisms.split(",") + ([f"identity3d-{m}" for m in args.hindsight.split(",")] if args.hindsight else [])
    epsilons = refused_epsilons(points, region, start, end, preset, args, vdr_params, mechanisms)
    if not epsilons:
        return 0
    config = STEvalConfig(
        mechanisms=mechanisms, epsilons=epsilons,
        window_start_s=start, window_end_s=end, slot_seconds=parse_slot(preset.get("slot", "1d")),
        privacy_unit=args.privacy_unit, max_points_per_user=args.k or preset["k"], n_queries=args.queries, hotspot_grid=hot_grid,
        trials=args.trials, hotspot_queries=args.hotspot_queries, forecast_queries=args.forecast_queries,
        mechanism_params={"identity3d": {"grid_size": args.grid}, "vdr": vdr_params,
                                              "uniform3d": {"grid_size": args.grid},
                                              "identity3d-rule": {"grid_size": args.grid,
                                                                  "slot_signal": vdr_params.get("slot_signal"),
                                                                  **({"rule_query_sides_m": vdr_params["rule_query_sides_m"]}
                                                                     if "rule_query_sides_m" in vdr_params else {})}},
        workload=args.workload)

    def progress(done: int, total: int, what: str) -> None:
        print(f"[bench] {done}/{total} {what} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)

    def train_progress(done: int, total: int, what: str) -> None:
        if done % 100 == 0:
            print(f"  [vdr] {done}/{total} {what}", file=sys.stderr, flush=True)

    peaks: dict = {}

    def on_fit(d) -> None:
        for lo, hi in PEAK_CLASSES:
            sel = (d.true_grid >= lo) & (d.true_grid < hi)
            acc = peaks.setdefault((d.mechanism, d.epsilon, lo), [0.0, 0.0])
            acc[0] += float(d.released_grid[sel].sum())
            acc[1] += float(d.true_grid[sel].sum())

    reports = [evaluate_st(points, region, replace(config, seed=seed), progress, train_progress,
                           on_fit if args.peaks else None) for seed in range(args.seeds)]
    report = mean_report(reports)
    suffix = "" if args.privacy_unit == "user" else "_record"
    out = Path(args.json or Path(__file__).parent / "results" / f"vdr_{args.dataset}{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=float))

    w = report["window"]
    print(f"\n### {args.dataset}: {report['n_points']:,} points, {report['n_users']:,} users, "
          f"{w['n_slots']} slots of {preset.get('slot', '1d')}, {args.grid}² cells, hotspot grid {hot_grid}², "
          f"{'k = ' + str(config.max_points_per_user) if args.privacy_unit == 'user' else 'record-level'}, ψ = {report['psi']:g}, "
          f"query locations: {report['workload']['centres']}\n")
    hind = [r for r in report["results"] if r["mechanism"].startswith("identity3d-") and r["mechanism"][11:].isdigit()]
    print("| mechanism | ε | range rel. err (mean) | 100–1000 m | 1–5 km | hotspot dist (m) | regret | "
          "forecast sMAPE | fit s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["results"]:
        if r in hind:
            continue
        per = [f"{x['mean_relative_error']:.3f}" for x in r["range_workloads"]]
        print(f"| {r['mechanism']} | {r['epsilon']:g} | {r['mean_relative_error']:.3f} | {' | '.join(per)} | "
              f"{r['hotspot_distance_error']:.0f} | {r['hotspot_regret']:.2f} | {r['forecast_smape']:.3f} | "
              f"{r['fit_seconds']:.1f} |")
    for e in config.epsilons if hind else []:
        rows = [r for r in hind if r["epsilon"] == e]
        best = {key: min(rows, key=lambda r, key=key: r[key]) for key in
                ("mean_relative_error", "hotspot_regret", "forecast_smape")}
        ranges = [min(r["range_workloads"][i]["mean_relative_error"] for r in rows)
                  for i in range(len(rows[0]["range_workloads"]))]
        print(f"| *hindsight grid (best m per column: range {best['mean_relative_error']['mechanism'][11:]}, "
              f"regret {best['hotspot_regret']['mechanism'][11:]}, sMAPE "
              f"{best['forecast_smape']['mechanism'][11:]})* | {e:g} | "
              f"{best['mean_relative_error']['mean_relative_error']:.3f} | {' | '.join(f'{v:.3f}' for v in ranges)} | "
              f"- | {best['hotspot_regret']['hotspot_regret']:.2f} | {best['forecast_smape']['forecast_smape']:.3f} | - |")
    zero, nothing = report["reference_answer_zero"], report["reference_report_nothing"]
    print(f"| *no data: answer 0, report no hotspot* | - | {np.mean([z['mean_relative_error'] for z in zero]):.3f} | "
          + " | ".join(f"{z['mean_relative_error']:.3f}" for z in zero)
          + f" | {nothing['hotspot_distance_error']:.0f} | {nothing['hotspot_regret']:.2f} | - | - |")
    by = {(r["mechanism"], r["epsilon"]): r for r in report["results"]}
    if "identity3d" in config.mechanisms and "vdr" in config.mechanisms:
        print("\n| ε | rel. err improvement | regret vdr/identity | sMAPE vdr/identity |")
        print("|---|---|---|---|")
        for e in config.epsilons:
            a, b = by[("identity3d", e)], by[("vdr", e)]
            imp = 1 - b["mean_relative_error"] / a["mean_relative_error"]
            print(f"| {e:g} | {imp:+.0%} | {b['hotspot_regret']:.2f} / {a['hotspot_regret']:.2f} | "
                  f"{b['forecast_smape']:.3f} / {a['forecast_smape']:.3f} |")
    if peaks:
        print("\nreleased ÷ true mass on the hotspot grid's cells, by the cell's true count in its slot\n")
        print("| mechanism | ε | " + " | ".join(f"true {lo:g}–{hi:g}" if np.isfinite(hi) else f"true ≥ {lo:g}"
                                                 for lo, hi in PEAK_CLASSES) + " |")
        print("|---|---|" + "---|" * len(PEAK_CLASSES))
        for mech in args.mechanisms.split(","):
            for e in config.epsilons:
                vals = [peaks[(mech, e, lo)] for lo, _ in PEAK_CLASSES]
                print(f"| {mech} | {e:g} | " + " | ".join(f"{a / b:.2f}" if b > 0 else "-" for a, b in vals) + " |")
    if args.seeds > 1 and {"vdr", "identity3d-rule"} <= set(config.mechanisms):
        print(f"\nvdr − identity3d-rule, paired by seed (mean ± standard error over {args.seeds} seeds of "
              f"{args.trials} trial(s)); negative: vdr better\n")
        print("| ε | range (mean) | hotspot regret | forecast sMAPE |")
        print("|---|---|---|---|")
        for e in config.epsilons:
            cells = []
            for key in ("mean_relative_error", "hotspot_regret", "forecast_smape"):
                d = np.array([_row(r, "vdr", e)[key] - _row(r, "identity3d-rule", e)[key] for r in reports])
                cells.append(f"{d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(d.size):.3f}")
            print(f"| {e:g} | {' | '.join(cells)} |")
    print(f"\nwrote {out}; total {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
