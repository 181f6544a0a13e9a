"""Exact discrete Laplace and discrete Gaussian noise: the laws against their exact pmfs (far tail
included), against OpenDP, the lazy tie path, the rigorous exp bounds, and the sources' properties."""

import copy
import math
import os
import pickle
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpcore.privacy import exact_noise
from dpcore.privacy.noise import (
    NoiseSource,
    _words_to_open_uniform,
    discrete_gaussian_pmf,
    discrete_gaussian_variance,
    discrete_laplace_pmf,
    discrete_laplace_variance,
)


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


def chi_square_binned(sample: np.ndarray, edges: np.ndarray, cdf) -> float:
    """Chi-square over the bins (edges[i], edges[i+1]] plus both open ends, from an exact cdf."""
    cum = np.concatenate([[0.0], cdf(edges), [1.0]])
    observed = np.bincount(np.searchsorted(edges, sample, side="left"), minlength=edges.size + 1)
    return float(stats.chisquare(observed, np.diff(cum) * sample.size).pvalue)


def dlap_cdf(scale: float):
    t = math.exp(-1.0 / scale)
    return lambda x: np.where(x >= 0, 1 - t ** (np.abs(x) + 1.0) / (1 + t), t ** np.abs(x) / (1 + t))


def seeded_words(seed: int):
    rng = np.random.default_rng(seed)
    return lambda n: rng.bit_generator.random_raw(n).astype(np.uint64)


@pytest.mark.parametrize("scale", [0.5, 2.0, 20.0])
def test_seeded_matches_exact_pmf(scale):
    sample = NoiseSource.seeded(1234).discrete_laplace(scale, 400_000)
    assert sample.dtype == np.int64
    assert chi_square_vs_pmf(sample, scale) > 1e-3
    assert abs(sample.var() / discrete_laplace_variance(scale) - 1) < 0.02


def test_large_scale_split_sampler_matches_exact_cdf():
    # Above ~1500 the sampler is G = L·B + R with a sign and "−0" rejected: check the whole law by deciles.
    scale = 3000.0
    sample = NoiseSource.seeded(8).discrete_laplace(scale, 400_000)
    reference = np.random.default_rng(0).laplace(0, scale, 200_000)
    edges = np.round(np.quantile(reference, np.linspace(0.02, 0.98, 25)))
    assert chi_square_binned(sample, edges, dlap_cdf(scale)) > 1e-3
    assert chi_square_binned(sample, edges, dlap_cdf(scale * 1.02)) < 1e-6  # the test can tell 2 %


def test_secure_matches_exact_pmf():
    # Secure noise is not reproducible; a 1e-6 threshold makes a false alarm negligible.
    sample = NoiseSource.secure().discrete_laplace(3.0, 400_000)
    assert chi_square_vs_pmf(sample, 3.0) > 1e-6
    assert NoiseSource.secure().description.startswith("secure:aes-256-ctr")


def test_chi_square_detects_wrong_scale():
    # The test above would catch a sampler calibrated to the wrong sensitivity.
    sample = NoiseSource.seeded(7).discrete_laplace(2.2, 400_000)
    assert chi_square_vs_pmf(sample, 2.0) < 1e-6


# -- the far tail -----------------------------------------------------------------------------------------
K_TAIL = 48  # condition on U < 2^-48: the region of the law 16–21 scales out at scale 0.5


def tail_law_pvalue(mags: np.ndarray, scale: float) -> float:
    """|X| given U < 2^-K against P(|X| ≥ m | U < 2^-K) = min(1, θ(m)·2^K), θ(m) = 2tᵐ/(1 + t)."""
    t = math.exp(-1.0 / scale)
    m = np.arange(0, 200)
    surv = np.minimum(1.0, 2 * t ** m.astype(float) / (1 + t) * 2.0**K_TAIL)
    surv[0] = 1.0
    probs = surv - np.append(surv[1:], 0.0)
    lo, hi = int(np.argmax(probs > 0)), int(np.flatnonzero(probs * mags.size >= 5).max())
    probs = np.concatenate([probs[lo:hi], [probs[hi:].sum()]])
    observed = np.bincount(np.clip(mags, lo, hi) - lo, minlength=hi - lo + 1)
    if observed.sum() != mags.size or (mags < lo).any():
        return 0.0
    return float(stats.chisquare(observed, probs * mags.size).pvalue)


