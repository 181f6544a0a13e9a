"""Heatmap quality metrics (Ghazi et al., AAAI 2023): EMD, KL divergence, Pearson correlation.

All three compare *normalised* heatmaps (non-negative part scaled to sum 1, see
:func:`dpcore.heatmap.quadtree.normalise`), so a release's total mass does not matter, only where it is.
Re-exported by :mod:`dpcore.evaluation.metrics`.

EMD (earth mover's distance, Wasserstein-1) uses the Euclidean distance between cell centres in
units of the region's side (so values are comparable across resolutions: 0.1 = mass moved a tenth
of the region on average). It is solved exactly by POT's network simplex (``ot.emd2``) on the
cells that hold mass. Grids finer than ``max_side`` are first summed into ``max_side`` × ``max_side``
blocks: this moves every unit of mass of each heatmap by at most half a block diagonal, so by the
triangle inequality the coarse value is within ``√2 / max_side`` side units of the exact EMD
(:func:`emd_coarsening_bound`; tested against the exact value on small grids). With
``max_side ≥ Δ`` the value is exact.
"""

from __future__ import annotations

import math

import numpy as np

from dpcore import GeoDPError
from dpcore.grid.histogram import resample_grid
from dpcore.heatmap.quadtree import normalise

DEFAULT_EMD_MAX_SIDE = 64
DEFAULT_KL_SMOOTHING = 1e-4


class MetricError(GeoDPError, ValueError):
    pass


def _check_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise MetricError(f"heatmaps must be 2-D grids of the same shape, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise MetricError("heatmaps must be finite")
    return a, b


def coarsen(grid: np.ndarray, side: int) -> np.ndarray:
    """Sum a (n, n) grid into (side, side) blocks (mass-preserving; exact block sums when side | n)."""
    g = np.asarray(grid, dtype=np.float64)
    n = g.shape[0]
    if n <= side:
        return g
    if n % side == 0 and g.shape[1] == n:
        f = n // side
        return g.reshape(side, f, side, f).sum(axis=(1, 3))
    return resample_grid(g, side, side)


def emd_coarsening_bound(resolution: int, max_side: int = DEFAULT_EMD_MAX_SIDE) -> float:
    """Largest possible |coarse EMD − exact EMD| in side units (0 when no coarsening happens)."""
    return 0.0 if resolution <= max_side else math.sqrt(2.0) / max_side


def emd(true: np.ndarray, released: np.ndarray, max_side: int = DEFAULT_EMD_MAX_SIDE) -> float:
    """Earth mover's distance between two normalised heatmaps, in units of the region side."""
    import ot

    a, b = _check_pair(true, released)
    if max_side < 1:
        raise MetricError("max_side must be ≥ 1")
    p = normalise(coarsen(normalise(a), max_side))
    q = normalise(coarsen(normalise(b), max_side))
    nx, ny = p.shape
    ia = np.flatnonzero(p.ravel() > 0)
    ib = np.flatnonzero(q.ravel() > 0)
    ca = np.stack([(ia // ny + 0.5) / nx, (ia % ny + 0.5) / ny], axis=1)
    cb = np.stack([(ib // ny + 0.5) / nx, (ib % ny + 0.5) / ny], axis=1)
    cost = np.sqrt(((ca[:, None, :] - cb[None, :, :]) ** 2).sum(axis=2))
    wa = p.ravel()[ia]
    wb = q.ravel()[ib]
    # Both weights sum to 1 up to round-off; rescale so the network simplex sees equal totals.
    wa = wa / wa.sum()
    wb = wb / wb.sum()
    return float(ot.emd2(wa, wb, cost, numItermax=50_000_000))


def kl_divergence(true: np.ndarray, released: np.ndarray, smoothing: float = DEFAULT_KL_SMOOTHING) -> float:
    """KL(true ‖ released) in nats. The release is mixed with the uniform distribution at weight
    ``smoothing`` so that cells where it put no mass give a finite (large) penalty, not infinity."""
    a, b = _check_pair(true, released)
    if not (0 < smoothing < 1):
        raise MetricError("smoothing must be in (0, 1)")
    p = normalise(a).ravel()
    q = (1.0 - smoothing) * normalise(b).ravel() + smoothing / b.size
    m = p > 0
    return float(np.sum(p[m] * np.log(p[m] / q[m])))


def pearson(true: np.ndarray, released: np.ndarray) -> float:
    """Pearson correlation of the cell values of the two normalised heatmaps (0 if either is constant)."""
    a, b = _check_pair(true, released)
    p = normalise(a).ravel()
    q = normalise(b).ravel()
    p = p - p.mean()
    q = q - q.mean()
    den = math.sqrt(float(p @ p) * float(q @ q))
    return 0.0 if den == 0 else float(p @ q) / den


__all__ = ["DEFAULT_EMD_MAX_SIDE", "DEFAULT_KL_SMOOTHING", "MetricError", "coarsen", "emd",
           "emd_coarsening_bound", "kl_divergence", "pearson"]
