"""A release's data steps on one file or partition of its input, as pure numpy/pandas functions.

A cluster runs them on its workers (tasks/dask_path.py wires them into one Dask graph). Record level:
read and validate one file and count its period's points on each region's fine grid, in one step
(:func:`file_counts`). User level: read and validate one file and keep, per point of the period inside
any region, only what the rest of the pass needs — the user key and each region's fine cell (a
:func:`compact_meta` row); after a shuffle that brings all of a person's rows into one partition,
bound each person to k rows (:func:`bound_chunk`) and count the cells (:func:`frame_counts`). Only
counts leave a worker; their sums are what a mechanism reads (FitInput.fine). Nothing here imports
Dask, so the same steps run on one core in a test.

The user key is an int64 per person, equal across files: integer ids as themselves, text ids that
are canonical integers as that integer, other text ids as a 64-bit hash (two people collide with
probability ~n²/2⁶⁴, which only ever merges their bound). A point table in memory (a backfill's one
read) enters as a chunk of int64 ``user``, ``ts`` (seconds UTC) and float64 ``lat``, ``lon``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpcore.data.inputs import InputFile, InputSet
from dpcore.data.points import DataError, Points, ValidationReport, check_part, strict_public
from dpcore.data.readers import Part, read_part
from dpcore.geo import Region, time_slots
from dpcore.heatmap.mass import MassSpec, cell_units
from dpcore.privacy.accounting import DAY_S
from dpcore.privacy.bounding import bound_contributions
from dpcore.privacy.profile import profile_counts

CHUNK_DTYPES = {"user": "int64", "ts": "int64", "lat": "float64", "lon": "float64"}
Window = tuple[int | None, int | None]

#: Points per step of the cell computation: a step's temporaries stay in the core's cache, where
#: numpy's passes over them cost a fraction of passes over a whole file's columns in memory.
BLOCK = 1 << 16


def _text_keys(uniques: pd.Index) -> np.ndarray:
    """int64 key of each distinct text id: its value when it is a canonical integer ("7", not "07"),
    else its 64-bit hash, so "7" in one file and 7 in another are one person (as load_points merges)."""
    text = pd.Series(np.asarray(uniques, dtype=object), dtype=object).astype(str)
    keys = pd.util.hash_pandas_object(text, index=False).to_numpy().view(np.int64).copy()
    as_int = pd.to_numeric(text, errors="coerce")
    ok = as_int.notna() & (as_int.abs() < 2 ** 53)
    if ok.any():
        ints = as_int[ok].astype(np.int64)
        canonical = ints.astype(str).to_numpy() == text[ok].to_numpy()
        idx = np.flatnonzero(ok.to_numpy())[canonical]
        keys[idx] = ints.to_numpy()[canonical]
    return keys


def points_chunk(points: Points) -> pd.DataFrame:
    """An in-memory point table as one chunk (its dense user codes are the keys)."""
    return pd.DataFrame({"user": points.user, "ts": points.ts, "lat": points.lat,
                         "lon": points.lon}).astype(CHUNK_DTYPES)


def read_valid(inp: InputSet, f: InputFile, columns: dict[str, str] | None, strict: bool,
               skip: frozenset[str] = frozenset(), window: Window = (None, None),
               ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray, np.ndarray, ValidationReport]:
    """One file's valid rows as (user key, ts, lat, lon) and its validation report (``strict``: the
    first bad row raises). Every row inside ``window`` is validated, and no other (_window_rows); a
    standard column in ``skip`` comes back None when
    the file's statistics prove every value of it valid (and, for the time, inside ``window``), so it
    need not be read (readers.proven_columns)."""
    part = read_part(inp, f, columns, skip, window, threads=False)
    in_file = part.n
    part, rows = _window_rows(part, window)
    keep, report = check_part(part)
    # the rows outside the window are read, not checked; an input is refused as empty only when its files
    # are, never because the charged days hold no rows (that would be a noise-free fact of the data)
    report.rows_outside = in_file - part.n
    first_bad = report.first_bad_row  # its number among the window's rows
    if first_bad is not None and rows is not None:
        report.first_bad_row = int(rows[first_bad - 1]) + 1  # its number in the file
    if first_bad is not None and strict:
        row = part.raw_row(first_bad - 1) if part.raw_row else {}
        raise DataError(f"{inp.display(f)}: row {report.first_bad_row} is invalid ({report.first_bad_reason}): {row}",
                        public=strict_public(inp.source))
    if report.first_bad_row is not None:
        report.first_bad_source = inp.display(f)
    part.raw_row = None
    if keep is not None:
        part = part.take(keep)
    if part.user_int is not None:
        user = np.asarray(part.user_int, dtype=np.int64)
    elif part.codes is not None:
        user = _text_keys(part.uniques)[part.codes]
    else:
        user = None
    return user, part.ts, part.lat, part.lon, report


@dataclass(frozen=True)
class GridSpec:
    """What one region's fit reads: counts on a ``cells`` × ``cells`` grid over its bounds (× time
    slots when ``n_slots`` is set); with ``mass``, a heatmap's mass on that grid (``cells`` is then
    ``mass.resolution``); with ``cells`` None, the bounded points themselves."""

    city: str
    region: Region
    cells: int | None
    start_s: int | None = None
    slot_seconds: int | None = None
    n_slots: int | None = None
    mass: MassSpec | None = None

    @property
    def size(self) -> int:
        return int(self.cells) ** 2 * int(self.n_slots or 1)

    @property
    def shape(self) -> tuple[int, ...]:
        c = int(self.cells)
        return (c, c) if not self.n_slots else (c, c, int(self.n_slots))


def spatial_cells(region: Region, n: int, lat: np.ndarray, lon: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Flat cell ix·n + iy (``dtype``, int64 unless the caller keeps a narrower one) of each point on
    the region's n × n grid; n² for points outside it.

    The same floating-point operations in the same order as Region.project then
    dpcore.grid.histogram.flat_cell_index, so each point lands in the same cell (record-level counts
    are bit-identical to counting a Points table), computed block by block in the cache. The
    longitude wrap (% 360) runs only on blocks that need it (it is the identity on [0, 360));
    truncation stands in for floor and for the lower clip, which agree on an inside point's
    non-negative offset; outside points get n² instead of being dropped, so nothing is compacted."""
    lat = np.ascontiguousarray(lat, dtype=np.float64)
    lon = np.ascontiguousarray(lon, dtype=np.float64)
    xmin, ymin, xmax, ymax = region.bounds_m
    sx, sy = n / (xmax - xmin), n / (ymax - ymin)
    clat, clon = region.center_lat, region.center_lon
    mlat, mlon = region.metres_per_degree
    size = n * n
    out = np.empty(lat.size, dtype=dtype)
    b = max(1, min(BLOCK, lat.size))
    bx, by, iy = np.empty(b), np.empty(b), np.empty(b, dtype=np.int64)
    # a narrower result is written block by block from a cached int64 block, never as a second array
    bix = None if out.dtype == np.int64 else np.empty(b, dtype=np.int64)
    o1, o2 = np.empty(b, dtype=bool), np.empty(b, dtype=bool)
    for s in range(0, lat.size, BLOCK):
        e = min(lat.size, s + BLOCK)
        k = e - s
        x, y, jy, away, tmp = bx[:k], by[:k], iy[:k], o1[:k], o2[:k]
        ix = out[s:e] if bix is None else bix[:k]
        np.subtract(lon[s:e], clon, out=x)
        x += 180.0
        if x.min() < 0.0 or x.max() >= 360.0:
            np.remainder(x, 360.0, out=x)
        x -= 180.0
        x *= mlon
        np.less(x, xmin, out=away)
        np.greater_equal(x, xmax, out=tmp)
        away |= tmp
        np.subtract(lat[s:e], clat, out=y)
        y *= mlat
        np.less(y, ymin, out=tmp)
        away |= tmp
        np.greater_equal(y, ymax, out=tmp)
        away |= tmp
        x -= xmin
        x *= sx
        np.copyto(ix, x, casting="unsafe")
        np.minimum(ix, n - 1, out=ix)
        ix *= n
        y -= ymin
        y *= sy
        np.copyto(jy, y, casting="unsafe")
        np.minimum(jy, n - 1, out=jy)
        ix += jy
        np.copyto(ix, size, where=away)
        if bix is not None:
            out[s:e] = ix
    return out