def _old_inversion(v: np.ndarray, scale: float) -> np.ndarray:
    """The replaced sampler's |X| from its 52-bit uniform V in (0, 1] (a reference for this test only)."""
    t = np.exp(-1.0 / scale)
    return np.maximum(np.floor(-scale * np.log(v * (1.0 + t) / 2.0)), 0.0).astype(np.int64)


def test_far_tail_is_exact_where_float_inversion_has_holes():
    # P(|X| ≥ 19) at scale 0.5 is ~1e-16: unobservable directly, so condition on the uniform's first 48
    # bits being zero and compare with the exact conditional law (most mass on 16–21 scales·2 out).
    scale, n = 0.5, 100_000
    table = exact_noise._abs_laplace_table(Fraction(2))
    rng = np.random.default_rng(3)
    a = rng.integers(0, 1 << (exact_noise.BITS - K_TAIL), n)  # U's 62-bit prefix below 2^(62−48)
    mags = table.invert(a, seeded_words(4))
    assert mags.max() >= 21  # values the old sampler could never produce
    assert tail_law_pvalue(mags, scale) > 1e-3
    # The float inversion under the same condition: V on its 52-bit grid, V ≤ 2^-48, i.e. 16 points.
    v = rng.integers(1, 17, n) * 2.0**-52
    old = _old_inversion(v, scale)
    assert old.max() <= 18
    assert tail_law_pvalue(old, scale) < 1e-6


def test_far_tail_of_the_split_sampler():
    # Large scales reach their tail through B ~ Geometric(q^L): the same conditional check on B's table.
    geo = exact_noise.geometric(Fraction(1, 3000))
    lam_b = geo.high.lam
    table = exact_noise._geometric_table(lam_b)
    n = 50_000
    a = np.random.default_rng(5).integers(0, 1 << (exact_noise.BITS - K_TAIL), n)
    b = table.invert(a, seeded_words(6))
    q = math.exp(-float(lam_b))
    surv = np.minimum(1.0, q ** np.arange(0, 400.0) * 2.0**K_TAIL)
    probs = surv - np.append(surv[1:], 0.0)
    support = np.flatnonzero(probs * n >= 5)
    lo, hi = support.min(), support.max()
    observed = np.bincount(np.clip(b, lo, hi) - lo, minlength=hi - lo + 1)
    expected = np.concatenate([probs[lo:hi], [probs[hi:].sum()]]) * n
    assert b.min() >= lo and stats.chisquare(observed, expected).pvalue > 1e-3


def test_lazy_path_resolves_ties_exactly():
    # Prefixes equal to a threshold's floor leave U's comparison open; the lazy path must accept with the
    # fractional part of θ(k)·2^62, the exact conditional probability.
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = 200
    table = exact_noise._abs_laplace_table(Fraction(2))
    words = seeded_words(9)
    for k in (1, 5, 20):
        floor_k = int(table.fe[k])
        phi = float(2 * mp.exp(-2 * k) / (1 + mp.exp(-2)) * mp.mpf(2) ** exact_noise.BITS - floor_k)
        x = table.invert(np.full(20_000, floor_k, dtype=np.int64), words)
        assert set(np.unique(x)) <= {k - 1, k}
        assert stats.binomtest(int((x == k).sum()), x.size, phi).pvalue > 1e-4


def test_a_wrong_float_hint_cannot_change_the_result():
    # Floats only propose a table position; the integer comparisons decide. A table given a random hint
    # must return exactly what the one with the good hint returns.
    table = exact_noise._abs_laplace_table(Fraction(1, 7))
    wild = exact_noise._Inversion(table.fe[:-1].tolist(), False, table.theta,
                                  lambda a: np.random.default_rng(0).uniform(-5, table.m + 5, a.size))
    a = exact_noise.prefixes(np.random.default_rng(1).bit_generator.random_raw(100_000).astype(np.uint64))
    assert np.array_equal(wild.invert(a, seeded_words(2)), table.invert(a, seeded_words(2)))


def test_exp_bounds_are_rigorous():
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = 600
    rng = np.random.default_rng(2)
    for _ in range(200):
        x = Fraction(int(rng.integers(0, 10**6)), int(rng.integers(1, 10**4)))
        w = int(rng.integers(8, 400))
        lo, hi = exact_noise.exp_neg_bounds(x, w)
        true = mp.exp(-mp.mpf(x.numerator) / x.denominator) * mp.mpf(2) ** w
        assert lo <= true <= hi and hi - lo <= 4
        lo, hi = exact_noise.exp_bounds(x / 997, w)
        true = mp.exp(mp.mpf(x.numerator) / x.denominator / 997) * mp.mpf(2) ** w
        assert lo <= true <= hi


