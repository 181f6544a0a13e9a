"""Point tables in: CSV / Parquet in the standard schema, the SNAP Gowalla/Brightkite format, validation.

The standard schema is ``user_id, timestamp, lat, lon`` (extra columns are ignored). An input is one
file, a folder, a glob or a hive-partitioned folder, local or on ``s3://`` (see :mod:`dpcore.data.inputs`).
Every row is validated; invalid rows are dropped and counted in a :class:`ValidationReport` summed
over the input's files, or, with ``strict=True``, the first one raises a :class:`DataError` naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpcore.data.inputs import DataError, resolve_files, source_version
from dpcore.data.readers import (
    SNAP_COLUMNS,
    STANDARD_COLUMNS,
    TS_MISSING,
    NonIntegralIds,
    Part,
    missing_columns,
    part_from_frame,
    read_part,
    release_arrow_memory,
)

__all__ = ["SNAP_COLUMNS", "STANDARD_COLUMNS", "DataError", "LoadResult", "Points", "ValidationReport",
           "clip_to_region", "load_points", "parse_column_map", "source_version", "validate_frame"]


@dataclass(frozen=True)
class Points:
    """A validated point table as numpy arrays.

    ``user`` holds dense int64 user codes 0..n_users-1 (the original ids are in ``user_ids``);
    ``ts`` is int64 seconds since the Unix epoch, UTC.
    """

    user: np.ndarray
    ts: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    user_ids: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0, dtype=object))

    def __post_init__(self) -> None:
        n = self.user.size
        if not (self.ts.size == self.lat.size == self.lon.size == n):
            raise DataError.all_public("user, ts, lat and lon must have the same length")

    def __len__(self) -> int:
        return int(self.user.size)

    @property
    def n_users(self) -> int:
        return int(np.unique(self.user).size) if len(self) else 0

    def take(self, idx: np.ndarray) -> Points:
        return Points(self.user[idx], self.ts[idx], self.lat[idx], self.lon[idx], self.user_ids)

    def between(self, start_s: int | None, end_s: int | None) -> Points:
        """Points with start ≤ ts < end (either bound may be None)."""
        m = np.ones(len(self), dtype=bool)
        if start_s is not None:
            m &= self.ts >= start_s
        if end_s is not None:
            m &= self.ts < end_s
        return self.take(np.flatnonzero(m))

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "user_id": self.user,
            "timestamp": pd.to_datetime(self.ts, unit="s", utc=True),
            "lat": self.lat,
            "lon": self.lon,
        })

@dataclass
class ValidationReport:
    rows_read: int = 0
    rows_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    first_bad_row: int | None = None  # 1-based data row of its file (header not counted)
    first_bad_reason: str | None = None
    first_bad_source: str | None = None  # the file holding it, when the input has several
    rows_outside: int = 0  # rows read outside the release's time window (not validated, not kept)

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict:
        return {"rows_read": self.rows_read, "rows_kept": self.rows_kept, "rows_dropped": self.rows_dropped,
                "dropped": dict(self.dropped), "first_bad_row": self.first_bad_row,
                "first_bad_reason": self.first_bad_reason, "first_bad_source": self.first_bad_source,
                "rows_outside_window": self.rows_outside}

    def summary(self) -> str:
        s = f"{self.rows_kept:,} of {self.rows_read:,} rows valid"
        if self.rows_dropped:
            reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(self.dropped.items()))
            s += f"; dropped {self.rows_dropped:,} ({reasons}); first bad row {self.first_bad_row}"
            if self.first_bad_source:
                s += f" of {self.first_bad_source}"
        if self.rows_outside:
            s += f"; {self.rows_outside:,} rows outside the period (not checked)"
        return s

    def add(self, other: ValidationReport, source: str | None) -> None:
        """Fold in one more file's report (files in input order)."""
        self.rows_read += other.rows_read
        self.rows_kept += other.rows_kept
        self.rows_outside += other.rows_outside
        for k, v in other.dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + v
        if self.first_bad_row is None and other.first_bad_row is not None:
            self.first_bad_row, self.first_bad_reason = other.first_bad_row, other.first_bad_reason
            self.first_bad_source = source


@dataclass(frozen=True)
class LoadResult:
    points: Points
    report: ValidationReport
    source: str
    # Public identity of the input (see dpcore.data.inputs.source_version): the files' latest mtime and
    # count, never their content; release keys and manifests use it.
    data_version: str
    n_files: int = 1  # files read
    n_pruned: int = 0  # partitions skipped by the time window, never opened