def fine_cells(spec: GridSpec, lat: np.ndarray, lon: np.ndarray, ts: np.ndarray | None,
               dtype: type = np.int64) -> np.ndarray:
    """Flat fine-grid cell (``dtype``; int64 unless the caller keeps a narrower one that holds
    spec.size) of each point (the cells of grid_counts / grid_counts_3d); spec.size for a point that
    does not count (outside the region or its time slots)."""
    if not spec.n_slots:
        return spatial_cells(spec.region, int(spec.cells), lat, lon, dtype)
    cells = spatial_cells(spec.region, int(spec.cells), lat, lon)
    slot = time_slots(ts, spec.start_s, spec.slot_seconds, spec.n_slots)
    away = (cells == int(spec.cells) ** 2) | (slot < 0)
    cells *= spec.n_slots
    cells += slot
    cells[away] = spec.size
    return cells.astype(dtype, copy=False)


def _window_rows(part: Part, window: Window) -> tuple[Part, np.ndarray | None]:
    """The rows of a file inside the time window (a release's charged days), and their numbers in the
    file (None: all rows). Only they are validated: a bad row outside the window, or one whose time
    cannot be read, is never looked at, so neither --strict nor the report depends on it."""
    inside = _in_window(part.ts, window)
    if inside is None:
        return part, None
    rows = np.flatnonzero(inside)
    raw = part.raw_row
    return Part(int(rows.size), part.ts[rows], part.lat[rows], part.lon[rows],
                None if part.bad_user is None else part.bad_user[rows],
                None if part.user_int is None else part.user_int[rows],
                None if part.codes is None else part.codes[rows], part.uniques,
                None if raw is None else (lambda i: raw(int(rows[i])))), rows