def test_scales_are_rounded_up_to_bounded_rationals():
    rng = np.random.default_rng(1)
    for x in [0.1, 1 / 3, 5 / 0.7, 2.0, 1e-3, 123456.789, *rng.uniform(0.01, 1e4, 200)]:
        r = exact_noise.rational_at_least(float(x), "scale", 1e15)
        assert r >= Fraction(float(x)) and r.denominator <= 1 << 20
        assert r - Fraction(float(x)) <= Fraction(1, 1 << 20)
    assert exact_noise.rational_at_least(2.0, "scale", 1e15) == 2  # integers are kept exactly
    with pytest.raises(ValueError):
        NoiseSource.seeded(0).discrete_laplace(2.0**60, 3)


# -- against OpenDP --------------------------------------------------------------------------------------
def _two_sample_p(ours: np.ndarray, theirs: np.ndarray, cut: int) -> float:
    a = np.bincount(np.clip(ours, -cut, cut) + cut, minlength=2 * cut + 1)
    b = np.bincount(np.clip(theirs, -cut, cut) + cut, minlength=2 * cut + 1)
    keep = (a + b) > 0
    return float(stats.chi2_contingency(np.vstack([a[keep], b[keep]]))[1])


def test_matches_opendp_discrete_laplace():
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    scale = 2.0
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=scale)
    theirs = np.asarray(meas([0] * 60_000), dtype=np.int64)
    ours = NoiseSource.seeded(5).discrete_laplace(scale, 60_000)
    assert _two_sample_p(ours, theirs, 12) > 1e-4
    assert _two_sample_p(NoiseSource.seeded(5).discrete_laplace(2.3, 60_000), theirs, 12) < 1e-4


def test_matches_opendp_discrete_gaussian():
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    sigma = 3.0
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int), scale=sigma)
    theirs = np.asarray(meas([0] * 60_000), dtype=np.int64)
    ours = NoiseSource.seeded(6).discrete_gaussian(sigma**2, 60_000)
    assert _two_sample_p(ours, theirs, 12) > 1e-4
    assert _two_sample_p(NoiseSource.seeded(6).discrete_gaussian(3.3**2, 60_000), theirs, 12) < 1e-4


# -- discrete Gaussian -----------------------------------------------------------------------------------
def chi_square_gauss(sample: np.ndarray, sigma2: float) -> float:
    cut = int(np.ceil(4.5 * math.sqrt(sigma2)))
    support = np.arange(-cut, cut + 1)
    probs = discrete_gaussian_pmf(support, sigma2)
    probs[0] += (1 - probs.sum()) / 2
    probs[-1] = 1 - probs[:-1].sum()
    observed = np.bincount(np.clip(sample, -cut, cut) + cut, minlength=support.size)
    return float(stats.chisquare(observed, probs * sample.size).pvalue)


@pytest.mark.parametrize("sigma2", [0.3, 6.0, 50.5, 2500.0])
def test_discrete_gaussian_matches_exact_pmf(sigma2):
    # 6 = t·c with t = 3, c = 2: the proposal's |y| = 2 is accepted with probability exactly 1.
    sample = NoiseSource.seeded(21).discrete_gaussian(sigma2, 300_000)
    assert sample.dtype == np.int64
    assert chi_square_gauss(sample, sigma2) > 1e-3
    assert abs(sample.var() / discrete_gaussian_variance(sigma2) - 1) < 0.02


def test_discrete_gaussian_far_tail_acceptance_is_exact():
    # Beyond its table every |y| has floor 0: acceptance happens only through a tie at prefix 0, with
    # probability e^-γ(y)·2^62. Pick a |y| where that is ≈ 0.3 and force the tie.
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = 200
    g = exact_noise.discrete_gaussian(Fraction(4))
    gam = [mp.mpf(f.numerator) / f.denominator for f in (g.gamma(y) for y in range(40))]
    y = next(y for y in range(40) if y > g.c and mp.exp(-gam[y]) * mp.mpf(2) ** exact_noise.BITS < 0.5)
    p = float(mp.exp(-gam[y]) * mp.mpf(2) ** exact_noise.BITS)
    assert y >= g.fa.size - 1  # outside the table
    acc = g.accept(np.full(20_000, y), np.zeros(20_000, dtype=np.int64), seeded_words(12))
    assert stats.binomtest(int(acc.sum()), acc.size, p).pvalue > 1e-4