#: Timestamps a location record can carry, [1980-01-01, 2100-01-01) UTC in seconds: a time outside
#: is a unit or parsing error (milliseconds read as seconds, a zero), flagged as an invalid row.
SANE_TS = (315_532_800, 4_102_444_800)


def _all_valid(part: Part) -> bool:
    """Every row's coordinates and time are valid: the fast path for clean files, by each column's
    lowest and highest value (a NaN is neither ≥ nor ≤ anything, and min and max return it), so no
    mask the size of the file is made."""
    if not part.n:
        return True
    ok = -90 <= part.lat.min() and part.lat.max() <= 90 and -180 <= part.lon.min() and part.lon.max() <= 180
    if ok and part.ts is not None:  # None: unread, its statistics prove every value valid
        ok = SANE_TS[0] <= part.ts.min() and part.ts.max() < SANE_TS[1]  # TS_MISSING is below the range
    return bool(ok)


def check_part(part: Part) -> tuple[np.ndarray | None, ValidationReport]:
    """Which rows of one file are valid (None: all), and its report. Each dropped row counts once,
    under the first failing check in this order."""
    report = ValidationReport(rows_read=part.n)
    if part.bad_user is None and _all_valid(part):
        report.rows_kept = part.n
        return None, report
    checks = [
        ("missing_user", part.bad_user),
        ("bad_coordinate", ~np.isfinite(part.lat) | ~np.isfinite(part.lon)),
        ("lat_out_of_range", np.abs(part.lat) > 90),  # NaN compares False
        ("lon_out_of_range", np.abs(part.lon) > 180),
        ("bad_timestamp", None if part.ts is None else part.ts == TS_MISSING),
        ("timestamp_out_of_range", None if part.ts is None else (part.ts != TS_MISSING)
         & ((part.ts < SANE_TS[0]) | (part.ts >= SANE_TS[1]))),
    ]
    bad = None
    first_idx, first_reason = None, None
    for reason, mask in checks:
        if mask is None or not mask.any():
            continue
        new = mask if bad is None else mask & ~bad
        n_new = int(np.count_nonzero(new))
        if n_new:
            report.dropped[reason] = n_new
            idx = int(np.argmax(new))
            if first_idx is None or idx < first_idx:
                first_idx, first_reason = idx, reason
        bad = mask.copy() if bad is None else (bad | mask)
    report.rows_kept = part.n - report.rows_dropped
    if first_idx is not None:
        report.first_bad_row, report.first_bad_reason = first_idx + 1, first_reason
    return (None if bad is None else ~bad), report


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    if len(arrays) > 1:
        return np.concatenate(arrays)
    # A one-chunk arrow column converts without a copy, read-only; callers may write into Points.
    return arrays[0] if arrays[0].flags.writeable else arrays[0].copy()


def _take_column(parts: list[Part], name: str) -> np.ndarray:
    """One column of all files, concatenated; the files' copies are let go at once, so the peak holds
    one extra column rather than a second copy of the table."""
    out = _cat([getattr(p, name) for p in parts])
    for p in parts:
        setattr(p, name, None)
    return out


def _merge(parts: list[Part]) -> Points:
    """Valid rows of every file → one :class:`Points` with dense user codes shared across files, in
    order of first appearance."""
    ts, lat, lon = (_take_column(parts, c) for c in ("ts", "lat", "lon"))
    if all(p.user_int is not None for p in parts):
        # Integer ids: one hash pass over the kept rows (faster than per file and a merge: a user
        # shows up in many files); all codes are present by construction, ids stay integers.
        user, uniques = pd.factorize(_take_column(parts, "user_int"))
        return Points(user.astype(np.int64, copy=False), ts, lat, lon, np.asarray(uniques, dtype=np.int64))
    # Mixed or string ids: merge the files' distinct ids as text (so 7 and "7" are one user), then
    # keep only users that still have a row.
    coded = []
    for p in parts:
        if p.user_int is not None:
            codes, uniq = pd.factorize(p.user_int)
            coded.append((codes.astype(np.int64), pd.Index(uniq).astype(str)))
        else:
            coded.append((p.codes, p.uniques))
        p.user_int = p.codes = None
    all_uniques = np.concatenate([np.asarray(u, dtype=object) for _, u in coded])
    global_code, global_uniques = pd.factorize(all_uniques)
    pieces, offset = [], 0
    for i, (codes, uniq) in enumerate(coded):
        pieces.append(global_code[offset: offset + len(uniq)][codes])
        offset += len(uniq)
        coded[i] = (None, uniq)
    user = _cat(pieces).astype(np.int64, copy=False)
    present = np.flatnonzero(np.bincount(user, minlength=len(global_uniques)))
    remap = np.full(len(global_uniques), -1, dtype=np.int64)
    remap[present] = np.arange(present.size)
    return Points(remap[user], ts, lat, lon, np.asarray(global_uniques, dtype=object)[present])


