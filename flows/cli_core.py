"""Core subcommands: cities, synth, release (single region, local folder), query, evaluate."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from dpcore import __version__
from dpcore.geo import CITY_CENTRES, DEFAULT_SIDE_KM, city_names, city_region
from flows.cli_common import (
    CLIError,
    ProgressPrinter,
    add_data_args,
    add_region_args,
    eprint,
    load_from_args,
    parse_epsilons,
    parse_params,
    region_from_args,
)

LOCAL_MANIFEST = "manifest.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cities", help="list the city catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cities)

    p = sub.add_parser("synth", help="write synthetic check-ins (skewed, power-law users, weekly rhythm)")
    p.add_argument("out", metavar="OUT", help="output .parquet or .csv")
    p.add_argument("--city", default="new-york")
    p.add_argument("--users", type=int, default=3000)
    p.add_argument("--days", type=int, default=28)
    p.add_argument("--start", default="2024-01-01")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("release", help="make a DP release of one region into a local folder")
    add_data_args(p)
    add_region_args(p)
    _add_privacy_args(p)
    p.add_argument("--epsilon", required=True, type=float)
    p.add_argument("--mechanism", default="identity")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="mechanism parameter (repeatable)")
    p.add_argument("--public-total", type=float, default=None,
                   help="PUBLIC total point count of the region; scales a user-level release to full counts")
    p.add_argument("--seed", type=int, default=None,
                   help="seeded noise for experiments (recorded as NOT FOR PUBLICATION); default: secure noise")
    p.add_argument("--out", required=True, help="release folder (must not exist or be empty)")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("query", help="range counts on a release folder")
    p.add_argument("release", metavar="RELEASE_DIR")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--box", metavar="MINLAT,MINLON,MAXLAT,MAXLON")
    g.add_argument("--boxes", metavar="CSV", help="CSV with min_lat,min_lon,max_lat,max_lon rows")
    p.add_argument("--time", metavar="START/END",
                   help="time window (ISO dates or times, UTC) for spatio-temporal releases")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("evaluate", help="accuracy of mechanisms on a dataset (range-count relative error)")
    add_data_args(p)
    add_region_args(p)
    _add_privacy_args(p)
    p.add_argument("--mechanisms", default="identity,ug,ag,hb,privtree")
    p.add_argument("--epsilon", default="0.1,0.4,1.6", help="comma-separated list")
    p.add_argument("--query-sides-m", default="25:100,100:1000,1000:5000")
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--param", action="append", metavar="MECH.KEY=VALUE",
                   help="mechanism parameter, e.g. identity.cell_width_m=200 (repeatable)")
    p.add_argument("--json", metavar="OUT.json", help="write the full result as JSON")
    p.set_defaults(func=cmd_evaluate)


def _add_privacy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--privacy-unit", choices=["user", "record"], default="user",
                   help="user: neighbours differ by one user's records (default); record: by one record")
    p.add_argument("--max-points-per-user", type=int, default=20, metavar="K",
                   help="contribution bound k under user-level privacy (default 20)")


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
    from dpcore.synthetic import generate_checkins

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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def code_version() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"geodp {__version__}" + (f" ({rev})" if rev else "")


def cmd_release(args: argparse.Namespace) -> int:
    from dpcore.budget import check_epsilon
    from dpcore.evaluate import make_fit_input, region_data
    from dpcore.mechanisms import get_mechanism
    from dpcore.noise import NoiseSource
    from dpcore.scaling import fit_scaled

    epsilon = check_epsilon(args.epsilon)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise CLIError(f"{out} exists and is not empty; releases are never overwritten")
    region = region_from_args(args)
    params = parse_params(args.param)
    mechanism = get_mechanism(args.mechanism, **params)
    loaded = load_from_args(args)
    data = region_data(loaded.points, region)
    if data.n_points == 0:
        raise CLIError(f"no valid points inside {region.name}; check --city/--center and the data")
    noise = NoiseSource.secure() if args.seed is None else NoiseSource.seeded(args.seed)
    fit_input = make_fit_input(data, args.privacy_unit, args.max_points_per_user, noise.rng)
    eprint(f"fitting {args.mechanism} on {fit_input.n:,} points (ε={epsilon:g}, privacy unit {args.privacy_unit}"
           + (f", k={args.max_points_per_user}" if args.privacy_unit == "user" else "") + ")")
    if args.public_total is not None and args.privacy_unit == "user":
        synopsis = fit_scaled(args.mechanism, params, fit_input, epsilon, noise, args.public_total,
                              "--public-total (declared public by the releaser)")
    else:
        synopsis = mechanism.fit(fit_input, epsilon, noise)
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        raise CLIError(f"{tmp} exists from an interrupted release; remove it first")
    files = synopsis.save(tmp)
    manifest = {
        "geodp_release": 1,
        "created_at": datetime.now(UTC).isoformat(),
        "region": region.to_dict(),
        "mechanism": synopsis.privacy.mechanism,
        "params": synopsis.privacy.params,
        "epsilon": epsilon,
        "privacy_unit": args.privacy_unit,
        "max_points_per_user": args.max_points_per_user if args.privacy_unit == "user" else None,
        "noise_source": noise.description,
        "privacy": synopsis.privacy.to_dict(),
        "code_version": code_version(),
        "input": {"source": loaded.source, "data_version": loaded.data_version,
                  "validation": loaded.report.to_dict()},
        "files": [{"path": f, "sha256": sha256_file(tmp / f), "size": (tmp / f).stat().st_size} for f in files],
    }
    (tmp / LOCAL_MANIFEST).write_text(json.dumps(manifest, indent=2))
    tmp.rename(out) if not out.exists() else (out.rmdir(), tmp.rename(out))
    print(f"release written to {out.resolve()}")
    lat0, lon0, lat1, lon1 = region.bbox_latlon()
    clat, clon = region.center_lat, region.center_lon
    print("query it with:\n  geodp query " + str(out) +
          f" --box {clat - 0.005:.4f},{clon - 0.005:.4f},{clat + 0.005:.4f},{clon + 0.005:.4f}")
    return 0


def verify_local_release(directory: Path) -> dict:
    """Read manifest.json and check every listed file's sha256; returns the manifest."""
    mpath = directory / LOCAL_MANIFEST
    if not mpath.exists():
        raise CLIError(f"{directory} has no {LOCAL_MANIFEST}: not a committed geodp release")
    manifest = json.loads(mpath.read_text())
    for f in manifest["files"]:
        p = directory / f["path"]
        if not p.exists():
            raise CLIError(f"release file {p} listed in the manifest is missing")
        if sha256_file(p) != f["sha256"]:
            raise CLIError(f"integrity check failed: {p} does not match its sha256 in the manifest")
    return manifest