def test_add_discrete_gaussian_has_the_zcdp_scale():
    # σ² = Δ₂²/(2ρ): Δ₂ = 3, ρ = 0.5 → σ² = 9; a Gaussian at the wrong ρ would fail the same check.
    noisy = NoiseSource.seeded(13).add_discrete_gaussian(np.full(300_000, 7), l2_sensitivity=3.0, rho=0.5)
    assert noisy.dtype == np.int64
    assert chi_square_gauss(noisy - 7, 9.0) > 1e-3
    assert chi_square_gauss(noisy - 7, 9.0 * 1.05) < 1e-6
    with pytest.raises(ValueError):
        NoiseSource.seeded(0).add_discrete_gaussian(np.zeros(2), 1.0, 0.0)
    with pytest.raises(ValueError):
        NoiseSource.seeded(0).discrete_gaussian(float("nan"), 2)


@pytest.mark.parametrize("sigma2", [0.05, 1.0, 99.0, 150.0, 1e4])
def test_gaussian_pmf_and_variance(sigma2):
    x = np.arange(-int(60 * math.sqrt(sigma2)) - 3, int(60 * math.sqrt(sigma2)) + 4)
    direct = np.exp(-(x * x) / (2 * sigma2))
    direct /= direct.sum()
    assert discrete_gaussian_pmf(x, sigma2) == pytest.approx(direct, rel=1e-10, abs=1e-300)
    assert discrete_gaussian_variance(sigma2) == pytest.approx(float((x * x * direct).sum()), rel=1e-10)
    if sigma2 < 0.1:
        assert discrete_gaussian_variance(sigma2) < 0.01 * sigma2  # far below σ² for small σ


# -- the sources -----------------------------------------------------------------------------------------
def test_seeded_is_reproducible_and_spawn_is_independent():
    a = NoiseSource.seeded(3).discrete_laplace(1.0, 1000)
    b = NoiseSource.seeded(3).discrete_laplace(1.0, 1000)
    assert np.array_equal(a, b)
    assert np.array_equal(NoiseSource.seeded(3).discrete_gaussian(2.0, 500),
                          NoiseSource.seeded(3).discrete_gaussian(2.0, 500))
    c = NoiseSource.seeded(3).spawn(1).discrete_laplace(1.0, 1000)
    assert not np.array_equal(a, c)
    assert "NOT FOR PUBLICATION" in NoiseSource.seeded(3).description


def test_secure_source_never_repeats():
    s = NoiseSource.secure()
    w1, w2 = s.random_words(64), s.random_words(64)
    assert not np.intersect1d(w1, w2).size  # the keystream goes on: no 64-bit word comes back
    assert not np.intersect1d(w1, NoiseSource.secure().random_words(64)).size  # fresh key per source
    for clone in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert clone.secure_mode
        assert not np.intersect1d(clone.random_words(64), s.random_words(64)).size
    assert not np.array_equal(s.discrete_laplace(1e6, 100), s.discrete_laplace(1e6, 100))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_secure_source_rekeys_after_fork():
    # A forked child shares the parent's cipher state; without a new key both would add the same noise.
    s = NoiseSource.secure()
    s.random_words(4)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, s.random_words(8).tobytes())
        os._exit(0)
    os.waitpid(pid, 0)
    child = np.frombuffer(os.read(r, 64), dtype=np.uint64)
    os.close(r)
    os.close(w)
    assert child.size == 8 and not np.intersect1d(child, s.random_words(8)).size


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
    assert np.array_equal(_words_to_open_uniform(np.array([0, 2**64 - 1], dtype=np.uint64)), [1.0, 2.0**-52])


@pytest.mark.parametrize("scale", [0.7, 40.0, 5000.0])
def test_geometric_matches_its_law(scale):
    # P(G ≥ g) = e^(−g/scale): the memoryless tail sparse samplers need (direct and split tables).
    g = NoiseSource.seeded(17).geometric(scale, 200_000)
    assert g.dtype == np.int64 and g.min() >= 0
    edges = np.unique(np.round(np.quantile(np.random.default_rng(0).exponential(scale, 100_000),
                                           np.linspace(0.02, 0.98, 25))))
    def cdf(x):
        return 1 - np.exp(-(np.floor(x) + 1) / scale)
    assert chi_square_binned(g, edges, cdf) > 1e-3
    assert abs(g.mean() / (1 / math.expm1(1 / scale)) - 1) < 0.02
