"""One file of an input → columns as numpy arrays (a :class:`Part`), ready for vectorised validation.

Parquet goes through pyarrow and reads only the needed columns; numeric, timestamp and integer-id
columns convert to numpy without Python objects. A caller that does not use the user or time column
may let it go unread when the file's own statistics prove every value of it valid (and, for the time,
inside the release window): see :func:`proven_columns`. CSV, TSV and SNAP go through pandas
(every cell a string, as the formats carry no types). Conversions that fail mark the value with a
sentinel (missing user, NaN coordinate, INT64_MIN time); :mod:`dpcore.data.points` turns sentinels into
dropped-row counts.

A user id is one person whatever type a file gives it: an integer column is the id itself; a float
column's whole numbers are that integer (88.0 is user 88) and any other number is an input error;
text "88" is user 88 and so is "88.0" (how float ids look once written as text). Other text ids stay
text. So the same person typed differently in two files is bounded once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpcore.data.inputs import DataError, InputFile, InputSet

STANDARD_COLUMNS = ("user_id", "timestamp", "lat", "lon")
SNAP_COLUMNS = ("user_id", "timestamp", "lat", "lon", "location_id")
TS_MISSING = np.iinfo(np.int64).min
_BAD_ID_TEXT = ["", "nan", "none", "null", "<na>"]
#: Text of a whole number written as a float ("88.0"): the id is the integer before the point.
_INTEGRAL_DECIMAL = r"^(-?(?:0|[1-9][0-9]*))\.0+$"


class NonIntegralIds(DataError):
    """A float user id column holds a number that is not a whole number (or beyond 64-bit integers)."""

    def __init__(self, shown: str = "the input"):
        super().__init__(*[f"{shown}: user_id holds numbers that are not whole; an id must be a whole number or "
                           "text (a float id would merge or split people)"] * 2)

    def __reduce__(self):  # pickled (by a Dask worker) as the plain DataError it is
        return (DataError, (str(self), self.public))


@dataclass
class Part:
    """One file's rows. Users are either integer ids (``user_int`` with ``user_null``) or codes into
    ``uniques`` (string ids, stripped; code -1 = missing)."""

    n: int
    ts: np.ndarray | None  # int64 seconds UTC, TS_MISSING when unparseable; None = unread, proven valid
    lat: np.ndarray  # float64, NaN when unparseable
    lon: np.ndarray
    bad_user: np.ndarray | None  # bool per row, None = no row is bad
    user_int: np.ndarray | None = None
    codes: np.ndarray | None = None
    uniques: pd.Index | None = None
    raw_row: Callable[[int], dict] | None = None  # the standard columns of row i as read, for --strict

    def take(self, keep: np.ndarray) -> Part:
        return Part(int(keep.sum()), None if self.ts is None else self.ts[keep], self.lat[keep], self.lon[keep], None,
                    None if self.user_int is None else self.user_int[keep],
                    None if self.codes is None else self.codes[keep], self.uniques)


# -- column conversions (pandas) ---------------------------------------------------------------
def to_epoch_seconds(col: pd.Series) -> np.ndarray:
    """int64 seconds UTC; unparseable → TS_MISSING."""
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_datetime64_any_dtype(col):
        return numeric_epoch(pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan))
    if pd.api.types.is_datetime64_any_dtype(col):
        ts = col.dt.tz_convert("UTC") if getattr(col.dt, "tz", None) is not None else col.dt.tz_localize("UTC")
    else:
        # Text columns of plain numbers (CSV epoch seconds or milliseconds) are epochs, not dates.
        as_number = pd.to_numeric(col, errors="coerce")
        if as_number.notna().any():
            numbers = as_number.to_numpy(dtype=np.float64, na_value=np.nan)
            if np.isfinite(numbers).all():
                return numeric_epoch(numbers)
            dates = to_epoch_seconds(col.where(as_number.isna()))
            return np.where(np.isfinite(numbers), numeric_epoch(numbers), dates)
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
    return np.where(ok, secs, TS_MISSING)


def numeric_epoch(v: np.ndarray) -> np.ndarray:
    """Numbers are epoch seconds (or milliseconds when they are too large to be seconds)."""
    out = np.full(v.size, TS_MISSING, dtype=np.int64)
    ok = np.isfinite(v)
    scaled = np.where(np.abs(v) > 1e11, v / 1000.0, v)
    out[ok] = np.floor(scaled[ok]).astype(np.int64)
    return out


def _judge_uniques(uniques: Any) -> tuple[pd.Index, np.ndarray]:
    """Stripped string ids (a whole number written as a float, "88.0", as its integer "88") and which
    of them mean 'no user' (blank, nan, null, …)."""
    text = pd.Index(uniques).astype(str).str.strip().str.replace(_INTEGRAL_DECIMAL, r"\1", regex=True)
    return text, np.asarray((text == "") | text.str.lower().isin(_BAD_ID_TEXT))


def _coded_users(codes: np.ndarray, uniques: Any) -> tuple[np.ndarray, pd.Index, np.ndarray | None]:
    text, bad_unique = _judge_uniques(uniques)
    codes = codes.astype(np.int64, copy=False)
    bad = (codes < 0) | np.append(bad_unique, True)[codes]
    return codes, text, (bad if bad.any() else None)


def _float_ids(values: np.ndarray, part: Part) -> None:
    """Float ids: a whole number is that integer id (as in an integer file), NaN a missing user, and
    anything else an input error (:class:`NonIntegralIds`)."""
    ok = np.isfinite(values)
    v = values[ok]
    if (v != np.floor(v)).any() or (np.abs(v) >= 2.0 ** 63).any():
        raise NonIntegralIds()
    ints = np.zeros(values.size, dtype=np.int64)
    ints[ok] = v.astype(np.int64)
    part.user_int, part.bad_user = ints, (None if ok.all() else ~ok)


def part_from_frame(df: pd.DataFrame) -> Part:
    """A frame with the standard columns (any dtypes) → :class:`Part`."""
    lat = pd.to_numeric(df["lat"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    lon = pd.to_numeric(df["lon"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ts = to_epoch_seconds(df["timestamp"])
    raw_row = lambda i: df.iloc[i][list(STANDARD_COLUMNS)].to_dict()  # noqa: E731
    if pd.api.types.is_float_dtype(df["user_id"]):
        part = Part(len(df), ts, lat, lon, None, raw_row=raw_row)
        _float_ids(df["user_id"].to_numpy(dtype=np.float64, na_value=np.nan), part)
        return part
    # Factorise first (hash-based, O(n)) and judge only the distinct ids: string work on every row
    # would dominate loading otherwise.
    codes, uniques = pd.factorize(df["user_id"], use_na_sentinel=True)
    codes, text, bad = _coded_users(codes, uniques)
    return Part(len(df), ts, lat, lon, bad, codes=codes, uniques=text, raw_row=raw_row)


# -- column conversions (arrow) ----------------------------------------------------------------
def _np(col: Any, fill: Any) -> np.ndarray:
    """A chunked column as numpy; nulls become ``fill`` (no copy pass when there are none)."""
    return (col.fill_null(fill) if col.null_count else col).to_numpy()


def _arrow_float(col: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return _np(pc.cast(col, pa.float64()), np.nan)
    return pd.to_numeric(col.to_pandas(), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _arrow_epoch(col: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        if pa.types.is_date(t):
            col, factor = pc.cast(pc.cast(col, pa.timestamp("s")), pa.int64()), 1
        else:
            factor = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[t.unit]
            col = pc.cast(col, pa.int64())  # timestamps are stored as UTC ticks, with or without a tz
        vals = _np(col, TS_MISSING)
        secs = vals // factor if factor != 1 else vals.copy()
        if col.null_count:
            secs[vals == TS_MISSING] = TS_MISSING
        return secs
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return numeric_epoch(_np(pc.cast(col, pa.float64()), np.nan))
    return to_epoch_seconds(col.to_pandas())


def _arrow_users(col: Any, part: Part) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if pa.types.is_integer(t) and not (pa.types.is_uint64(t)):
        part.user_int = _np(pc.cast(col, pa.int64()), 0)
        part.bad_user = col.is_null().to_numpy() if col.null_count else None
        return
    if pa.types.is_floating(t):
        _float_ids(_np(pc.cast(col, pa.float64()), np.nan), part)
        return
    if pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_string_view(t):
        # Dictionary-read columns only need their row groups' dictionaries merged; others take one
        # hash pass in arrow. Either way only the distinct ids (few) are judged as text.
        if pa.types.is_dictionary(t):
            enc = col.unify_dictionaries()
        else:
            enc = pc.dictionary_encode(col.cast(pa.string()) if pa.types.is_string_view(t) else col)
        chunks = enc.chunks
        if not chunks:
            part.codes, part.uniques, part.bad_user = np.empty(0, np.int64), pd.Index([], dtype=str), None
            return
        codes = np.concatenate([c.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
                                for c in chunks])
        dictionary = chunks[0].dictionary
        if pa.types.is_dictionary(dictionary.type):
            dictionary = dictionary.dictionary_decode()
        part.codes, part.uniques, part.bad_user = _coded_users(codes, dictionary.to_pandas())
        return
    codes, uniques = pd.factorize(col.to_pandas(), use_na_sentinel=True)
    part.codes, part.uniques, part.bad_user = _coded_users(codes, uniques)


def _raw_value(col: Any, i: int) -> Any:
    """Row ``i`` of an arrow column as Python, for a --strict error's row; a date or time Python cannot
    hold (a year past 9999) as arrow writes it: the row --strict names is often the one that is wrong."""
    scalar = col[i]
    try:
        return scalar.as_py()
    except (OverflowError, ValueError):
        return repr(scalar)  # e.g. <pyarrow.TimestampScalar: '5321-08-18T05:20:00'>


def part_from_table(table: Any) -> Part:
    """An arrow table with the standard columns (a column left out is unread: None in the Part) →
    :class:`Part`, vectorised."""
    names = table.column_names
    part = Part(table.num_rows, _arrow_epoch(table.column("timestamp")) if "timestamp" in names else None,
                _arrow_float(table.column("lat")), _arrow_float(table.column("lon")), None,
                raw_row=lambda i: {c: _raw_value(table.column(c), i) for c in STANDARD_COLUMNS if c in names})
    if "user_id" in names:
        _arrow_users(table.column("user_id"), part)
    return part


def _no_nulls(meta: Any, name: str) -> list | None:
    """Each row group's statistics of top-level column ``name`` when they all say it holds no null
    (None when any row group lacks them or has a null)."""
    stats = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        col = next((rg.column(j) for j in range(rg.num_columns) if rg.column(j).path_in_schema == name), None)
        st = None if col is None else col.statistics
        if st is None or not st.has_null_count or st.null_count:
            return None
        stats.append(st)
    return stats


def proven_columns(pf: Any, want: dict[str, str], skip: frozenset[str],
                   window: tuple[int | None, int | None]) -> set[str]:
    """Which of the ``skip`` standard columns ("user_id", "timestamp") need not be read from this
    Parquet file: its statistics show no null in any row group of an integer user column (whose every
    non-null value is a valid id), or of an INT64 timestamp column whose min and max lie in ``window``
    (start ≤ t < end, so no row falls outside it). Other types are read and validated row by row."""
    import pyarrow as pa

    schema, meta = pf.schema_arrow, pf.metadata
    proven = set()
    user = want["user_id"]
    if "user_id" in skip and user in schema.names:
        t = schema.field(user).type
        if pa.types.is_integer(t) and not pa.types.is_uint64(t) and _no_nulls(meta, user) is not None:
            proven.add("user_id")
    ts = want["timestamp"]
    if "timestamp" in skip and ts in schema.names and pa.types.is_timestamp(schema.field(ts).type):
        stats = _no_nulls(meta, ts)
        factor = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[schema.field(ts).type.unit]
        start, end = window
        if stats is not None and all(st.physical_type == "INT64" and st.has_min_max for st in stats):
            lo = min(int(st.min_raw) for st in stats) // factor if stats else 0
            hi = max(int(st.max_raw) for st in stats) // factor if stats else 0
            if (start is None or lo >= start) and (end is None or hi < end):
                proven.add("timestamp")
    return proven


# -- reading one file --------------------------------------------------------------------------
def release_arrow_memory() -> None:
    """Hand a read file's freed arrow buffers back to the OS: arrow's allocator keeps them cached
    otherwise, and the process's peak (every worker's, on a cluster) would hold a dead copy of a file."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def sources_for(columns: dict[str, str] | None) -> dict[str, str]:
    """Standard name → source column name, from a source→standard mapping."""
    inverse = {std: src for src, std in (columns or {}).items()}
    return {std: inverse.get(std, std) for std in STANDARD_COLUMNS}


