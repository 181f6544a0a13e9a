"""A release's expected relative error per band from its paid contribution profile and public inputs only.

A first release has no published map to show how many points a square around a data point holds, so the
count is modelled from the profile (post-processing of the noisy, already paid histogram of points per
unit) and public constants. For a square of side s centred on a point of a unit with n points:

    T(s) = 1 + a(s)·(m − 1) + c(s)·(N̂ − m)

the point itself, a share a(s) of its unit's other points (people return to their places) and a share c(s)
of everyone else's points. N̂ is the profile's total, m = Σn²/Σn its points-weighted mean points per unit
(the unit a data-centred square is centred on is drawn in proportion to its points). a(s) and c(s) are
public constants fitted on data the verdict is not judged on: the geometric mean of the medians on the
Gowalla sample's Austin and San Francisco weeks (bench/bench_concentration.py). Gowalla NYC, on which the
verdict's confusion table is measured, is held out (its days' shares are ×0.54–1.1 these for a and
×0.25–0.65 for c: the model errs towards larger counts there, that is towards publishing).

The release's error at a square of side s on cells of width w: the cells' noise (σ·s/w for s ≥ w, σ·(s/w)²
for a part of one cell), times the scale factor 1/κ̂(k), the factor's uncertainty and the bound's sampling
spread, and for a square smaller than its cell the spread of the cell's count over it (what the cell's
uniform answer misses: T(s) − T(w)·(s/w)²). The measure is the bench's: the mean over data-centred squares
of |error| / true count, where a blank map (answering 0) scores 1. Its mean of ratios weighs sparse
squares more than the ratio of means: E[1/T]·E[T] is ≥ 1.2 (25–100 m) and ≥ 1.5 (larger) on both cities,
taken as SPARSE_WEIGHT. A band's figure is the mean over SIDES_PER_BAND sides spread over it, as the bench
draws its sides; mechanisms without one cell width take the best proxy width per side (optimistic).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dpcore.privacy.noise import discrete_laplace_variance
from dpcore.privacy.profile import PROFILE_FRACTION, ContributionProfile
from dpcore.synopsis.expected_error import (
    HALF_NORMAL,
    K_CANDIDATES,
    PROXY_WIDTHS_M,
    REFUSE_MARGIN,
    first_helping,
    help_words,
    useless,
)
from dpcore.synopsis.uncertainty import DEFAULT_BANDS

#: Square sides (m) at which the shares below were measured (between: log-log interpolation).
ANCHOR_SIDES_M = (62.5, 550.0, 3000.0)
#: a(s): the share of a unit's other points in a square of side s centred on one of its points.
OWN_SHARE = (0.050, 0.22, 0.56)
#: c(s): the share of the other units' points in it.
OTHERS_SHARE = (0.0044, 0.034, 0.29)
#: E[1/T]·E[T] over data-centred squares (at least; never above T itself).
SPARSE_WEIGHT = (1.2, 1.5, 1.5)
SIDES_PER_BAND = 5
#: A band of squares smaller than the cells that answer it best gets a cell's count spread over it, which
#: misses at most about the square's own count (a blank map's error). Expected worse than a blank map there
#: (≥ SUB_CELL_MARGIN) with its noise alone at least NOISE_SHARE of a blank map's error, the noise is what
#: makes it worse, and the band counts towards a refusal: the model under-predicts such bands where they are
#: worse (measured / predicted 1.0–1.14 on Gowalla NYC first releases, bench/results/2026-11-29-verdict-4.md),
#: so they need no margin of 2. Where the spread's miss alone makes it ≈ 1 (an `auto` release's small
#: squares, 0.98 on an empty period; 1 km cells on a month whose people the profile cannot see, noise 0.1,
#: measured 0.97) it does not count. With the noise alone at 1 instead, 27 of 93 profiles of Gowalla NYC's
#: May 2010 days at ε 1 with 250 m cells (measured 1.6 / 13 / 12.5 × a blank map) were refused; at 0.3, days
#: with 500 m cells too (not measured).
SUB_CELL_MARGIN = 1.0
NOISE_SHARE = 0.5
# Any band counts when its expected relative error is at least REFUSE_MARGIN (twice a blank map's, as the
# plan's other verdicts). HALF_NORMAL, PROXY_WIDTHS_M and K_CANDIDATES are the plan's (dpcore.synopsis.expected_error).


@dataclass(frozen=True)
class ProfileInputs:
    """The run's public options and what its paid profile says (N̂ and m), per period factor 1."""

    epsilon: float
    k: int
    cell_width_m: float | None  # None: the mechanism sizes its own cells (PROXY_WIDTHS_M)
    total: float  # N̂
    own_mean: float  # m = Σn²/Σn
    period_factor: float = 1.0  # a period this many times as long (what-would-help): N̂ and m scale with it


