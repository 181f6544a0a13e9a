"""Budget-spending helpers for mechanisms that feed ParamSelect: a private n (paid when not public)
and the cell width ParamSelect picks from it. ParamSelect itself (dpcore.paramselect) spends nothing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dpcore.mechanisms.contract import FitRecord, MechanismError
from dpcore.mechanisms.inputs import PointsInput
from dpcore.privacy.noise import NoiseSource

#: Default share of ε for the first (often only) look at n, and the relative accuracy ParamSelect needs:
#: its features use log n, and a 10% error in n moves log10 n by 0.04, well inside the spread of the
#: training table. At record level 1% of ε is a noise scale of 1/(0.01·ε) = 2,000 at ε = 0.05,
#: 2% of n ~ 10⁵.
N_FIRST_FRACTION = 0.01
N_TARGET_REL_STD = 0.10


class NForFit(NamedTuple):
    """n for a fit: its value, where it came from, whether it counts the bounded (noised) sample, and its
    noise variance (0 for a public count; None when a caller's paid estimate came without one)."""

    n: float
    how: str
    bounded: bool
    variance: float | None


def public_n_for_fit(data: PointsInput, acct: FitRecord, noise: NoiseSource, total_fraction: float,
                     first_fraction: float = N_FIRST_FRACTION,
                     target_rel_std: float = N_TARGET_REL_STD) -> NForFit:
    """n for ParamSelect inside a mechanism: ``public_total`` when declared, else a paid DP estimate.

    The estimate is paid in at most two looks, each the point count plus discrete Laplace noise of
    scale s/ε_i (s = sensitivity: a count has L1 sensitivity k user-level, 1 record-level):

    1. ε_1 = min(first_fraction, total_fraction)·ε, charged as step ``total_count``;
    2. only if that estimate is not accurate enough — its noise std (≈ √2·s/ε_1; the exact discrete
       Laplace value is used) exceeds ``target_rel_std``
       of max(n̂_1, its std) — the rest of the cap, ε_2 = (total_fraction − first)·ε, as step
       ``total_count_refine``; the two are combined by inverse-variance weighting.

    Whether step 2 runs depends only on n̂_1, an ε_1-DP output, so this is ordinary adaptive sequential
    composition: every path spends at most ``total_fraction``·ε here and the mechanism spends the rest,
    and the ledger records the charges actually made. Large releases
    thus pay 1% instead of 5% (at the defaults: when n·ε/s ≥ √2/(0.1·0.01) ≈ 1,400); small or
    user-level ones pay up to ``total_fraction`` where they need it.
    Returns :class:`NForFit`: ``public_total`` is the unbounded public count, the estimate counts what
    was noised.
    """
    if data.sample_size is not None:
        return NForFit(float(data.sample_size), "the caller's already-paid DP estimate of the sample size", True,
                       data.sample_size_variance)
    if data.public_total is not None:
        return NForFit(float(data.public_total), "public_total (declared public by the caller)", False, 0.0)
    if not (0 < total_fraction < 1):
        raise MechanismError(f"total_fraction must be in (0, 1), got {total_fraction}")
    first = min(float(first_fraction), float(total_fraction))
    if not first > 0:
        raise MechanismError(f"first_fraction must be > 0, got {first_fraction}")
    s = float(data.sensitivity)
    eps1 = acct.spend_fraction("total_count", first, s,
                               note="noisy point count for ParamSelect (n is private); first look")
    n1 = float(data.add_count_noise(np.array([data.mass]), eps1, noise)[0])
    # The noise is discrete Laplace: variance 2t/(1 − t)² with t = exp(−ε/s), not the continuous 2(s/ε)².
    var1 = data.count_noise_variance(eps1)
    how = f"a DP estimate paid with ε={eps1:g} (step total_count)"
    n_hat, n_var = n1, var1
    if total_fraction > first and math.sqrt(var1) > target_rel_std * max(n1, math.sqrt(var1)):
        # Post-processing of n̂_1 decides to look again; the second look is charged like the first.
        eps2 = acct.spend_fraction("total_count_refine", total_fraction - first, s,
                                   note="second noisy count: the first was not within "
                                        f"{target_rel_std:.0%} relative std; combined by inverse variance")
        n2 = float(data.add_count_noise(np.array([data.mass]), eps2, noise)[0])
        var2 = data.count_noise_variance(eps2)
        n_hat = (n1 / var1 + n2 / var2) / (1.0 / var1 + 1.0 / var2)
        n_var = 1.0 / (1.0 / var1 + 1.0 / var2)
        how = f"a DP estimate paid with ε={eps1 + eps2:g} (steps total_count, total_count_refine)"
    return NForFit(max(n_hat, 1.0), how, True, n_var)


def cell_width_for_fit(data: PointsInput, acct: FitRecord, noise: NoiseSource, *, mechanism: str,
                       band: tuple[float, float], total_fraction: float,
                       model_path: str | Path | None = None) -> tuple[float, str]:
    """ρ for ``mechanism`` inside a fit, from public inputs and n (see :func:`public_n_for_fit`, which
    may charge ``total_count`` / ``total_count_refine``); returns (ρ, a note for the release)."""
    from dpcore.paramselect import rho_extrapolation_note, select_params

    n_public, how, bounded, _ = public_n_for_fit(data, acct, noise, total_fraction)
    choice = select_params(region=data.region, n=n_public, epsilon=acct.remaining,
                           sensitivity=float(data.sensitivity), privacy_unit=data.privacy_unit,
                           max_points_per_user=data.max_points_per_user, band=band, mechanisms=(mechanism,),
                           n_is_bounded=bounded, model_path=model_path)
    return choice.cell_width_m, "; ".join(filter(None, (
        f"cell width {choice.cell_width_m:.1f} m chosen by ParamSelect; n from {how}", rho_extrapolation_note(choice))))
