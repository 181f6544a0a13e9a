"""Non-neural statistics of VDR's spatio-temporal release: residual Wiener correction, block-mass
preserving non-negativity and coarse-to-fine quadtree shrinkage of noisy (nx, ny, nt) histograms.
Pure numpy post-processing of already-noisy counts (dpcore.models.vqvae holds the network)."""

from __future__ import annotations

import numpy as np

from dpcore.grid.histogram import block_sum, expand, shrink_factor, split_to_parent


def quadtree_sums(values: np.ndarray) -> tuple[int, dict[int, np.ndarray]]:
    """(size, {g: (g, g, nt) block sums}) for g = 1, 2, 4, ..., size: the (nx, ny, nt) array zero-padded
    to the next power-of-two side, summed 2 × 2 level by level."""
    nx, ny, nt = values.shape
    size = 1
    while size < max(nx, ny):
        size *= 2
    padded = np.zeros((size, size, nt))
    padded[:nx, :ny] = values
    sums = {size: padded}
    g = size
    while g > 1:
        sums[g // 2] = block_sum(sums[g], 2)
        g //= 2
    return size, sums


def residual_wiener(noisy: np.ndarray, denoised: np.ndarray, noise_std: float, window: int,
                    scales: tuple[int, ...] = (256, 128, 64, 32, 16, 8, 4, 2, 1),
                    bar: float = 2.0) -> np.ndarray:
    """Add back the part of the residual H̄ − D that is signal, not noise (local Wiener filter), at
    several block scales.

    Where the bottleneck dropped real structure (a sharp peak, or mass shifted between blocks), the
    residual's local energy exceeds the known noise variance and the residual is kept in proportion
    1 − 2·var/energy; where it looks like noise it is dropped. At scale s the residual is summed over
    s×s blocks (noise variance s²σ²), energy is averaged over window × window blocks of each slice,
    and the kept part is spread over the block in proportion to the current estimate. Coarse scales
    go first and restore block totals, fine ones restore sharp peaks, so at high SNR the output
    moves towards the noisy histogram's unbiased totals and at low SNR it stays the denoiser's.
    Post-processing only.
    """
    from scipy.ndimage import uniform_filter

    current = np.asarray(denoised, dtype=np.float64).copy()
    nx, ny, nt = current.shape
    for s in scales:
        if s > min(nx, ny):
            continue
        px, py = (-nx) % s, (-ny) % s
        resid = np.pad(noisy - current, ((0, px), (0, py), (0, 0)))
        block = block_sum(resid, s)
        var = (s * noise_std) ** 2
        energy = uniform_filter(block * block, size=(window, window, 1), mode="nearest")
        # With bar = 2 (twice the noise variance) a window of pure noise rarely reaches it, so at
        # low SNR (nearly everywhere at small ε) no noise is added back.
        kept = np.clip(1.0 - bar * var / np.maximum(energy, 1e-12), 0.0, 1.0) * block
        if s == 1:
            current += kept
            continue
        pos = np.pad(np.maximum(current, 0.0), ((0, px), (0, py), (0, 0)))
        pos_block = block_sum(pos, s)
        up = expand(pos_block, s)
        share = np.where(up > 0, pos / np.where(up > 0, up, 1.0), 1.0 / (s * s))
        current += (expand(kept, s) * share)[:nx, :ny]
    return current


def nonnegative_keep_block_mass(values: np.ndarray, block: int) -> np.ndarray:
    """Project to ≥ 0 without the upward bias of plain clamping.

    Clamping noise-like cells at 0 adds mass wherever counts are near 0; here the clamped values of
    each block × block tile (per slot) are rescaled to the tile's signed total (floored at 0), so
    tile totals are what they were before the projection.
    """
    v = np.asarray(values, dtype=np.float64)
    pos = np.maximum(v, 0.0)
    if block <= 1:
        return pos
    nx, ny = v.shape[:2]
    target = np.maximum(block_sum(v, block, pad=True), 0.0)
    have = block_sum(pos, block, pad=True)
    factor = np.divide(target, have, out=np.zeros_like(have), where=have > 0)
    return pos * expand(factor, block)[:nx, :ny]


#: Family-wise false-positive rate of the slot-total test at the quadtree's root (see slot_kappa).
SLOT_TEST_ALPHA = 0.05


def slot_kappa(kappa: float, n_slots: int, alpha: float = SLOT_TEST_ALPHA) -> float:
    """The shrinkage factor for the n_slots per-slot total deviations at the root of a quadtree stage.

    There are only T of them, so 2·ln T (the universal threshold) or a small κ lets a pure-noise
    slot through often (κ' = 6.1 passes 2.5 σ; one of 21 slots does so about a quarter of the time),
    and that one slot then carries a spurious spike of the whole region. The root uses
    max(κ, z²) with z the Gaussian quantile at 1 − α/(2T) (a Bonferroni bound: a slot of pure noise
    passes with probability ≤ α over all T), since slot totals are sums of thousands of cells.
    """
    from scipy.special import ndtri

    if n_slots < 1:
        raise ValueError(f"n_slots must be ≥ 1, got {n_slots}")
    z = float(ndtri(1.0 - alpha / (2.0 * n_slots)))
    return max(float(kappa), z * z)


def multiscale_shrink(values: np.ndarray, noise_var: float, kappa: float = 2.0,
                      total_floor: float = 1.0) -> np.ndarray:
    """Coarse-to-fine significance shrinkage of a (nx, ny, nt) count estimate; output ≥ 0 (post-processing).

    A spatial quadtree over the window: the root is the whole region (its signed total, floored at
    ``total_floor``); each node's estimate is split among its 4 children as the equal share plus each
    child's deviation from its siblings' mean, shrunk by max(0, 1 − κ·σ_d² / d²) (a per-node
    positive-part Wiener factor; σ_d² is the deviation's noise variance, from ``noise_var`` per cell).
    The deviation is split into its window-total part (noise variance T times smaller relative to
    signal) and its per-slot remainder, shrunk separately, so structure that is only visible summed
    over the whole window and over large blocks is kept and pushed down, while structure that
    does not stand out from the noise is flattened to the parent's even split. Children are clipped
    at 0 and rescaled to the parent's estimate, so no level adds mass.
    """
    v = np.asarray(values, dtype=np.float64)
    nx, ny, nt = v.shape
    size, sums = quadtree_sums(v)  # noisy sums at every level (g × g × nt)
    slot_tot = sums[1][0, 0]
    root_total = max(float(slot_tot.sum()), float(total_floor))
    # root: split the total across slots (per-slot deviations shrunk likewise, at slot_kappa)
    dev = slot_tot - slot_tot.mean()
    dvar = noise_var * size * size * (1.0 - 1.0 / nt)
    lam = shrink_factor(dev, dvar, slot_kappa(kappa, nt)) if nt > 1 else np.zeros(nt)
    est = np.maximum(root_total / nt + lam * dev, 0.0)
    est = (est * (root_total / est.sum()) if est.sum() > 0 else np.full(nt, root_total / nt))[None, None, :]
    g = 1
    while g < size:
        child = sums[2 * g].reshape(g, 2, g, 2, nt)
        cells = (size // (2 * g)) ** 2  # cells per child
        d = child - child.mean(axis=(1, 3), keepdims=True)            # per-slot sibling deviations
        dw = d.sum(axis=4, keepdims=True)                              # window-total deviation
        rem = d - dw / nt
        var_w = noise_var * cells * nt * 0.75
        var_r = noise_var * cells * 0.75 * (1.0 - 1.0 / nt)
        lw = shrink_factor(dw, var_w, kappa)
        lr = shrink_factor(rem, var_r, kappa) if nt > 1 else 0.0
        parent = est[:, None, :, None, :]
        c = split_to_parent(np.maximum(parent / 4.0 + lw * dw / nt + lr * rem, 0.0), parent)
        est = c.reshape(2 * g, 2 * g, nt)
        g *= 2
    return est[:nx, :ny]


def multiscale_consistency(estimate: np.ndarray, noisy: np.ndarray, noise_var: float, kappa: float = 2.0,
                           min_block: int = 1, universal: bool = False) -> np.ndarray:
    """Pull a (nx, ny, nt) estimate towards the noisy histogram's block sums where they are significant.

    A coarse-to-fine quadtree over the window, like :func:`multiscale_shrink`, but the prior is the
    estimate (e.g. the denoiser's output) instead of the even split, and the data is H̄ (unbiased,
    cell noise variance ``noise_var``). At every node the parent's final total is first split in
    proportion to the estimate's children; then each child's residual deviation from its siblings,
    e = (H̄_c − D_c) − mean over siblings, is added back with the positive-part Wiener weight
    max(0, 1 − κ·σ_e² / e²) (σ_e² = 0.75·cells·noise_var per slot). So where a block's noisy sum
    disagrees with the estimate by much more than its noise (large blocks at high SNR: the
    denoiser's bias), the output follows the unbiased sum; where the difference looks like noise
    (everywhere at low SNR), the estimate's shape is kept. As in multiscale_shrink the window-total
    part of e (noise T times smaller relative to signal) and its per-slot remainder are weighed
    separately. The root keeps the estimate's total; per-slot totals are corrected likewise, with
    the stricter :func:`slot_kappa` (only T tests, each a whole-region spike if it passes).
    The weighted corrections are re-centred so that siblings' corrections cancel; children are
    clipped at 0 (then rescaled to their parent), so the output is ≥ 0 with the estimate's total. Below ``min_block`` (cells per side) the final block totals are spread in proportion to
    the estimate. ``universal``: at a level with n tested deviations the factor is max(κ, 2·ln n)
    (the universal threshold of wavelet denoising): a level of pure noise then lets almost none of
    its n nodes through, instead of the fraction that exceeds √κ noise standard deviations by chance.
    Post-processing only: it reads nothing but the two released-side arrays.
    """
    e = np.maximum(np.asarray(estimate, dtype=np.float64), 0.0)
    y = np.asarray(noisy, dtype=np.float64)
    if e.shape != y.shape or e.ndim != 3:
        raise ValueError(f"estimate and noisy must have one (nx, ny, nt) shape, got {e.shape} and {y.shape}")
    nx, ny, nt = e.shape
    size, se = quadtree_sums(e)
    _, sy = quadtree_sums(y)

    def _weight(d: np.ndarray, var: float) -> np.ndarray:
        k = max(kappa, 2.0 * np.log(d.size)) if universal and d.size > 1 else kappa
        return shrink_factor(d, var, k)

    root_total = float(se[1].sum())
    est = se[1].copy()  # (1, 1, nt)
    if nt > 1 and root_total > 0:
        r = sy[1] - est
        d = r - r.mean()
        slot_var = noise_var * size * size * (1.0 - 1.0 / nt)
        moved = np.maximum(est + shrink_factor(d, slot_var, slot_kappa(kappa, nt)) * d, 0.0)
        if moved.sum() > 0:
            est = moved * (root_total / moved.sum())
    block = max(1, int(min_block))
    g = 1
    while g < size and size // (2 * g) >= block:
        cells = (size // (2 * g)) ** 2
        parent = est[:, None, :, None, :]
        child_e = se[2 * g].reshape(g, 2, g, 2, nt)
        prior = split_to_parent(child_e, parent)
        r = sy[2 * g].reshape(g, 2, g, 2, nt) - prior
        d = (r - r.mean(axis=(1, 3), keepdims=True)).reshape(2 * g, 2 * g, nt)
        dw = d.sum(axis=2, keepdims=True)
        rem = d - dw / nt
        lw = _weight(dw, noise_var * cells * nt * 0.75)
        lr = _weight(rem, noise_var * cells * 0.75 * (1.0 - 1.0 / nt)) if nt > 1 else 0.0
        shape = (g, 2, g, 2, nt)
        dw, rem = dw.reshape(g, 2, g, 2, 1), rem.reshape(shape)
        lw = lw.reshape(g, 2, g, 2, 1)
        lr = lr.reshape(shape) if nt > 1 else 0.0
        corr = lw * dw / nt + lr * rem
        # re-centre after weighting: the children's corrections cancel, so the parent's total is kept
        # without rescaling every child (a rescale would move mass in proportion to the prior)
        corr = corr - corr.mean(axis=(1, 3), keepdims=True)
        c = split_to_parent(np.maximum(prior + corr, 0.0), parent)
        est = c.reshape(2 * g, 2 * g, nt)
        g *= 2
    if g < size:  # spread the final block totals over their cells in proportion to the estimate
        s = size // g
        est = split_to_parent(se[size].reshape(g, s, g, s, nt), est[:, None, :, None, :]).reshape(size, size, nt)
    return est[:nx, :ny]
