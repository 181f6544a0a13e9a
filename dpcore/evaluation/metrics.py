"""Error metrics. Range counts: relative error |est − truth| / max(truth, ψ), ψ = 0.1% of n."""

from __future__ import annotations

import numpy as np

PSI_FRACTION = 0.001


def psi_for(n_points: int | float) -> float:
    """Smoothing bound ψ = 0.1% of the region's point count (at least 1, so empty regions work)."""
    return max(1.0, PSI_FRACTION * float(n_points))


def relative_error(estimate: np.ndarray, truth: np.ndarray, psi: float) -> np.ndarray:
    est = np.asarray(estimate, dtype=np.float64)
    tru = np.asarray(truth, dtype=np.float64)
    return np.abs(est - tru) / np.maximum(tru, psi)


# Heatmap quality metrics (EMD, KL, Pearson) live in dpcore.heatmap.metrics; re-exported here.
from dpcore.heatmap.metrics import emd, emd_coarsening_bound, kl_divergence, pearson  # noqa: E402, F401
