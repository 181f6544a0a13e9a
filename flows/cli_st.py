"""CLI for spatio-temporal releases: `geodp evaluate-st`, `geodp hotspot`, `geodp forecast`.

(`geodp query RELEASE --box … --time …` lives in the platform CLI and calls ``answer_st_time``.)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from flows.cli_common import (
    CLIError,
    ProgressPrinter,
    add_data_args,
    add_region_args,
    add_workload_arg,
    check_public_workload,
    eprint,
    evaluation_params,
    load_from_args,
    parse_epsilons,
    parse_mechanism_params,
    region_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    from dpcore.evaluation.spatiotemporal import DEFAULT_ST_MAX_POINTS_PER_USER

    p = sub.add_parser("evaluate-st", help="accuracy of spatio-temporal mechanisms: range counts, hotspots, forecasts")
    add_data_args(p)
    add_region_args(p)
    p.add_argument("--window", required=True, metavar="START/END",
                   help="public time window (UTC ISO dates/times), e.g. 2008-05-18/2008-06-08")
    p.add_argument("--slot", default="1d", help="time slot length: 1h, 1d, ... (default 1d)")
    p.add_argument("--epsilon", default="0.1,0.2,0.5,1", help="comma-separated list")
    p.add_argument("--mechanisms", default="identity3d,vdr")
    p.add_argument("--privacy-unit", choices=["user", "record"], default="user")
    p.add_argument("--max-points-per-user", type=int, default=DEFAULT_ST_MAX_POINTS_PER_USER, metavar="K",
                   help=f"bound k over the whole window (default {DEFAULT_ST_MAX_POINTS_PER_USER})")
    p.add_argument("--query-sides-m", default="100:1000,1000:5000")
    p.add_argument("--queries", type=int, default=1000, help="range queries per workload")
    p.add_argument("--max-query-slots", type=int, default=7, help="longest slot range of a range query")
    p.add_argument("--hotspot-queries", type=int, default=300)
    p.add_argument("--hotspot-extent-km", type=float, default=2.0)
    p.add_argument("--forecast-queries", type=int, default=20)
    p.add_argument("--horizon", type=int, default=None, help="forecast steps (default: one period)")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    add_workload_arg(p)
    p.add_argument("--param", action="append", metavar="MECH.KEY=VALUE",
                   help="mechanism parameter, e.g. vdr.steps=200 or identity3d.grid_size=128 (repeatable)")
    p.add_argument("--json", required=True, metavar="OUT", help="write the report here")
    add_flow_args(p)
    p.add_argument("--image-epsilon", type=float, default=None, metavar="EPS",
                   help="with --flow: the ε whose releases are drawn in the artifacts (default: the smallest)")
    p.set_defaults(func=cmd_evaluate_st)

    p = sub.add_parser("hotspot", help="nearest cell with released count ≥ V around a location")
    p.add_argument("release", metavar="RELEASE")
    p.add_argument("--at", required=True, metavar="LAT,LON", action="append",
                   help="query location (repeatable)")
    p.add_argument("--threshold", required=True, type=float, metavar="V")
    p.add_argument("--extent-km", type=float, default=2.0, help="search radius (default 2 km)")
    p.add_argument("--time", metavar="START/END", help="time window (default: the whole release)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_hotspot)

    p = sub.add_parser("forecast", help="forecast a box's counts past the release window (ThetaModel)")
    p.add_argument("release", metavar="RELEASE")
    p.add_argument("--box", required=True, metavar="MINLAT,MINLON,MAXLAT,MAXLON")
    p.add_argument("--horizon", required=True, type=int, metavar="H")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_forecast)


def add_flow_args(p: argparse.ArgumentParser) -> None:
    """The flow form of an evaluation command: the Prefect `evaluate` flow, one Dask task per
    (city, mechanism, ε), with artifacts (shared by `evaluate` and `evaluate-st`)."""
    g = p.add_argument_group("flow form (--flow)")
    g.add_argument("--flow", action="store_true",
                   help="run as the Prefect `evaluate` flow on Dask, with artifacts; --city may then list "
                        "several catalog cities (A,B,...) that run in parallel")
    g.add_argument("--artifacts-dir", metavar="DIR", default=None,
                   help="also write the artifact images (PNG, operator only: true counts) here")
    g.add_argument("--workers", type=int, default=2, help="Dask LocalCluster workers (default 2)")
    g.add_argument("--dask-address", default=None, help="Dask scheduler address (default: a LocalCluster)")


def flow_cities(args: argparse.Namespace) -> list[str]:
    """The catalog cities of the flow form (checked before any data is read)."""
    from dpcore.geo import resolve_region

    if args.center or not args.city:
        raise CLIError("--flow needs catalog cities (--city A[,B,...]); --center is not supported there")
    cities = [c.strip() for c in args.city.split(",") if c.strip()]
    for c in cities:
        resolve_region(city=c, side_km=args.side_km)
    if args.side_km is not None:
        raise CLIError("--flow evaluates the catalog's city regions; --side-km is not supported there")
    if args.workers < 1:
        raise CLIError("--workers must be ≥ 1")
    if args.strict:
        raise CLIError("--strict is not supported with --flow (the flow drops invalid rows and reports them)")
    from dpcore.data.inputs import resolve_input

    resolve_input(str(args.data), args.format)  # a missing, empty or mixed-format input fails here
    return cities


def run_evaluate_flow(params) -> dict:
    """Run the `evaluate` flow under the configured Prefect API (or one local server for this command)."""
    from flows.evaluate_flow import check_output_dir, run_evaluate
    from tasks.runtime import local_prefect

    check_output_dir(params.output_dir)  # fail before starting Prefect
    with local_prefect():
        return run_evaluate(params)


def _evaluate_st_flow(args: argparse.Namespace, config, mech_params: dict[str, dict]) -> int:
    from dpcore.evaluation.spatiotemporal import format_st_table
    from dpcore.mechanisms import get_mechanism
    from tasks.config import EvaluateParams, STEvaluateOptions

    cities = flow_cities(args)
    for m in config.mechanisms:  # unknown or bad parameters fail here, not in a worker
        get_mechanism(m, **mech_params.get(m, {})).check_params()
    st = evaluation_params(lambda: STEvaluateOptions(
        window=args.window, slot=args.slot, mechanisms=config.mechanisms, epsilons=config.epsilons,
        max_points_per_user=config.max_points_per_user, query_sides_m=config.query_sides_m,
        queries=config.n_queries, max_query_slots=config.max_query_slots, hotspot_queries=config.hotspot_queries,
        hotspot_extent_km=args.hotspot_extent_km, forecast_queries=config.forecast_queries,
        horizon=args.horizon, trials=config.trials, image_epsilon=args.image_epsilon))
    params = evaluation_params(lambda: EvaluateParams(
        data=str(args.data), cities=cities, mechanisms=[], privacy_unit=args.privacy_unit, seed=args.seed,
        mechanism_params=mech_params, spatio_temporal=st, columns=args.columns, format=args.format,
        output_dir=args.artifacts_dir, dask_address=args.dask_address, n_workers=args.workers,
        workload=config.workload))
    out = run_evaluate_flow(params)
    st_out = out["spatio_temporal"]
    report = {"results": [{"city": c, **r} for c, rep in st_out["cities"].items() for r in rep["results"]],
              "cities": st_out["cities"], "window": st_out["cities"][cities[0]]["window"],
              "drawn_epsilon": st_out["drawn_epsilon"], "flow_run_id": out["flow_run_id"],
              "data": {"source": str(args.data), "data_version": out["data_version"]}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2, default=float))
    for city, rep in st_out["cities"].items():
        print(f"== {city}")
        print(format_st_table(rep))
    if args.artifacts_dir:
        print(f"artifact images in {args.artifacts_dir}")
    print(f"wrote {args.json}")
    return 0


def _parse_window(text: str) -> tuple[int, int]:
    from tasks.config import parse_time_window

    return parse_time_window(text)


def cmd_evaluate_st(args: argparse.Namespace) -> int:
    from dpcore.evaluation.spatiotemporal import STEvalConfig, evaluate_st, format_st_table
    from dpcore.geo import parse_slot
    from dpcore.queries.range import parse_query_sides

    region = None if args.flow else region_from_args(args)
    start, end = _parse_window(args.window)
    mech_params = parse_mechanism_params(args.param, "evaluate-st")
    for name, value in (("--queries", args.queries), ("--trials", args.trials),
                        ("--hotspot-queries", args.hotspot_queries), ("--forecast-queries", args.forecast_queries),
                        ("--max-points-per-user", args.max_points_per_user)):
        if value < 1:
            raise CLIError(f"{name} must be ≥ 1")
    config = STEvalConfig(
        mechanisms=[m.strip() for m in args.mechanisms.split(",") if m.strip()],
        epsilons=parse_epsilons(args.epsilon), window_start_s=start, window_end_s=end,
        slot_seconds=parse_slot(args.slot), privacy_unit=args.privacy_unit,
        max_points_per_user=args.max_points_per_user, query_sides_m=parse_query_sides(args.query_sides_m),
        n_queries=args.queries, max_query_slots=args.max_query_slots, hotspot_queries=args.hotspot_queries,
        hotspot_extent_m=args.hotspot_extent_km * 1000.0, forecast_queries=args.forecast_queries,
        forecast_horizon=args.horizon, trials=args.trials, seed=args.seed, mechanism_params=mech_params,
        workload=args.workload)
    check_public_workload(config.workload)
    if args.flow:
        return _evaluate_st_flow(args, config, mech_params)
    loaded = load_from_args(args)
    points = loaded.points.between(start, end)
    report = evaluate_st(points, region, config, progress=ProgressPrinter("evaluate-st"),
                         train_progress=ProgressPrinter("vdr training"))
    report["data"] = {"source": str(args.data), "data_version": loaded.data_version}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2, default=float))
    print(format_st_table(report))
    print(f"wrote {args.json}")
    return 0


def _open_spatio_temporal(target: str):
    """Fetch a release (folder or store URL; sha256-checked) and return (values (nx, ny, nt), synopsis)."""
    from dpcore.synopsis.base import load_synopsis
    from tasks.storage.store import fetch_to_temp

    _, tmp = fetch_to_temp(target)
    try:
        syn = load_synopsis(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    inner, factor = syn, 1.0
    while not hasattr(inner, "density_st") and hasattr(inner, "inner"):  # e.g. a scaled wrapper
        factor *= float(getattr(inner, "factor", 1.0))
        inner = inner.inner
    if not hasattr(inner, "density_st"):
        raise CLIError("this command needs a spatio-temporal release (mechanism identity3d or vdr)")
    return inner, factor


def _parse_latlon(text: str) -> tuple[float, float]:
    try:
        lat, lon = (float(v) for v in text.split(","))
    except ValueError as exc:
        raise CLIError(f"--at must be LAT,LON, got {text!r}") from exc
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise CLIError(f"--at out of range: {text!r}")
    return lat, lon


def cmd_hotspot(args: argparse.Namespace) -> int:
    from dpcore.queries.spatiotemporal import cell_centres, nearest_hotspot

    if args.extent_km <= 0:
        raise CLIError("--extent-km must be > 0")
    syn, factor = _open_spatio_temporal(args.release)
    at = np.array([_parse_latlon(a) for a in args.at])
    x, y = syn.region.project(at[:, 0], at[:, 1])
    if args.time:
        t0, t1 = syn.slots_for_times(*_parse_window(args.time))
    else:
        t0, t1 = 0, syn.n_slots
    values = syn.values * factor
    ans = nearest_hotspot(values, syn.region, np.column_stack([x, y]), args.threshold, args.extent_km * 1000.0,
                          np.array([[t0, t1]]))
    nx, ny = values.shape[:2]
    cx, cy = cell_centres(syn.region, nx, ny)
    window_counts = values[:, :, t0:t1].sum(axis=2)
    rows = []
    for q in range(at.shape[0]):
        if ans.ix[q] < 0:
            rows.append({"at": at[q].tolist(), "found": False})
            continue
        lat, lon = syn.region.unproject(cx[ans.ix[q]], cy[ans.iy[q]])
        rows.append({"at": at[q].tolist(), "found": True, "cell_lat": float(lat), "cell_lon": float(lon),
                     "distance_m": float(ans.distance_m[q]),
                     "released_count": float(window_counts[ans.ix[q], ans.iy[q]]), "slots": [t0, t1]})
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            where = f"{r['at'][0]:.5f},{r['at'][1]:.5f}"
            if r["found"]:
                print(f"{where}\thotspot at {r['cell_lat']:.5f},{r['cell_lon']:.5f}\t{r['distance_m']:.0f} m\t"
                      f"count {r['released_count']:.1f}")
            else:
                print(f"{where}\tno cell with count ≥ {args.threshold:g} within {args.extent_km:g} km")
    return 0


def cmd_forecast(args: argparse.Namespace) -> int:
    from dpcore.queries.range import parse_box
    from dpcore.queries.spatiotemporal import forecast_theta, season_period

    if args.horizon < 1:
        raise CLIError("--horizon must be ≥ 1")
    syn, factor = _open_spatio_temporal(args.release)
    box_m = syn.region.box_latlon_to_m(parse_box(args.box))
    series = syn.series(box_m) * factor
    fc = forecast_theta(series, args.horizon, season_period(syn.slot_seconds))[0]
    start = None
    if syn.window_start_s is not None and syn.slot_seconds:
        start = syn.window_start_s + syn.n_slots * syn.slot_seconds
    out = {"history": series[0].tolist(), "forecast": fc.tolist(), "slot_seconds": syn.slot_seconds,
           "forecast_start_s": start}
    if args.json:
        print(json.dumps(out))
    else:
        eprint(f"released series ({syn.n_slots} slots): " + " ".join(f"{v:.0f}" for v in series[0]))
        for h, v in enumerate(fc):
            when = ""
            if start is not None:
                import pandas as pd

                when = pd.Timestamp(start + h * syn.slot_seconds, unit="s", tz="UTC").isoformat() + "\t"
            print(f"{when}{v:.1f}")
    return 0
