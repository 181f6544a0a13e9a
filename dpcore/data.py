"""Point tables in: CSV / Parquet in the standard schema, the SNAP Gowalla/Brightkite format, validation.

The standard schema is ``user_id, timestamp, lat, lon`` (extra columns are ignored). Every row is
validated; invalid rows are dropped and counted in a :class:`ValidationReport`, or, with
``strict=True``, the first one raises a :class:`DataError` naming it.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore import GeoDPError

STANDARD_COLUMNS = ("user_id", "timestamp", "lat", "lon")
SNAP_COLUMNS = ("user_id", "timestamp", "lat", "lon", "location_id")


class DataError(GeoDPError, ValueError):
    pass


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
            raise DataError("user, ts, lat and lon must have the same length")

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
    first_bad_row: int | None = None  # 1-based data row (header not counted)
    first_bad_reason: str | None = None

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict:
        return {"rows_read": self.rows_read, "rows_kept": self.rows_kept, "rows_dropped": self.rows_dropped,
                "dropped": dict(self.dropped), "first_bad_row": self.first_bad_row,
                "first_bad_reason": self.first_bad_reason}

    def summary(self) -> str:
        s = f"{self.rows_kept:,} of {self.rows_read:,} rows valid"
        if self.rows_dropped:
            reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(self.dropped.items()))
            s += f"; dropped {self.rows_dropped:,} ({reasons}); first bad row {self.first_bad_row}"
        return s


@dataclass(frozen=True)
class LoadResult:
    points: Points
    report: ValidationReport
    source: str
    data_version: str  # public version of the input (source_version): modification time, never content


def source_version(path: str | os.PathLike, window: tuple[int | None, int | None] | None = None) -> str:
    """The input's public version: the latest modification time (UTC) of its files and their count.

    It changes when a file is rewritten, and it is a function of file-system metadata only, never of
    the content: a release key built from it cannot tell two neighbouring datasets apart. With a
    ``window``, only the hive partitions that may hold it count, so a new day's partition does not
    change the version (and so the release keys) of days already released.
    """
    files = dataset_files(path, window)
    latest = max(f.stat().st_mtime_ns for f in files)
    stamp = datetime.fromtimestamp(latest / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"mtime:{stamp}" + (f"+{len(files)}files" if len(files) > 1 else "")


def _detect_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".tsv", ".tsv.gz", ".txt", ".txt.gz")):
        # SNAP files are headerless TSV; a TSV with the standard header is read as CSV with tabs.
        opener = gzip.open if name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8", errors="replace") as f:
                first = f.readline()
        except (OSError, EOFError) as exc:
            raise DataError(f"cannot read {path}: {exc}") from exc
        return "tsv" if "user_id" in first.split("\t")[0].lower() else "snap"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    raise DataError(f"cannot tell the format of {path.name}: use .parquet, .csv, .tsv or SNAP .txt(.gz)")


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    names = pq.ParquetFile(path).schema_arrow.names
    # Dictionary-decode string ids: a few hundred distinct cab ids need not become 11 M strings.
    return pq.read_table(path, read_dictionary=[c for c in names if c == "user_id"]).to_pandas()


def _read_frame(path: Path, fmt: str) -> pd.DataFrame:
    try:
        if fmt == "parquet":
            return _read_parquet(path)
        text_opts = {"dtype": str, "keep_default_na": False, "encoding_errors": "replace"}
        if fmt == "csv":
            return pd.read_csv(path, **text_opts)
        if fmt == "tsv":
            return pd.read_csv(path, sep="\t", **text_opts)
        if fmt == "snap":
            # Headerless TSV: columns are named by position ("0", "1", …) so that --columns can
            # map any layout; the 5-column SNAP layout is recognised without a mapping.
            df = pd.read_csv(path, sep="\t", header=None, on_bad_lines="skip", **text_opts)
            df.columns = [str(i) for i in range(df.shape[1])]
            return df
    except FileNotFoundError as exc:
        raise DataError(f"input file not found: {path}") from exc
    except Exception as exc:  # pyarrow / parser errors vary by format; all mean "unreadable"
        raise DataError(f"cannot read {path} as {fmt}: {type(exc).__name__}: {exc}") from exc
    raise DataError(f"unknown format {fmt!r}")


def _to_epoch_seconds(col: pd.Series) -> np.ndarray:
    """int64 seconds UTC; unparseable → INT64_MIN sentinel."""
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_datetime64_any_dtype(col):
        return _numeric_epoch(pd.to_numeric(col, errors="coerce"))
    if pd.api.types.is_datetime64_any_dtype(col):
        ts = col.dt.tz_convert("UTC") if getattr(col.dt, "tz", None) is not None else col.dt.tz_localize("UTC")
    else:
        ts = pd.to_datetime(col, errors="coerce", utc=True, format="ISO8601")
        retry = ts.isna() & col.astype(str).str.strip().ne("")
        if retry.any():
            # Non-ISO layouts (e.g. Foursquare's "Tue Apr 03 18:00:09 +0000 2012"): parse only the
            # rows ISO-8601 missed, element by element, so ISO files stay fast.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ts = ts.copy()
                ts[retry] = pd.to_datetime(col[retry], errors="coerce", utc=True, format="mixed")
    # Naive UTC datetime64 → integer seconds without per-element Timestamp objects.
    naive = ts.dt.tz_convert(None)
    ok = naive.notna().to_numpy()
    secs = naive.to_numpy(dtype="datetime64[s]", na_value=np.datetime64("NaT")).astype(np.int64)
    return np.where(ok, secs, np.iinfo(np.int64).min)


def _numeric_epoch(vals: pd.Series) -> np.ndarray:
    """Numbers are epoch seconds (or milliseconds when they are too large to be seconds)."""
    v = vals.to_numpy(dtype=np.float64, na_value=np.nan)
    out = np.full(v.size, np.iinfo(np.int64).min, dtype=np.int64)
    ok = np.isfinite(v)
    scaled = np.where(np.abs(v) > 1e11, v / 1000.0, v)
    out[ok] = np.floor(scaled[ok]).astype(np.int64)
    return out


def validate_frame(df: pd.DataFrame, strict: bool = False, source: str = "") -> tuple[Points, ValidationReport]:
    """Turn a frame in the standard schema into :class:`Points`, dropping (or rejecting) invalid rows."""
    missing = [c for c in STANDARD_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(
            f"{source or 'input'} is missing column(s) {missing}; it has {list(df.columns)}. "
            "Map other names with --columns user_id=NAME,timestamp=NAME,lat=NAME,lon=NAME"
        )
    report = ValidationReport(rows_read=len(df))
    lat = pd.to_numeric(df["lat"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    lon = pd.to_numeric(df["lon"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ts = _to_epoch_seconds(df["timestamp"])
    # Factorise first (hash-based, O(n)) and judge only the distinct ids: string work on 11 M rows
    # would dominate loading otherwise.
    codes, uniques = pd.factorize(df["user_id"], use_na_sentinel=True)
    unique_str = pd.Index(uniques).astype(str).str.strip()
    bad_unique = np.asarray((unique_str == "") | unique_str.str.lower().isin(["nan", "none", "null", "<na>"]))
    bad_user = (codes < 0) | np.append(bad_unique, True)[codes]
    checks = [
        ("missing_user", bad_user),
        ("bad_coordinate", ~np.isfinite(lat) | ~np.isfinite(lon)),
        ("lat_out_of_range", np.isfinite(lat) & (np.abs(lat) > 90)),
        ("lon_out_of_range", np.isfinite(lon) & (np.abs(lon) > 180)),
        ("bad_timestamp", ts == np.iinfo(np.int64).min),
    ]
    bad = np.zeros(len(df), dtype=bool)
    first_idx, first_reason = None, None
    for reason, mask in checks:
        new = mask & ~bad
        n_new = int(new.sum())
        if n_new:
            report.dropped[reason] = n_new
            idx = int(np.argmax(new))
            if first_idx is None or idx < first_idx:
                first_idx, first_reason = idx, reason
        bad |= mask
    if first_idx is not None:
        report.first_bad_row, report.first_bad_reason = first_idx + 1, first_reason
        if strict:
            row = df.iloc[first_idx][list(STANDARD_COLUMNS)].to_dict()
            raise DataError(f"{source or 'input'}: row {first_idx + 1} is invalid ({first_reason}): {row}")
    keep = ~bad
    report.rows_kept = int(keep.sum())
    if report.rows_kept == 0:
        raise DataError(f"{source or 'input'} has no valid rows ({report.summary()})")
    kept_codes = codes[keep]
    present = np.flatnonzero(np.bincount(kept_codes, minlength=len(uniques)))
    remap = np.full(len(uniques), -1, dtype=np.int64)
    remap[present] = np.arange(present.size)
    user_ids = np.asarray(unique_str)[present]
    pts = Points(remap[kept_codes], ts[keep], lat[keep], lon[keep], user_ids)
    return pts, report


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


_DATA_SUFFIXES = (".parquet", ".pq", ".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz", ".txt.gz")
_PARTITION_DAY = re.compile(r"^(?:date|day|dt)=(\d{4}-\d{2}-\d{2})$")


def dataset_files(path: str | os.PathLike, window: tuple[int | None, int | None] | None = None) -> list[Path]:
    """The data files of an input: one file, a folder (searched recursively, hive folders included) or
    a glob. Hive partitions ``date=YYYY-MM-DD`` (or ``day=``, ``dt=``) wholly outside ``window``
    ([start_s, end_s) UTC) are skipped without being opened."""
    text = str(path)
    if any(c in text for c in "*?["):
        files = sorted(Path(f) for f in glob.glob(text, recursive=True) if Path(f).is_file())
        if not files:
            raise DataError(f"no file matches {text}")
    else:
        p = Path(text)
        if not p.exists():
            raise DataError(f"input file not found: {p}")
        if not p.is_dir():
            return [p]
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.lower().endswith(_DATA_SUFFIXES)
                       and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts))
        if not files:
            raise DataError(f"{p} holds no .parquet, .csv or .tsv files")
    if window is not None:
        files = [f for f in files if _partition_may_overlap(f, window)]
    return files


def _partition_may_overlap(f: Path, window: tuple[int | None, int | None]) -> bool:
    start, end = window
    for part in f.parts:
        m = _PARTITION_DAY.match(part)
        if m:
            day = int(datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC).timestamp())
            if (end is not None and day >= end) or (start is not None and day + 86_400 <= start):
                return False
    return True


def load_points(path: str | os.PathLike, columns: dict[str, str] | None = None, fmt: str = "auto",
                strict: bool = False, window: tuple[int | None, int | None] | None = None) -> LoadResult:
    """Read and validate a point table: one file, a folder of files (hive partitions included) or a glob.

    ``columns`` maps source column names to standard ones (see :func:`parse_column_map`).
    ``fmt`` is ``auto`` (by extension), ``parquet``, ``csv``, ``tsv`` or ``snap``; every file of a folder
    must have the same format. ``window`` skips hive day partitions outside it. The validation report
    counts every row of every file read.
    """
    files = dataset_files(path, window)
    kinds = {(_detect_format(f) if fmt == "auto" else fmt) for f in files}
    if len(kinds) > 1:
        raise DataError(f"{path} mixes formats ({', '.join(sorted(kinds))}); keep one format per input")
    (kind,) = kinds if files else ("parquet",)
    frames = []
    for f in files:
        if f.stat().st_size == 0:
            raise DataError(f"input file is empty: {f}")
        frames.append(_read_frame(f, kind))
    df = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if columns:
        df = df.rename(columns=columns)
    elif kind == "snap":
        if df.shape[1] != len(SNAP_COLUMNS):
            raise DataError(
                f"{path} is a headerless table with {df.shape[1]} columns, not the 5-column SNAP layout "
                "(user, time, lat, lon, location_id); map columns by position, e.g. "
                "--columns user_id=0,timestamp=7,lat=4,lon=5"
            )
        df.columns = list(SNAP_COLUMNS)
    if len(df) == 0:
        raise DataError(f"{path} holds no rows")
    pts, report = validate_frame(df, strict=strict, source=str(path))
    return LoadResult(pts, report, str(path), source_version(path, window))


def clip_to_region(points: Points, region) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(index, x, y) of the points inside a region, projected to metres."""
    x, y = region.project(points.lat, points.lon)
    inside = np.flatnonzero(region.contains_m(x, y))
    return inside, x[inside], y[inside]
