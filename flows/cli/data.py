"""`geodp data check DATA`: the input's validation report, in this terminal only.

A release run through Prefect says only what is wrong with bad data (tasks/public_errors.py): the
counts of rows read, kept and dropped per reason, and the first bad row, describe the private data
and are never sent to Prefect. This command reads the input here, with no Prefect and no Dask, and
prints them for the operator. It spends no budget and writes nothing."""

from __future__ import annotations

import typer

from flows.cli.common import emit_json, noun
from flows.cli.inputs import Columns, Data, Format, Json, Strict, check_input_options

app = noun("data", "Check an input table in this terminal (counts of private rows: never published).")


@app.command("check")
def check(
    data: Data,
    columns: Columns = None,
    format: Format = "auto",
    strict: Strict = False,
    period: str | None = typer.Option(None, "--period", metavar="P",
                                      help="read only the partitions of this period, as a release would"),
    json_out: Json = None,
) -> int:
    """Read and validate DATA here and print its validation report (rows read, kept, dropped per reason,
    the first bad row). With --strict the first bad row is an error that names it."""
    from dpcore.data.points import load_points, parse_column_map
    from tasks.config import parse_period

    check_input_options(format)
    p = parse_period(period)
    window = None if p.start_s is None else (p.start_s, p.end_s)
    result = load_points(data, columns=parse_column_map(columns), fmt=format, strict=strict, window=window)
    report = {**result.report.to_dict(), "source": result.source, "files": result.n_files,
              "partitions_skipped": result.n_pruned}
    if json_out is not None:
        emit_json(report, json_out)
        return 0
    print(f"{result.source}: {result.report.summary()}")
    print(f"  {result.n_files} file(s) read, {result.n_pruned} partition file(s) outside the period skipped")
    for reason, n in sorted(result.report.dropped.items()):
        print(f"  dropped {n:,} row(s): {reason}")
    return 0
