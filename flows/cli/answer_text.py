"""An answer table as CSV or JSON text, every row at once: numbers formatted by Arrow's compute kernels and
rows joined element-wise, never a Python call per row or per cell (a million boxes are written in about a
second, where pandas' ``to_csv(float_format=…)`` formats each cell in Python)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

BOX = ["min_lat", "min_lon", "max_lat", "max_lon"]
#: Significant digits of a CSV's estimates and bounds (what ``%.6g`` printed); coordinates are written as read.
CSV_DIGITS = 6
#: Decimal places of JSON numbers (what ``DataFrame.to_json(double_precision=10)`` wrote).
JSON_DECIMALS = 10


def round_significant(x: np.ndarray, digits: int) -> np.ndarray:
    """x rounded to ``digits`` significant digits (as ``%.{digits}g`` rounds); 0, NaN and ±inf unchanged."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    ok = np.isfinite(x) & (x != 0)
    v = x[ok]
    d = digits - 1 - np.floor(np.log10(np.abs(v))).astype(np.int64)
    # numpy's round: multiply by an exact power of ten (or divide, for negative decimals), rint, undo
    up = d >= 0
    scale = 10.0 ** np.abs(d)
    out[ok] = np.where(up, np.rint(v * np.where(up, scale, 1.0)) / np.where(up, scale, 1.0),
                       np.rint(v / np.where(up, 1.0, scale)) * np.where(up, 1.0, scale))
    return out


def _numbers(x: np.ndarray, missing: str, floats: bool) -> pa.Array:
    """Shortest round-trip text of each value (Arrow's cast), ``missing`` where not finite; ``floats``:
    integral values keep a ``.0`` (a JSON reader then reads a float, as it did)."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    text = pc.cast(pa.array(np.where(finite, x, 0.0)), pa.string())
    if floats:  # Arrow writes 3.0 as "3" (and 1e16 as "1e+16")
        whole = finite & (x == np.floor(x)) & (np.abs(x) < 1e16)
        if whole.any():
            text = pc.replace_with_mask(text, pa.array(whole),
                                        pc.binary_join_element_wise(text.filter(pa.array(whole)), ".0", ""))
    if not finite.all():
        text = pc.if_else(pa.array(finite), text, missing)
    return text


def _strings(values: pd.Series, quote) -> pa.Array:
    """Each value through ``quote`` (a function of one str; None/NaN: quote(None)), computed once per distinct
    value."""
    cat = values.astype("category") if not isinstance(values.dtype, pd.CategoricalDtype) else values
    words = [quote(None)] + [quote(str(c)) for c in cat.cat.categories]
    return pc.take(pa.array(words, pa.string()), pa.array(cat.cat.codes.to_numpy().astype(np.int64) + 1))


def _csv_field(s: str | None) -> str:
    if s is None:
        return ""
    return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n\r') else s


def _join(parts: list, sep: str) -> memoryview:
    """Rows of ``parts`` (Arrow string arrays or literal str) joined by ``sep``, each row ending in a newline."""
    return _text_of(pc.binary_join_element_wise(*parts, "\n", "") if not sep else
                    pc.binary_join_element_wise(pc.binary_join_element_wise(*parts, sep), "\n", ""))


def _text_of(rows: pa.Array) -> memoryview:
    """The concatenation of the strings of a string array: its data buffer between the first and last offset,
    not copied."""
    if not len(rows):
        return memoryview(b"")
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=rows.offset + len(rows) + 1)[rows.offset:]
    return memoryview(rows.buffers()[2])[offsets[0]:offsets[-1]]


def csv_bytes(table: pd.DataFrame) -> list:
    """The table as CSV (a header row; estimates and bounds to CSV_DIGITS significant digits, coordinates as
    read, empty where NaN; text quoted where it holds a comma or a quote)."""
    header = (",".join(_csv_field(str(c)) for c in table.columns) + "\n").encode()
    if not len(table):
        return [header]
    parts = []
    for col in table.columns:
        s = table[col]
        if pd.api.types.is_float_dtype(s.dtype) or pd.api.types.is_integer_dtype(s.dtype):
            x = s.to_numpy(dtype=np.float64)
            parts.append(_numbers(x if col in BOX else round_significant(x, CSV_DIGITS), "", floats=False))
        else:
            parts.append(_strings(s, _csv_field))
    return [header, _join(parts, ",")]


def _json_string(s: str | None) -> str:
    return "null" if s is None else json.dumps(s, ensure_ascii=False)


def json_bytes(table: pd.DataFrame, first: dict | None = None) -> list:
    """The table as one JSON array of records (keys: ``period`` where the table has periods, ``box``,
    estimate, lower, upper, unit, interval_covers, ``interval``, ``note`` where the table has notes; numbers
    to JSON_DECIMALS decimal places, null where NaN); ``first``: more keys of the first record alone."""
    if not len(table):
        return [b"[]\n"]
    num = {c: _numbers(np.round(table[c].to_numpy(dtype=np.float64), JSON_DECIMALS), "null", floats=True)
           for c in (*BOX, "estimate", "lower", "upper")}
    parts: list = ["{"]
    if "period" in table.columns:
        parts += ['"period":', _strings(table["period"].astype(str), _json_string), ","]
    parts += ['"box":[', num["min_lat"], ",", num["min_lon"], ",", num["max_lat"], ",", num["max_lon"], "],"]
    for c in ("estimate", "lower", "upper"):
        parts += [f'"{c}":', num[c], ","]
    parts += ['"unit":', _strings(table["unit"], _json_string), ',"interval_covers":',
              _strings(table["interval_covers"], _json_string), f',"interval":"{table.attrs["level"]:.0%}"']
    if "note" in table.columns:  # a band the release is expected to serve worse than a blank map
        parts += [',"note":', _strings(table["note"], _json_string)]
    text = _text_of(pc.binary_join_element_wise(*parts, "},", ""))[:-1]  # the last record takes no comma
    head = "".join(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}," for k, v in (first or {}).items())
    return [b"[{" + head.encode(), text[1:], b"]\n"]
