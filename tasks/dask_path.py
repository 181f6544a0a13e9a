"""A release's data pass on Dask: the input's files → validated, bounded points → fine count grids.

One Dask graph, whatever runs it: a cluster of worker processes (the Prefect release flow's LocalCluster
with GEODP_DASK_WORKERS=processes, or ``--dask-address``, reached from the task through ``worker_client``)
or the local threaded scheduler: in the in-process form, and in the flow's default LocalCluster of
threads, whose workers share this process and so need nothing shipped between them (at record level an input of one file runs the graph's one read step
directly: :func:`_one_file_counts`). Record level: one task per file reads it, validates it and counts its
period's points on every region's fine grid (dpcore.data.chunks.file_counts); nothing else moves.
User level: one task per file reads and validates it and keeps, per point of the period inside any
region, its user key and fine cells (a few bytes a row; chunks.compact_rows); dask.dataframe's
shuffle on the user key brings each person's rows from every file, city and slot into one
partition, where one uniform k-sample per person (or per person and day) is drawn for the whole
release, and each partition is counted in one task (so a person's sample is the same for all
regions), or, for a heatmap, spreads each of its people's mass over their own points on the heatmap's
grid (Mechanism.fine_mass). The sparse sums are added in a tree. Only those sums come back; a
release's fits never receive points. With no cluster, or a cluster of threads, a user-level pass does not
shuffle: the files' rows are read (in threads when there are several) and bounded and counted together
in this process (dpcore.data.user_pass), with the same sample law.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpcore import GeoDPError
from dpcore.data.chunks import (
    CHUNK_DTYPES,
    GridSpec,
    Window,
    array_counts,
    bound_chunk,
    chunk_rows,
    compact_meta,
    compact_rows,
    dense_counts,
    file_counts,
    file_rows,
    frame_counts,
    merge_counts,
    points_chunk,
    unit_profile,
)
from dpcore.data.inputs import InputSet, resolve_files
from dpcore.data.points import DataError, LoadResult, ValidationReport, check_some_valid
from dpcore.data.readers import release_arrow_memory
from dpcore.data.user_pass import user_level_counts
from dpcore.heatmap.mass import MassGrid
from dpcore.privacy.noise import NoiseSource
from tasks.public_errors import public_failure

if TYPE_CHECKING:
    import dask.dataframe as dd

# dask is imported where a graph is built, so that an in-process pass over one file imports none of it
# (0.15 s of CPU; dask.dataframe 0.5 s more).

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
    #: user level: units (people, or people and days) per bucket of their point count in the release
    #: (dpcore.privacy.profile); private, it leaves this pass only to be noised
    profile: np.ndarray | None = None


def _cluster() -> str | None:
    """Where this code runs: "worker" (inside a task on a Dask worker), "client" (a distributed client
    in this process), or None (no cluster: the local threaded scheduler)."""
    if "distributed" not in sys.modules:  # neither exists before it is imported (0.15 s of CPU to import)
        return None
    try:
        from distributed import default_client, get_worker
    except ImportError:
        return None
    for where, probe in (("worker", get_worker), ("client", default_client)):
        try:
            probe()
            return where
        except ValueError:
            pass
    return None


def _worker_of_this_process():
    """The Dask worker this code runs on when its whole cluster lives in this process (a LocalCluster of
    threads, whose scheduler speaks ``inproc://``, which no other process can reach), else None."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return None
    return worker if str(worker.scheduler.address).startswith("inproc://") else None


def new_topic() -> str:
    """A fresh Dask event topic for one data pass's file reads."""
    return f"geodp-data-pass-{uuid.uuid4().hex}"


#: Per data pass (its topic): what to call in this process when one of its files is read.
_LOCAL_LISTENERS: dict[str, object] = {}


def _file_read(topic: str | None, rows: int) -> None:
    """Tell the data pass's progress that one more file (of ``rows`` rows) is read: a Dask event to
    the client that computes the pass (tasks run in other processes), or a call in this process."""
    if topic is None:
        return
    listener = _LOCAL_LISTENERS.get(topic)  # the pass runs in this process (with or without a cluster)
    if listener is not None:
        listener({"rows": int(rows)})
    elif _cluster() == "worker":
        from distributed import get_worker

        get_worker().log_event(topic, {"rows": int(rows)})


def _read_file(read, inp: InputSet, *args, topic: str | None = None):
    """``read(inp, *args)`` for one file (chunks.file_counts or chunks.file_rows), its arrow memory
    released after. On a cluster worker a data error leaves with its public part only: the worker logs
    a failed task's exception and its scheduler keeps it for the dashboard, which the run's summary
    links; any other exception leaves as a PrivateDataFailure naming its type (tasks/public_errors.py).
    The local threaded scheduler keeps the detail for the in-process form's operator."""
    try:
        out = read(inp, *args)
        _file_read(topic, out[1].rows_read)
        return out
    except DataError as exc:
        if _cluster() != "worker":
            raise
        failed: Exception = DataError(exc.public or f"reading {inp.source} failed on the data's content",
                                      public=exc.public)
    except GeoDPError:
        raise
    except Exception as exc:  # a library's own error may quote a value of the file
        if _cluster() != "worker":
            raise
        failed = public_failure(exc, inp.source)
    finally:
        release_arrow_memory()
    raise failed


def _file_reads(read, inp: InputSet, columns: dict[str, str] | None, strict: bool, specs: list[GridSpec],
                window: Window, *extra, topic: str | None = None) -> tuple[list, list]:
    """One delayed :func:`_read_file` per file of ``inp``: (their results, their validation reports)."""
    import dask

    # one graph node each for the input and the specs, which every read shares (not one copy per read)
    shared_inp, shared_specs = dask.delayed(inp, traverse=False), dask.delayed(specs, traverse=False)
    reads = [dask.delayed(_read_file, nout=2)(read, shared_inp, f, columns, strict, shared_specs, window, *extra,
                                              topic=topic)
             for f in inp.files]
    return [r[0] for r in reads], [r[1] for r in reads]


def _bound(df: pd.DataFrame, k: int, per_day: bool, seed: int | None, count_people: bool = False,
           partition_info: dict | None = None) -> pd.DataFrame:
    if seed is None:
        rng = NoiseSource.secure().rng  # a fresh OS-seeded stream per partition
    else:
        # Experiments only: a reproducible draw needs a reproducible row order, which a shuffle does
        # not promise, so rows are put in a canonical order first (rows equal in every column are
        # interchangeable: they count in the same cells).
        df = df.sort_values(list(df.columns), kind="stable")
        number = 0 if partition_info is None else int(partition_info["number"])
        rng = np.random.default_rng([seed, 0x5A17, number])
    if count_people:  # a person once per cell (and slot): then at most k cells, each one person
        df = df.drop_duplicates(subset=[c for c in df.columns if c not in ("lat", "lon")], ignore_index=True)
    return bound_chunk(df, k, rng, per_day)


def _shuffle_method() -> str | None:
    """dask's default (p2p, which spills to disk) on a distributed cluster; in-process, the task-based
    shuffle: dask's in-process default ("disk", partd) buffers up to 1 GB in memory before it writes
    anything, so it holds as much as "tasks" and costs more CPU."""
    return "tasks" if _cluster() is None else None


def release_frame(source: str | InputSet | LoadResult, specs: list[GridSpec], window: Window, *,
                  columns: dict[str, str] | None = None, fmt: str = "auto", strict: bool = False,
                  max_points_per_user: int = 1, per_day: bool = False,
                  seed: int | None = None) -> tuple[dd.DataFrame, list, InputSet | None]:
    """User level: the release's bounded rows (chunks.compact_meta: user key, fine cells) as a lazy
    dask DataFrame, the per-file validation reports (delayed) and the resolved input (None for an
    in-memory table)."""
    ddf, reports, inp = _shuffled_frame(source, specs, window, columns, fmt, strict, per_day)
    return _bounded(ddf, specs, max_points_per_user, per_day, seed), reports, inp


def _bounded(shuffled: dd.DataFrame, specs: list[GridSpec], max_points_per_user: int, per_day: bool,
             seed: int | None, count_people: bool = False) -> dd.DataFrame:
    return shuffled.map_partitions(_bound, int(max_points_per_user), per_day, seed, count_people,
                                   meta=compact_meta(specs, per_day))


def _shuffled_frame(source: str | InputSet | LoadResult, specs: list[GridSpec], window: Window,
                    columns: dict[str, str] | None, fmt: str, strict: bool,
                    per_day: bool, topic: str | None = None) -> tuple[dd.DataFrame, list, InputSet | None]:
    """The release's compact rows shuffled on the user key, so each person's rows are in one partition."""
    # imported here: only a user-level pass shuffles, and dask.dataframe costs 0.5 s of CPU to import
    import dask.dataframe as dd

    meta = compact_meta(specs, per_day)
    if isinstance(source, LoadResult):
        pts = points_chunk(source.points)
        n_parts = max(1, -(-len(pts) // MEMORY_PARTITION_ROWS))
        ddf = dd.from_pandas(pts, npartitions=n_parts, sort=False)
        ddf = ddf.map_partitions(chunk_rows, specs, window, per_day, meta=meta)
        reports, inp = [], None
    else:
        inp = _files(source, fmt, window)
        rows, reports = _file_reads(file_rows, inp, columns, strict, specs, window, per_day, topic=topic)
        ddf = dd.from_delayed(rows, meta=meta, verify_meta=False)
    # The rows' index means nothing here; dropping it saves 8 bytes a row through the shuffle.
    ddf = ddf.shuffle(on="user", npartitions=ddf.npartitions, ignore_index=True,
                      shuffle_method=_shuffle_method())
    return ddf, reports, inp


def _tree_sum(parts: list, merge=merge_counts):
    import dask

    while len(parts) > 1:
        parts = [dask.delayed(merge)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def compute(*objs, listen: tuple[str, object] | None = None):
    """Compute on the cluster this code runs in (from inside a task on a Dask worker, or with a
    distributed client in this process), else on the local threaded scheduler. ``listen`` (topic,
    callback): the callback gets the events that the graph's tasks send on the topic (:func:`_file_read`)."""
    where = _cluster()
    if where == "worker" and _worker_of_this_process() is not None:
        where = None  # a cluster of threads here: the local threaded scheduler, with no task shipped
    if where in ("worker", "client"):
        from distributed import default_client, worker_client

        with (worker_client() if where == "worker" else contextlib.nullcontext(default_client())) as client:
            if listen is not None:
                topic, callback = listen
                client.subscribe_topic(topic, lambda event: callback(event[1]))
            try:
                return tuple(client.compute(list(objs), sync=True))
            finally:
                if listen is not None:
                    client.unsubscribe_topic(topic)
    import dask
    import dask.threaded

    if listen is not None:
        _LOCAL_LISTENERS[listen[0]] = listen[1]
    try:
        # the threaded scheduler's function itself: dask resolves the name "threads" by importing
        # distributed first, to look for a client that cannot exist here (0.15 s of CPU)
        return dask.compute(*objs, scheduler=dask.threaded.get)
    finally:
        if listen is not None:
            _LOCAL_LISTENERS.pop(listen[0], None)


def release_counts(source: str | InputSet | LoadResult, specs: list[GridSpec], window: Window, *,
                   columns: dict[str, str] | None = None, fmt: str = "auto", strict: bool = False,
                   privacy_unit: str = "record", max_points_per_user: int = 1, per_day: bool = False,
                   seed: int | None = None, count_people: bool = False, topic: str | None = None) -> DataPass:
    """Run the data pass: each spec's city gets its summed fine grid (or its bounded points); with
    ``count_people`` (user level) a grid of distinct people per cell, each person in at most k cells.
    ``topic``: the Dask event topic its file reads report on (:func:`_file_read`), so that another client
    (the flow's process, drawing the terminal's progress) can follow them too."""
    inp, profile = None, None
    topic = topic or new_topic()
    if not isinstance(source, LoadResult):
        source = inp = _files(source, fmt, window)
    where = _cluster()
    # a cluster of threads in this process holds every row in this process anyway: the pass runs here,
    # on the local threaded scheduler, as with no cluster (its file events still reach the cluster's clients)
    worker = _worker_of_this_process() if where == "worker" else None
    local = where is None or worker is not None
    one = local and (privacy_unit == "user" or (inp is not None and len(inp.files) == 1))
    if one and privacy_unit == "user":
        # in one process the rows need no shuffle: they are bounded and counted together
        with _data_pass_progress(inp, worker, topic) as listener:
            frames, reps = _local_rows(source, specs, window, columns, strict, per_day, topic, listener)
        total, profile = user_level_counts(frames, compact_meta(specs, per_day), specs, int(max_points_per_user),
                                           _bounding_rng(seed), per_day, count_people)
    elif one:
        with _data_pass_progress(inp, worker, topic) as listener:
            total, reps = _one_file_counts(inp, specs, window, columns, strict, topic, listener)
    elif privacy_unit == "user":
        import dask

        shuffled, reports, inp = _shuffled_frame(source, specs, window, columns, fmt, strict, per_day, topic)
        ddf = _bounded(shuffled, specs, max_points_per_user, per_day, seed, count_people)
        partials = [dask.delayed(frame_counts)(p, specs) for p in ddf.to_delayed()]
        # the contribution profile is a sum too: units per bucket of their point count, per partition
        profile = _tree_sum([dask.delayed(unit_profile)(p, per_day) for p in shuffled.to_delayed()], np.add)
    elif isinstance(source, LoadResult):
        import dask

        p, reports = source.points, []
        partials = [dask.delayed(array_counts)(p.user[i:i + MEMORY_PARTITION_ROWS], p.ts[i:i + MEMORY_PARTITION_ROWS],
                                               p.lat[i:i + MEMORY_PARTITION_ROWS], p.lon[i:i + MEMORY_PARTITION_ROWS],
                                               specs, window)
                    for i in range(0, max(1, len(p)), MEMORY_PARTITION_ROWS)]
    else:
        partials, reports = _file_reads(file_counts, inp, columns, strict, specs, window, topic=topic)
    if not one:
        with _data_pass_progress(inp, worker, topic) as listener:
            total, reps, profile = compute(_tree_sum(partials), reports, profile, listen=(topic, listener))
    report = _sum_reports(reps, source if isinstance(source, LoadResult) else inp.source)
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
        return DataPass(cities, report, source.source, source.n_files, source.n_pruned, profile)
    return DataPass(cities, report, inp.source, len(inp.files), inp.n_pruned, profile)


def _one_file_counts(inp: InputSet, specs: list[GridSpec], window: Window, columns: dict[str, str] | None,
                     strict: bool, topic: str, listener) -> tuple[dict, list]:
    """(counts, [report]) of a one-file input at record level in this process: the graph's one read
    task, called directly (no dask to import)."""
    _LOCAL_LISTENERS[topic] = listener
    try:
        total, report = _read_file(file_counts, inp, inp.files[0], columns, strict, specs, window, topic=topic)
    finally:
        _LOCAL_LISTENERS.pop(topic, None)
    return total, [report]


def _local_rows(source: InputSet | LoadResult, specs: list[GridSpec], window: Window,
                columns: dict[str, str] | None, strict: bool, per_day: bool, topic: str,
                listener) -> tuple[list[pd.DataFrame], list[ValidationReport]]:
    """User level in this process: the compact rows (chunks.compact_meta) of each file, read in threads
    on the local scheduler (one file, or an in-memory table, directly: no dask to import), and the
    files' validation reports (none for an in-memory table: it was validated when loaded)."""
    if isinstance(source, LoadResult):
        p = source.points
        return [compact_rows(*(np.asarray(a[i:i + MEMORY_PARTITION_ROWS], dtype=CHUNK_DTYPES[c])
                               for c, a in (("user", p.user), ("ts", p.ts), ("lat", p.lat), ("lon", p.lon))),
                             specs, window, per_day)
                for i in range(0, max(1, len(p)), MEMORY_PARTITION_ROWS)], []
    if len(source.files) == 1:
        _LOCAL_LISTENERS[topic] = listener
        try:
            rows, report = _read_file(file_rows, source, source.files[0], columns, strict, specs, window, per_day,
                                      topic=topic)
        finally:
            _LOCAL_LISTENERS.pop(topic, None)
        return [rows], [report]
    rows, reports = _file_reads(file_rows, source, columns, strict, specs, window, per_day, topic=topic)
    frames, reps = compute(rows, reports, listen=(topic, listener))
    return list(frames), list(reps)


def _bounding_rng(seed: int | None) -> np.random.Generator:
    """Where the in-process k-sample's randomness comes from: the secure source's generator (seeded
    from the OS), or for experiments a generator of the seed (rows come in file order, so a seed
    draws the same sample each time)."""
    return NoiseSource.secure().rng if seed is None else np.random.default_rng([seed, 0x5A17])


@contextlib.contextmanager
def _data_pass_progress(inp: InputSet | None, worker=None, topic: str | None = None):
    """A callback for the pass's file events, driving a progress reporter (tasks/progress.py): files
    read of the input's files, and elapsed time, in a run's log; rows read only on a terminal bar.
    ``worker`` (the cluster's worker in this process, running the pass here): each event also goes out
    on ``topic`` as a Dask event, for the clients that follow the pass (the flow's terminal)."""
    from tasks.progress import Progress

    if inp is None:  # an in-memory table: read already, nothing to count
        yield lambda event: None
        return
    rows = 0
    with Progress("data pass", total=len(inp.files), unit="files") as progress:
        def listener(event: dict) -> None:
            nonlocal rows
            rows += int(event.get("rows", 0))
            progress.advance(private=f"{rows:,} rows")
            if worker is not None and topic is not None:
                worker.log_event(topic, dict(event))

        yield listener


def _files(source: str | InputSet, fmt: str, window: Window) -> InputSet:
    """The files to read: the release plan's own listing (the one its release key's data version came
    from), else a listing made here."""
    return source if isinstance(source, InputSet) else resolve_files(source, fmt, window)


def _sum_reports(reps: list[ValidationReport], source) -> ValidationReport:
    if isinstance(source, LoadResult):
        return source.report
    report = ValidationReport()
    for rep in reps:
        report.add(rep, rep.first_bad_source if len(reps) > 1 else None)
    check_some_valid(report, str(source))
    return report