def missing_columns(shown: str, missing: list[str], has: list[str]) -> DataError:
    """The error for an input without some standard columns."""
    # a headerless file's "columns" are its first row: only the missing standard names are public
    return DataError(f"{shown} is missing column(s) {missing}; it has {has}. "
                     "Map other names with --columns user_id=NAME,timestamp=NAME,lat=NAME,lon=NAME",
                     public=f"{shown} is missing column(s) {missing}; map names with --columns")


def _check_coordinate_types(shown: str, types: dict[str, Any]) -> None:
    """lat and lon are numbers (or text read as numbers): a boolean column would read as 0.0 and 1.0,
    every row a valid coordinate. A column's type is schema, public like its name."""
    import pyarrow as pa

    for std, t in types.items():
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)):
            raise DataError.all_public(f"{shown}: column {std} holds {t} values, not numbers; "
                                       "map a numeric column with --columns")


def _check_unique_header(shown: str, names: list[str], wanted: dict[str, str]) -> None:
    """A header naming a used column twice: pandas keeps the first and renames the second NAME.1, so the
    input would be read from whichever came first. Header names are public, like missing columns."""
    for src in wanted.values():
        if src in names and f"{src}.1" in names:
            raise DataError.all_public(f"{shown} has two columns named {src!r} (the second read as "
                                       f"'{src}.1'); keep one, or rename one and map it with --columns")


