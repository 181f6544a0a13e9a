"""The answer table every reader of a release gets (CLI, Python API): one row per box with its estimate,
its 95% interval, what it counts (the unit) and what the interval covers; all boxes at once."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.estimand import COVERS_NONE, covers_words, honest_intervals, unit_words

#: Columns of an answer table, in order.
BOX_COLUMNS = ["min_lat", "min_lon", "max_lat", "max_lon"]
ANSWER_COLUMNS = [*BOX_COLUMNS, "estimate", "lower", "upper", "unit", "interval_covers"]


class NoiseHalfwidths:
    """The half-widths (below, above) of each answer's interval that are the release's own noise: independent
    between releases, unlike the spread inside cut cells or the bounding's bias.
    (Compared by identity, so pandas can compare the ``attrs`` that carry it.)"""

    def __init__(self, below: np.ndarray, above: np.ndarray):
        self.below, self.above = below, above


def answer_table(synopsis: Synopsis, boxes_latlon: np.ndarray, level: float = 0.95,
                 window_s: tuple[float, float] | None = None) -> pd.DataFrame:
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
    covers = covers_words(synopsis)
    df = pd.DataFrame(boxes_ll, columns=BOX_COLUMNS)
    df["estimate"], df["lower"], df["upper"] = est, lower, upper
    df["unit"] = pd.Categorical.from_codes(np.zeros(len(df), dtype=np.int8), [synopsis.unit().label])
    df["interval_covers"] = pd.Categorical.from_codes(np.isfinite(lower).astype(np.int8), [COVERS_NONE, covers])
    noise = iv.noise or (est - iv.lower, iv.upper - est)
    df.attrs.update({"level": level, "interval_method": method, "unit": synopsis.unit().to_dict(),
                     "unit_words": unit_words(synopsis),
                     "noise_halfwidths": NoiseHalfwidths(*(np.where(np.isfinite(lower), h, np.nan) for h in noise))})
    return df
