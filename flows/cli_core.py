"""Core subcommands: cities, synth, evaluate. (release and query live in flows/cli_platform.py.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from dpcore.geo import CITY_CENTRES, DEFAULT_SIDE_KM, city_names, city_region
from flows.cli_common import (
    CLIError,
    ProgressPrinter,
    add_data_args,
    add_privacy_args,
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
from flows.cli_st import add_flow_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cities", help="list the city catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cities)

    p = sub.add_parser("synth", help="write synthetic check-ins (skewed, power-law users, weekly rhythm)")
    p.add_argument("out", metavar="OUT", help="output .parquet or .csv (a folder with --partitions)")
    p.add_argument("--city", default="new-york")
    p.add_argument("--users", type=int, default=3000)
    p.add_argument("--days", type=int, default=28)
    p.add_argument("--start", default="2024-01-01")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--partitions", metavar="N|day",
                   help="write a Parquet dataset into the folder OUT: N files (equal time slices) or, with "
                        "'day', hive partitions OUT/date=YYYY-MM-DD/part-0.parquet")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("evaluate", help="accuracy of mechanisms on a dataset (range-count relative error)")
    add_data_args(p)
    add_region_args(p)
    add_privacy_args(p)
    p.add_argument("--mechanisms", default="identity,ug,ag,hb,privtree")
    p.add_argument("--epsilon", default="0.1,0.4,1.6", help="comma-separated list")
    p.add_argument("--query-sides-m", default="25:100,100:1000,1000:5000")
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    add_workload_arg(p)
    p.add_argument("--bounding", choices=["sample", "weight"], default="sample",
                   help="user level: keep a uniform k-sample of each person's points (default), or keep every "
                        "point weighted min(1, k/n_u) (identity, ug, ag, hb, privtree, auto)")
    p.add_argument("--param", action="append", metavar="MECH.KEY=VALUE",
                   help="mechanism parameter, e.g. identity.cell_width_m=200 (repeatable)")
    p.add_argument("--json", metavar="OUT.json", help="write the full result as JSON")
    add_flow_args(p)
    p.set_defaults(func=cmd_evaluate)


def cmd_cities(args: argparse.Namespace) -> int:
    rows = [{"city": c, "center_lat": CITY_CENTRES[c][0], "center_lon": CITY_CENTRES[c][1],
             "side_km": DEFAULT_SIDE_KM} for c in city_names()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['city']:<16} {r['center_lat']:>9.4f} {r['center_lon']:>10.4f}  {r['side_km']:g} km")
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from dpcore.data.synthetic import generate_checkins

    if args.users < 1 or args.days < 1:
        raise CLIError("--users and --days must be ≥ 1")
    if args.partitions is not None:
        return _synth_partitioned(args)
    df = generate_checkins(city_region(args.city), n_users=args.users, start=args.start, days=args.days,
                           seed=args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        df.to_csv(out, index=False)
    else:
        df.to_parquet(out, index=False)
    print(f"wrote {len(df):,} synthetic check-ins of {df.user_id.nunique():,} users in {args.city} to {out}")
    return 0


def _synth_partitioned(args: argparse.Namespace) -> int:
    from dpcore.data.synthetic import generate_checkin_chunks, write_partitioned

    parts = args.partitions.strip().lower()
    if parts != "day" and not (parts.isdigit() and int(parts) >= 1):
        raise CLIError(f"--partitions must be a positive number of files or 'day', got {args.partitions!r}")
    out = Path(args.out)
    if out.suffix.lower() in (".csv", ".parquet", ".pq"):
        raise CLIError(f"--partitions writes a folder of Parquet files; give a folder, not {out.name}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CLIError(f"{out} exists and is not an empty folder; a dataset would mix with what is there")
    try:
        start = pd.Timestamp(args.start, tz="UTC")
    except ValueError as exc:
        raise CLIError(f"--start must be a date, got {args.start!r}") from exc
    chunks = generate_checkin_chunks(city_region(args.city), n_users=args.users, start=args.start,
                                     days=args.days, seed=args.seed)
    stats = write_partitioned(chunks, out, str(start.date()), args.days,
                              "day" if parts == "day" else int(parts))
    layout = "hive-partitioned by day" if parts == "day" else "equal time slices"
    print(f"wrote {stats['rows']:,} synthetic check-ins of {stats['users']:,} users in {args.city} to {out} "
          f"({stats['files']} Parquet files, {layout})")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dpcore.evaluation.range import EvalConfig, evaluate, format_table
    from dpcore.queries.range import parse_query_sides

    region = None if args.flow else region_from_args(args)
    mech_params = parse_mechanism_params(args.param, "evaluate")
    config = EvalConfig(mechanisms=[m.strip() for m in args.mechanisms.split(",") if m.strip()],
                        epsilons=parse_epsilons(args.epsilon), privacy_unit=args.privacy_unit,
                        max_points_per_user=args.max_points_per_user,
                        query_sides_m=parse_query_sides(args.query_sides_m), n_queries=args.queries,
                        trials=args.trials, seed=args.seed, mechanism_params=mech_params,
                        workload=args.workload, bounding=args.bounding)
    from dpcore.mechanisms import MechanismError, get_mechanism_class

    for m in config.mechanisms:
        cls = get_mechanism_class(m)  # unknown names fail before the data is read
        if config.bounding == "weight" and not cls.supports_weights:
            raise MechanismError(f"{m} does not support --bounding weight")
    check_public_workload(config.workload)
    if args.flow:
        return _evaluate_flow(args, config)
    loaded = load_from_args(args)
    report = evaluate(loaded.points, region, config, progress=ProgressPrinter("evaluate"))
    report["input"] = {"source": loaded.source, "validation": loaded.report.to_dict()}
    print(format_table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
        eprint(f"wrote {args.json}")
    return 0


def _evaluate_flow(args: argparse.Namespace, config) -> int:
    """`geodp evaluate --flow`: the Prefect `evaluate` flow (one Dask task per city × mechanism × ε),
    with its artifacts: error table, error-vs-ε plot and training curves (SNH)."""
    from dpcore.evaluation.range import format_table
    from dpcore.mechanisms import get_mechanism
    from flows.cli_st import flow_cities, run_evaluate_flow
    from tasks.config import EvaluateParams

    cities = flow_cities(args)
    for m in config.mechanisms:  # unknown or bad parameters fail here, not in a worker
        get_mechanism(m, **config.mechanism_params.get(m, {})).check_params()
    params = evaluation_params(lambda: EvaluateParams(
        data=str(args.data), cities=cities, mechanisms=config.mechanisms, epsilons=config.epsilons,
        privacy_unit=config.privacy_unit, max_points_per_user=config.max_points_per_user,
        query_sides_m=config.query_sides_m, queries=config.n_queries, trials=config.trials, seed=config.seed,
        mechanism_params=config.mechanism_params, output_dir=args.artifacts_dir, columns=args.columns,
        format=args.format, dask_address=args.dask_address, n_workers=args.workers, workload=config.workload,
        bounding=config.bounding))
    out = run_evaluate_flow(params)
    for city in cities:
        info = out["cities"][city]
        print(f"== {city}")
        print(format_table({**info, "privacy_unit": out["privacy_unit"],
                            "results": [r for r in out["results"] if r["city"] == city]}))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=float))
        eprint(f"wrote {args.json}")
    return 0