def _read_parquet(inp: InputSet, f: InputFile, columns: dict[str, str] | None, shown: str,
                  skip: frozenset[str], window: tuple[int | None, int | None], threads: bool) -> Part:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = f.path if inp.local else inp.fs.open(f.path, "rb")
    try:
        pf = pq.ParquetFile(src, memory_map=inp.local)
        has = pf.schema_arrow.names
        want = sources_for(columns)
        missing = [std for std, s in want.items() if s not in has and s not in f.partition]
        if missing:
            raise missing_columns(shown, missing, has)
        _check_coordinate_types(shown, {std: pf.schema_arrow.field(s).type for std, s in want.items()
                                        if std in ("lat", "lon") and s in has})
        unread = proven_columns(pf, want, skip, window) if skip else set()
        want = {std: s for std, s in want.items() if std not in unread}
        from_file = sorted({s for s in want.values() if s in has})
        # String ids are read as dictionaries: a few thousand distinct ids need not become millions of
        # strings (parquet stores them dictionary-encoded already).
        user = want.get("user_id")
        utype = pf.schema_arrow.field(user).type if user in has else None
        as_dict = [user] if utype is not None and (pa.types.is_string(utype) or pa.types.is_large_string(utype)) \
            else []
        table = pf.read(columns=from_file, use_threads=threads) if not as_dict else pq.ParquetFile(
            src, read_dictionary=as_dict, memory_map=inp.local).read(columns=from_file, use_threads=threads)
    finally:
        if not inp.local:
            src.close()
    n = table.num_rows
    cols = {}
    for std, s in want.items():
        if s in has:
            cols[std] = table.column(s)
        else:  # a hive partition key used as a column: one dictionary entry, no per-row strings
            cols[std] = pa.chunked_array([pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, dtype=np.int32)), pa.array([f.partition[s]]))])
    return part_from_table(pa.table(cols))


