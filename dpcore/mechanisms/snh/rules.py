"""SNH's post-processing rules and their tuned constants: losses, answer rules, the blend's weights and
the public denoiser's gates. All were chosen on public data only; the evidence is recorded in
docs/decisions/0003-snh-pyramid-loss-and-answer-blend.md and 0004-snh-public-denoiser.md."""

from __future__ import annotations

import numpy as np

from dpcore.models.denoiser_meta import DENOISER_GRID

#: ψ = PSI_FRACTION · n (the relative-error floor of the SNH paper and of our metrics).
PSI_FRACTION = 1e-3

#: Training losses (per sample, y = label, ψ = 0.1% of n̂, w = workload weight): ``"paper"``:
#: w·(ŷ − y)²/max(y, ψ), the SNH paper's; ``"relative_l1"``: w·|ŷ − y|/max(y, ψ), the relative error
#: releases are judged by. The absolute loss fits a local median rather than a mean, so isolated noise
#: peaks are not learned as mass; on raw noisy labels (the flat grid) the weights 1/max(y, ψ) see the label
#: noise and pull that median low. ``"auto"`` takes ``"relative_l1"`` with the pyramid and ``"paper"``
#: with the flat grid.
LOSSES = ("auto", "relative_l1", "paper")

#: How queries up to the trained side u are answered (larger ones always use the grid): ``"nets"`` (the
#: paper's), ``"grid"`` (prefix sums of the (denoised) grid), ``"geometric"`` (√(nets · grid)),
#: ``"blend"`` (nets^a · grid^(1−a), a from :func:`blend_nets_weights`). ``"auto"``: blend with the
#: pyramid (denoised or not), nets with the paper's flat grid.
ANSWER_RULES = ("auto", "nets", "grid", "geometric", "blend")

#: The blend's nets weight a. Where the release's signal n̂·ε/s is large the (denoised) grid resolves what
#: the nets smooth away and answers alone (a = 0); where it is small the nets, which shrink towards 0
#: where the grid spreads noise, keep half the say (a = ½, the geometric mean). Squares under
#: BLEND_SMALL_SIDE_M always get a = ½: there the grid alone is worse on real cities at every signal.
BLEND_SMALL_SIDE_M = 100.0
#: ``answer="geometric"``'s weights (small squares, large ones), and those of releases saved before the blend.
GEOMETRIC_NETS_WEIGHTS = (0.5, 0.5)
BLEND_NETS_WEIGHT_SMALL = 0.5
#: (signal at least, nets weight on squares ≥ 100 m), from the largest threshold down; below all: ½.
BLEND_LARGE_STEPS = ((8000.0, 0.0), (1000.0, 0.25))
BLEND_NETS_WEIGHT_LOW_SIGNAL = 0.5
#: Nets weight on squares under 100 m when the grid is refined to a fine level (``fine_factor`` > 1).
FINE_NETS_WEIGHT_SMALL = 0.0

#: Without the public denoiser (the plain pyramid) the nets answer alone below this signal and the blend's
#: weights apply from it: the plain grid is noisier than the denoised one, so it earns its share later.
PLAIN_BLEND_MIN_SIGNAL = 4000.0


def release_signal(estimated_total: float, epsilon: float, sensitivity: float) -> float:
    """A release's signal n̂·ε/s: its collection's estimated total (post-processing; at least 1) times the
    collection's ε over its sensitivity. The denoiser gate and the blend's weights are set by it."""
    return max(float(estimated_total), 1.0) * float(epsilon) / float(sensitivity)


def blend_nets_weights(signal: float, denoised: bool = True, fine: bool = False) -> tuple[float, float]:
    """The blend's nets weights (squares under 100 m, larger ones) for a release whose signal n̂·ε/s
    (n̂ the noisy grid's total, ε the data collection's, s its sensitivity) is ``signal``; ``denoised``:
    whether the release's pyramid goes through the public denoiser (:data:`PLAIN_BLEND_MIN_SIGNAL`);
    ``fine``: whether its grid was refined to a fine level below the denoiser's (``fine_factor``), whose
    cells resolve squares under 100 m that the nets, trained on squares aligned to the same grid, smooth."""
    if not denoised and signal < PLAIN_BLEND_MIN_SIGNAL:
        return 1.0, 1.0
    large = next((a for threshold, a in BLEND_LARGE_STEPS if signal >= threshold), BLEND_NETS_WEIGHT_LOW_SIGNAL)
    return (FINE_NETS_WEIGHT_SMALL if fine else BLEND_NETS_WEIGHT_SMALL), large


#: ``data_collection`` values: see the mechanism's docstring, step 1.
DATA_COLLECTIONS = ("auto", "grid", "pyramid")

#: Finest pyramid levels the public denoiser may be applied at. It is convolutional and learned at 128²;
#: at 256² the same model resolves small squares better but loses on 100–1000 m ones at low signal, so 128
#: is the default and 256 is for releases meant for small squares.
DENOISER_GRIDS = (128, 256)

#: The denoised grid's blocks at the measured coarser levels are capped at their combined noisy count + this
#: many standard deviations (:func:`~dpcore.grid.pyramid.cap_to_levels`): at low signal the
#: denoiser can put mass far from any data, and a block's own counts rule that out. At 3σ the excess is
#: ruled out at ~99% one-sided (discrete Laplace tails) without dropping mass the denoiser had right.
DENOISER_CAP_SIGMAS = 3.0

#: A release whose cap dropped at least this fraction of the mass says so to whoever queries it
#: (:meth:`SNHSynopsis.caveats`): typically user level at small ε, where hotspots are starved.
CAVEAT_DROPPED_FRACTION = 0.10

#: The denoiser is applied only below this signal n̂·ε/s; at or above it the plain pyramid estimate is the
#: grid. Where the counts pin the density down, the denoiser's learned prior only adds bias.
DENOISER_MAX_SIGNAL = 25_000.0

#: Name snh's post-processing rules in ParamSelect's row cache, so changing one recomputes the rows it
#: changes: the denoised snh's (answer blend, cap, the paid n̂ in the pyramid's root, the signal gate, the
#: specialist's choice by signal and unit; its weights are keyed by ParamSelect's flow) and
#: the plain pyramid's (the blend from PLAIN_BLEND_MIN_SIGNAL).
BLEND_KEY = "blend:" + ":".join(
    f"{v:g}" for v in (BLEND_SMALL_SIDE_M, BLEND_NETS_WEIGHT_SMALL, *np.ravel(BLEND_LARGE_STEPS),
                       BLEND_NETS_WEIGHT_LOW_SIGNAL))
DENOISED_RULES_KEY = (BLEND_KEY + f"|cap:{DENOISER_CAP_SIGMAS:g}|root:sample_size"
                      f"|max_signal:{DENOISER_MAX_SIGNAL:g}|bands:signal+unit@{DENOISER_GRID}")
PLAIN_RULES_KEY = BLEND_KEY + f"|plain_from:{PLAIN_BLEND_MIN_SIGNAL:g}|nets_floor:0"  # nets' answers ≥ 0
