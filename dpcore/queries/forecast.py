"""Forecasts of a released series with an interval from the model's own error on that series.

The interval of a step h ahead is the spread of the model's h-step errors when it forecast the released
history from earlier origins (a rolling-origin backtest: fit on the first o slots, compare with the
released slots o … o + h − 1), plus the released answers' own noise variance, so the band covers a
future released value and the true count it estimates. Only the release is read: post-processing.

A series the model cannot be judged on is refused rather than given a narrow band: fewer than
MIN_SLOTS slots, or slots a mechanism merged (answers within a merged slot are flat, so the history
would look exact while the true counts vary).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from dpcore.queries.spatiotemporal import STQueryError, _theta_one

#: The fewest slots a forecast is made from: the model fits on at least MIN_FIT and is judged from at
#: least MIN_SLOTS − MIN_FIT origins.
MIN_SLOTS = 8
MIN_FIT = 4


def slot_words(seconds: float | None) -> str:
    """A slot width in an analyst's words: "1 day", "28 days", "6 hours"."""
    if not seconds:
        return "an unknown width"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds:g} s"


def check_forecastable(n_slots: int, slot_seconds: float | None, slot_factor: int = 1,
                       what: str = "this release") -> None:
    """Refuse (STQueryError, one line) a series with merged slots or fewer than MIN_SLOTS of them."""
    if slot_factor > 1:
        coarse = -(-int(n_slots) // int(slot_factor))
        width = slot_words(slot_seconds * slot_factor if slot_seconds else None)
        raise STQueryError(
            f"{what} has {coarse} slot{'s' if coarse != 1 else ''} of {width}: its {n_slots} requested slots of "
            f"{slot_words(slot_seconds)} were merged {slot_factor} at a time, so its per-slot answers are flat "
            f"and a forecast needs at least {MIN_SLOTS} slots of their own; release a longer period or a larger ε, "
            "or keep the requested slots (--param resolution=fixed)")
    if n_slots < MIN_SLOTS:
        raise STQueryError(f"{what} has {n_slots} slot{'s' if n_slots != 1 else ''} of {slot_words(slot_seconds)}; "
                           f"a forecast needs at least {MIN_SLOTS} to judge its own error")


def backtest_errors(row: np.ndarray, horizon: int, period: int | None) -> list[np.ndarray]:
    """Per step ahead (0 … horizon − 1), the model's errors forecasting ``row`` from every origin
    o ≥ MIN_FIT that leaves that step inside the history."""
    n = row.size
    errs: list[list[float]] = [[] for _ in range(horizon)]
    for o in range(MIN_FIT, n):
        steps = min(horizon, n - o)
        fc = _theta_one_quiet(row[:o], steps, period)
        for j in range(steps):
            errs[j].append(float(row[o + j] - fc[j]))
    return [np.asarray(e) for e in errs]


def _theta_one_quiet(row: np.ndarray, h: int, period: int | None) -> np.ndarray:
    from statsmodels.tsa.forecasting.theta import ThetaModel

    return _theta_one(ThetaModel, row, h, period)


def forecast_interval(series: np.ndarray, horizon: int, period: int | None = None, noise_sd: float | None = None,
                      level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(forecast, lower, upper, method) of one released series of at least MIN_SLOTS slots.

    Step j's half-width is t·sqrt(e_j² + σ²): e_j the root mean square of the backtest's n_j errors j + 1
    steps ahead (a step beyond what the history can test takes the last tested one's, grown as √steps),
    σ the released answers' noise sd (``noise_sd``; None when the release states none), and t Student's
    quantile with n_j degrees of freedom: e_j is itself estimated from a handful of errors (10 one day
    ahead on 14 daily slots, 4 a week ahead), and the normal quantile under-covered (0.92 on SF cabs,
    bench/bench_forecast_coverage.py). The bounds are NaN, and the method says why, only where neither
    gives a width: the history is exactly reproduced and no noise is known."""
    from scipy.stats import t as student_t  # loaded with statsmodels' ThetaModel anyway

    row = np.asarray(series, dtype=np.float64).ravel()
    h = int(horizon)
    if h < 1:
        raise STQueryError(f"forecast horizon must be ≥ 1, got {horizon}")
    if row.size < MIN_SLOTS:
        raise STQueryError(f"a forecast needs at least {MIN_SLOTS} slots, got {row.size}")
    fc = _theta_one_quiet(row, h, period)
    errs = backtest_errors(row, h, period)
    tested = [j for j, e in enumerate(errs) if e.size]
    rms, dof = np.empty(h), np.empty(h)
    for j in range(h):
        if errs[j].size:
            rms[j], dof[j] = float(np.sqrt(np.mean(errs[j] ** 2))), errs[j].size
        else:
            last = tested[-1]
            rms[j], dof[j] = rms[last] * np.sqrt((j + 1) / (last + 1)), dof[last]
    noise_var = 0.0 if noise_sd is None or not np.isfinite(noise_sd) else float(noise_sd) ** 2
    half = student_t.ppf((1.0 + level) / 2.0, dof) * np.sqrt(rms ** 2 + noise_var)
    noise_words = ("the released answers' noise" if noise_sd is not None and np.isfinite(noise_sd)
                   else "no noise term (the release states no interval for its answers)")
    method = (f"ThetaModel; ±t·√(backtest error² + noise variance), Student's t with a degree of freedom per error: its own errors forecasting the released "
              f"history from {len(errs[0])} earlier origins, and {noise_words}")
    if not np.all(half > 0):
        nan = np.full(h, np.nan)
        return fc, nan, nan, ("none: the model reproduces the released history exactly and the release states no "
                              "noise, so no width can be told")
    return fc, fc - half, fc + half, method


def noise_sd_from(lower: np.ndarray, upper: np.ndarray, level: float = 0.95) -> float | None:
    """The noise sd a release's own intervals imply (their median half-width over z), None without them."""
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    ok = np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return None
    return float(np.median(hi[ok] - lo[ok]) / 2.0 / NormalDist().inv_cdf((1.0 + level) / 2.0))
