"""Sparse 1-D histograms: noise then threshold, top-t%, and the sparse vector technique done right.

Some releases are 1-D: check-ins per venue, per hour of the week, along a Hilbert order of cells.
Most bins are empty, and noise on the empty bins drowns the signal: with D bins, plain Laplace has
total absolute error ≈ D·scale however few bins are occupied. Keeping only bins whose *noisy* value
clears a threshold removes most of that error. All published noise here is discrete Laplace
(integer counts, integer sensitivity), drawn from the caller's :class:`~dpcore.privacy.noise.NoiseSource`.

Sensitivity: ``sensitivity`` is the L1 sensitivity of the count vector: k under user-level privacy
(each user contributes ≤ k records), 1 under record-level. The bins (the domain) must be public
configuration: a venue id space, the 168 hours of a week — never "the bins that occur in the data".

**Noise then threshold** (Cormode et al. ICDT 2012; Xu et al. 2012/13): add DLap(Δ/ε) to every bin
of the public domain, then release only bins with noisy value ≥ θ = η·Δ·ln(n)/ε, n = number of bins
(the issue's θ = η·log(n)/ε, scaled by the sensitivity so that it stays a multiple of the noise
scale under user-level privacy). Thresholding is post-processing. For a huge domain,
:func:`noise_then_threshold_sparse` samples exactly the same output distribution without touching
the empty bins one by one: how many empty bins pass is Binomial(#empty, P(DLap ≥ ⌈θ⌉)), which ones
is uniform, and their values are ⌈θ⌉ + Geometric (the discrete Laplace tail is memoryless). All three
are drawn exactly, with integer arithmetic on the source's random bits (dpcore/sparse1d/binomial.py:
the count inverts the binomial CDF against lazily read bits, as the published noise does), so the
output has the law of the dense form: no float inversion, no δ.

**Top-t%** (:func:`top_percent`): the same noisy vector, keeping the t% largest bins instead of a
fixed threshold (also post-processing).

**Sparse vector technique**, Lyu, Su, Li, "Understanding the Sparse Vector Technique for
Differential Privacy", VLDB 2017, Algorithm 1 (:func:`sparse_vector`): ε = ε₁ + ε₂ (+ ε₃):
- the threshold noise ρ ~ Lap(Δ/ε₁) is drawn **once**;
- every query gets **fresh** ν_i ~ Lap(2cΔ/ε₂) (cΔ/ε₂ for monotonic queries);
- query i is positive (⊤) when q_i + ν_i ≥ T + ρ; the algorithm **stops after c positives**;
- numeric answers for the positives, if wanted, come from a **separate** budget ε₃ (fresh
  Lap(cΔ/ε₃) on each), never from q_i + ν_i.
Budget split ε₁ : ε₂ = 1 : (2c)^{2/3} (monotonic: 1 : c^{2/3}), the paper's optimum (Sec. 4.2).
With integer queries, integer Δ and discrete Laplace, the paper's proof carries over verbatim: it
shifts ρ by Δ and each positive's ν_i by 2Δ — integers — and the discrete Laplace pmf ratio for an
integer shift s is at most exp(s/scale).

Why the published variants that Lyu et al. examine are broken (their Algorithms 3–6):
- Alg. 3 (Roth's 2011 lecture notes) outputs the noisy value q_i + ν_i of each positive: that value
  together with "it cleared T + ρ" reveals ρ, after which the negatives leak without bound (∞-DP).
- Alg. 4 (Lee & Clifton 2014) draws ν_i ~ Lap(Δ/ε₂) without the factor c (or 2c): the positives'
  privacy losses add up and the true guarantee is ((1 + 6c)/4)·ε, not ε.
- Alg. 5 (Stoddard et al. 2014) adds **no noise to the queries**: a ⊥ for q_i followed by ⊤ for q_j
  pins T + ρ into (q_i, q_j], so neighbouring inputs that swap the order of q_i and q_j give an
  output that is possible under one and impossible under the other (∞-DP).
- Alg. 6 (Chen et al. 2015) also omits query noise scaled by c and **never stops**, so the number of
  positives — and the loss — is unbounded (∞-DP).
:func:`svt_decisions_BROKEN_no_query_noise` implements Alg. 5 *only* so that the statistical privacy
test (:func:`audit_event_ratio`) can show it catches a broken SVT; never use it for a release.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpcore import GeoDPError
from dpcore.privacy.budget import Accountant, check_epsilon
from dpcore.privacy.noise import NoiseSource
from dpcore.sparse1d.binomial import passing_count, tail_lambda


class SparseHistogramError(GeoDPError, ValueError):
    pass


def _check_sensitivity(sensitivity: float) -> int:
    s = float(sensitivity)
    if not (s >= 1 and s == int(s)):
        raise SparseHistogramError(f"sensitivity must be an integer ≥ 1 (k, or 1 per record), got {sensitivity!r}")
    return int(s)


def _check_counts(counts: np.ndarray) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size == 0:
        raise SparseHistogramError("counts must be a non-empty 1-D array (one entry per public bin)")
    if c.dtype.kind not in "iu":
        if not np.all(np.isfinite(c)) or not np.all(c == np.rint(c)):
            raise SparseHistogramError("counts must be integers")
    return c.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# noise then threshold / top-t%
# ---------------------------------------------------------------------------------------------
def threshold_for(eta: float, n_bins: int, epsilon: float, sensitivity: float = 1) -> float:
    """θ = η·Δ·ln(n_bins)/ε: η noise scales times ln(number of public bins)."""
    eps = check_epsilon(epsilon)
    if not (eta >= 0 and math.isfinite(eta)):
        raise SparseHistogramError(f"eta must be a finite number ≥ 0, got {eta!r}")
    if n_bins < 1:
        raise SparseHistogramError("the domain needs at least one bin")
    return float(eta) * float(sensitivity) * math.log(n_bins) / eps


def laplace_histogram(counts: np.ndarray, epsilon: float, sensitivity: float, noise: NoiseSource,
                      acct: Accountant | None = None) -> np.ndarray:
    """counts + DLap(Δ/ε) on every bin (int64): the plain Laplace baseline, and the first step of
    thresholding. Charges ``epsilon`` to ``acct`` when one is given."""
    c = _check_counts(counts)
    k = _check_sensitivity(sensitivity)
    eps = check_epsilon(epsilon)
    if acct is not None:
        acct.spend("bins", eps, k, note=f"{c.size} disjoint public bins; L1 sensitivity {k}")
    return noise.add_discrete_laplace(c, k, eps)


def noise_then_threshold(counts: np.ndarray, epsilon: float, sensitivity: float, eta: float,
                         noise: NoiseSource, acct: Accountant | None = None) -> np.ndarray:
    """Dense release: noisy bins below θ = η·Δ·ln(n)/ε set to 0 (n = ``counts.size``)."""
    noisy = laplace_histogram(counts, epsilon, sensitivity, noise, acct)
    theta = threshold_for(eta, noisy.size, epsilon, sensitivity)
    return np.where(noisy >= theta, noisy, 0)


def top_percent(counts: np.ndarray, epsilon: float, sensitivity: float, percent: float,
                noise: NoiseSource, acct: Accountant | None = None) -> np.ndarray:
    """Dense release keeping the ``percent`` % largest noisy bins (negatives zeroed), the rest 0."""
    if not (0 < percent <= 100):
        raise SparseHistogramError(f"percent must be in (0, 100], got {percent!r}")
    noisy = laplace_histogram(counts, epsilon, sensitivity, noise, acct)
    keep = max(1, int(round(noisy.size * percent / 100.0)))
    out = np.zeros_like(noisy)
    top = np.argpartition(-noisy, keep - 1)[:keep]
    out[top] = np.maximum(noisy[top], 0)
    return out


@dataclass(frozen=True)
class SparseRelease:
    """Released bins of a domain [0, n_bins): ``keys`` (sorted int64) with noisy ``values``."""

    keys: np.ndarray
    values: np.ndarray
    n_bins: int
    threshold: float

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.n_bins, dtype=np.int64)
        out[self.keys] = self.values
        return out


def _uniform_ints(noise: NoiseSource, n: int, high: int) -> np.ndarray:
    """n integers exactly uniform on [0, high) from the noise source's 64-bit words (secure in secure
    mode): a word at or above the largest multiple of ``high`` is drawn again (rejection, no float)."""
    limit = np.uint64((1 << 64) - (1 << 64) % high) if (1 << 64) % high else None
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
        words = noise.random_words(n - out.size)
        if limit is not None:
            words = words[words < limit]
        out = np.concatenate([out, (words % np.uint64(high)).astype(np.int64)])
    return out


def noise_then_threshold_sparse(keys: np.ndarray, counts: np.ndarray, n_bins: int, epsilon: float,
                                sensitivity: float, eta: float, noise: NoiseSource,
                                acct: Accountant | None = None) -> SparseRelease:
    """The output distribution of :func:`noise_then_threshold` over the public domain [0, n_bins),
    given only the occupied bins (``keys`` with ``counts``); cost O(occupied + released)."""
    keys = np.asarray(keys, dtype=np.int64)
    c = _check_counts(counts)
    if keys.shape != c.shape:
        raise SparseHistogramError("keys and counts must have the same length")
    if keys.size and (keys.min() < 0 or keys.max() >= n_bins):
        raise SparseHistogramError(f"bin keys must lie in the public domain [0, {n_bins})")
    if np.unique(keys).size != keys.size:
        raise SparseHistogramError("bin keys must be distinct")
    k = _check_sensitivity(sensitivity)
    eps = check_epsilon(epsilon)
    theta = threshold_for(eta, n_bins, eps, k)
    if not theta > 0:
        raise SparseHistogramError("the sparse sampler needs a positive threshold (eta > 0 and n_bins ≥ 2)")
    if acct is not None:
        acct.spend("bins", eps, k, note=f"{n_bins} disjoint public bins; L1 sensitivity {k}")
    scale = k / eps
    noisy = c + noise.discrete_laplace(scale, c.shape)
    keep = noisy >= theta
    out_keys, out_vals = [keys[keep]], [noisy[keep]]
    n_empty = int(n_bins - keys.size)
    m = math.ceil(theta)  # integer noise ≥ θ ⇔ ≥ ⌈θ⌉ ≥ 1
    if n_empty > 0:
        # how many pass: Binomial(n_empty, p_pass) drawn exactly (integer bounds, lazily read bits)
        n_pass = passing_count(n_empty, tail_lambda(scale), m, noise)
        if n_pass:
            occupied = np.sort(keys)
            # Uniform distinct positions among the empty bins, by rank: the first n_pass distinct values
            # of a sequence of uniform ranks in [0, n_empty) (a uniform subset), then rank r → r-th empty bin.
            ranks = np.empty(0, dtype=np.int64)
            while True:
                ranks = np.concatenate([ranks, _uniform_ints(noise, 2 * n_pass - min(n_pass, ranks.size) + 8, n_empty)])
                _, first = np.unique(ranks, return_index=True)
                if first.size >= n_pass:
                    chosen = ranks[np.sort(first)[:n_pass]]
                    break
            # r-th empty bin = r + #occupied bins ≤ it; solve by searchsorted on occupied − arange.
            gaps = occupied - np.arange(occupied.size)
            empty_bins = chosen + np.searchsorted(gaps, chosen, side="right")
            # Values: m + Geometric(1 − t) failures (the discrete Laplace tail above m is memoryless).
            extra = noise.geometric(scale, n_pass)  # exact: no float inversion in the published tail
            out_keys.append(empty_bins)
            out_vals.append(m + extra)
    keys_all = np.concatenate(out_keys)
    vals_all = np.concatenate(out_vals).astype(np.int64)
    order = np.argsort(keys_all)
    return SparseRelease(keys_all[order], vals_all[order], int(n_bins), theta)


# ---------------------------------------------------------------------------------------------
# sparse vector technique (Lyu, Su, Li VLDB 2017, Alg. 1)
# ---------------------------------------------------------------------------------------------
POSITIVE, NEGATIVE, NOT_ANSWERED = 1, 0, -1


def svt_split(epsilon: float, c: int, answer_fraction: float = 0.0, monotonic: bool = False) -> tuple[float, float, float]:
    """(ε₁, ε₂, ε₃): ε₃ = answer_fraction·ε for numeric answers, the rest split ε₁ : ε₂ = 1 : (2c)^{2/3}
    (1 : c^{2/3} for monotonic queries), Lyu et al. Sec. 4.2. The three add up to ε."""
    eps = check_epsilon(epsilon)
    if int(c) < 1:
        raise SparseHistogramError(f"c (the number of positives) must be ≥ 1, got {c!r}")
    if not (0 <= answer_fraction < 1):
        raise SparseHistogramError(f"answer_fraction must be in [0, 1), got {answer_fraction!r}")
    eps3 = eps * answer_fraction
    rest = eps - eps3
    ratio = (int(c) if monotonic else 2 * int(c)) ** (2.0 / 3.0)
    eps1 = rest / (1.0 + ratio)
    return eps1, rest - eps1, eps3


def _decisions(queries: np.ndarray, threshold: float, c: int, rho: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """(runs, m) int8 decisions with the cutoff: a query is answered iff fewer than c positives precede it."""
    above = (queries[None, :] + nu) >= (threshold + rho)
    before = np.cumsum(above, axis=1) - above
    return np.where(before < c, above.astype(np.int8), np.int8(NOT_ANSWERED)).astype(np.int8)


def svt_decisions(queries: np.ndarray, threshold: float, c: int, eps1: float, eps2: float, sensitivity: float,
                  noise: NoiseSource, runs: int = 1, monotonic: bool = False) -> np.ndarray:
    """Lyu et al. Alg. 1 decisions, vectorised over ``runs`` independent runs: (runs, m) int8 of
    1 (⊤), 0 (⊥), −1 (not answered: the run had stopped after c positives). Queries are integers
    with sensitivity Δ each; ρ ~ DLap(Δ/ε₁) once per run, ν_i ~ DLap(2cΔ/ε₂) fresh per query."""
    q = _check_counts(queries)
    k = _check_sensitivity(sensitivity)
    c = int(c)
    if c < 1:
        raise SparseHistogramError("c must be ≥ 1")
    check_epsilon(eps1, "ε₁")
    check_epsilon(eps2, "ε₂")
    rho = noise.discrete_laplace(k / eps1, (runs, 1))
    nu = noise.discrete_laplace((1 if monotonic else 2) * c * k / eps2, (runs, q.size))
    return _decisions(q, threshold, c, rho, nu)


def svt_decisions_BROKEN_no_query_noise(queries: np.ndarray, threshold: float, c: int, eps1: float,
                                        eps2: float, sensitivity: float, noise: NoiseSource,
                                        runs: int = 1) -> np.ndarray:
    """KNOWN BROKEN — NOT differentially private. Lyu et al. Alg. 5 (Stoddard et al. 2014): the
    threshold is noised but the queries are not, so outputs pin T + ρ between query values and
    some outputs are possible on one input and impossible on a neighbour (∞-DP). Kept only so
    the statistical test can show that it detects a broken SVT. ``eps2`` is accepted and ignored,
    which is exactly the bug."""
    q = _check_counts(queries)
    k = _check_sensitivity(sensitivity)
    rho = noise.discrete_laplace(k / check_epsilon(eps1, "ε₁"), (runs, 1))
    return _decisions(q, threshold, int(c), rho, np.zeros((runs, q.size), dtype=np.int64))


@dataclass(frozen=True)
class SVTResult:
    decisions: np.ndarray  # (m,) int8: 1 ⊤, 0 ⊥, −1 not answered
    positives: np.ndarray  # indices of the ⊤ queries (≤ c)
    answers: np.ndarray | None  # noisy counts of the positives from ε₃ (None when ε₃ = 0)
    epsilons: tuple[float, float, float]


def sparse_vector(queries: np.ndarray, threshold: float, c: int, epsilon: float, sensitivity: float,
                  noise: NoiseSource, answer_fraction: float = 0.0, monotonic: bool = False,
                  acct: Accountant | None = None) -> SVTResult:
    """Lyu et al. Alg. 1 over ``queries`` in order, with optional numeric answers for the positives.

    Charges (when ``acct`` is given): ε₁ for the threshold noise (sensitivity Δ), ε₂ for the query
    noise (each of ≤ c positives costs ε₂/c at a shift of 2Δ), ε₃ for the answers (c answers of
    sensitivity Δ each: total cΔ, so DLap(cΔ/ε₃) on each).
    """
    k = _check_sensitivity(sensitivity)
    eps1, eps2, eps3 = svt_split(epsilon, c, answer_fraction, monotonic)
    if acct is not None:
        acct.spend("svt_threshold", eps1, k, note="threshold noise ρ ~ DLap(Δ/ε₁), drawn once")
        acct.spend("svt_queries", eps2, k, note=f"fresh ν_i ~ DLap({'' if monotonic else '2'}cΔ/ε₂) per query; "
                   f"stops after c={int(c)} positives")
    dec = svt_decisions(queries, threshold, c, eps1, eps2, k, noise, 1, monotonic)[0]
    pos = np.flatnonzero(dec == POSITIVE)
    answers = None
    if eps3 > 0:
        if acct is not None:
            acct.spend("svt_answers", eps3, int(c) * k, note="numeric answers of the ≤ c positives, separate budget")
        q = _check_counts(queries)
        answers = q[pos] + noise.discrete_laplace(int(c) * k / eps3, pos.shape)
    return SVTResult(dec, pos, answers, (eps1, eps2, eps3))


# ---------------------------------------------------------------------------------------------
# statistical privacy audit
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AuditResult:
    """Largest lower confidence bound on ln(P[E | D] / P[E | D']) over output events E (both ways)."""

    epsilon: float
    max_log_ratio_lower: float
    worst_event: str
    runs: int
    confidence: float

    @property
    def violation(self) -> bool:
        return self.max_log_ratio_lower > self.epsilon


def _cp_bounds(k: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper–Pearson lower and upper bounds at level 1 − alpha each."""
    k = np.asarray(k, dtype=np.float64)
    lower = np.where(k > 0, stats.beta.ppf(alpha, k, n - k + 1), 0.0)
    upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, n - k), 1.0)
    return lower, upper


def audit_event_ratio(run: Callable[[np.ndarray, NoiseSource, int], np.ndarray], queries_d: np.ndarray,
                      queries_d2: np.ndarray, epsilon: float, runs: int, noise: NoiseSource,
                      confidence: float = 0.99) -> AuditResult:
    """Estimate every output event's probability on neighbouring inputs D, D' over ``runs`` runs each
    and bound the privacy-loss ratio from below with Clopper–Pearson intervals (Bonferroni over all
    events and both directions, so the whole statement holds with probability ≥ ``confidence``).

    ``run(queries, noise, runs)`` returns (runs, m) outputs. An ε-DP mechanism has, with probability
    ≥ confidence, ``max_log_ratio_lower ≤ ε``; a lower bound above ε *proves* (at that confidence)
    that the mechanism is not ε-DP.
    """
    out_d = np.asarray(run(np.asarray(queries_d), noise, runs))
    out_d2 = np.asarray(run(np.asarray(queries_d2), noise, runs))
    both = np.concatenate([out_d, out_d2])
    patterns, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    cnt_d = np.bincount(inverse[:runs], minlength=len(patterns))
    cnt_d2 = np.bincount(inverse[runs:], minlength=len(patterns))
    alpha = (1 - confidence) / (4 * len(patterns))
    lo_d, up_d = _cp_bounds(cnt_d, runs, alpha)
    lo_d2, up_d2 = _cp_bounds(cnt_d2, runs, alpha)
    with np.errstate(divide="ignore"):
        r1 = np.log(lo_d) - np.log(up_d2)
        r2 = np.log(lo_d2) - np.log(up_d)
    r = np.maximum(r1, r2)
    i = int(np.argmax(r))
    return AuditResult(float(epsilon), float(r[i]), "".join({1: "T", 0: "F", -1: "-"}[int(v)] for v in patterns[i]),
                       int(runs), float(confidence))
