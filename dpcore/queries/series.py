"""Answers over several releases of one place: a time series, one row per period, and the sum over the
window with its combined interval. Each release drew its own noise, independently of the others, so the
sum's error is the sum of independent errors: noise-only half-widths add in quadrature (exact for
normal noise, conservative for Laplace-tailed noise, whose sums are closer to normal than their parts);
intervals that also cover the bias of bounding each person to k points or the spread inside partly covered
cells add linearly, since the same people's bias and the same venues' spread recur in every period.
Post-processing of the releases only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.queries.answers import BOX_COLUMNS

#: The ``period`` of the rows that sum a window.
SUM_PERIOD = "sum"


def sum_rows(per_period: pd.DataFrame, window_label: str) -> pd.DataFrame:
    """One row per box: Σ estimates over the periods of ``per_period`` (an answer table with a ``period``
    column, the same boxes in every period) and the combined interval (NaN unless every period has one)."""
    periods = per_period["period"].unique()
    n_boxes = len(per_period) // max(len(periods), 1)
    est = per_period["estimate"].to_numpy().reshape(len(periods), n_boxes)
    lo = per_period["lower"].to_numpy(dtype=np.float64).reshape(len(periods), n_boxes)
    hi = per_period["upper"].to_numpy(dtype=np.float64).reshape(len(periods), n_boxes)
    covers = set(per_period["interval_covers"].astype(str))
    units = set(per_period["unit"].astype(str))
    if "none" in covers or len(units) != 1:
        total, lower, upper = est.sum(axis=0), np.full(n_boxes, np.nan), np.full(n_boxes, np.nan)
        cover = "none"
    else:
        cover = covers.pop() if len(covers) == 1 else "mixed"
        total, lower, upper = combine_sum(est, lo, hi, cover)
    out = per_period.iloc[:n_boxes][BOX_COLUMNS].copy().reset_index(drop=True)
    out.insert(0, "period", f"{SUM_PERIOD} {window_label}")
    out["estimate"], out["lower"], out["upper"] = total, lower, upper
    out["unit"] = units.pop() if len(units) == 1 else "mixed"
    out["interval_covers"] = cover
    return out


def combine_sum(est, lower, upper, covers: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ estimates, lower, upper) over periods (rows of ``est``, ``lower``, ``upper``: periods × boxes) of
    independent releases whose intervals cover ``covers``."""
    est, lo, hi = (np.asarray(v, dtype=np.float64) for v in (est, lower, upper))
    total = est.sum(axis=0)
    if covers == "noise":
        return (total, total - np.sqrt(np.sum((est - lo) ** 2, axis=0)),
                total + np.sqrt(np.sum((hi - est) ** 2, axis=0)))
    return total, total - np.sum(est - lo, axis=0), total + np.sum(hi - est, axis=0)


def sum_method(covers: str) -> str:
    if covers == "noise":
        return "sum of independent releases: half-widths added in quadrature"
    if covers in ("none", "mixed"):
        return "none: a period has no interval or the periods count different units"
    return ("sum of releases: half-widths added (the bounding bias and the spread inside cut cells recur in "
            "every period where people pile up, so they are not averaged out)")
