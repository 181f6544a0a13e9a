"""An answer table as CSV or JSON text, every row at once: numbers formatted by Arrow's compute kernels and
rows joined element-wise, never a Python call per row or per cell (a million boxes are written in about a
second, where pandas' ``to_csv(float_format=…)`` formats each cell in Python)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpcore.queries.answers import Answers, Words

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


def _arrow(x: np.ndarray) -> pa.Array:
    """A float64, int64 or bool numpy array as an Arrow array over the same memory (bools packed to bits).
    ``pa.array`` would import pandas to check for its types: 0.4 CPU-s of a command's start."""
    x = np.ascontiguousarray(x)
    if x.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(x), [None, pa.py_buffer(np.packbits(x, bitorder="little"))])
    kind = {np.dtype(np.float64): pa.float64(), np.dtype(np.int64): pa.int64()}[x.dtype]
    return pa.Array.from_buffers(kind, len(x), [None, pa.py_buffer(x)])


def _arrow_strings(words: list[str]) -> pa.Array:
    """A short list of str as an Arrow string array (built from its buffers, as :func:`_arrow`)."""
    data = [w.encode() for w in words]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def _lit(text: str) -> pa.Scalar:
    """A str as an Arrow scalar for compute kernels (taken from an array: converting a Python str imports
    pandas, as ``pa.array`` does)."""
    return _arrow_strings([text])[0]


def _numbers(x: np.ndarray, missing: str, floats: bool) -> pa.Array:
    """Shortest round-trip text of each value (Arrow's cast), ``missing`` where not finite; ``floats``:
    integral values keep a ``.0`` (a JSON reader then reads a float, as it did)."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    text = pc.cast(_arrow(np.where(finite, x, 0.0)), pa.string())
    if floats:  # Arrow writes 3.0 as "3" (and 1e16 as "1e+16")
        whole = finite & (x == np.floor(x)) & (np.abs(x) < 1e16)
        if whole.any():
            mask = _arrow(whole)
            text = pc.replace_with_mask(text, mask, pc.binary_join_element_wise(text.filter(mask), _lit(".0"),
                                                                                _lit("")))
    if not finite.all():
        text = pc.if_else(_arrow(finite), text, _lit(missing))
    return text


class _Texts:
    """A column of a few distinct texts: per row an index into ``texts``; :meth:`of` quotes each distinct word
    of a Words column once (index 0: no word)."""

    def __init__(self, index: np.ndarray, texts: list[str]):
        self.index, self.texts = index, texts

    @classmethod
    def of(cls, col: Words, quote) -> _Texts:
        return cls(np.asarray(col.codes, dtype=np.int64) + 1, [quote(None)] + [quote(str(w)) for w in col.words])


def _folded(parts: list) -> list:
    """``parts`` (literal str, Arrow string arrays, :class:`_Texts`) with neighbouring literals and text
    columns made one text column (each distinct combination's text built once), and the rest as Arrow
    arrays: the same rows, with fewer parts for Arrow's join to append row by row."""
    out: list = []
    for p in parts:
        prev = out[-1] if out else None
        if isinstance(p, str) and isinstance(prev, str):
            out[-1] = prev + p
        elif isinstance(p, str) and isinstance(prev, _Texts):
            out[-1] = _Texts(prev.index, [t + p for t in prev.texts])
        elif isinstance(p, _Texts) and isinstance(prev, str):
            out[-1] = _Texts(p.index, [prev + t for t in p.texts])
        elif isinstance(p, _Texts) and isinstance(prev, _Texts):
            out[-1] = _Texts(prev.index * len(p.texts) + p.index, [a + b for a in prev.texts for b in p.texts])
        else:
            out.append(p)
    return [_lit(p) if isinstance(p, str) else
            pc.take(_arrow_strings(p.texts), _arrow(p.index)) if isinstance(p, _Texts) else p for p in out]


def columns_of(table: Any) -> tuple[dict[str, np.ndarray | Words], dict]:
    """(columns in order, attrs) of an :class:`Answers` or a DataFrame: numbers as float64 arrays, anything
    else as Words (a DataFrame's text through its categories)."""
    if isinstance(table, Answers):
        return table.columns, table.attrs
    import pandas as pd

    cols: dict[str, np.ndarray | Words] = {}
    for c in table.columns:
        s = table[c]
        if pd.api.types.is_float_dtype(s.dtype) or pd.api.types.is_integer_dtype(s.dtype):
            cols[c] = s.to_numpy(dtype=np.float64)
        else:
            cat = s.astype("category") if not isinstance(s.dtype, pd.CategoricalDtype) else s
            cols[c] = Words(cat.cat.codes.to_numpy(), [str(w) for w in cat.cat.categories])
    return cols, table.attrs


def texts_of(col: Words) -> list:
    """Each row's word (None where it has none)."""
    words = [*col.words, None]  # code -1 reads the last
    return [words[c] for c in np.asarray(col.codes).tolist()]


def _csv_field(s: str | None) -> str:
    if s is None:
        return ""
    return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n\r') else s


def _join(parts: list, sep: str) -> memoryview:
    """Rows of ``parts`` (literal str, Arrow string arrays, :class:`_Texts`) joined by ``sep``: one pass of
    Arrow's join."""
    return _text_of(pc.binary_join_element_wise(*_folded(parts), _lit(sep)))


def _text_of(rows: pa.Array) -> memoryview:
    """The concatenation of the strings of a string array: its data buffer between the first and last offset,
    not copied."""
    if not len(rows):
        return memoryview(b"")
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=rows.offset + len(rows) + 1)[rows.offset:]
    return memoryview(rows.buffers()[2])[offsets[0]:offsets[-1]]


