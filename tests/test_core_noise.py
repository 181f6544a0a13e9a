"""Discrete Laplace noise: distribution against the exact pmf, against OpenDP, and the input checks."""

import numpy as np
import pytest
from scipy import stats

from dpcore.noise import NoiseSource, discrete_laplace_pmf, discrete_laplace_variance


def chi_square_vs_pmf(sample: np.ndarray, scale: float) -> float:
    """p-value of a chi-square goodness-of-fit test, tails pooled into the end bins."""
    cut = int(np.ceil(6 * scale))
    support = np.arange(-cut, cut + 1)
    probs = discrete_laplace_pmf(support, scale)
    probs[0] += (1 - probs.sum()) / 2
    probs[-1] = 1 - probs[:-1].sum()
    clipped = np.clip(sample, -cut, cut)
    observed = np.bincount(clipped + cut, minlength=support.size)
    return float(stats.chisquare(observed, probs * sample.size).pvalue)


@pytest.mark.parametrize("scale", [0.5, 2.0, 20.0])
def test_seeded_matches_exact_pmf(scale):
    sample = NoiseSource.seeded(1234).discrete_laplace(scale, 400_000)
    assert sample.dtype == np.int64
    assert chi_square_vs_pmf(sample, scale) > 1e-3
    assert abs(sample.var() / discrete_laplace_variance(scale) - 1) < 0.02


def test_secure_matches_exact_pmf():
    # Secure noise is not reproducible; a 1e-6 threshold makes a false alarm negligible.
    sample = NoiseSource.secure().discrete_laplace(3.0, 400_000)
    assert chi_square_vs_pmf(sample, 3.0) > 1e-6
    assert NoiseSource.secure().description.startswith("secure")


def test_chi_square_detects_wrong_scale():
    # The test above would catch a sampler calibrated to the wrong sensitivity.
    sample = NoiseSource.seeded(7).discrete_laplace(2.2, 400_000)
    assert chi_square_vs_pmf(sample, 2.0) < 1e-6


def test_matches_opendp_discrete_laplace():
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    scale = 2.0
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=scale)
    theirs = np.asarray(meas([0] * 60_000), dtype=np.int64)
    ours = NoiseSource.seeded(5).discrete_laplace(scale, 60_000)
    cut = 12
    a = np.bincount(np.clip(ours, -cut, cut) + cut, minlength=2 * cut + 1)
    b = np.bincount(np.clip(theirs, -cut, cut) + cut, minlength=2 * cut + 1)
    _, p, _, _ = stats.chi2_contingency(np.vstack([a, b]) + 1)
    assert p > 1e-4


def test_seeded_is_reproducible_and_spawn_is_independent():
    a = NoiseSource.seeded(3).discrete_laplace(1.0, 1000)
    b = NoiseSource.seeded(3).discrete_laplace(1.0, 1000)
    assert np.array_equal(a, b)
    c = NoiseSource.seeded(3).spawn(1).discrete_laplace(1.0, 1000)
    assert not np.array_equal(a, c)
    assert "NOT FOR PUBLICATION" in NoiseSource.seeded(3).description


def test_add_discrete_laplace_is_integer_and_validates():
    ns = NoiseSource.seeded(0)
    out = ns.add_discrete_laplace(np.array([[1, 2], [3, 4]]), sensitivity=5, epsilon=1.0)
    assert out.shape == (2, 2) and out.dtype == np.int64
    with pytest.raises(ValueError):
        ns.add_discrete_laplace(np.zeros(3), sensitivity=1, epsilon=0.0)
    with pytest.raises(ValueError):
        ns.add_discrete_laplace(np.zeros(3), sensitivity=1, epsilon=-1.0)
    with pytest.raises(ValueError):
        ns.discrete_laplace(float("nan"), 3)


@pytest.mark.parametrize(("sensitivity", "epsilon"), [(1.0, 2.0), (5.0, 1.0), (10.0, 0.2)])
def test_variance_matches_add_discrete_laplace_draws(sensitivity, epsilon):
    # The mechanisms weight noisy counts by this variance; check it against what they actually add.
    scale = sensitivity / epsilon  # 0.5, 5, 50
    noisy = NoiseSource.seeded(11).add_discrete_laplace(np.zeros(400_000), sensitivity, epsilon)
    assert abs(noisy.var() / discrete_laplace_variance(scale) - 1) < 0.02
    if scale < 1:
        # At small scales the continuous-Laplace 2·scale² is visibly wrong (0.5 vs 0.362 here).
        assert abs(noisy.var() / (2 * scale**2) - 1) > 0.2


@pytest.mark.parametrize("scale", [1e3, 1e6, 1e9, 1e12, 1e15, 1e17])
def test_variance_is_stable_for_large_scales(scale):
    # Var = 2t/(1 − t)² = 1/(2·sinh²(1/(2·scale))) = 2·scale² − 1/6 + O(scale⁻²): the sinh form has
    # no cancellation, so it checks the computed value to near machine precision where 1 − t would not.
    v = discrete_laplace_variance(scale)
    assert np.isfinite(v)
    assert v == pytest.approx(1.0 / (2.0 * np.sinh(0.5 / scale) ** 2), rel=1e-12)
    assert v == pytest.approx(2.0 * scale**2 - 1.0 / 6.0, rel=1e-12)


@pytest.mark.parametrize("scale", [0.3, 2.0, 1e6, 1e12, 1e17])
def test_pmf_is_exact_and_stable_for_large_scales(scale):
    # pmf(x) = (1 − t)/(1 + t)·t^|x|, t = exp(−1/scale). For large scales the limit is the continuous
    # Laplace density 1/(2·scale)·exp(−|x|/scale); at small ones, check against the direct form in
    # long arithmetic (no cancellation there), and that it sums to 1 over a wide support.
    x = np.array([0, 1, -3, 7])
    p = discrete_laplace_pmf(x, scale)
    if scale >= 1e6:
        assert p == pytest.approx(np.exp(-np.abs(x) / scale) / (2 * scale), rel=1e-9, abs=0)
    else:
        t = np.exp(np.longdouble(-1.0) / np.longdouble(scale))
        direct = (1 - t) / (1 + t) * t ** np.abs(x).astype(np.longdouble)
        assert p == pytest.approx(direct.astype(np.float64), rel=1e-13, abs=0)
        support = np.arange(-2000, 2001)
        assert discrete_laplace_pmf(support, scale).sum() == pytest.approx(1.0, abs=1e-12)


def test_snapped_laplace_lies_on_grid():
    v = NoiseSource.seeded(0).snapped_laplace(np.array([0.123, 0.5, 2.0]), scale=1.0, granularity=0.25)
    assert np.allclose(v / 0.25, np.rint(v / 0.25))


def test_uniform_open_range():
    u = NoiseSource.secure().uniform_open(100_000)
    assert u.min() > 0 and u.max() <= 1 and abs(u.mean() - 0.5) < 0.01
