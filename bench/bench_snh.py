"""SNH and ParamSelect benchmark: training time, query throughput, accuracy against the baselines.

    nice -n 10 .venv/bin/python bench/bench_snh.py speed            # 20 × 20 km training time, queries/s
    nice -n 10 .venv/bin/python bench/bench_snh.py accuracy --epsilons 0.05,0.1,0.2 --privacy-unit record
    nice -n 10 .venv/bin/python bench/bench_snh.py rho              # ParamSelect ρ vs the best searched ρ
    nice -n 10 .venv/bin/python bench/bench_snh.py floors           # no-privacy reference errors
    nice -n 10 .venv/bin/python bench/bench_snh.py bins             # error split by the squares' true counts
    nice -n 10 .venv/bin/python bench/bench_snh.py cabs             # the authors' CABS_SFS protocol via the CLI

Query centres are drawn from the evaluated data by default (--workload data; uniform and public:PATH
as in `geodp evaluate`). Data: Gowalla NYC from ../shared/data (falls back to the synthetic generator when it is absent, and
says so), or any point table with --data PATH (the region is still --city's). Prints numbers; nothing
here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcore.data.points import Points, clip_to_region, load_points
from dpcore.geo import city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource

SHARED = Path(os.environ.get("GEODP_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def load_city(city: str, data: str | None = None) -> tuple[Points, str]:
    """``data`` (any point table geodp reads) when given; else Gowalla NYC for new-york, the Gowalla
    sample's points for its other cities (held out from every choice tuned on NYC), else the synthetic
    generator."""
    if data:
        return load_points(data).points, data
    path = SHARED / "gowalla_nyc_checkins.tsv.gz"
    if city == "new-york" and path.exists():
        return load_points(path).points, str(path)
    sample = SHARED / "gowalla_sample_1000users.parquet"
    if city != "new-york" and sample.exists():
        idx, _, _ = clip_to_region(pts := load_points(sample).points, city_region(city))
        if idx.size >= 1000:
            return pts, f"{sample} ({idx.size:,} points in {city})"
    from dpcore.data.points import validate_frame
    from dpcore.data.synthetic import generate_checkins

    df = generate_checkins(city_region(city), n_users=6000, seed=0)
    return validate_frame(df)[0], "synthetic (dpcore.data.synthetic, seed 0)"


def cmd_speed(args: argparse.Namespace) -> None:
    import torch

    pts, source = load_city(args.city, args.data)
    region = city_region(args.city)
    idx, x, y = clip_to_region(pts, region)
    print(f"data {source}: {x.size:,} points in {region.name} {region.side_km:g} km; torch threads "
          f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} (shared machine)")
    for rho in args.rhos:
        params = {} if rho == 0 else {"cell_width_m": rho}
        mech = get_mechanism("snh", **params)
        t0 = time.perf_counter()
        syn = mech.fit(FitInput(x, y, region, "record", None), args.epsilon, NoiseSource.seeded(0))
        fit_s = time.perf_counter() - t0
        tr = syn.config["training"]
        print(f"snh ρ={'ParamSelect' if rho == 0 else rho}: grid {syn.config['grid_size']}², "
              f"{sum(tr['samples_per_size']):,} training squares, {tr['epochs']} epochs "
              f"(early stop {tr['stopped_early']}), train {tr['seconds']:.1f} s, fit total {fit_s:.1f} s, "
              f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")
        rng = np.random.default_rng(1)
        q = args.queries
        side = rng.uniform(25, 1000, q)
        c = rng.uniform(-region.half_m, region.half_m, (q, 2))
        boxes = np.stack([c[:, 0] - side / 2, c[:, 1] - side / 2, c[:, 0] + side / 2, c[:, 1] + side / 2], axis=1)
        syn.answer(boxes[:1000])
        t0 = time.perf_counter()
        syn.answer(boxes)
        dt = time.perf_counter() - t0
        print(f"  answering {q:,} queries (25-1000 m): {dt:.2f} s = {q / dt:,.0f} queries/s")


def _rows(report: dict) -> list[dict]:
    return report["results"]


def cmd_accuracy(args: argparse.Namespace) -> None:
    from dpcore.evaluation.range import EvalConfig, evaluate
    from dpcore.paramselect import select_params
    from dpcore.queries.range import parse_query_sides

    pts, source = load_city(args.city, args.data)
    region = city_region(args.city)
    sides = parse_query_sides(args.query_sides_m)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    k = args.max_points_per_user
    idx, _, _ = clip_to_region(pts, region)
    n_public = idx.size  # the evaluation protocol's public N (as in dpcore.evaluation.range)
    print(f"data {source}; {args.privacy_unit}-level; k={k if args.privacy_unit == 'user' else '-'}; "
          f"load average {os.getloadavg()[0]:.1f} (shared machine)")
    all_rows = []
    zero: dict[tuple[float, float], float] = {}  # answer-0 reference per band, from the reports
    grid: dict[tuple[float, tuple[float, float]], dict] = {}  # hindsight grid per (ε, band), not DP
    for eps in epsilons:
        mechs = [m for m in args.mechanisms.split(",") if m]
        params: dict[str, dict] = {}
        for a, b in sides:
            # identity@ParamSelect: ρ from public inputs only (the release city is left out).
            choice = select_params(region=region, n=n_public, epsilon=eps,
                                   sensitivity=float(k) if args.privacy_unit == "user" else 1.0,
                                   privacy_unit=args.privacy_unit, max_points_per_user=k, band=(a, b))
            params[f"identity@{a:g}-{b:g}"] = {"cell_width_m": choice.cell_width_m}
        # Every mechanism sees the same workloads (all bands drawn in one EvalConfig); band-specific
        # ones (identity@ParamSelect, auto) run once per band and keep their band's rows, the others
        # (ug, ag, privtree, snh: snh trains on (25, 1000) m for both) run once per ε.
        runs: list[tuple[list[str], dict, tuple[float, float] | None]] = []
        shared = [m for m in mechs if m not in ("identity", "auto")]
        if shared:
            lo, hi = min(a for a, _ in sides), max(b for _, b in sides)
            runs.append((shared, {"snh": {"query_sides_m": (min(lo, 25.0), max(hi, 1000.0)), **args.snh_params}},
                         None))
        for (a, b) in sides:
            own = [m for m in mechs if m in ("identity", "auto")]
            if own:
                runs.append((own, {"identity": params[f"identity@{a:g}-{b:g}"], "auto": {"query_sides_m": (a, b)}},
                             (a, b)))
        for run_mechs, cfg_params, band in runs:
            cfg = EvalConfig(mechanisms=run_mechs, epsilons=[eps], privacy_unit=args.privacy_unit,
                             max_points_per_user=k, query_sides_m=list(sides), n_queries=args.queries,
                             trials=args.trials, seed=0, mechanism_params=cfg_params,
                             workload=args.workload)
            rep = evaluate(pts, region, cfg)
            zero.update({(float(r["query_sides_m"][0]), float(r["query_sides_m"][1])): r["mean_relative_error"]
                         for r in rep["reference_answer_zero"]})
            grid.update({(r["epsilon"], (float(r["query_sides_m"][0]), float(r["query_sides_m"][1]))): r
                         for r in rep["reference_hindsight_grid"]})
            for r in _rows(rep):
                a, b = r["query_sides_m"]
                if band is not None and (a, b) != band:
                    continue
                all_rows.append(r)
                print(f"ε={eps:<5g} {a:g}-{b:g} m  {r['mechanism']:<9} {r['mean_relative_error']:.4f}  "
                      f"fit {r['fit_seconds']:.1f}s  params {r.get('params')}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=2, default=str))
    # Summary: snh / auto vs the best of the others per (ε, band).
    print("\nsummary (mean relative error; ratio = mechanism / best of the others):")
    keys = sorted({(r["epsilon"], tuple(r["query_sides_m"])) for r in all_rows})
    for key in keys:
        rows = {r["mechanism"]: r["mean_relative_error"] for r in all_rows
                if (r["epsilon"], tuple(r["query_sides_m"])) == key}
        base = {m: v for m, v in rows.items() if m not in ("snh", "auto")}
        if not base:
            continue
        best_m = min(base, key=base.get)
        line = f"ε={key[0]:<5g} {key[1][0]:g}-{key[1][1]:g} m: best baseline {best_m} {base[best_m]:.4f}"
        for m in ("snh", "auto"):
            if m in rows:
                line += f"; {m} {rows[m]:.4f} (×{rows[m] / base[best_m]:.2f})"
        if "auto" in rows and "snh" in rows:
            # auto is compared with the best of all the others, snh included.
            others = {m: v for m, v in rows.items() if m != "auto"}
            best_o = min(others, key=others.get)
            line += f"; auto / best of all others ({best_o}) ×{rows['auto'] / others[best_o]:.2f}"
        g = grid.get((key[0], tuple(map(float, key[1]))))
        if g is not None:
            line += (f"; hindsight grid {g['mean_relative_error']:.4f} (m={g['grid_size']}, not DP)"
                     + "".join(f", {m} ×{rows[m] / g['mean_relative_error']:.2f}" for m in ("snh", "auto") if m in rows))
        print(line + f"; answer-0 reference {zero[tuple(map(float, key[1]))]:.4f}")


def cmd_floors(args: argparse.Namespace) -> None:
    """Reference errors that use the TRUE data (no privacy), on the protocol's workloads: how far a
    release could get at best. Answer 0; the exact counts of a G × G grid under the uniformity
    assumption (the resolution floor); the exact counts of only the cells holding ≥ T points, zero
    elsewhere (an oracle of spike detection: a DP release must find those cells under noise of scale
    sensitivity/ε per cell, so at ε = 0.1 it cannot tell cells below T ≈ 30–50 from empty ones)."""
    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.evaluation.range import protocol_workloads, region_data
    from dpcore.grid.histogram import answer_boxes, grid_counts, prefix_sums
    from dpcore.queries.range import parse_query_sides

    pts, source = load_city(args.city, args.data)
    region = city_region(args.city)
    data = region_data(pts, region)
    psi = psi_for(data.n_points)
    sides = parse_query_sides(args.query_sides_m)
    work = [(boxes, truth) for _, boxes, truth in protocol_workloads(data, sides, args.queries, seed=0,
                                                                        workload=args.workload)]
    print(f"data {source}; {data.n_points:,} points; ψ = {psi:g}; columns: " +
          ", ".join(f"{a:g}-{b:g} m" for a, b in sides))

    def row(label: str, est: np.ndarray | None) -> None:
        errs = []
        for boxes, truth in work:
            ans = np.zeros_like(truth, dtype=np.float64) if est is None else \
                answer_boxes(prefix_sums(est), region.bounds_m, boxes)
            errs.append(relative_error(ans, truth, psi).mean())
        print(f"{label:<38}" + "  ".join(f"{e:.4f}" for e in errs))

    row("answer 0", None)
    for g in (64, 128, 256, 512, 1024):
        counts = grid_counts(data.x, data.y, region.bounds_m, g, g).astype(np.float64)
        row(f"exact {g}x{g} grid ({region.side_m / g:.0f} m)", counts)
        for t in (10, 30, 50):
            row(f"  only cells with >= {t} points", np.where(counts >= t, counts, 0.0))


#: Upper edges of the true-count bins `bins` splits a workload by, in units of ψ (0.1% of n), after the
#: empty squares: (0, 0.2ψ], (0.2ψ, ψ], (ψ, 4ψ], (4ψ, 16ψ], (16ψ, ∞).
COUNT_BIN_EDGES_PSI = (0.2, 1.0, 4.0, 16.0)


def cmd_bins(args: argparse.Namespace) -> None:
    """Where each mechanism's mean relative error comes from: the workload's squares split by their TRUE
    count (no privacy: a diagnostic), with each bin's share of the mean (its errors summed ÷ all squares)
    and its own mean. Variants of snh are given as JSON parameter sets with --snh-variants."""
    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.evaluation.range import fit_and_scale, make_fit_input, protocol_workloads, region_data
    from dpcore.queries.range import parse_query_sides

    pts, source = load_city(args.city, args.data)
    region = city_region(args.city)
    data = region_data(pts, region)
    psi = psi_for(data.n_points)
    (a, b), = parse_query_sides(args.query_sides_m)
    (_, boxes, truth), = protocol_workloads(data, [(a, b)], args.queries, seed=0, workload=args.workload)
    runs = [(m, {}) for m in args.mechanisms.split(",") if m] + [("snh", v) for v in args.snh_variants]
    edges = [0.0] + [e * psi for e in COUNT_BIN_EDGES_PSI] + [np.inf]
    bins = [(truth == 0, "0")] + [((truth > lo) & (truth <= hi), f"{lo:.0f}-{hi:.0f}")
                                  for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    print(f"data {source}; {args.privacy_unit}-level; {a:g}-{b:g} m, {truth.size:,} squares; ψ = {psi:g}; "
          f"{args.trials} trials; share of the mean error per true-count bin (bin mean in brackets)")
    for eps in [float(e) for e in args.epsilons.split(",")]:
        errors = {}
        for mech, params in runs:
            per_trial = []
            for trial in range(args.trials):
                rng = np.random.default_rng([trial, 7])
                fit_input = make_fit_input(data, args.privacy_unit, args.max_points_per_user, rng)
                syn = fit_and_scale(mech, params, fit_input, eps, NoiseSource.seeded(trial), data.n_points)
                per_trial.append(relative_error(syn.answer(boxes), truth, psi))
            errors[mech + (json.dumps(params) if params else "")] = np.mean(per_trial, axis=0)
        print(f"\nε = {eps:g}\n{'true count':<12}{'squares':>8}  " + "  ".join(f"{k:>20}" for k in errors))
        for mask, label in bins:
            print(f"{label:<12}{int(mask.sum()):>8}  " + "  ".join(
                f"{e[mask].sum() / e.size:>10.4f} ({e[mask].mean() if mask.any() else 0.0:7.3f})"
                for e in errors.values()))
        print(f"{'all':<12}{truth.size:>8}  " + "  ".join(f"{e.mean():>10.4f}{'':10}" for e in errors.values()))


def cmd_rho(args: argparse.Namespace) -> None:
    from dpcore.evaluation.range import EvalConfig, evaluate
    from dpcore.paramselect import RHO_GRID_M, kept_fractions, select_params
    from dpcore.queries.range import parse_query_sides

    pts, source = load_city(args.city, args.data)
    region = city_region(args.city)
    idx, _, _ = clip_to_region(pts, region)
    sides = parse_query_sides(args.query_sides_m)
    k = args.max_points_per_user
    user_level = args.privacy_unit == "user"
    # What a release's identity@ParamSelect is given: at user level the size of the bounded sample (it
    # pays for a DP estimate of it; here the exact count), not the full count scaled by the public
    # profile's kept fraction, which is a check-in city's and can be far off on other data (2.4% of the
    # SF cab trip starts survive k = 20).
    n_noised = kept_fractions(pts.user[idx], (k,))[k] * idx.size if user_level else float(idx.size)
    print(f"data {source}; {args.privacy_unit}-level; n noised {n_noised:,.0f}; identity grid over ρ ∈ "
          f"{list(RHO_GRID_M)}")
    ratios: dict[str, list[float]] = {}
    for eps in [float(e) for e in args.epsilons.split(",")]:
        for a, b in sides:
            errs = {}
            for rho in RHO_GRID_M:
                cfg = EvalConfig(mechanisms=["identity"], epsilons=[eps], privacy_unit=args.privacy_unit,
                                 max_points_per_user=k, query_sides_m=[(a, b)], n_queries=args.queries,
                                 trials=args.trials, mechanism_params={"identity": {"cell_width_m": rho}},
                                 workload=args.workload, hindsight=False)
                errs[rho] = evaluate(pts, region, cfg)["results"][0]["mean_relative_error"]
            best_rho = min(errs, key=errs.get)
            for model in args.models:
                choice = select_params(region=region, n=n_noised, epsilon=eps, n_is_bounded=user_level,
                                       sensitivity=float(k) if user_level else 1.0,
                                       privacy_unit=args.privacy_unit, max_points_per_user=k, band=(a, b),
                                       model_path=model)
                err_ps = errs.get(choice.cell_width_m)
                if err_ps is None:
                    cfg = EvalConfig(mechanisms=["identity"], epsilons=[eps], privacy_unit=args.privacy_unit,
                                     max_points_per_user=k, query_sides_m=[(a, b)], n_queries=args.queries,
                                     trials=args.trials,
                                     mechanism_params={"identity": {"cell_width_m": choice.cell_width_m}},
                                     workload=args.workload, hindsight=False)
                    err_ps = evaluate(pts, region, cfg)["results"][0]["mean_relative_error"]
                ratio = err_ps / errs[best_rho]
                ratios.setdefault(model or "shipped", []).append(ratio)
                print(f"ε={eps:<5g} {a:g}-{b:g} m: best ρ {best_rho:g} m err {errs[best_rho]:.4f}; ParamSelect "
                      f"({model or 'shipped'}) ρ {choice.cell_width_m:.0f} m err {err_ps:.4f} (×{ratio:.3f}) "
                      f"[trained without {choice.excluded_groups}]", flush=True)
    for model, values in ratios.items():
        r = np.array(values)
        print(f"\nParamSelect ({model}) / best: mean ×{r.mean():.3f}, within 10% in {np.mean(r <= 1.10):.0%} of "
              f"{r.size} cases")


#: The SNH authors' CABS_SFS protocol (github szeighami/SNH, tests/test_sf_cabs/0/conf.json): record level,
#: squares of 0.2–0.8% of the region's side centred on data points, ψ = 0.1% of n; their smallest model's
#: squares are 0.2–0.275% of the side, where their README's sample output reaches 0.065 at ε 0.05.
CABS_FILE = "cabs_sfs_trip_starts.npy"
CABS_AUTHORS_ERROR = 0.065
CABS_BANDS_FRACTION = ((0.002, 0.00275), (0.002, 0.008))
#: What `cabs` runs through the CLI: (label, mechanism, --param list). The authors' ρ ≈ 0.0293 of the side
#: (ParamSelect's choice in their run.py) is 38 m on 13 km; `cell_width_m` makes it a public parameter.
CABS_RUNS = (
    ("snh (default: pyramid)", "snh", []),
    ("snh flat 38 m, nets (authors' design)", "snh", ["cell_width_m=38.1", "query_sides_m=[26,104]", "hidden=80"]),
    ("snh flat 38 m, nets, longer fit", "snh", ["cell_width_m=38.1", "query_sides_m=[26,104]", "hidden=80",
                                                "batch_size=4096", "samples_per_epoch=131072"]),
    ("snh flat 38 m, grid answers", "snh", ["cell_width_m=38.1", "query_sides_m=[26,104]", "answer=grid",
                                             "max_epochs=1"]),
    ("snh flat 35 m, grid answers", "snh", ["cell_width_m=35.4", "query_sides_m=[26,104]", "answer=grid",
                                             "max_epochs=1"]),
    ("snh flat ParamSelect ρ, grid answers", "snh", ["data_collection=grid", "query_sides_m=[26,104]",
                                                     "answer=grid", "max_epochs=1"]),
    ("identity (default: 100 m)", "identity", []),
    ("identity 50 m (the issue's)", "identity", ["cell_width_m=50"]),
    ("identity ParamSelect ρ for 26–104 m", "identity", ["cell_width_m=auto", "query_sides_m=[26,104]"]),
    ("identity 35 m, negative cells 0", "identity", ["cell_width_m=35.4", "clamp_negative=true"]),
    ("privtree", "privtree", []),
    ("ag", "ag", []),
    ("auto (no band)", "auto", []),
    ("auto, band 26–104 m", "auto", ["query_sides_m=[26,104]"]),
)


def _cli_cpu(argv: list[str]) -> tuple[str, float]:
    """Run a geodp CLI command; (stdout, CPU-seconds of the child, user + system)."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(["geodp", *argv], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"geodp {' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cmd_cabs(args: argparse.Namespace) -> None:
    """The authors' CABS_SFS protocol through the CLI users take: `geodp release run … --mechanism M` on a
    public configured box, then `geodp query range --boxes`; errors beside the authors' 0.065, a blank map
    and the hindsight grid, with CPU-seconds per fit (release run, imports included)."""
    import tempfile

    import pandas as pd

    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.evaluation.range import EvalConfig, hindsight_grid, region_data
    from dpcore.geo import resolve_region
    from dpcore.queries.range import square_workload, true_counts

    latlon = np.load(args.data or SHARED / CABS_FILE)
    region = resolve_region(center=args.center, side_km=args.side_km)  # public configuration, not the data's box
    work = Path(tempfile.mkdtemp(prefix="bench_snh_cabs_"))
    table = work / "cabs.parquet"
    pd.DataFrame({"user_id": np.arange(latlon.shape[0], dtype=np.int64),
                  "timestamp": pd.Timestamp("2008-06-01", tz="UTC"),
                  "lat": latlon[:, 0], "lon": latlon[:, 1]}).to_parquet(table)
    pts = load_points(table).points
    data = region_data(pts, region)
    psi = psi_for(data.n_points)
    rng = np.random.default_rng([0, 0xCAB5])
    bands, workloads, frames = [], [], []
    for lo, hi in CABS_BANDS_FRACTION:
        a, b = lo * region.side_m, hi * region.side_m
        boxes_m = square_workload(region, args.queries, a, b, rng, (data.x, data.y))
        lat0, lon0 = region.unproject(boxes_m[:, 0], boxes_m[:, 1])
        lat1, lon1 = region.unproject(boxes_m[:, 2], boxes_m[:, 3])
        frames.append(pd.DataFrame({"min_lat": lat0, "min_lon": lon0, "max_lat": lat1, "max_lon": lon1}))
        bands.append((a, b))
    # One boxes file for every band (one `query range` per release); band w is rows w·q .. (w+1)·q.
    path = work / "boxes.csv"
    pd.concat(frames).to_csv(path, index=False, float_format="%.10f")
    # Truth on the boxes the CLI reads back (degrees → metres), so both sides count the same squares.
    all_boxes = region.box_latlon_to_m(pd.read_csv(path).to_numpy())
    for w, sides in enumerate(bands):
        boxes = all_boxes[w * args.queries:(w + 1) * args.queries]
        workloads.append((sides, boxes, true_counts(data.x, data.y, boxes), w))
    print(f"data {args.data or SHARED / CABS_FILE}: {data.n_points:,} of {latlon.shape[0]:,} points in the public box "
          f"{args.center} side {args.side_km:g} km; ψ = {psi:.1f}; {args.queries} squares per band, centred on data "
          f"points; {args.trials} trial(s); load average {os.getloadavg()[0]:.1f}")
    zero = [float(relative_error(np.zeros(t.size), t, psi).mean()) for _, _, t, _ in workloads]
    header = "| ε | mechanism | " + " | ".join(f"{a:.0f}–{b:.0f} m" for a, b in bands) + " | CPU s per fit |"
    lines = [header, "|" + "---|" * (len(bands) + 3)]
    lines.append("| – | authors' SNH (their README, 5,000 epochs) | " + f"{CABS_AUTHORS_ERROR} | – | – |")
    lines.append("| – | answer 0 (a blank map) | " + " | ".join(f"{z:.4f}" for z in zero) + " | – |")
    runs = [r for r in CABS_RUNS if not args.only or any(o in r[0] for o in args.only.split(","))]
    for eps in [float(e) for e in args.epsilons.split(",")]:
        cfg = EvalConfig(mechanisms=["identity"], epsilons=[eps], privacy_unit="record", query_sides_m=bands,
                         n_queries=args.queries, trials=args.trials, seed=0)
        grid = hindsight_grid(data, [(s, b, t) for s, b, t, _ in workloads], eps, cfg, psi)
        lines.append(f"| {eps:g} | hindsight grid (not DP) | " + " | ".join(
            f"{g['mean_relative_error']:.4f} ({g['cell_width_m']:.0f} m)" for g in grid) + " | – |")
        print(lines[-1], flush=True)
        for label, mech, params in runs:
            errs, cpu = np.zeros(len(workloads)), 0.0
            for trial in range(args.trials):
                out = work / f"store_{mech}_{eps:g}_{trial}_{len(lines)}"
                argv = ["release", "run", str(table), "--center", args.center, "--side-km", str(args.side_km),
                        "--privacy-unit", "record", "--epsilon", str(eps), "--mechanism", mech, "--out", str(out),
                        "--seed", str(1000 + trial), "--json"]
                for p in params:
                    argv += ["--param", p]
                stdout, c = _cli_cpu(argv)
                cpu += c
                url = json.loads(stdout)["releases"][0]["url"]
                answers, _ = _cli_cpu(["query", "range", url, "--boxes", str(path), "--json"])
                est = np.array([row["estimate"] for row in json.loads(answers)], dtype=np.float64)
                for w, (_, _, truth, _) in enumerate(workloads):
                    part = est[w * args.queries:(w + 1) * args.queries]
                    errs[w] += relative_error(part, truth, psi).mean() / args.trials
            lines.append(f"| {eps:g} | {label} | " + " | ".join(f"{e:.4f}" for e in errs) +
                         f" | {cpu / args.trials:.1f} |")
            print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--city", default="new-york")
    s.add_argument("--epsilon", type=float, default=0.1)
    s.add_argument("--rhos", type=lambda t: [float(v) for v in t.split(",")], default=[0.0, 200.0],
                   help="cell widths to time; 0 = chosen by ParamSelect")
    s.add_argument("--queries", type=int, default=1_000_000)
    s.set_defaults(func=cmd_speed)
    f = sub.add_parser("floors", help="no-privacy reference errors (answer 0, exact grids, spike oracle)")
    f.add_argument("--city", default="new-york")
    f.add_argument("--query-sides-m", default="25:100,100:1000")
    f.add_argument("--queries", type=int, default=2000)
    f.set_defaults(func=cmd_floors)
    bn = sub.add_parser("bins", help="each mechanism's error split by the squares' true counts (diagnostic)")
    bn.add_argument("--city", default="new-york")
    bn.add_argument("--epsilons", default="0.05,0.1,0.2")
    bn.add_argument("--privacy-unit", default="record", choices=["record", "user"])
    bn.add_argument("--max-points-per-user", type=int, default=20)
    bn.add_argument("--query-sides-m", default="100:1000", help="one band A:B")
    bn.add_argument("--queries", type=int, default=2000)
    bn.add_argument("--trials", type=int, default=3)
    bn.add_argument("--mechanisms", default="ag,privtree,snh")
    bn.add_argument("--snh-variants", type=json.loads, default=[],
                    help='extra snh runs, a JSON list of parameter sets, e.g. \'[{"answer": "grid"}]\'')
    bn.set_defaults(func=cmd_bins)
    cb = sub.add_parser("cabs", help="the SNH authors' CABS_SFS protocol through the CLI, beside their 0.065")
    cb.add_argument("--center", default="37.76369,-122.43371")
    cb.add_argument("--side-km", type=float, default=13.0)
    cb.add_argument("--epsilons", default="0.05,0.2,0.8")
    cb.add_argument("--queries", type=int, default=2000)
    cb.add_argument("--trials", type=int, default=1)
    cb.add_argument("--only", default="", help="run only the rows whose label holds one of these (comma-separated)")
    cb.set_defaults(func=cmd_cabs)
    for name, fn in (("accuracy", cmd_accuracy), ("rho", cmd_rho)):
        p = sub.add_parser(name)
        p.add_argument("--city", default="new-york")
        p.add_argument("--epsilons", default="0.05,0.1,0.2")
        p.add_argument("--privacy-unit", default="record", choices=["record", "user"])
        p.add_argument("--max-points-per-user", type=int, default=20)
        p.add_argument("--query-sides-m", default="25:100,100:1000")
        p.add_argument("--queries", type=int, default=1000)
        p.add_argument("--trials", type=int, default=1)
        p.add_argument("--mechanisms", default="identity,ug,ag,privtree,snh,auto")
        p.add_argument("--json", default=None)
        p.add_argument("--snh-params", type=json.loads, default={},
                       help='extra snh parameters as JSON, e.g. \'{"data_collection": "pyramid"}\'')
        p.set_defaults(func=fn)
    sub.choices["rho"].add_argument(
        "--models", type=lambda t: [None if v == "shipped" else v for v in t.split(",")], default=[None],
        help="ParamSelect model files to compare, comma-separated ('shipped': the package's)")
    for p in sub.choices.values():
        p.add_argument("--workload", default="data",
                       help="query centres: data (default: points of the evaluated data), uniform, public:PATH")
        p.add_argument("--data", default=None,
                       help="point table to use instead of the city's default data (e.g. one written by "
                            "bench_accuracy.py --export)")
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
