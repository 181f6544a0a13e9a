"""`geodp cities`, `geodp synth` and `geodp serve`: the region catalog, synthetic test data, and the
long-running process that serves the deployments on their schedules."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from flows.cli.common import CLIError, at_least, emit_json
from flows.cli.inputs import Json


def cities(json_out: Json = None) -> int:
    """The city catalog: slugs, centres and the side of their square regions."""
    from dpcore.geo import CITY_CENTRES, DEFAULT_SIDE_KM, city_names

    rows = [{"city": c, "center_lat": CITY_CENTRES[c][0], "center_lon": CITY_CENTRES[c][1],
             "side_km": DEFAULT_SIDE_KM} for c in city_names()]
    if json_out is not None:
        emit_json(rows, json_out)
        return 0
    for r in rows:
        print(f"{r['city']:<16} {r['center_lat']:>9.4f} {r['center_lon']:>10.4f}  {r['side_km']:g} km")
    return 0


def synth(
    out: str = typer.Argument(..., metavar="OUT", show_default=False,
                              help="output .parquet or .csv file (a folder with --partitions)"),
    city: str = typer.Option("new-york", "--city", help="catalog city the check-ins fall in"),
    users: int = typer.Option(3000, "--users", help="number of synthetic users"),
    days: int = typer.Option(28, "--days", help="number of days from --start"),
    start: str = typer.Option("2024-01-01", "--start", help="first UTC day of the data"),
    seed: int = typer.Option(0, "--seed", help="random seed"),
    partitions: str | None = typer.Option(None, "--partitions", metavar="N|day",
                                          help="write a Parquet dataset into the folder OUT: N files (equal time "
                                               "slices) or, with day, hive partitions OUT/date=YYYY-MM-DD/"),
) -> int:
    """Write synthetic check-ins (hotspot skew, power-law users, weekly rhythm) for trying geodp."""
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    at_least(users, 1, "--users")
    at_least(days, 1, "--days")
    if partitions is not None:
        return _synth_partitioned(out, partitions, city, users, days, start, seed)
    df = generate_checkins(city_region(city), n_users=users, start=start, days=days, seed=seed)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path, index=False)
    print(f"wrote {len(df):,} synthetic check-ins of {df.user_id.nunique():,} users in {city} to {path}")
    return 0


def _synth_partitioned(out_path: str, partitions: str, city: str, users: int, days: int, start: str,
                        seed: int) -> int:
    import pandas as pd

    from dpcore.data.synthetic import generate_checkin_chunks, write_partitioned
    from dpcore.geo import city_region

    parts = partitions.strip().lower()
    if parts != "day" and not (parts.isdigit() and int(parts) >= 1):
        raise CLIError(f"--partitions must be a positive number of files or 'day', got {partitions!r}")
    out = Path(out_path)
    if out.suffix.lower() in (".csv", ".parquet", ".pq"):
        raise CLIError(f"--partitions writes a folder of Parquet files; give a folder, not {out.name}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CLIError(f"{out} exists and is not an empty folder; a dataset would mix with what is there")
    try:
        first = pd.Timestamp(start, tz="UTC")
    except ValueError as exc:
        raise CLIError(f"--start must be a date, got {start!r}") from exc
    chunks = generate_checkin_chunks(city_region(city), n_users=users, start=start,
                                     days=days, seed=seed)
    stats = write_partitioned(chunks, out, str(first.date()), days,
                              "day" if parts == "day" else int(parts))
    layout = "hive-partitioned by day" if parts == "day" else "equal time slices"
    print(f"wrote {stats['rows']:,} synthetic check-ins of {stats['users']:,} users in {city} to {out} "
          f"({stats['files']} Parquet files, {layout})")
    return 0


def serve(config: str | None = typer.Option(None, "--config", metavar="FILE",
                                           help="platform config TOML (default: $GEODP_CONFIG, else the packaged tasks/geodp.toml)")) -> int:
    """Serve the release, backfill and evaluate deployments, with the nightly schedule of the config."""
    from flows.serve import serve_from_config

    try:
        serve_from_config(config)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0