def _in_window(ts: np.ndarray | None, window: Window) -> np.ndarray | None:
    """Rows with start ≤ ts < end; None when all are (no window, or ts unread because proven inside)."""
    start, end = window
    if ts is None or (start is None and end is None):
        return None
    m = np.ones(ts.size, dtype=bool)
    if start is not None:
        m &= ts >= start
    if end is not None:
        m &= ts < end
    return None if m.all() else m


def _sparse(cells: np.ndarray, size: int) -> tuple:
    """("counts", non-empty cells, their int64 counts) of cell indices with size meaning 'not counted'."""
    if size <= max(1 << 22, 8 * cells.size):  # a dense count is cheaper than sorting
        dense = np.bincount(cells, minlength=size + 1)[:size]
        idx = np.flatnonzero(dense)
        return "counts", idx, dense[idx].astype(np.int64)
    idx, cnt = np.unique(cells[cells != size], return_counts=True)
    return "counts", idx, cnt.astype(np.int64)


def _needs(specs: list[GridSpec], per_day: bool = False, user_level: bool = False) -> frozenset[str]:
    """The standard columns the pass may leave unread (when proven valid): the user where only counts
    are made at record level, the time where no slot or day is asked for."""
    skip = set()
    if not user_level and all(s.cells is not None for s in specs):
        skip.add("user_id")
    if not per_day and not any(s.n_slots for s in specs):
        skip.add("timestamp")
    return frozenset(skip)


def array_counts(user: np.ndarray | None, ts: np.ndarray | None, lat: np.ndarray, lon: np.ndarray,
                 specs: list[GridSpec], window: Window = (None, None)) -> dict[str, tuple]:
    """Per region: ("counts", cell indices, counts) of the window's points on its non-empty fine cells,
    or ("points", x, y, user) of its points inside the region when the fit reads points."""
    inwin = _in_window(ts, window)
    out: dict[str, tuple] = {}
    for spec in specs:
        if spec.cells is None:
            x, y = spec.region.project(lat, lon)
            m = spec.region.contains_m(x, y)
            if inwin is not None:
                m &= inwin
            out[spec.city] = ("points", x[m], y[m], user[m])
            continue
        cells = fine_cells(spec, lat, lon, ts)
        if inwin is not None:
            cells[~inwin] = spec.size
        kind, idx, cnt = _sparse(cells, spec.size)
        if spec.mass is not None:
            # every point is its own unit here (record level, or the "bound" normalisation)
            if spec.mass.point_units is None:
                raise DataError("a user-normalised mass grid is built after the shuffle on the user key")
            cnt = cnt * int(spec.mass.point_units)
        out[spec.city] = (kind, idx, cnt)
    return out


def file_counts(inp: InputSet, f: InputFile, columns: dict[str, str] | None, strict: bool,
                specs: list[GridSpec], window: Window) -> tuple[dict[str, tuple], ValidationReport]:
    """Record level, one file: its validation report and :func:`array_counts` of its valid rows."""
    user, ts, lat, lon, report = read_valid(inp, f, columns, strict, _needs(specs), window)
    return array_counts(user, ts, lat, lon, specs, window), report


