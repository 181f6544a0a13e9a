"""Argument helpers shared by every CLI module: data input, regions, progress, parameter parsing."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from dpcore import GeoDPError
from dpcore.data.points import LoadResult, load_points, parse_column_map
from dpcore.geo import Region, resolve_region

T = TypeVar("T")


class CLIError(GeoDPError, ValueError):
    pass


def add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA",
                   help="point table: a .parquet, .csv, .tsv or SNAP Gowalla .txt/.tsv(.gz) file, a folder or quoted "
                        "glob of such files, or a hive-partitioned folder (date=YYYY-MM-DD/...); local or s3://")
    p.add_argument("--columns", metavar="MAP",
                   help="map source columns to the standard ones, e.g. user_id=uid,timestamp=time,lat=y,lon=x")
    p.add_argument("--format", default="auto", choices=["auto", "parquet", "csv", "tsv", "snap"],
                   help="input format (default: from the file name)")
    p.add_argument("--strict", action="store_true", help="fail on the first invalid row instead of dropping it")


def add_region_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--city", help="catalog city slug (see `geodp cities`)")
    g.add_argument("--center", metavar="LAT,LON", help="custom region centre")
    p.add_argument("--side-km", type=float, default=None, help="side of the square region in km (default 20)")


def add_privacy_args(p: argparse.ArgumentParser, default_k: int | None = 20) -> None:
    p.add_argument("--privacy-unit", choices=["user", "record"], default="user",
                   help="user: neighbours differ by one user's records (default); record: by one record")
    p.add_argument("--max-points-per-user", type=int, default=default_k, metavar="K",
                   help="contribution bound k under user-level privacy, over the whole release " +
                   ("(default: the dataset's policy, 20 for a new dataset)" if default_k is None
                    else f"(default {default_k})"))


def add_workload_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="data", metavar="data|uniform|public:PATH",
                   help="where query centres come from: data (default: uniformly drawn points of the evaluated "
                        "data, i.e. where people are), uniform (over the region), or public:PATH (points of a "
                        "public point file inside the region; only that file is read for the centres)")


def check_public_workload(workload: str) -> None:
    """A public centre file that is missing fails before the private data is read."""
    from pathlib import Path

    from dpcore.queries.range import QueryError, parse_workload

    spec = parse_workload(workload)
    if spec.kind == "public" and not Path(spec.path).is_file():
        raise QueryError(f"public workload file not found: {spec.path}")


def region_from_args(args: argparse.Namespace) -> Region:
    return resolve_region(city=args.city, center=args.center, side_km=args.side_km)


def load_from_args(args: argparse.Namespace, quiet: bool = False) -> LoadResult:
    t0 = time.perf_counter()
    result = load_points(args.data, columns=parse_column_map(args.columns), fmt=args.format, strict=args.strict)
    if not quiet:
        files = f" from {result.n_files} files" if result.n_files > 1 else ""
        eprint(f"loaded {args.data}: {result.report.summary()}{files} ({time.perf_counter() - t0:.1f}s)")
    return result


def parse_epsilons(text: str) -> list[float]:
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError as exc:
        raise CLIError(f"--epsilon must be a number or a comma-separated list, got {text!r}") from exc
    if not values:
        raise CLIError("--epsilon is empty")
    for v in values:
        if not v > 0:
            raise CLIError(f"epsilon must be > 0, got {v:g}")
    return values


def parse_params(items: list[str] | None) -> dict:
    """--param key=value (value parsed as JSON when it can be: numbers, true/false, lists)."""
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise CLIError(f"--param must be KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def parse_mechanism_params(items: list[str] | None, command: str) -> dict[str, dict]:
    """--param MECH.KEY=VALUE (an evaluation's per-mechanism parameters) → {mech: {key: value}}."""
    out: dict[str, dict] = {}
    for key, value in parse_params(items).items():
        if "." not in key:
            raise CLIError(f"{command} --param needs MECH.KEY=VALUE, got {key!r}")
        mech, k = key.split(".", 1)
        out.setdefault(mech, {})[k] = value
    return out


def evaluation_params(build: Callable[[], T]) -> T:
    """Build the flow's pydantic parameters, turning a validation error into one CLI error line."""
    from pydantic import ValidationError

    try:
        return build()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"]))
        raise CLIError(f"bad evaluation parameters: {where + ': ' if where else ''}{err['msg']}") from exc


def eprint(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


class ProgressPrinter:
    """One stderr line per step with elapsed time and an ETA; cheap enough for every step."""

    def __init__(self, label: str):
        self.label = label
        self.t0 = time.perf_counter()

    def __call__(self, done: int, total: int, what: str) -> None:
        el = time.perf_counter() - self.t0
        eta = el / done * (total - done) if done else 0.0
        eprint(f"[{self.label}] {done}/{total} {what} ({el:.0f}s elapsed, ~{eta:.0f}s left)")
