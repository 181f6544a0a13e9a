"""Answers over several releases of one place: a time series, one row per period, and the sum over the
window with its combined interval. Each release drew its own noise, independently of the others, so the
sum's error is the sum of independent errors: noise-only half-widths add in quadrature (exact for
normal noise, conservative for Laplace-tailed noise, whose sums are closer to normal than their parts);
of intervals that also cover the bias of bounding each person to k points or the spread inside partly
covered cells, each release's own noise adds in quadrature and the rest as recurring errors
(:data:`RECURRING`), since the same people's bias and the same venues' spread recur from period to period.
Post-processing of the releases only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.queries.answers import BOX_COLUMNS
from dpcore.synopsis.spread import add_halfwidths, rest_of

#: Correlation ρ of the non-noise part (spread in cut cells, bounding bias) between periods: the periods'
#: parts r add as √((1 − ρ)·Σr² + ρ·(Σr)²), between independent (0) and the same every period (1). On daily
#: record-level releases of Gowalla NYC (bench/fit_spread.py --daily) ρ = 1 came nearest 0.95 over 3- and
#: 7-day sums (rms 0.039 from 0.95; ρ = 0.3: 0.087, 25–100 m 3-day sums of UG 0.65): a venue in a small
#: box is cut the same way every day.
RECURRING = 1.0

#: The ``period`` of the rows that sum a window.
SUM_PERIOD = "sum"


def sum_rows(per_period: pd.DataFrame, window_label: str,
             noise: list[tuple[np.ndarray, np.ndarray]] | None = None) -> pd.DataFrame:
    """One row per box: Σ estimates over the periods of ``per_period`` (an answer table with a ``period``
    column, the same boxes in every period) and the combined interval (NaN unless every period has one);
    ``noise``: per period, the half-widths of its own noise alone (answer tables' ``noise_halfwidths``)."""
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
        nb = na = None
        if noise is not None:
            nb, na = (np.stack([n[i] for n in noise]) for i in (0, 1))
        total, lower, upper = combine_sum(est, lo, hi, cover, nb, na)
    out = per_period.iloc[:n_boxes][BOX_COLUMNS].copy().reset_index(drop=True)
    out.insert(0, "period", f"{SUM_PERIOD} {window_label}")
    out["estimate"], out["lower"], out["upper"] = total, lower, upper
    out["unit"] = units.pop() if len(units) == 1 else "mixed"
    out["interval_covers"] = cover
    return out


def combine_sum(est, lower, upper, covers: str, noise_below=None, noise_above=None,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ estimates, lower, upper) over periods (rows of ``est``, ``lower``, ``upper``: periods × boxes) of
    independent releases whose intervals cover ``covers``: each period's own noise (``noise_below``,
    ``noise_above``: its half-widths; all of the interval when ``covers`` is the noise alone) adds in
    quadrature, the rest of each half-width (what :func:`~dpcore.synopsis.spread.add_halfwidths` added to the
    noise) as errors of correlation :data:`RECURRING`, and the two as the spread and noise of one release do."""
    est, lo, hi = (np.asarray(v, dtype=np.float64) for v in (est, lower, upper))
    total = est.sum(axis=0)
    below, above = est - lo, hi - est
    if covers == "noise":
        noise_below, noise_above = below, above
    elif noise_below is None or noise_above is None:
        return total, total - below.sum(axis=0), total + above.sum(axis=0)

    def side(h: np.ndarray, n: np.ndarray) -> np.ndarray:
        n = np.minimum(np.asarray(n, dtype=np.float64), h)
        r = rest_of(h, n)
        rest = np.sqrt((1.0 - RECURRING) * np.sum(r * r, axis=0) + RECURRING * np.sum(r, axis=0) ** 2)
        return add_halfwidths(np.sqrt(np.sum(n * n, axis=0)), rest)

    return total, total - side(below, noise_below), total + side(above, noise_above)


def sum_method(covers: str) -> str:
    if covers == "noise":
        return "sum of independent releases: half-widths added in quadrature"
    if covers in ("none", "mixed"):
        return "none: a period has no interval or the periods count different units"
    return ("sum of releases: each release's own noise added in quadrature, the rest of each half-width (the "
            "spread inside cut cells, the bounding bias) added, since it recurs in every period where the same "
            "places and people do")