# -- user level: compact rows, shuffled on the user key, bounded, counted ----------------------
def _cell_dtype(spec: GridSpec) -> type:
    return np.int32 if spec.size < 2 ** 31 - 1 else np.int64


def compact_meta(specs: list[GridSpec], per_day: bool = False) -> pd.DataFrame:
    """The empty frame of user-level rows: ``user`` (int64 key), ``day`` (int32 UTC day, with
    per-day bounding), ``c0``, ``c1``, … (each grid spec's fine cell, its size = not counted; int32
    when it fits) and, when a fit reads points, float64 ``lat``, ``lon``."""
    cols: dict[str, np.ndarray] = {"user": np.empty(0, dtype=np.int64)}
    if per_day:
        cols["day"] = np.empty(0, dtype=np.int32)
    for i, spec in enumerate(specs):
        if spec.cells is not None:
            cols[f"c{i}"] = np.empty(0, dtype=_cell_dtype(spec))
    if any(s.cells is None for s in specs):
        cols["lat"], cols["lon"] = np.empty(0), np.empty(0)
    return pd.DataFrame(cols)


def compact_rows(user: np.ndarray, ts: np.ndarray | None, lat: np.ndarray, lon: np.ndarray,
                 specs: list[GridSpec], window: Window, per_day: bool = False) -> pd.DataFrame:
    """The :func:`compact_meta` rows of the window's points that count in at least one region: only
    these travel through the shuffle, at 12 bytes a row for one grid (user key + int32 cell)."""
    keep = np.zeros(lat.size, dtype=bool)
    cells = {}
    for i, spec in enumerate(specs):
        if spec.cells is None:
            keep |= spec.region.contains(lat, lon)
            continue
        c = fine_cells(spec, lat, lon, ts, _cell_dtype(spec))
        keep |= c != spec.size
        cells[f"c{i}"] = c
    inwin = _in_window(ts, window)
    if inwin is not None:
        keep &= inwin
    idx = None if keep.all() else np.flatnonzero(keep)

    def pick(a: np.ndarray) -> np.ndarray:
        return a if idx is None else a[idx]

    cols: dict[str, np.ndarray] = {"user": pick(user)}
    if per_day:
        cols["day"] = (pick(ts) // DAY_S).astype(np.int32)
    cols.update({k: pick(v) for k, v in cells.items()})
    if any(s.cells is None for s in specs):
        cols["lat"], cols["lon"] = pick(lat), pick(lon)
    return pd.DataFrame(cols, copy=False)


def file_rows(inp: InputSet, f: InputFile, columns: dict[str, str] | None, strict: bool,
              specs: list[GridSpec], window: Window, per_day: bool = False) -> tuple[pd.DataFrame, ValidationReport]:
    """User level, one file: its :func:`compact_rows` and its validation report."""
    user, ts, lat, lon, report = read_valid(inp, f, columns, strict, _needs(specs, per_day, True), window)
    return compact_rows(user, ts, lat, lon, specs, window, per_day), report


def chunk_rows(df: pd.DataFrame, specs: list[GridSpec], window: Window, per_day: bool = False) -> pd.DataFrame:
    """:func:`compact_rows` of an in-memory chunk (:func:`points_chunk`)."""
    return compact_rows(df["user"].to_numpy(), df["ts"].to_numpy(), df["lat"].to_numpy(), df["lon"].to_numpy(),
                        specs, window, per_day)


def bound_chunk(df: pd.DataFrame, max_points_per_user: int, rng: np.random.Generator,
                per_day: bool = False) -> pd.DataFrame:
    """A uniform sample of at most k rows per person (per person and UTC ``day`` with ``per_day``),
    chosen with ``rng`` by dpcore.privacy.bounding.bound_contributions. Every row of a person must be in
    ``df`` (the caller shuffles on ``user`` first), so the bound holds over the whole release."""
    if not len(df):
        return df
    if per_day:
        unit = df.groupby([df["user"], df["day"]], sort=False).ngroup().to_numpy()
    else:
        unit = df["user"].to_numpy()
        if unit.min() < 0 or unit.max() >= 2 * unit.size + 1_000_000:
            # hashed or sparse keys: dense codes (bound_contributions counts small keys as they are)
            unit = pd.factorize(unit)[0]
    keep = bound_contributions(unit, max_points_per_user, rng).keep
    return df.iloc[keep]


def unit_profile(df: pd.DataFrame, per_day: bool = False) -> np.ndarray:
    """Units (people, or people and UTC days with ``per_day``) per bucket of their point count in
    ``df``, which must hold all of each person's rows (after the shuffle on ``user``)."""
    if not len(df):
        return profile_counts(np.empty(0, dtype=np.int64))
    keys = [df["user"], df["day"]] if per_day else [df["user"]]
    return profile_counts(df.groupby(keys, sort=False).size().to_numpy())


def frame_counts(df: pd.DataFrame, specs: list[GridSpec]) -> dict[str, tuple]:
    """Per region, what :func:`array_counts` gives, from bounded :func:`compact_meta` rows."""
    out: dict[str, tuple] = {}
    person_total = union_point_counts(df, specs)
    for i, spec in enumerate(specs):
        if spec.cells is None:
            x, y = spec.region.project(df["lat"].to_numpy(), df["lon"].to_numpy())
            m = spec.region.contains_m(x, y)
            out[spec.city] = ("points", x[m], y[m], df["user"].to_numpy()[m])
        elif spec.mass is not None:
            out[spec.city] = frame_mass(df, f"c{i}", spec, person_total)
        else:
            out[spec.city] = _sparse(df[f"c{i}"].to_numpy().astype(np.intp, copy=False), spec.size)
    return out


def union_point_counts(df: pd.DataFrame, specs: list[GridSpec]) -> np.ndarray | None:
    """Per row, how many (point, region) pairs its person has over every user-normalised mass grid of
    the run: each person's mass is shared over all of them (≤ 1 over the whole run, not 1 per region;
    dpcore.heatmap.mass). None when the run has no such grid."""
    normalised = [i for i, s in enumerate(specs) if s.mass is not None and s.mass.point_units is None]
    if not normalised or not len(df):
        return None
    codes = pd.factorize(df["user"])[0]
    n = int(codes.max()) + 1
    per_person = np.zeros(n, dtype=np.int64)
    for i in normalised:
        inside = df[f"c{i}"].to_numpy() != specs[i].size
        per_person += np.bincount(codes[inside], minlength=n)
    return per_person[codes]


def frame_mass(df: pd.DataFrame, column: str, spec: GridSpec, person_total: np.ndarray | None = None) -> tuple:
    """("counts", cell indices, units) of the partition's mass on a heatmap's grid (dpcore.heatmap.mass)
    from its rows' cells in ``column``. Under user normalisation every person's rows must be in ``df``
    (the shuffle on ``user`` puts them there), so each person's mass is spread over all of their
    points in the run's regions (``person_total``, per row: :func:`union_point_counts`; without it, in
    this region); the partitions' units then add up exactly."""
    cells = df[column].to_numpy().astype(np.int64, copy=False)
    inside = cells != spec.size
    total = None if person_total is None else person_total[inside]
    idx, units = cell_units(cells[inside], df["user"].to_numpy()[inside], spec.mass, total)
    return ("counts", idx, units)


def merge_counts(a: dict[str, tuple], b: dict[str, tuple]) -> dict[str, tuple]:
    """The sum of two partitions' :func:`array_counts` (sparse; exact int64 sums)."""
    out = {}
    for city, pa in a.items():
        pb = b[city]
        if pa[0] == "points":
            out[city] = ("points", *(np.concatenate([u, v]) for u, v in zip(pa[1:], pb[1:], strict=True)))
            continue
        span = int(max(pa[1][-1] if pa[1].size else -1, pb[1][-1] if pb[1].size else -1)) + 1
        if span <= max(1 << 20, 8 * (pa[1].size + pb[1].size)):
            # each side's cells are distinct and sorted: add them into a dense run, no sort
            dense = np.zeros(span, dtype=np.int64)
            dense[pa[1]] += pa[2]
            dense[pb[1]] += pb[2]
            idx = np.flatnonzero(dense)
            out[city] = ("counts", idx, dense[idx])
            continue
        idx = np.concatenate([pa[1], pb[1]])
        cnt = np.concatenate([pa[2], pb[2]])
        uniq, inv = np.unique(idx, return_inverse=True)
        # float64 sums of integer counts (or mass units) are exact below 2⁵³
        out[city] = ("counts", uniq, np.bincount(inv, weights=cnt, minlength=uniq.size).astype(np.int64))
    return out


def dense_counts(spec: GridSpec, partial: tuple) -> np.ndarray:
    """The int64 fine grid of a region from its summed sparse counts."""
    grid = np.zeros(spec.size, dtype=np.int64)
    grid[partial[1]] = partial[2]
    return grid.reshape(spec.shape)
