"""A release's data pass on Dask: the input's files → validated, bounded points → fine count grids.

One dask.dataframe graph, whatever runs it: a distributed cluster (the Prefect release flow's
LocalCluster or ``--dask-address``, reached from the task through ``worker_client``) or, in the
in-process form, the local threaded scheduler. Workers read one file each (dpcore.data.chunks.read_chunk),
keep the period's points inside any release region, and under user-level privacy the frame is
shuffled on the user key (dask.dataframe's shuffle), so each person's rows from every file, city and
slot meet in one partition, where one uniform k-sample per person (or per person and day) is drawn
for the whole release. Each partition is then counted on every region's fine grid in one task (so a
person's sample is the same for all regions), or, for a heatmap, spreads each of its people's mass
over their own points on the heatmap's grid (Mechanism.fine_mass), and the sparse sums are added in a
tree. Only those sums come back; a release's fits never receive points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

from dpcore.data.chunks import (
    GridSpec,
    bound_chunk,
    chunk_counts,
    dense_counts,
    empty_chunk,
    merge_counts,
    points_chunk,
    read_chunk,
    select_rows,
)
from dpcore.data.inputs import InputFile, InputSet, resolve_input
from dpcore.data.points import DataError, LoadResult, ValidationReport, check_some_valid
from dpcore.heatmap.mass import MassGrid
from dpcore.privacy.noise import NoiseSource

#: Rows per partition when an in-memory table (a backfill's one read) goes through the graph.
MEMORY_PARTITION_ROWS = 4_000_000


@dataclass
class CityData:
    """What one city's fit reads: the fine count grid, the heatmap's mass grid, or (only for a
    GridSpec with ``cells`` None, which a release never plans) the bounded points in metres with their
    users. Private; it goes to the privatize task only."""

    fine: np.ndarray | None = None
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    user: np.ndarray | None = None
    mass: MassGrid | None = None


@dataclass
class DataPass:
    cities: dict[str, CityData]
    report: ValidationReport
    source: str
    n_files: int
    n_pruned: int


def _read(inp: InputSet, f: InputFile, columns: dict[str, str] | None, strict: bool):
    try:
        return read_chunk(inp, f, columns, strict)
    except DataError as exc:
        if not _on_cluster_worker():
            raise  # the local threaded scheduler: the in-process form shows the detail to its operator
        failed = exc
    # A cluster worker logs a failed task's exception and its scheduler keeps it for the dashboard,
    # which the run's summary links: only the public part (no row number or values) leaves the worker.
    raise DataError(failed.public or f"reading {inp.source} failed on the data's content", public=failed.public)


def _on_cluster_worker() -> bool:
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


def _bound(df: pd.DataFrame, k: int, per_day: bool, seed: int | None,
           partition_info: dict | None = None) -> pd.DataFrame:
    if seed is None:
        rng = NoiseSource.secure().rng  # a fresh OS-seeded stream per partition
    else:
        # Experiments only: a reproducible draw needs a reproducible row order, which a shuffle does
        # not promise, so rows are put in a canonical order first.
        df = df.sort_values(["user", "ts", "lat", "lon"], kind="stable")
        number = 0 if partition_info is None else int(partition_info["number"])
        rng = np.random.default_rng([seed, 0x5A17, number])
    return bound_chunk(df, k, rng, per_day)


def release_frame(source: str | LoadResult, regions: Sequence, window: tuple[int | None, int | None],
                  *, columns: dict[str, str] | None = None, fmt: str = "auto", strict: bool = False,
                  privacy_unit: str = "record", max_points_per_user: int = 1, per_day: bool = False,
                  seed: int | None = None) -> tuple[dd.DataFrame, list, InputSet | None]:
    """The release's bounded points as a dask DataFrame (lazy), the per-file validation reports
    (delayed) and the resolved input (None for an in-memory table)."""
    start_s, end_s = window
    if isinstance(source, LoadResult):
        pts = points_chunk(source.points)
        n_parts = max(1, -(-len(pts) // MEMORY_PARTITION_ROWS))
        ddf, reports, inp = dd.from_pandas(pts, npartitions=n_parts, sort=False), [], None
    else:
        inp = resolve_input(source, fmt, window)
        if not inp.files:
            msg = f"no partition of {inp.source} lies in the time window ({inp.n_pruned} file(s) outside it)"
            raise DataError(msg, public=msg)  # file names and counts are public listing metadata
        reads = [dask.delayed(_read, nout=2)(inp, f, columns, strict) for f in inp.files]
        ddf = dd.from_delayed([r[0] for r in reads], meta=empty_chunk(), verify_meta=False)
        reports = [r[1] for r in reads]
    if privacy_unit == "user":
        # only the regions' rows travel through the shuffle
        ddf = ddf.map_partitions(select_rows, list(regions), start_s, end_s, meta=empty_chunk())
        ddf = ddf.shuffle(on="user", npartitions=ddf.npartitions)
        ddf = ddf.map_partitions(_bound, int(max_points_per_user), per_day, seed, meta=empty_chunk())
    elif start_s is not None or end_s is not None:
        ddf = ddf.map_partitions(select_rows, None, start_s, end_s, meta=empty_chunk())
    return ddf, reports, inp


def _tree_sum(parts: list):
    while len(parts) > 1:
        parts = [dask.delayed(merge_counts)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def compute(*objs):
    """Compute on the cluster this code runs in (from inside a task on a Dask worker, or with a
    distributed client in this process), else on the local threaded scheduler."""
    try:
        from distributed import default_client, get_worker, worker_client
    except ImportError:
        return dask.compute(*objs, scheduler="threads")
    try:
        get_worker()
    except ValueError:
        pass
    else:
        with worker_client() as client:
            return tuple(client.compute(list(objs), sync=True))
    try:
        return tuple(default_client().compute(list(objs), sync=True))
    except ValueError:
        return dask.compute(*objs, scheduler="threads")


def release_counts(source: str | LoadResult, specs: list[GridSpec], window: tuple[int | None, int | None],
                   **frame_kwargs) -> DataPass:
    """Run the data pass: each spec's city gets its summed fine grid (or its bounded points)."""
    ddf, reports, inp = release_frame(source, [s.region for s in specs], window, **frame_kwargs)
    partials = [dask.delayed(chunk_counts)(p, specs) for p in ddf.to_delayed()]
    total, reps = compute(_tree_sum(partials), reports)
    report = _sum_reports(reps, source)
    cities = {}
    for spec in specs:
        got = total[spec.city]
        if got[0] == "points":
            cities[spec.city] = CityData(x=got[1], y=got[2], user=got[3])
        elif spec.mass is not None:
            cities[spec.city] = CityData(mass=MassGrid(spec.mass, dense_counts(spec, got)))
        else:
            cities[spec.city] = CityData(fine=dense_counts(spec, got))
    if isinstance(source, LoadResult):
        return DataPass(cities, report, source.source, source.n_files, source.n_pruned)
    return DataPass(cities, report, inp.source, len(inp.files), inp.n_pruned)


def _sum_reports(reps: list[ValidationReport], source) -> ValidationReport:
    if isinstance(source, LoadResult):
        return source.report
    report = ValidationReport()
    for rep in reps:
        report.add(rep, rep.first_bad_source if len(reps) > 1 else None)
    check_some_valid(report, str(source))
    return report
