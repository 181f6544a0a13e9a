"""Options that name an input: the point table, the region, the privacy unit, a release to read; and
loading the table with a report of what was dropped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.common import CLIError, eprint

if TYPE_CHECKING:
    from tasks.storage.manifest import Manifest

Data = Annotated[str, typer.Argument(
    metavar="DATA", show_default=False,
    help="point table: a .parquet, .csv, .tsv or SNAP Gowalla .txt/.tsv(.gz) file, a folder or quoted glob of "
         "such files, or a hive-partitioned folder (date=YYYY-MM-DD/...); local or s3://")]
Columns = Annotated[str | None, typer.Option(
    "--columns", metavar="MAP",
    help="source columns of the standard ones, e.g. user_id=uid,timestamp=time,lat=y,lon=x")]
Format = Annotated[str, typer.Option(
    "--format", help="input format: auto (from the file name), parquet, csv, tsv or snap")]
Strict = Annotated[bool, typer.Option("--strict", help="fail on the first invalid row instead of dropping it")]
City = Annotated[str | None, typer.Option("--city", help="catalog city slug (see `geodp cities`)")]
Center = Annotated[str | None, typer.Option("--center", metavar="LAT,LON",
                                            help="centre of a custom square region")]
SideKm = Annotated[float | None, typer.Option("--side-km", help="side of the square region in km (default 20)")]
PrivacyUnit = Annotated[str, typer.Option(
    "--privacy-unit", help="user: neighbouring datasets differ by one person's records; record: by one record")]
Release = Annotated[str, typer.Argument(
    metavar="RELEASE", show_default=False,
    help="a committed release: version URL (…/releases/DATASET/CITY/PERIOD/vN), or a folder or store URL "
         "holding one release")]
Store = Annotated[str, typer.Argument(metavar="STORE", show_default=False,
                                      help="release store: a folder, file:///path or s3://bucket/prefix")]
ConfigFile = Annotated[str | None, typer.Option("--config", metavar="FILE",
                                                help="platform config TOML (default: $GEODP_CONFIG, else the packaged tasks/geodp.toml)")]
Json = Annotated[str | None, typer.Option(
    "--json", metavar="[PATH]", help="JSON output: into PATH, or to stdout when no PATH follows")]
Params = Annotated[list[str] | None, typer.Option(
    "--param", metavar="K=V|MECH.K=V",
    help="mechanism parameter (repeatable); MECH.K=V sets it for one of several mechanisms only")]
Workload = Annotated[str, typer.Option(
    "--workload", metavar="data|uniform|public:PATH",
    help="query centres: data (points of the evaluated data, where people are), uniform (over the region), "
         "or public:PATH (points of a public file inside the region)")]


def choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise CLIError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def check_input_options(fmt: str, privacy_unit: str | None = None) -> None:
    choice(fmt, ("auto", "parquet", "csv", "tsv", "snap"), "--format")
    if privacy_unit is not None:
        choice(privacy_unit, ("user", "record"), "--privacy-unit")


def region(city: str | None, center: str | None, side_km: float | None):
    from dpcore.geo import resolve_region

    return resolve_region(city=city, center=center, side_km=side_km)


def load(data: str, columns: str | None, fmt: str, strict: bool, quiet: bool = False):
    """The point table, with one stderr line on what was read and dropped."""
    from dpcore.data.points import load_points, parse_column_map

    t0 = time.perf_counter()
    result = load_points(data, columns=parse_column_map(columns), fmt=fmt, strict=strict)
    if not quiet:
        files = f" from {result.n_files} files" if result.n_files > 1 else ""
        eprint(f"loaded {data}: {result.report.summary()}{files} ({time.perf_counter() - t0:.1f}s)")
    return result


def check_public_workload(workload: str) -> None:
    """A public centre file that is missing fails before the private data is read."""
    from pathlib import Path

    from dpcore.queries.range import QueryError, parse_workload

    spec = parse_workload(workload)
    if spec.kind == "public" and not Path(spec.path).is_file():
        raise QueryError(f"public workload file not found: {spec.path}")


@contextmanager
def fetch_release(target: str) -> Iterator[tuple[Manifest, object]]:
    """(manifest, synopsis) of a committed release, every file's sha256 checked; reads, never creates."""
    import shutil

    from dpcore.mechanisms import adopt_noise_model
    from dpcore.synopsis.base import load_synopsis
    from tasks.storage.store import fetch_to_temp

    manifest, tmp = fetch_to_temp(target)
    try:
        yield manifest, adopt_noise_model(load_synopsis(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_spatio_temporal(synopsis) -> bool:
    """Whether a synopsis answers time-window queries (the one place the CLI asks)."""
    from dpcore.synopsis.spatiotemporal import SpatioTemporalSynopsis

    return isinstance(synopsis, SpatioTemporalSynopsis)
