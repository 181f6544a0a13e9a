"""SNH's noisy pyramid: quadtree levels noised once, combined by inverse-variance consistency and Wiener
shrinkage, capped to the levels' counts. Pure numpy; the public denoiser trains on the same release."""

from __future__ import annotations

import numpy as np

from dpcore import GeoDPError
from dpcore.grid.histogram import block_sum, expand, shrink_factor, split_to_parent
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance


class PyramidError(GeoDPError, ValueError):
    """A pyramid whose levels do not nest (a programming error of the caller)."""


#: Pyramid levels as divisors of the finest grid G, coarse → fine, and their shares of the budget (one
#: definition, shared with the public denoiser that learns from simulated pyramids).
LEVEL_DIVISORS = (16, 4, 1)
LEVEL_WEIGHTS = (1.0, 2.0, 2.0)


def pyramid_upward(noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                   ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Hay et al.'s upward pass (inverse-variance form): for every level g from the finest up to the root,
    the best linear combination z[g] of its own measurement (when that level was measured) and the sum
    of its children's combined estimates, with its variance v[g] (post-processing)."""
    G = max(noisy_levels)
    if G & (G - 1) or any(g & (g - 1) for g in noisy_levels):
        raise PyramidError(f"pyramid levels must be powers of two, got {sorted(noisy_levels)}")
    z = {G: np.asarray(noisy_levels[G], dtype=np.float64)}
    v = {G: np.full((G, G), float(noise_var[G]))}
    g = G
    while g > 1:
        h = g // 2
        agg, agg_var = block_sum(z[g], 2), block_sum(v[g], 2)
        if h in noisy_levels:
            own_var = float(noise_var[h])
            w = agg_var / (agg_var + own_var)
            z[h] = w * np.asarray(noisy_levels[h], dtype=np.float64) + (1 - w) * agg
            v[h] = agg_var * own_var / (agg_var + own_var)
        else:
            z[h], v[h] = agg, agg_var
        g = h
    return z, v


def pyramid_estimate(noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                     kappa: float = 1.0, total_floor: float = 1.0,
                     total: tuple[float, float] | None = None) -> np.ndarray:
    """Combine noisy quadtree levels into one non-negative (G, G) estimate (post-processing only).

    ``noisy_levels[g]`` is a (g, g) noisy histogram for some powers of two g ≤ G (G, the finest, must be
    present); ``noise_var[g]`` its per-cell noise variance.

    1. Upward pass (:func:`pyramid_upward`): every node of every level up to the root gets the best
       linear combination of its own measurement and the sum of its four children's, with its variance.
    2. Downward pass: a node's final estimate P is split among its children as their combined estimates
       made to add up to P (the residual spread evenly), then each child's deviation d from the even
       share P/4 is shrunk by the positive-part Wiener factor max(0, 1 − κ·σ_d²/d²) (σ_d² = ¾ of the
       child's variance): structure that does not stand out from the noise is flattened, significant
       structure — a dense block next to an empty one — is kept. Children are clipped at 0 and rescaled
       to P, so no level adds or loses mass.

    ``total`` = (value, variance) is one more unbiased measurement of the grand total, independent of the
    levels (a user-level release's paid sample size n̂, or a public count with variance 0); it joins the
    root's combination with its inverse-variance weight. The levels' own root is poor at low signal: it
    sums the noise of every coarsest cell (64 of them at G = 128).
    """
    z, v = pyramid_upward(noisy_levels, noise_var)
    root, root_var = float(z[1][0, 0]), float(v[1][0, 0])
    if total is not None:
        value, variance = float(total[0]), float(total[1])
        root = value if variance <= 0 else (root / root_var + value / variance) / (1 / root_var + 1 / variance)
    return shrink_down(np.array([[max(root, total_floor)]]), z, v, kappa)


def shrink_down(est: np.ndarray, z: dict[int, np.ndarray], v: dict[int, np.ndarray],
                kappa: float) -> np.ndarray:
    """The downward pass of :func:`pyramid_estimate` from a (g, g) estimate to the finest level of ``z``:
    each node's mass split among its children by their combined estimates ``z`` (variances ``v``), each
    child's deviation from the even share Wiener-shrunk, clipped at 0 and rescaled to the parent."""
    g, G = est.shape[0], max(z)
    while g < G:
        child = z[2 * g].reshape(g, 2, g, 2)
        parent = est[:, None, :, None]
        child = child + (parent - child.sum(axis=(1, 3), keepdims=True)) / 4.0
        d = child - parent / 4.0
        d_var = 0.75 * v[2 * g].reshape(g, 2, g, 2)
        lam = shrink_factor(d, d_var, kappa)
        c = split_to_parent(np.maximum(parent / 4.0 + lam * d, 0.0), parent)
        est = c.reshape(2 * g, 2 * g)
        g *= 2
    return est


def join_fine_level(noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                    fine: np.ndarray, fine_var: float) -> tuple[dict[int, np.ndarray], dict[int, float]]:
    """The pyramid's finest level G joined by the block sums of a finer noisy level (inverse variance,
    post-processing), so the levels a denoiser sees lose little of the budget the finer level took."""
    G = max(noisy_levels)
    b = fine.shape[0] // G
    agg, agg_var = block_sum(np.asarray(fine, dtype=np.float64), b), float(fine_var) * b * b
    own_var = float(noise_var[G])
    w = agg_var / (agg_var + own_var)
    levels, var = dict(noisy_levels), dict(noise_var)
    levels[G] = w * np.asarray(noisy_levels[G], dtype=np.float64) + (1 - w) * agg
    var[G] = agg_var * own_var / (agg_var + own_var)
    return levels, var


def refine_to_fine(est: np.ndarray, fine: np.ndarray, fine_var: float, kappa: float = 1.0) -> np.ndarray:
    """A (G, G) estimate refined to a finer noisy level (F, F), F = G·2^j, by the Wiener-shrunk downward
    pass (post-processing): a cell's mass is spread evenly over its sub-cells except where the fine
    counts show structure that stands out from their noise, which is where the data are dense."""
    F, G = fine.shape[0], est.shape[0]
    if F % G or (F // G) & (F // G - 1):
        raise PyramidError(f"the fine level {F} must be the estimate's grid {G} times a power of two")
    z, v = pyramid_upward({F: np.asarray(fine, dtype=np.float64)}, {F: float(fine_var)})
    return shrink_down(np.asarray(est, dtype=np.float64), {g: z[g] for g in z if g >= G},
                       {g: v[g] for g in v if g >= G}, kappa)


def cap_to_levels(grid: np.ndarray, noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                  sigmas: float) -> tuple[np.ndarray, float]:
    """Cap a (G, G) estimate's block sums at every measured coarser level g < G to z + sigmas·σ, z the
    block's combined measurement (:func:`pyramid_upward`) and σ its standard deviation; the mass above the
    caps is dropped, not moved (post-processing). Returns (capped grid, fraction of mass dropped).

    The public denoiser outputs a distribution learned on other cities; where it puts more in a block
    than the block's own noisy counts allow, the counts are the better witness. The excess is dropped
    rather than moved: moved, it lands in sparse blocks, where the relative error is largest.
    """
    z, v = pyramid_upward(noisy_levels, noise_var)
    G = grid.shape[0]
    out = np.asarray(grid, dtype=np.float64)
    before = float(out.sum())
    # Fine → coarse: a dump into one cell is cut at the smallest block that rules it out, so the larger
    # block around it keeps its other cells' mass.
    for g in sorted((k for k in noisy_levels if k < G), reverse=True):
        b = G // g
        have = block_sum(out, b)
        cap = np.maximum(z[g] + sigmas * np.sqrt(v[g]), 0.0)
        factor = np.where(have > cap, cap / np.maximum(have, 1e-300), 1.0)
        out = out * expand(factor, b)
    return out, (1.0 - float(out.sum()) / before) if before > 0 else 0.0


def release_pyramid(counts: dict[int, np.ndarray], sensitivity: float, level_epsilons: dict[int, float],
                    noise: NoiseSource, kappa: float = 1.0, total: tuple[float, float] | None = None,
                    fine: tuple[np.ndarray, float] | None = None,
                    ) -> tuple[np.ndarray, dict[int, np.ndarray], dict[int, float]]:
    """Discrete Laplace noise at each level's ε (levels in the order given), then :func:`pyramid_estimate`
    (``total``: an independent measurement of the grand total, see there; ``fine``: an already noisy
    finer level and its per-cell variance, joined into the finest level first, :func:`join_fine_level`).

    Returns (estimate, noisy levels, per-cell noise variances). The one place SNH's pyramid is noised:
    releases call it with the ε their accountant granted, the public denoiser's training with simulated ε.
    """
    noisy, var = {}, {}
    for g, eps in level_epsilons.items():
        noisy[g] = noise.add_discrete_laplace(counts[g], sensitivity, eps).astype(np.float64)
        var[g] = discrete_laplace_variance(sensitivity / eps)
    if fine is not None:
        noisy, var = join_fine_level(noisy, var, *fine)
    return pyramid_estimate(noisy, var, kappa, total=total), noisy, var


def pyramid_size(side_m: float, rho_m: float) -> int:
    """Finest pyramid level G: the power of two nearest to 4·side/ρ (cells ≈ ρ/4), within [16, 512].

    ρ is the flat grid's width from ParamSelect; the pyramid's shrinkage removes the noise that makes
    the flat optimum coarse, so its finest level can be ~4× finer.
    """
    return int(2 ** int(np.clip(np.round(np.log2(4.0 * side_m / rho_m)), 4, 9)))
