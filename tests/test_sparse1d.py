"""Sparse 1-D histograms: thresholding, its sparse sampler, top-t%, and the sparse vector technique,
including the statistical privacy test that tells the correct SVT from a known-broken one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource
from dpcore.sparse1d.histograms import (
    NOT_ANSWERED,
    POSITIVE,
    SparseHistogramError,
    audit_event_ratio,
    laplace_histogram,
    noise_then_threshold,
    noise_then_threshold_sparse,
    sparse_vector,
    svt_decisions,
    svt_decisions_BROKEN_no_query_noise,
    svt_split,
    threshold_for,
    top_percent,
)


def sparse_counts(n_bins=20_000, occupied=60, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(n_bins, dtype=np.int64)
    counts[rng.choice(n_bins, occupied, replace=False)] = rng.integers(20, 400, occupied)
    return counts


def test_threshold_formula_scales_with_sensitivity_and_log_domain():
    assert threshold_for(2.0, 1000, 0.5, 1) == pytest.approx(2.0 * math.log(1000) / 0.5)
    assert threshold_for(2.0, 1000, 0.5, 4) == pytest.approx(4 * threshold_for(2.0, 1000, 0.5, 1))


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_thresholding_lowers_total_absolute_error_against_plain_laplace(eps):
    counts = sparse_counts()
    lap = laplace_histogram(counts, eps, 3, NoiseSource.seeded(1))
    thr = noise_then_threshold(counts, eps, 3, 1.0, NoiseSource.seeded(1))
    top = top_percent(counts, eps, 3, 0.5, NoiseSource.seeded(1))
    err_lap = np.abs(lap - counts).sum()
    assert np.abs(thr - counts).sum() < 0.1 * err_lap
    assert np.abs(top - counts).sum() < 0.1 * err_lap
    assert np.count_nonzero(top) <= 100


def test_sparse_sampler_matches_the_dense_release_in_distribution():
    n_bins, eps, k, eta = 5_000, 1.0, 1, 0.5  # low threshold: several empty bins pass per run
    counts = sparse_counts(n_bins, 30, seed=2)
    keys = np.flatnonzero(counts)
    theta = threshold_for(eta, n_bins, eps, k)
    m = math.ceil(theta)
    t = math.exp(-eps / k)
    expected_spurious = (n_bins - keys.size) * t ** m / (1 + t)
    sparse_spurious, dense_spurious, values = [], [], []
    for seed in range(200):
        rel = noise_then_threshold_sparse(keys, counts[keys], n_bins, eps, k, eta, NoiseSource.seeded(seed))
        assert np.all(np.diff(rel.keys) > 0) and rel.keys.min() >= 0 and rel.keys.max() < n_bins
        assert np.all(rel.values >= theta)
        spurious = ~np.isin(rel.keys, keys)
        sparse_spurious.append(spurious.sum())
        values.append(rel.values[spurious])
        dense = noise_then_threshold(counts, eps, k, eta, NoiseSource.seeded(10_000 + seed))
        dense_spurious.append(np.count_nonzero(dense[counts == 0]))
        assert set(keys[counts[keys] > theta + 40]) <= set(rel.keys.tolist())  # heavy bins survive
    se = math.sqrt(expected_spurious / 200)
    assert abs(np.mean(sparse_spurious) - expected_spurious) < 5 * se
    assert abs(np.mean(dense_spurious) - expected_spurious) < 5 * se
    # Spurious values are m + Geometric: mean m + t/(1 − t).
    v = np.concatenate(values)
    assert abs(v.mean() - (m + t / (1 - t))) < 5 * math.sqrt(t) / (1 - t) / math.sqrt(v.size)


def test_sparse_sampler_rejects_keys_outside_the_public_domain():
    with pytest.raises(SparseHistogramError, match="domain"):
        noise_then_threshold_sparse(np.array([5, 10]), np.array([1, 2]), 8, 1.0, 1, 1.0, NoiseSource.seeded(0))
    with pytest.raises(SparseHistogramError, match="distinct"):
        noise_then_threshold_sparse(np.array([1, 1]), np.array([1, 2]), 8, 1.0, 1, 1.0, NoiseSource.seeded(0))
    with pytest.raises(SparseHistogramError, match="sensitivity"):
        laplace_histogram(np.array([1, 2]), 1.0, 0.5, NoiseSource.seeded(0))


@pytest.mark.parametrize("c", [1, 3, 10])
@pytest.mark.parametrize("frac", [0.0, 0.25])
def test_svt_budget_split_adds_up_and_follows_the_paper_ratio(c, frac):
    e1, e2, e3 = svt_split(2.0, c, frac)
    assert e1 + e2 + e3 == pytest.approx(2.0)
    assert e3 == pytest.approx(2.0 * frac)
    assert e2 / e1 == pytest.approx((2 * c) ** (2 / 3))


def test_svt_stops_after_c_positives():
    queries = np.full(50, 100)  # far above the threshold: every answered query is positive
    dec = svt_decisions(queries, 0.0, 3, 0.5, 0.5, 1, NoiseSource.seeded(0), runs=200)
    assert ((dec == POSITIVE).sum(axis=1) == 3).all()
    assert (dec[:, 3:] == NOT_ANSWERED).all()
    low = svt_decisions(np.zeros(20, dtype=np.int64), 1000.0, 3, 0.5, 0.5, 1, NoiseSource.seeded(1), runs=50)
    assert (low == 0).all()  # nothing clears a far threshold; nothing is cut off


def test_sparse_vector_charges_and_answers():
    acct = Accountant(1.0)
    q = np.array([0, 0, 500, 0, 800, 0, 900])
    res = sparse_vector(q, 100.0, 2, 1.0, 1, NoiseSource.seeded(0), answer_fraction=0.5, acct=acct)
    assert acct.spent == pytest.approx(1.0)
    assert [c.name for c in acct.charges] == ["svt_threshold", "svt_queries", "svt_answers"]
    assert res.positives.tolist() == [2, 4]
    assert res.answers is not None and np.all(np.abs(res.answers - q[[2, 4]]) < 100)


# ---- the statistical privacy test -------------------------------------------------------------
# Neighbouring inputs (each query moves by at most Δ = 1): the order of two queries flips, which is
# where a missing query noise shows (Lyu et al. Sec. 3, Alg. 5).
D = np.array([0, 0, 1])
D_PRIME = np.array([1, 1, 0])
EPS = 1.0
RUNS = 60_000


def _correct(q, noise, runs):
    e1, e2, _ = svt_split(EPS, 1)
    return svt_decisions(q, 0.5, 1, e1, e2, 1, noise, runs)


def _broken(q, noise, runs):
    e1, e2, _ = svt_split(EPS, 1)
    return svt_decisions_BROKEN_no_query_noise(q, 0.5, 1, e1, e2, 1, noise, runs)


def test_statistical_privacy_test_passes_the_correct_svt():
    audit = audit_event_ratio(_correct, D, D_PRIME, EPS, RUNS, NoiseSource.seeded(7))
    assert not audit.violation, audit
    # It is not vacuous: some event's loss is bounded away from zero, close to the ε it must stay under.
    assert audit.max_log_ratio_lower > 0.3 * EPS


def test_statistical_privacy_test_detects_the_broken_svt():
    audit = audit_event_ratio(_broken, D, D_PRIME, EPS, RUNS, NoiseSource.seeded(7))
    assert audit.violation, audit
    assert audit.worst_event == "FFT"  # ⊥⊥⊤ is impossible on D' when queries carry no noise


def test_statistical_privacy_test_catches_a_subtle_bug_too():
    # Alg. 1 with the *monotonic* query-noise scale cΔ/ε₂ on non-monotone neighbours (q₁, q₂ go up,
    # q₃ goes down): the true loss is up to ε₁ + 2ε₂ > ε, which the audit proves from samples.
    def half_noise(q, noise, runs):
        e1, e2, _ = svt_split(EPS, 1)
        return svt_decisions(q, 0.5, 1, e1, e2, 1, noise, runs, monotonic=True)

    audit = audit_event_ratio(half_noise, D, D_PRIME, EPS, 100_000, NoiseSource.seeded(3))
    assert audit.violation, audit
    correct = audit_event_ratio(_correct, D, D_PRIME, EPS, 100_000, NoiseSource.seeded(3))
    assert not correct.violation, correct


def test_sparse_sampler_needs_a_positive_threshold():
    with pytest.raises(SparseHistogramError, match="positive threshold"):
        noise_then_threshold_sparse(np.array([1]), np.array([5]), 100, 1.0, 1, 0.0, NoiseSource.seeded(0))


def test_the_passing_empty_bins_are_counted_without_a_float_binom_ppf(monkeypatch):
    """The count of empty bins that pass is drawn with integer arithmetic (issue 42 item 7): scipy's
    float binom.ppf rounds its inversion, so its law is not the binomial the release is charged for."""
    from scipy import stats

    def float_inversion(*args, **kwargs):
        raise AssertionError("the passing count was drawn by float binom.ppf")

    monkeypatch.setattr(stats.binom, "ppf", float_inversion)
    n_bins, eps, eta = 100_000, 1.0, 0.5
    counts = sparse_counts(n_bins, 30, seed=2)
    keys = np.flatnonzero(counts)
    rel = noise_then_threshold_sparse(keys, counts[keys], n_bins, eps, 1, eta, NoiseSource.seeded(1))
    assert np.count_nonzero(~np.isin(rel.keys, keys)) > 0  # some empty bins passed: the count was drawn


def test_the_exact_passing_count_has_the_binomial_law():
    from scipy import stats

    from dpcore.sparse1d.binomial import passing_count, tail_lambda

    n, m, runs = 40, 1, 20_000
    lam = tail_lambda(1.0)
    p = math.exp(-float(lam) * m) / (1 + math.exp(-float(lam)))
    source = NoiseSource.seeded(5)
    observed = np.bincount([passing_count(n, lam, m, source) for _ in range(runs)], minlength=n + 1)
    expected = runs * stats.binom.pmf(np.arange(n + 1), n, p)
    cells = expected >= 5
    chi2 = float(((observed[cells] - expected[cells]) ** 2 / expected[cells]).sum())
    df = int(cells.sum()) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df), (chi2, df)
    # a huge domain costs a handful of big-integer steps, not one per bin
    assert 1_000 < passing_count(10**12, tail_lambda(2.0), 40, source) < 1_600