def parse_time_window(text: str) -> tuple[int, int]:
    import pandas as pd

    try:
        a, b = text.split("/")
        t0 = pd.Timestamp(a, tz="UTC") if pd.Timestamp(a).tzinfo is None else pd.Timestamp(a)
        t1 = pd.Timestamp(b, tz="UTC") if pd.Timestamp(b).tzinfo is None else pd.Timestamp(b)
    except (ValueError, TypeError) as exc:
        raise CLIError(f"--time must be START/END, e.g. 2008-05-18/2008-05-19, got {text!r}") from exc
    if t1 <= t0:
        raise CLIError("--time END must be after START")
    return int(t0.timestamp()), int(t1.timestamp())


def cmd_query(args: argparse.Namespace) -> int:
    from dpcore.queries import parse_box, read_boxes_csv
    from dpcore.synopsis import load_synopsis

    directory = Path(args.release)
    verify_local_release(directory)
    synopsis = load_synopsis(directory)
    boxes_ll = parse_box(args.box) if args.box else read_boxes_csv(args.boxes)
    boxes_m = synopsis.region.box_latlon_to_m(boxes_ll)
    if args.time:
        if not hasattr(synopsis, "answer_st_time"):
            raise CLIError("--time needs a spatio-temporal release (e.g. mechanism identity3d or vdr)")
        t0, t1 = parse_time_window(args.time)
        est = synopsis.answer_st_time(boxes_m, np.full(len(boxes_m), t0), np.full(len(boxes_m), t1))
    else:
        est = synopsis.answer(boxes_m)
    if args.json:
        print(json.dumps([{"box": list(map(float, b)), "estimate": float(e)} for b, e in zip(boxes_ll, est, strict=True)]))
    else:
        for b, e in zip(boxes_ll, est, strict=True):
            print(f"{b[0]:.5f},{b[1]:.5f},{b[2]:.5f},{b[3]:.5f}\t{e:.1f}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dpcore.evaluate import EvalConfig, evaluate, format_table
    from dpcore.queries import parse_query_sides

    region = region_from_args(args)
    mech_params: dict[str, dict] = {}
    for key, value in parse_params(args.param).items():
        if "." not in key:
            raise CLIError(f"evaluate --param needs MECH.KEY=VALUE, got {key!r}")
        mech, k = key.split(".", 1)
        mech_params.setdefault(mech, {})[k] = value
    config = EvalConfig(mechanisms=[m.strip() for m in args.mechanisms.split(",") if m.strip()],
                        epsilons=parse_epsilons(args.epsilon), privacy_unit=args.privacy_unit,
                        max_points_per_user=args.max_points_per_user,
                        query_sides_m=parse_query_sides(args.query_sides_m), n_queries=args.queries,
                        trials=args.trials, seed=args.seed, mechanism_params=mech_params)
    from dpcore.mechanisms import get_mechanism_class

    for m in config.mechanisms:
        get_mechanism_class(m)  # unknown names fail before the data is read
    loaded = load_from_args(args)
    report = evaluate(loaded.points, region, config, progress=ProgressPrinter("evaluate"))
    report["input"] = {"source": loaded.source, "validation": loaded.report.to_dict()}
    print(format_table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
        eprint(f"wrote {args.json}")
    return 0
