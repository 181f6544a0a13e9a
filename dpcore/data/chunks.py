"""A release's data steps on one partition of its input, as pure functions of a pandas chunk.

A cluster runs them on its workers (tasks/dask_path.py wires them into a dask.dataframe graph):
read and validate one file → keep the period's points inside any release region → (after a shuffle
that brings all of a person's rows into one partition) bound each person to k points → count the
kept points on each region's fine grid. Only the counts leave a worker; the sums over partitions are
what a mechanism reads (FitInput.fine). Nothing here imports Dask: each function takes and returns
pandas or numpy values, so the same steps run on one core in a test.

A chunk is a DataFrame with int64 ``user`` (a key per person, equal across files: integer ids as
themselves, text ids that are canonical integers as that integer, other text ids as a 64-bit hash, so
two people collide with probability ~n²/2⁶⁴, which only ever merges their bound), int64 ``ts``
(seconds UTC) and float64 ``lat``, ``lon``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpcore.data.inputs import InputFile, InputSet
from dpcore.data.points import DataError, Points, ValidationReport, check_part, strict_public
from dpcore.data.readers import read_part
from dpcore.geo import Region, time_slots
from dpcore.grid.histogram import flat_cell_index
from dpcore.heatmap.mass import MassSpec, mass_cells
from dpcore.privacy.accounting import DAY_S
from dpcore.privacy.bounding import bound_contributions

CHUNK_DTYPES = {"user": "int64", "ts": "int64", "lat": "float64", "lon": "float64"}


def empty_chunk() -> pd.DataFrame:
    return pd.DataFrame({c: np.empty(0, dtype=t) for c, t in CHUNK_DTYPES.items()})


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


def read_chunk(inp: InputSet, f: InputFile, columns: dict[str, str] | None,
               strict: bool = False) -> tuple[pd.DataFrame, ValidationReport]:
    """One file's valid rows as a chunk, and its validation report (``strict``: the first bad row raises)."""
    part = read_part(inp, f, columns)
    keep, report = check_part(part)
    if report.first_bad_row is not None and strict:
        row = part.raw_row(report.first_bad_row - 1) if part.raw_row else {}
        raise DataError(f"{inp.display(f)}: row {report.first_bad_row} is invalid ({report.first_bad_reason}): {row}",
                        public=strict_public(inp.source))
    if report.first_bad_row is not None:
        report.first_bad_source = inp.display(f)
    part.raw_row = None
    if keep is not None:
        part = part.take(keep)
    if part.user_int is not None:
        user = np.asarray(part.user_int, dtype=np.int64)
    else:
        user = _text_keys(part.uniques)[part.codes]
    df = pd.DataFrame({"user": user, "ts": part.ts, "lat": part.lat, "lon": part.lon})
    return df.astype(CHUNK_DTYPES), report


def points_chunk(points: Points) -> pd.DataFrame:
    """An in-memory point table as one chunk (its dense user codes are the keys)."""
    return pd.DataFrame({"user": points.user, "ts": points.ts, "lat": points.lat,
                         "lon": points.lon}).astype(CHUNK_DTYPES)


def select_rows(df: pd.DataFrame, regions: list[Region] | None, start_s: int | None,
                end_s: int | None) -> pd.DataFrame:
    """Rows with start ≤ ts < end that lie inside at least one region (the release's data); with
    ``regions`` None, the window only (counting ignores points outside a region anyway)."""
    m = np.ones(len(df), dtype=bool)
    ts = df["ts"].to_numpy()
    if start_s is not None:
        m &= ts >= start_s
    if end_s is not None:
        m &= ts < end_s
    if regions is not None:
        lat, lon = df["lat"].to_numpy(), df["lon"].to_numpy()
        inside = np.zeros(len(df), dtype=bool)
        for r in regions:
            x, y = r.project(lat, lon)
            inside |= r.contains_m(x, y)
        m &= inside
    return df if m.all() else df[m]


def bound_chunk(df: pd.DataFrame, max_points_per_user: int, rng: np.random.Generator,
                per_day: bool = False) -> pd.DataFrame:
    """A uniform sample of at most k rows per person (per person and UTC day with ``per_day``),
    chosen with ``rng`` by dpcore.privacy.bounding.bound_contributions. Every row of a person must be in
    ``df`` (the caller shuffles on ``user`` first), so the bound holds over the whole release."""
    if not len(df):
        return df
    if per_day:
        unit = df.groupby([df["user"], df["ts"] // DAY_S], sort=False).ngroup().to_numpy()
    else:
        unit = pd.factorize(df["user"].to_numpy())[0]
    keep = bound_contributions(unit, max_points_per_user, rng).keep
    return df.iloc[keep]


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


def _flat_cells(spec: GridSpec, x: np.ndarray, y: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Flat fine-grid cell of each point that counts (the same cells as grid_counts / grid_counts_3d)."""
    flat, inside = flat_cell_index(x, y, spec.region.bounds_m, spec.cells, spec.cells)
    if not spec.n_slots:
        return flat
    slot = time_slots(ts[inside], spec.start_s, spec.slot_seconds, spec.n_slots)
    ok = slot >= 0
    return flat[ok] * spec.n_slots + slot[ok]


def chunk_counts(df: pd.DataFrame, specs: list[GridSpec]) -> dict[str, tuple]:
    """Per region: ("counts", cell indices, counts) of the chunk's non-empty fine cells, or ("points",
    x, y, user) of its points inside the region when the fit reads points."""
    lat, lon, ts = df["lat"].to_numpy(), df["lon"].to_numpy(), df["ts"].to_numpy()
    out: dict[str, tuple] = {}
    for spec in specs:
        x, y = spec.region.project(lat, lon)
        if spec.cells is None:
            m = spec.region.contains_m(x, y)
            out[spec.city] = ("points", x[m], y[m], df["user"].to_numpy()[m])
            continue
        if spec.mass is not None:
            out[spec.city] = chunk_mass(df, x, y, spec)
            continue
        flat = _flat_cells(spec, x, y, ts)
        if spec.size <= max(1 << 22, 8 * flat.size):  # a dense count is cheaper than sorting
            dense = np.bincount(flat, minlength=spec.size)
            idx = np.flatnonzero(dense)
            out[spec.city] = ("counts", idx, dense[idx].astype(np.int64))
        else:
            idx, cnt = np.unique(flat, return_counts=True)
            out[spec.city] = ("counts", idx, cnt.astype(np.int64))
    return out


def chunk_mass(df: pd.DataFrame, x: np.ndarray, y: np.ndarray, spec: GridSpec) -> tuple:
    """("counts", cell indices, units) of the chunk's mass on a heatmap's grid (dpcore.heatmap.mass),
    from its points inside the region (``x``, ``y`` projected). Under user normalisation every
    person's rows must be in ``df`` (the shuffle on ``user`` puts them there), so each person's mass
    is spread over all of their points in the region; the partitions' units then add up exactly."""
    m = spec.region.contains_m(x, y)
    cells, units = mass_cells(x[m], y[m], df["user"].to_numpy()[m], spec.region.bounds_m, spec.mass)
    return ("counts", cells, units)


def merge_counts(a: dict[str, tuple], b: dict[str, tuple]) -> dict[str, tuple]:
    """The sum of two partitions' :func:`chunk_counts` (sparse; exact int64 sums)."""
    out = {}
    for city, pa in a.items():
        pb = b[city]
        if pa[0] == "points":
            out[city] = ("points", *(np.concatenate([u, v]) for u, v in zip(pa[1:], pb[1:], strict=True)))
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
