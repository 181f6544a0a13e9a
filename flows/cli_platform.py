"""Platform subcommands: release, query, backfill, releases (list/show), ledger, serve.

``release`` has two forms. The platform form (``--cities A,B --period P --store URL``) runs the Prefect
release flow with one Dask task per city. The core form (``--city NAME | --center LAT,LON ... --out
DIR``) runs the same steps in-process without Prefect, into DIR as a local release store. Both
go through the same ledger and exactly-once logic.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

import numpy as np

from dpcore import GeoDPError
from dpcore.privacy.accounting import budget_label
from flows.cli_common import CLIError, add_data_args, add_privacy_args, eprint, parse_params


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("release", help="make DP releases of one period for some cities into a release store")
    add_data_args(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--cities", help="comma-separated catalog city slugs (platform form, Prefect + Dask)")
    g.add_argument("--city", help="one catalog city (core form)")
    g.add_argument("--center", metavar="LAT,LON", help="custom region centre")
    p.add_argument("--side-km", type=float, default=None, help="side of each square region in km (default 20)")
    p.add_argument("--period", default=None,
                   help="YYYY-MM-DD (a UTC day), YYYY-MM, A..B (days, inclusive); default: the whole file")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epsilon", type=float, help="ε per city-release (pure ε-DP)")
    budget.add_argument("--rho", type=float, help="ρ per city-release (ρ-zCDP, discrete Gaussian noise; "
                        "mechanisms that support it, into a dataset accounted in ρ)")
    p.add_argument("--mechanism", default="identity")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="mechanism parameter (repeatable)")
    add_privacy_args(p, default_k=None)
    p.add_argument("--data-version", default=None,
                   help="public version of the input, declared by the operator (default: its modification time)")
    p.add_argument("--public-total", type=float, default=None,
                   help="PUBLIC total point count of the region (single region); scales a user-level release")
    p.add_argument("--seed", type=int, default=None,
                   help="seeded noise for experiments (recorded as NOT FOR PUBLICATION); default: secure noise")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--store", help="release store URL: a folder, file:///path or s3://bucket/prefix")
    dest.add_argument("--out", help="core form: a local folder used as the release store")
    _add_platform_args(p)
    p.add_argument("--no-prefect", action="store_true",
                   help="run in-process without Prefect/Dask (default for the --out form)")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("query", help="range counts on a committed release (folder, store URL or version URL)")
    p.add_argument("release", metavar="RELEASE",
                   help="version URL (…/releases/DATASET/CITY/PERIOD/vN) or a store holding one release")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--box", metavar="MINLAT,MINLON,MAXLAT,MAXLON")
    g.add_argument("--boxes", metavar="CSV", help="CSV with min_lat,min_lon,max_lat,max_lon rows")
    p.add_argument("--time", metavar="START/END",
                   help="time window (ISO dates or times, UTC) for spatio-temporal releases")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("backfill", help="one release per day over a date range (skips committed days)")
    add_data_args(p)
    p.add_argument("--cities", required=True, help="comma-separated catalog city slugs")
    p.add_argument("--side-km", type=float, default=None)
    p.add_argument("--start", required=True, help="first day YYYY-MM-DD")
    p.add_argument("--end", required=True, help="last day YYYY-MM-DD (inclusive)")
    p.add_argument("--epsilon", required=True, type=float, help="ε per city-release")
    p.add_argument("--mechanism", default="identity")
    p.add_argument("--param", action="append", metavar="KEY=VALUE")
    add_privacy_args(p, default_k=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--store", required=True, help="release store URL")
    _add_platform_args(p)
    p.add_argument("--deployment", metavar="NAME", default=None,
                   help="submit one run per day to a served deployment (e.g. release/release) instead")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser("releases", help="list or show committed releases in a store")
    rs = p.add_subparsers(dest="releases_command", metavar="ACTION", required=True)
    q = rs.add_parser("list", help="committed versions, one per line")
    q.add_argument("store", metavar="STORE_URL")
    q.add_argument("--dataset")
    q.add_argument("--city")
    q.add_argument("--period")
    q.add_argument("--json", action="store_true", help="JSON list of dataset, city, period, version, epsilon, "
                   "mechanism, url")
    q.set_defaults(func=cmd_releases_list)
    q = rs.add_parser("show", help="a release's manifest, after checking every file's sha256")
    q.add_argument("release", metavar="RELEASE")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_releases_show)

    p = sub.add_parser("serve", help="serve the release/backfill/evaluate deployments with the nightly schedule")
    p.add_argument("--config", default=None, help="platform config TOML (default deploy/geodp.toml)")
    p.set_defaults(func=cmd_serve)


def _add_platform_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default=None, help="dataset name in the store (default: the file's stem)")
    p.add_argument("--budget-cap", type=float, default=None,
                   help="ε one person may lose from a NEW dataset over its life (sets the dataset's policy; "
                   "default: [budget] in the config file, else 10); a different value for an existing "
                   "dataset is an error (change a policy with `geodp dataset policy`)")
    p.add_argument("--config", default=None, help="platform config TOML (default deploy/geodp.toml)")
    p.add_argument("--dask-address", default=None, help="Dask scheduler address (default: a LocalCluster)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (default 2)")
    p.add_argument("--slot", default="1h", help="time slot of spatio-temporal mechanisms (default 1h)")


def _release_params(args: argparse.Namespace, period: str | None) -> object:
    from pydantic import ValidationError

    from tasks.config import ReleaseParams

    cities = args.cities if getattr(args, "cities", None) else (args.city or "")
    rho = getattr(args, "rho", None)
    if rho is not None:
        if not rho > 0:
            raise CLIError(f"rho must be > 0, got {rho}")
    elif args.epsilon is None or not args.epsilon > 0:
        raise CLIError(f"epsilon must be > 0, got {args.epsilon}")
    if args.max_points_per_user is not None and args.max_points_per_user < 1:
        raise CLIError("--max-points-per-user must be ≥ 1")
    try:
        return ReleaseParams(
            data=str(args.data), cities=cities, period=period, epsilon=args.epsilon, mechanism=args.mechanism,
            mechanism_params=parse_params(args.param), max_points_per_user=args.max_points_per_user,
            privacy_unit=args.privacy_unit, store=str(getattr(args, "store", None) or args.out),
            dataset=args.dataset, budget_cap=args.budget_cap, center=getattr(args, "center", None),
            side_km=args.side_km, slot=args.slot, public_total=getattr(args, "public_total", None), seed=args.seed,
            columns=args.columns, format=args.format, dask_address=args.dask_address, n_workers=args.workers,
            data_version=getattr(args, "data_version", None), rho=rho)
    except ValidationError as exc:
        raise CLIError(f"bad release parameters: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc


def _prevalidate(params, open_store: bool = True) -> None:
    """Fail on names and parameters before starting Prefect or reading data."""
    from dpcore.data.inputs import resolve_input
    from dpcore.geo import resolve_region
    from dpcore.mechanisms import get_mechanism
    from tasks.config import parse_period
    from tasks.storage.store import ReleaseStore

    parse_period(params.period)
    get_mechanism(params.mechanism, **params.mechanism_params)
    if params.center:
        resolve_region(center=params.center, side_km=params.side_km)
    for c in params.cities:
        resolve_region(city=c, side_km=params.side_km)
    if "://" not in params.data or params.data.startswith("s3"):
        from dpcore.data.inputs import resolve_input

        resolve_input(params.data, params.format)  # a missing, empty or mixed-format input fails here
    if open_store:  # a run submitted to a served deployment opens the store on the serving side
        ReleaseStore(params.store)


def run_release_inprocess(params, config_path: str | None = None, strict: bool = False) -> dict:
    """The release pipeline without Prefect or Dask (the same steps as the flow, run here)."""
    from flows.release import release_cities

    return release_cities(params, config_path, in_process=True, strict=strict)


def cmd_release(args: argparse.Namespace) -> int:
    params = _release_params(args, args.period)
    _prevalidate(params)
    use_prefect = bool(args.store) and not args.no_prefect
    if use_prefect:
        from flows.release import run_release
        from tasks.runtime import local_prefect

        with local_prefect():
            summary = run_release(params, args.config)
        from tasks.storage.store import ReleaseStore

        store = ReleaseStore(params.store)
        for r in summary["releases"]:
            found = [m["region"] for m in store.list_releases(summary["dataset"], r["city"], summary["period"])
                     if int(m["version"]) == int(r["version"])]
            if not found:
                raise CLIError(f"{r['city']}: the flow reported v{r['version']} but {store.url} holds no such "
                               "committed version; re-run the release")
            r["region"] = found[0]
    else:
        summary = run_release_inprocess(params, args.config, strict=args.strict)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    for r in summary["releases"]:
        word = "release written to" if r["status"] == "committed" else "already committed (no-op):"
        chose = f" ({r['mechanism']} chose {r['chosen_mechanism']})" if r.get("chosen_mechanism") else ""
        print(f"{r['city']} {summary['period']} v{r['version']}: {word} {r['url']}{chose}")
    from flows.release import _loss_line

    print(f"dataset {summary['dataset']}: {summary['guarantee']}")
    if summary["loss"] is not None:
        print(f"  {_loss_line(summary['policy'], summary['loss'])}")
    r = summary["releases"][0]
    clat, clon = r["region"]["center_lat"], r["region"]["center_lon"]
    print("query it with:\n  geodp query " + r["url"] +
          f" --box {clat - 0.005:.4f},{clon - 0.005:.4f},{clat + 0.005:.4f},{clon + 0.005:.4f}")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from dpcore.queries.range import parse_box, read_boxes_csv
    from dpcore.synopsis.base import load_synopsis
    from tasks.storage.store import fetch_to_temp

    boxes_ll = parse_box(args.box) if args.box else read_boxes_csv(args.boxes)
    _, tmp = fetch_to_temp(args.release)  # verifies every file's sha256 and size
    try:
        synopsis = load_synopsis(tmp)
        boxes_m = synopsis.region.box_latlon_to_m(boxes_ll)
        if args.time:
            if not hasattr(synopsis, "answer_st_time"):
                raise CLIError("--time needs a spatio-temporal release (e.g. mechanism identity3d or vdr)")
            from tasks.config import parse_time_window

            t0, t1 = parse_time_window(args.time)
            est = synopsis.answer_st_time(boxes_m, np.full(len(boxes_m), t0), np.full(len(boxes_m), t1))
        else:
            est = synopsis.answer(boxes_m)
        lower = upper = np.full(len(est), np.nan)
        method = "none: spatio-temporal window queries have no interval yet"
        if not args.time:
            from dpcore.synopsis.uncertainty import query_intervals

            lower, upper, method = query_intervals(synopsis, boxes_m)
        for caveat in synopsis.caveats():
            eprint(f"note: {caveat}")
        box_bounds = synopsis.region.bbox_latlon()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _note_odd_boxes(boxes_ll, box_bounds)
    if args.json:
        num = lambda v: float(v) if np.isfinite(v) else None  # noqa: E731 - JSON has no NaN
        print(json.dumps([{"box": list(map(float, b)), "estimate": num(e), "lower": num(lo), "upper": num(hi),
                           "interval": "95%", "interval_method": method}
                          for b, e, lo, hi in zip(boxes_ll, est, lower, upper, strict=True)]))
    else:
        for b, e, lo, hi in zip(boxes_ll, est, lower, upper, strict=True):
            ci = f"\t95% [{lo:.1f}, {hi:.1f}]" if np.isfinite(lo) else ""
            print(f"{b[0]:.5f},{b[1]:.5f},{b[2]:.5f},{b[3]:.5f}\t{e:.1f}{ci}")
        eprint(f"intervals: {method}")
    return 0


def _note_odd_boxes(boxes_ll: np.ndarray, region_bbox: tuple[float, float, float, float]) -> None:
    """A note on stderr for boxes that were typed inverted or reach outside the released region."""
    b = np.atleast_2d(boxes_ll)
    inverted = int(np.sum((b[:, 0] > b[:, 2]) | (b[:, 1] > b[:, 3])))
    lat0, lon0, lat1, lon1 = region_bbox
    outside = int(np.sum((b[:, 0] < lat0) | (b[:, 1] < lon0) | (b[:, 2] > lat1) | (b[:, 3] > lon1)))
    if inverted:
        eprint(f"note: {inverted} box(es) had min above max; read as the box between the two corners")
    if outside:
        eprint(f"note: {outside} box(es) reach outside the released region {lat0:.4f},{lon0:.4f},"
               f"{lat1:.4f},{lon1:.4f}; the release counts nothing there")


def cmd_backfill(args: argparse.Namespace) -> int:
    from tasks.config import BackfillParams, days_between

    days = days_between(args.start, args.end)
    params = _release_params(args, None)
    _prevalidate(params, open_store=not args.deployment)
    if args.deployment:  # the serving process has its own working directory: send absolute local paths
        from tasks.release_tasks import public_locator

        params = params.model_copy(update={"data": public_locator(params.data),
                                           "store": public_locator(params.store)})
    bp = BackfillParams(release=params, start=args.start, end=args.end)
    if args.deployment:
        from flows.backfill import submit_to_deployment

        runs = submit_to_deployment(bp, args.deployment)
        for r in runs:
            print(f"{r['period']}: flow run {r['flow_run_id']} ({r['state']})")
        return 0
    from flows.backfill import run_backfill
    from tasks.runtime import local_prefect

    eprint(f"backfill of {len(days)} day(s) × {len(params.cities)} cities through Prefect")
    with local_prefect():
        summary = run_backfill(bp, args.config)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        for day in summary["periods"]:
            states = ", ".join(f"{r['city']} v{r['version']} {r['status']}" for r in day["releases"])
            print(f"{day['period']}: {states}")
        print(f"committed {summary['committed']} new version(s); {summary['skipped']} already committed")
    return 0


def cmd_releases_list(args: argparse.Namespace) -> int:
    from tasks.storage.store import ReleaseStore

    store = ReleaseStore(args.store, create=False)
    rows = [{"dataset": m["dataset"], "city": m["city"], "period": m["period"], "version": m["version"],
             "epsilon": m["epsilon"], "rho": m.get("rho"), "mechanism": m["mechanism"], "url": m["url"]}
            for m in store.list_releases(args.dataset, args.city, args.period)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['dataset']}\t{r['city']}\t{r['period']}\tv{r['version']}\t"
                  f"{budget_label(r['epsilon'], r.get('rho'))}\t"
                  f"{r['mechanism']}\t{r['url']}")
        if not rows:
            eprint(f"no committed releases in {store.url}")
    return 0


def cmd_releases_show(args: argparse.Namespace) -> int:
    from tasks.storage.store import fetch_to_temp

    manifest, tmp = fetch_to_temp(args.release)
    shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(manifest, indent=2))
        return 0
    print(f"{manifest['dataset']}/{manifest['city']}/{manifest['period']} v{manifest['version']} "
          f"(committed {manifest.get('committed_at')})")
    print(f"  mechanism {manifest['mechanism']} {json.dumps(manifest['params'])}")
    print(f"  {budget_label(manifest['epsilon'], manifest.get('rho'))}, privacy unit {manifest['privacy_unit']}, k={manifest['max_points_per_user']}")
    print(f"  noise: {manifest['noise_source']}; code: {manifest['code_version']}")
    for c in manifest["privacy"]["charges"]:
        print(f"  charge {c['name']}: {budget_label(c.get('epsilon'), c.get('rho'))}, "
              f"sensitivity {c['sensitivity']:g}")
    print(f"  ledger entry #{manifest['ledger_entry']['seq']} ({manifest['ledger_entry']['created_at']})")
    for f in manifest["files"]:
        print(f"  {f['name']}\t{f['size']} bytes\tsha256 {f['sha256'][:16]}… ok")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.serve import serve_from_config

    try:
        serve_from_config(args.config)
    except GeoDPError:
        raise
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0
