"""The answer table every reader of a release gets (CLI, Python API): one row per box with its estimate,
its 95% interval, what it counts (the unit) and what the interval covers; all boxes at once.

:func:`answers` computes the columns as numpy arrays (what the CLI writes, without importing pandas);
:func:`answer_table` gives them as a DataFrame (the Python API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.estimand import COVERS_NONE, covers_words, honest_intervals, unit_words

if TYPE_CHECKING:
    import pandas as pd

#: Columns of an answer table, in order.
BOX_COLUMNS = ["min_lat", "min_lon", "max_lat", "max_lon"]
ANSWER_COLUMNS = [*BOX_COLUMNS, "estimate", "lower", "upper", "unit", "interval_covers"]


class NoiseHalfwidths:
    """The half-widths (below, above) of each answer's interval that are the release's own noise: independent
    between releases, unlike the spread inside cut cells or the bounding's bias.
    (Compared by identity, so pandas can compare the ``attrs`` that carry it.)"""

    def __init__(self, below: np.ndarray, above: np.ndarray):
        self.below, self.above = below, above


@dataclass
class Words:
    """A column of a few distinct words: per row, an index into ``words`` (-1: none), as a pandas
    Categorical holds them."""

    codes: np.ndarray
    words: list[str]


@dataclass
class Answers:
    """An answer table's columns in order (float arrays; ``Words`` for text) and its ``attrs``."""

    columns: dict[str, np.ndarray | Words]
    attrs: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["estimate"])


def answers(synopsis: Synopsis, boxes_latlon: np.ndarray, level: float = 0.95,
            window_s: tuple[float, float] | None = None) -> Answers:
    """Estimates and intervals of (q, 4) lat/lon boxes; ``window_s``: a [start, end) window in UTC
    seconds of a spatio-temporal release. ``attrs`` carry the interval's level and method, and the half-widths
    (below, above) of the release's own noise alone (``noise_halfwidths``), which a sum over independent
    releases adds in quadrature."""
    boxes_ll = np.atleast_2d(np.asarray(boxes_latlon, dtype=np.float64))
    boxes_m = synopsis.region.box_latlon_to_m(boxes_ll)
    if window_s is None:
        est, iv = synopsis.intervals(boxes_m, level)
    else:
        n = len(boxes_m)
        est, iv = synopsis.window_intervals(boxes_m, np.full(n, float(window_s[0])), np.full(n, float(window_s[1])),
                                            level)
    lower, upper, method = honest_intervals(synopsis, iv.lower, iv.upper, iv.method)
    known = np.isfinite(lower)
    columns: dict[str, np.ndarray | Words] = {c: boxes_ll[:, i] for i, c in enumerate(BOX_COLUMNS)}
    columns.update({"estimate": est, "lower": lower, "upper": upper,
                    "unit": Words(np.zeros(len(est), dtype=np.int8), [synopsis.unit().label]),
                    "interval_covers": Words(known.astype(np.int8), [COVERS_NONE, covers_words(synopsis)])})
    noise = iv.noise or (est - iv.lower, iv.upper - est)
    return Answers(columns, {"level": level, "interval_method": method, "unit": synopsis.unit().to_dict(),
                             "unit_words": unit_words(synopsis),
                             "noise_halfwidths": NoiseHalfwidths(*(np.where(known, h, np.nan) for h in noise))})


def answer_table(synopsis: Synopsis, boxes_latlon: np.ndarray, level: float = 0.95,
                 window_s: tuple[float, float] | None = None) -> pd.DataFrame:
    """:func:`answers` as a DataFrame (``unit`` and ``interval_covers`` categorical; the same ``attrs``)."""
    import pandas as pd

    a = answers(synopsis, boxes_latlon, level, window_s)
    boxes_ll = np.atleast_2d(np.asarray(boxes_latlon, dtype=np.float64))
    df = pd.DataFrame(boxes_ll, columns=BOX_COLUMNS)
    for name, col in a.columns.items():
        if name not in BOX_COLUMNS:
            df[name] = pd.Categorical.from_codes(col.codes, col.words) if isinstance(col, Words) else col
    df.attrs.update(a.attrs)
    return df
