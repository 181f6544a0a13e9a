"""Heatmap metrics: EMD against brute-force transport, the coarsening bound, KL and Pearson."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from dpcore.heatmap.metrics import MetricError, emd, emd_coarsening_bound, kl_divergence, pearson


def brute_force_emd(a: np.ndarray, b: np.ndarray) -> float:
    """Transport LP over every pair of cells (no POT, no support trimming), Euclidean in side units."""
    n = a.shape[0]
    p = (a / a.sum()).ravel()
    q = (b / b.sum()).ravel()
    idx = np.arange(n * n)
    cx, cy = (idx // n + 0.5) / n, (idx % n + 0.5) / n
    cost = np.hypot(cx[:, None] - cx[None, :], cy[:, None] - cy[None, :]).ravel()
    m = n * n
    rows = np.zeros((2 * m, m * m))
    for i in range(m):
        rows[i, i * m:(i + 1) * m] = 1  # mass leaving cell i of a
        rows[m + i, i::m] = 1  # mass arriving at cell i of b
    res = linprog(cost, A_eq=rows, b_eq=np.concatenate([p, q]), bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.fun)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [3, 4])
def test_emd_equals_brute_force_transport_on_tiny_grids(seed, n):
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) * (rng.random((n, n)) < 0.6)
    b = rng.random((n, n))
    a[0, 0] += 0.1  # never all zero
    assert emd(a, b) == pytest.approx(brute_force_emd(a, b), abs=1e-9)


def test_emd_of_a_unit_shift_is_the_shift():
    a = np.zeros((8, 8))
    b = np.zeros((8, 8))
    a[2, 3] = 1
    b[5, 7] = 1
    assert emd(a, b) == pytest.approx(np.hypot(3, 4) / 8)
    assert emd(a, a) == pytest.approx(0.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_coarsened_emd_is_within_its_stated_bound_of_the_exact_value(seed):
    rng = np.random.default_rng(seed)
    a = rng.random((16, 16)) ** 6  # spiky
    b = rng.random((16, 16)) ** 6
    exact = emd(a, b, max_side=16)
    coarse = emd(a, b, max_side=4)
    bound = emd_coarsening_bound(16, 4)
    assert bound == pytest.approx(np.sqrt(2) / 4)
    assert abs(coarse - exact) <= bound
    assert emd_coarsening_bound(16, 16) == 0.0


def test_kl_and_pearson():
    rng = np.random.default_rng(0)
    a = rng.random((8, 8))
    assert kl_divergence(a, a) == pytest.approx(0.0, abs=1e-3)  # only the smoothing separates them
    b = a.copy()
    b[0, 0] = 0
    assert kl_divergence(a, b) > kl_divergence(a, a)
    assert pearson(a, 3 * a) == pytest.approx(1.0)
    assert pearson(a, a.max() - a) == pytest.approx(-1.0)
    assert pearson(a, np.ones_like(a)) == 0.0


def test_metrics_reject_mismatched_grids():
    with pytest.raises(MetricError):
        emd(np.ones((4, 4)), np.ones((5, 5)))
    with pytest.raises(MetricError):
        pearson(np.ones(4), np.ones(4))