def _read_text(inp: InputSet, f: InputFile, columns: dict[str, str] | None, shown: str) -> Part:
    src = f.path if inp.local else inp.fs.open(f.path, "rb", compression="infer")
    text_opts = {"dtype": str, "keep_default_na": False, "encoding_errors": "replace"}
    try:
        if f.fmt == "csv":
            df = pd.read_csv(src, **text_opts)
        elif f.fmt == "tsv":
            df = pd.read_csv(src, sep="\t", **text_opts)
        else:
            # Headerless TSV: columns are named by position ("0", "1", …) so that --columns can
            # map any layout; the 5-column SNAP layout is recognised without a mapping.
            # a line with more fields than the first is not read; it is counted as an invalid row
            # (so the report and --strict see it), never dropped silently
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", pd.errors.ParserWarning)
                df = pd.read_csv(src, sep="\t", header=None, on_bad_lines="warn", **text_opts)
            bad = sum(str(w.message).count("Skipping line") for w in caught
                      if issubclass(w.category, pd.errors.ParserWarning))
            df.columns = [str(i) for i in range(df.shape[1])]
            if bad:
                df = pd.concat([df, pd.DataFrame("", index=range(bad), columns=df.columns)], ignore_index=True)
    finally:
        if not inp.local:
            src.close()
    if f.fmt != "snap":
        _check_unique_header(shown, list(df.columns), sources_for(columns))
    if columns:
        df = df.rename(columns=columns)
    elif f.fmt == "snap":
        if df.shape[1] != len(SNAP_COLUMNS):
            raise DataError(
                f"{shown} is a headerless table with {df.shape[1]} columns, not the 5-column SNAP layout "
                "(user, time, lat, lon, location_id); map columns by position, e.g. "
                "--columns user_id=0,timestamp=7,lat=4,lon=5",
                public=f"{shown} is not in the 5-column SNAP layout; map columns by position with --columns",
            )
        df.columns = list(SNAP_COLUMNS)
    for key, value in f.partition.items():
        std = (columns or {}).get(key, key)
        if std in STANDARD_COLUMNS and std not in df.columns:
            df[std] = value
    missing = [c for c in STANDARD_COLUMNS if c not in df.columns]
    if missing:
        raise missing_columns(shown, missing, list(df.columns))
    return part_from_frame(df)