def _validated(parts_iter, strict: bool, source: str, names: list[str]) -> tuple[Points, ValidationReport]:
    """Validate file by file (dropping bad rows at once, so memory holds only valid ones), then merge."""
    report = ValidationReport()
    kept: list[Part] = []
    for name, part in zip(names, parts_iter, strict=True):
        keep, rep = check_part(part)
        if rep.first_bad_row is not None and strict:
            row = part.raw_row(rep.first_bad_row - 1) if part.raw_row else {}
            raise DataError(f"{name}: row {rep.first_bad_row} is invalid ({rep.first_bad_reason}): {row}",
                            public=strict_public(source))
        report.add(rep, name if len(names) > 1 else None)
        part.raw_row = None  # it holds the file's table; only its arrays go on
        release_arrow_memory()
        if rep.rows_kept:
            kept.append(part if keep is None else part.take(keep))
    check_some_valid(report, source)
    return _merge(kept), report


def strict_public(source: str) -> str:
    """What a --strict failure may say in public: which row failed, and why, are private."""
    return f"--strict: a row of {source or 'the input'} failed validation"


def check_some_valid(report: ValidationReport, source: str) -> None:
    """Refuse an input with no (valid) rows; the counts go into the message, never into ``public``. Rows
    outside the release's period count: a period in which no one has a row is released like any other
    (refusing it would publish that no one has, with no noise)."""
    name = source or "input"
    if report.rows_read + report.rows_outside == 0:
        raise DataError.all_public(f"{name} holds no rows")
    if report.rows_kept == 0 and report.rows_outside == 0:
        raise DataError(f"{name} has no valid rows ({report.summary()})", public=f"{name} has no valid rows")


def validate_frame(df: pd.DataFrame, strict: bool = False, source: str = "") -> tuple[Points, ValidationReport]:
    """Turn a frame in the standard schema into :class:`Points`, dropping (or rejecting) invalid rows."""
    missing = [c for c in STANDARD_COLUMNS if c not in df.columns]
    if missing:
        raise missing_columns(source or "input", missing, list(df.columns))
    try:
        part = part_from_frame(df)
    except NonIntegralIds:
        raise NonIntegralIds(source or "the input") from None
    return _validated([part], strict, source, [source or "input"])


def parse_column_map(text: str | None) -> dict[str, str] | None:
    """'user_id=uid,lat=latitude' → {'uid': 'user_id', 'latitude': 'lat'} (source name → standard name)."""
    if not text:
        return None
    mapping = {}
    for part in text.split(","):
        if "=" not in part:
            raise DataError(f"column mapping must be STANDARD=SOURCE pairs, got {part!r}")
        std, src = (s.strip() for s in part.split("=", 1))
        if std not in STANDARD_COLUMNS:
            raise DataError(f"{std!r} is not a standard column; standard columns are {STANDARD_COLUMNS}")
        mapping[src] = std
    return mapping


def load_points(path: str | os.PathLike, columns: dict[str, str] | None = None, fmt: str = "auto",
                strict: bool = False, window: tuple[int | None, int | None] | None = None) -> LoadResult:
    """Read and validate a point table: a file, a folder or glob of files, or a hive-partitioned
    folder, local or ``s3://``.

    ``columns`` maps source column names to standard ones (see :func:`parse_column_map`).
    ``fmt`` is ``auto`` (by extension), ``parquet``, ``csv``, ``tsv`` or ``snap``.
    ``window`` = (start_s, end_s) skips, unopened, every partition whose ``date=``/``day=`` key (a UTC
    date) lies entirely outside start ≤ t < end; rows are not filtered by time here.
    """
    inp = resolve_files(path, fmt, window)
    names = [inp.display(f) for f in inp.files]
    parts = (read_part(inp, f, columns) for f in inp.files)  # one file in memory at a time
    pts, report = _validated(parts, strict, inp.source, names)
    return LoadResult(pts, report, inp.source, inp.version, len(inp.files), inp.n_pruned)


def clip_to_region(points: Points, region) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(index, x, y) of the points inside a region, projected to metres."""
    x, y = region.project(points.lat, points.lon)
    inside = np.flatnonzero(region.contains_m(x, y))
    return inside, x[inside], y[inside]