def _anchored(side: np.ndarray, values: tuple[float, ...]) -> np.ndarray:
    logs = np.log(np.asarray(ANCHOR_SIDES_M))
    slope_lo = (np.log(values[1]) - np.log(values[0])) / (logs[1] - logs[0])
    slope_hi = (np.log(values[-1]) - np.log(values[-2])) / (logs[-1] - logs[-2])
    x = np.log(np.asarray(side, dtype=np.float64))
    y = np.interp(x, logs, np.log(values))
    y = np.where(x < logs[0], np.log(values[0]) + slope_lo * (x - logs[0]), y)
    y = np.where(x > logs[-1], np.log(values[-1]) + slope_hi * (x - logs[-1]), y)
    return np.exp(y)


def typical_count(side: np.ndarray, total: float, own_mean: float) -> np.ndarray:
    """T(s): the expected count of a square of side ``side`` centred on a data point (at least the point;
    at most every point)."""
    a = np.minimum(_anchored(side, OWN_SHARE), 1.0)
    c = np.minimum(_anchored(side, OTHERS_SHARE), 1.0)
    m = max(own_mean, 1.0)
    t = 1.0 + a * (m - 1.0) + c * max(total - m, 0.0)
    return np.clip(t, 1.0, max(total, 1.0))


def own_mean(profile: ContributionProfile) -> float:
    """m = Σn²/Σn over the profile's estimated units: the mean points of the unit a data point belongs to."""
    from dpcore.privacy.profile import _bucket_bounds, _power_integral, tail_slopes

    c = profile.counts()
    if c.sum() <= 0:
        return 1.0
    alpha = tail_slopes(c)
    lo, hi = (b[: c.size] for b in _bucket_bounds())
    mass = _power_integral(lo, hi, -alpha)
    first = np.sum(c * _power_integral(lo, hi, 1.0 - alpha) / mass)
    second = np.sum(c * _power_integral(lo, hi, 2.0 - alpha) / mass)
    return max(float(second / first), 1.0) if first > 0 else 1.0


def trusted_top(profile: ContributionProfile) -> int:
    """The highest visible bucket the verdict trusts to hold people (−1: none): one with another visible
    bucket at most TAIL_BUCKETS away, or one reached from the lowest buckets (0 or 1) by buckets that each
    clear the one-bucket threshold, each at most TAIL_BUCKETS above the last, with at least one below it.

    People per doubling change gradually down to one point per person, so a real visible bucket has such a
    run under it, or visible neighbours (a run of heavy units, as cabs). Noise alone gives an empty profile
    a visible bucket in 5% of draws and one with a single non-empty-looking bucket just below it in about
    0.5%, wherever it falls: counted, such a pair set N̂ to 2.5 million points on a day of 110 people at
    ε_p 0.025, whose every band was then called informative and which was not refused (1 draw in 400 of
    test_a_first_day_worse_than_a_blank_map…). A run down to the lowest buckets or a visible pair is
    noise in about 6·10⁻⁴ of empty profiles (bench/results/2026-11-29-verdict-5.md)."""
    from dpcore.privacy.profile import linked_from_bottom, nonzero_threshold, visible_near, visible_threshold

    noisy = np.asarray(profile.noisy, dtype=np.float64)
    visible = noisy >= visible_threshold(profile.epsilon)
    trusted = np.flatnonzero(visible & (linked_from_bottom(noisy >= nonzero_threshold(profile.epsilon))
                                        | visible_near(visible)))
    return int(trusted[-1]) if trusted.size else -1


def without_untrusted(profile: ContributionProfile) -> ContributionProfile:
    """The profile from which the verdict models its counts: without the lowest visible bucket above
    :func:`trusted_top` and the lowest buckets (0 … TAIL_BUCKETS − 1, whose noise sets N̂ no higher than a few
    points a person), and everything above it. Counted, a noise-made one makes an empty period look like
    thousands of points (N̂ up to 10⁹)."""
    from dpcore.privacy.profile import TAIL_BUCKETS, visible_threshold

    noisy = np.asarray(profile.noisy, dtype=np.float64)
    start = max(trusted_top(profile) + 1, TAIL_BUCKETS)
    above = np.flatnonzero(noisy[start:] >= visible_threshold(profile.epsilon))
    if not above.size:
        return profile
    trimmed = noisy.copy()
    trimmed[start + int(above[0]):] = 0.0
    return ContributionProfile(trimmed, profile.epsilon, profile.per_day)


def inputs_from(profile: ContributionProfile, epsilon: float, k: int, cell_width_m: float | None) -> ProfileInputs:
    """The model's inputs (profile: :func:`without_untrusted` of the paid one)."""
    return ProfileInputs(float(epsilon), int(k), cell_width_m, profile.total_estimate(), own_mean(profile))