def csv_bytes(table: Any) -> list:
    """The table (an Answers or a DataFrame) as CSV (a header row; estimates and bounds to CSV_DIGITS
    significant digits, coordinates as read, empty where NaN; text quoted where it holds a comma or a quote)."""
    cols, _ = columns_of(table)
    header = (",".join(_csv_field(str(c)) for c in cols) + "\n").encode()
    if not len(table):
        return [header]
    parts: list = []
    for name, col in cols.items():
        if parts:
            parts.append(",")
        if isinstance(col, Words):
            parts.append(_Texts.of(col, _csv_field))
        else:
            parts.append(_numbers(col if name in BOX else round_significant(col, CSV_DIGITS), "", floats=False))
    return [header, _join([*parts, "\n"], "")]


def _json_string(s: str | None) -> str:
    return "null" if s is None else json.dumps(s, ensure_ascii=False)


def json_bytes(table: Any, first: dict | None = None) -> list:
    """The table (an Answers or a DataFrame) as one JSON array of records (keys: ``period`` where the table has
    periods, ``box``, estimate, lower, upper, unit, interval_covers, ``interval``, ``note`` where the table has
    notes; numbers to JSON_DECIMALS decimal places, null where NaN); ``first``: more keys of the first record
    alone."""
    if not len(table):
        return [b"[]\n"]
    cols, attrs = columns_of(table)
    num = {c: _numbers(np.round(cols[c], JSON_DECIMALS), "null", floats=True)
           for c in (*BOX, "estimate", "lower", "upper")}
    parts: list = ["{"]
    if "period" in cols:
        parts += ['"period":', _Texts.of(cols["period"], _json_string), ","]
    parts += ['"box":[', num["min_lat"], ",", num["min_lon"], ",", num["max_lat"], ",", num["max_lon"], "],"]
    for c in ("estimate", "lower", "upper"):
        parts += [f'"{c}":', num[c], ","]
    parts += ['"unit":', _Texts.of(cols["unit"], _json_string), ',"interval_covers":',
              _Texts.of(cols["interval_covers"], _json_string), f',"interval":"{attrs["level"]:.0%}"']
    if "note" in cols:  # a band the release is expected to serve worse than a blank map
        parts += [',"note":', _Texts.of(cols["note"], _json_string)]
    text = _join([*parts, "},"], "")[:-1]  # the last record takes no comma
    head = "".join(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}," for k, v in (first or {}).items())
    return [b"[{" + head.encode(), text[1:], b"]\n"]