def read_part(inp: InputSet, f: InputFile, columns: dict[str, str] | None, skip: frozenset[str] = frozenset(),
              window: tuple[int | None, int | None] = (None, None), threads: bool = True) -> Part:
    """Read one file of an input into a :class:`Part`; every failure is a one-line DataError.

    ``skip``: standard columns the caller does not use, left unread (None in the Part) where
    :func:`proven_columns` proves them valid and inside ``window``. ``threads``: let arrow decode
    columns in parallel (off where the caller already runs one file per core)."""
    shown = inp.display(f)
    if f.size == 0:
        raise DataError.all_public(f"input file is empty: {shown}")
    try:
        if f.fmt == "parquet":
            return _read_parquet(inp, f, columns, shown, skip, window, threads)
        return _read_text(inp, f, columns, shown)
    except NonIntegralIds:
        raise NonIntegralIds(shown) from None
    except DataError:
        raise
    except FileNotFoundError as exc:
        raise DataError.all_public(f"input file not found: {shown}") from exc
    except Exception as exc:  # pyarrow / parser / network errors vary by format; all mean "unreadable"
        msg = " ".join(str(exc).split())[:300]
        # a parser's message may quote a line of the file or its number: public names only the file
        raise DataError(f"cannot read {shown} as {f.fmt}: {type(exc).__name__}: {msg}",
                        public=f"cannot read {shown} as {f.fmt}") from exc