def _band_sides(lo: float, hi: float) -> np.ndarray:
    return lo + (np.arange(SIDES_PER_BAND) + 0.5) * (hi - lo) / SIDES_PER_BAND


def profile_errors(inputs: ProfileInputs, profile: ContributionProfile, bands=DEFAULT_BANDS,
                   shown: np.ndarray | None = None) -> list[dict]:
    """Per band: the typical count of a data-centred square (at the band's middle side), the expected
    relative error (blank map: 1) and that of its noise alone, the expected |error| (their product), and the
    verdict: ``hopeless`` at REFUSE_MARGIN, or at SUB_CELL_MARGIN where the band's squares are smaller than the
    cells that answer them best (``inside_cells``) and its noise alone reaches NOISE_SHARE. ``shown``: per band
    the typical count a published map of the region shows (NaN where it does not); where it is smaller than
    the model's, the band's counts are scaled down to it."""
    eps_main = inputs.epsilon * (1.0 - PROFILE_FRACTION)
    sd = float(np.sqrt(discrete_laplace_variance(inputs.k / eps_main)))
    draws = profile.factor_draws(inputs.k, 2001, np.random.default_rng(0))
    factor = float(np.median(draws))
    factor_rel_sd = float(np.std(draws) / factor) if factor > 0 else 0.0
    spread_var = profile.sampling_variance(inputs.k)
    total, m = inputs.total * inputs.period_factor, inputs.own_mean * inputs.period_factor
    widths = PROXY_WIDTHS_M if inputs.cell_width_m is None else (float(inputs.cell_width_m),)
    rows = []
    for lo, hi in bands:
        sides = _band_sides(lo, hi)
        t = typical_count(sides, total, m)
        mid = float(typical_count(np.full(1, (lo + hi) / 2.0), total, m)[0])
        cap = np.nan if shown is None else float(shown[len(rows)])
        scale = min(1.0, cap / mid) if np.isfinite(cap) and cap > 0 else 1.0
        t, mid = np.maximum(t * scale, 1.0), max(mid * scale, 1.0)
        weight = np.minimum(_anchored(sides, SPARSE_WEIGHT), t)
        best, best_w, best_random = np.full(sides.shape, np.inf), np.zeros(sides.shape), np.zeros(sides.shape)
        for w in widths:
            ratio = sides / w
            noise = sd * np.where(ratio >= 1.0, ratio, ratio * ratio) * factor
            miss = np.where(ratio < 1.0, np.maximum(t - typical_count(np.full(1, w), total, m) * ratio * ratio, 0.0), 0.0)
            random = HALF_NORMAL * np.sqrt((noise * weight / t) ** 2 + factor_rel_sd ** 2 + spread_var / t)
            err = np.sqrt(random ** 2 + (miss / t) ** 2)
            better = err < best
            best_w, best_random = np.where(better, w, best_w), np.where(better, random, best_random)
            best = np.minimum(best, err)
        rel, noise_rel = float(np.mean(best)), float(np.mean(best_random))
        inside = bool(np.all(sides < best_w))
        rows.append({"query_sides_m": [lo, hi], "typical_count": mid, "expected_relative_error": rel,
                     "expected_abs_error": rel * mid, "worse_than_blank_map": rel >= 1.0,
                     "hopeless": rel >= REFUSE_MARGIN or (inside and rel >= SUB_CELL_MARGIN and noise_rel >= NOISE_SHARE),
                     "inside_cells": inside, "noise_relative_error": noise_rel})
    return rows


def what_would_help(inputs: ProfileInputs, profile: ContributionProfile, bands=DEFAULT_BANDS,
                    period_days: float | None = None, shown: np.ndarray | None = None) -> list[str]:
    """The smallest change along each public option (ε up to ×1024, k among K_CANDIDATES, cells up to ×32
    as wide, periods up to 365× as long) that takes at least one band out of :func:`~dpcore.synopsis.expected_error.useless`, in words."""
    tries = [("epsilon", [inputs.epsilon * 2 ** (i / 2) for i in range(1, 21)]),
             ("k", [k for k in K_CANDIDATES if k != inputs.k]),
             ("cell_width_m", [] if inputs.cell_width_m is None else [inputs.cell_width_m * m for m in (2, 4, 8, 16, 32)]),
             ("period_factor", [float(m) for m in (2, 7, 30, 90, 365)])]
    found = first_helping(tries, lambda field, v: not useless(profile_errors(
        replace(inputs, **{field: v}), profile, bands,
        None if shown is None else np.asarray(shown) * (v if field == "period_factor" else 1.0))))
    return help_words(found, inputs.k, period_days)
