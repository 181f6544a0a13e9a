"""Exact samplers for the discrete Laplace and discrete Gaussian laws, vectorised with numpy.

Every random decision compares an integer drawn from random words with an integer threshold that is
the *exact* floor of the target probability times 2^b (computed once per scale with Python's big
integers and rigorous interval bounds on exp). A uniform U in [0, 1) is read lazily, Knuth–Yao style:
the top ``BITS`` bits of one word decide almost every comparison; when they equal the threshold's
floor (probability ≲ table size · 2^-62) the lane goes to a scalar path that appends 64 more random
bits and compares against the next 64 bits of the threshold, until the comparison is decided. The
thresholds are irrational (e^-x for rational x ≠ 0), so that ends with probability 1. Floats only
*propose* where in a table a lane falls; the integer comparisons decide, so the laws are exact.

* ``TwoSidedLaplace(λ)``: P(Y = y) ∝ exp(−λ|y|). For moderate scales by inversion of |Y| with
  P(|Y| ≥ m) = 2q^m/(1 + q), q = e^-λ, and an independent sign bit (one word per sample). For large
  scales G = L·B + R, a one-sided geometric G with R truncated to [0, L) and B ~ Geometric(q^L)
  independent (the memoryless split), signed with rejection of "−0" (Canonne–Kamath–Steinke 2020,
  Algorithm 2's sign step).
* ``DiscreteGaussian(σ²)``: Canonne–Kamath–Steinke (NeurIPS 2020) Algorithm 3: propose Y from the
  discrete Laplace of scale t = ⌊σ⌋ + 1 and accept with probability exp(−(|Y| − σ²/t)²/(2σ²)); the
  Bernoulli is decided against the exact threshold of each |Y|.

Scales are exact rationals: callers round their float scale UP with :func:`rational_at_least`
(more noise, never a weaker guarantee).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import numpy as np

WordSource = Callable[[int], np.ndarray]  # n → n uint64 random words

BITS = 62  # bits of a word that give U's first digits; bit 0 carries the sign where one is needed
_ONE = 1 << BITS
_DEN_LIMIT = 1 << 20  # denominators of the rounded scales
MAX_SCALE = float(1 << 52)  # beyond it int64 noise could overflow
_DIRECT_MAX = 1 << 16  # largest inversion table for |Y| (≈ 43·scale entries); larger scales split
_GAUSS_TABLE_MAX = 1 << 22  # acceptance table of the discrete Gaussian (≈ 10.4·σ entries)
CHUNK = 1 << 18  # lanes per vectorised pass: the temporaries stay in cache


# -- exact rationals and rigorous bounds --------------------------------------------------------------
def rational_at_least(x: float | Fraction, what: str, upper: float) -> Fraction:
    """A rational ≥ x with denominator ≤ 2^20: the closest such if it is not below x, else ⌈x·2^20⌉/2^20.

    Noise scales (and σ²) are rounded UP to it, so the noise is never smaller than requested; the
    change is below 2^-20 absolute (none at all for integers and simple fractions).
    """
    if not isinstance(x, Fraction):
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"{what} must be a positive finite number, got {x}")
    fx = Fraction(x)
    if not 0 < fx <= upper:
        raise ValueError(f"{what} must be a positive number ≤ {upper:g}, got {x}")
    r = fx.limit_denominator(_DEN_LIMIT)
    if r < fx:
        r = Fraction(-((-fx.numerator * _DEN_LIMIT) // fx.denominator), _DEN_LIMIT)
    return r


def _ceil_shift(v: int, s: int) -> int:
    return -((-v) >> s)


def exp_neg_bounds(x: Fraction, w: int) -> tuple[int, int]:
    """Integers lo ≤ e^-x·2^w ≤ hi for rational x ≥ 0, with hi − lo ≤ 4.

    exp(−x) = exp(−x/2^k)^(2^k) with x/2^k ≤ 1/2; the series is summed in fixed point with floored
    terms (each term low by at most its index, the alternating tail below the last zero term), then
    squared k times with outward rounding. The guard bits absorb the 2^k growth of the width.
    """
    if x == 0:
        return 1 << w, 1 << w
    a, d = x.numerator, x.denominator
    k = (a // d).bit_length() + 1
    dk = d << k
    wp = w + k + 24
    term = s = 1 << wp
    n = 0
    while term:
        n += 1
        term = term * a // (dk * n)
        s = s - term if n & 1 else s + term
    err = n * (n + 1) // 2 + 1
    lo, hi = max(s - err, 0), s + err
    for _ in range(k):
        lo = (lo * lo) >> wp
        hi = _ceil_shift(hi * hi, wp)
    return lo >> (wp - w), _ceil_shift(hi, wp - w)


def exp_bounds(x: Fraction, w: int) -> tuple[int, int]:
    """lo ≤ e^x·2^w ≤ hi for any rational x (e^x = 1/e^-x for x > 0)."""
    if x <= 0:
        return exp_neg_bounds(-x, w)
    wn = w + math.ceil(float(x) * 1.4426950408889634) + 16  # e^-x·2^wn ≥ 2^(w+15): lo is far from 0
    lo, hi = exp_neg_bounds(x, wn)
    return (1 << (w + wn)) // hi, -((-(1 << (w + wn))) // lo)


def floor_exact(bounds: Callable[[int], tuple[int, int]], p: int) -> int:
    """⌊v·2^p⌋ for an irrational v given by ``bounds(w)`` (lo ≤ v·2^w ≤ hi): more bits until exact."""
    guard = 32
    while True:
        lo, hi = bounds(p + guard)
        if lo >> guard == hi >> guard:
            return lo >> guard
        guard *= 2


class _LazyUniform:
    """U in [0, 1) known to ``p`` bits (``prefix``), extended 64 bits at a time from the word source."""

    def __init__(self, prefix: int, p: int, words: WordSource):
        self.prefix, self.p, self.words = prefix, p, words

    def less_than(self, floor_at: Callable[[int], int | None]) -> bool:
        """U < v, where ``floor_at(p)`` is ⌊v·2^p⌋ for irrational v, or None when v is exactly 0."""
        while True:
            f = floor_at(self.p)
            if f is None or self.prefix > f:
                return False
            if self.prefix < f:
                return True
            self.prefix = (self.prefix << 64) | int(self.words(1)[0])
            self.p += 64


# -- inversion tables -----------------------------------------------------------------------------------
class _Inversion:
    """X = max{g ≥ 0 : U < θ(g)} for a non-increasing θ with θ(0) = 1.

    ``floors[g]`` = ⌊θ(g)·2^BITS⌋ for g = 0..M (floors[0] = 2^BITS). Either θ(g) = 0 exactly for g > M
    (``truncated``), or floors[M] = 0 and θ stays positive (the tail is reached through ties at 0).
    ``theta(g, w)`` gives rigorous bounds on θ(g)·2^w for the lazy path; ``guess(u)`` a float estimate
    of X for u = A/2^BITS (a hint that integer comparisons then verify).
    """

    def __init__(self, floors: list[int], truncated: bool,
                 theta: Callable[[int, int], tuple[int, int]], guess: Callable[[np.ndarray], np.ndarray]):
        self.m = len(floors) - 1
        self.fe = np.array(floors + [-1], dtype=np.int64)  # −1: never equals a prefix, never above one
        self.truncated, self.theta, self.guess = truncated, theta, guess
        self._floor_cache: dict[tuple[int, int], int] = {}

    def floor_at(self, g: int, p: int) -> int | None:
        if self.truncated and g > self.m:
            return None
        key = (g, p)
        if key not in self._floor_cache:
            self._floor_cache[key] = floor_exact(lambda w: self.theta(g, w), p)
        return self._floor_cache[key]

    def invert(self, a: np.ndarray, words: WordSource) -> np.ndarray:
        """X for lanes whose U has the BITS-bit prefixes ``a`` (int64)."""
        x = self.guess(a)
        np.clip(x, 0, self.m, out=x)
        k = x.astype(np.int64)
        fe = self.fe
        above = fe[k + 1]
        bad = (fe[k] <= a) | (above > a)
        if bad.any():  # the float hint was off by one near a threshold: exact count instead
            idx = np.flatnonzero(bad)
            k[idx] = self.m - np.searchsorted(self.fe[self.m:0:-1], a[idx], side="right")
            above[idx] = fe[k[idx] + 1]
        tie = above == a
        if tie.any():
            for i in np.flatnonzero(tie):
                k[i] = self._resolve(int(a[i]), int(k[i]) + 1, words)
        return k

    def _resolve(self, a: int, g: int, words: WordSource) -> int:
        """The lazy path: U's prefix ``a`` ties with θ(g)'s floor; compare more bits, then go on up."""
        u = _LazyUniform(a, BITS, words)
        while u.less_than(lambda p, g=g: self.floor_at(g, p)):
            g += 1
        return g - 1


def _table_floors(first: tuple[int, int], q: tuple[int, int], w: int, stop: Callable[[int, int], bool],
                  exact: Callable[[int], int], limit: int) -> list[int]:
    """⌊v_g·2^BITS⌋ for v_g = v_1·q^(g−1), g = 1, 2, … until ``stop(g, floor)``, each exact.

    The product is carried as a lower bound plus a width that grows by at most q's width + 2 per
    step (v, q ≤ 1); an entry whose bounds straddle an integer is recomputed by ``exact(g)``.
    """
    lo, width = first[0], first[1] - first[0]
    qlo, dq = q[0], q[1] - q[0] + 2
    s = w - BITS
    out = []
    g = 1
    while True:
        f = lo >> s
        if (lo + width) >> s != f:
            f = exact(g)
        out.append(f)
        if stop(g, f):
            return out
        if g >= limit:
            raise ValueError("noise scale too large for an exact table")
        lo = (lo * qlo) >> w
        width += dq
        g += 1


def _precision(entries: int) -> int:
    return BITS + 40 + entries.bit_length()


@lru_cache(maxsize=64)
def _abs_laplace_table(lam: Fraction) -> _Inversion:
    """|Y| for P(Y = y) ∝ e^-λ|y|: θ(m) = 2q^m/(1 + q) for m ≥ 1."""
    w = _precision(_DIRECT_MAX)

    def theta(m: int, ww: int) -> tuple[int, int]:
        e_lo, e_hi = exp_neg_bounds(lam * m, ww + 8)
        q_lo, q_hi = exp_neg_bounds(lam, ww + 8)
        one = 1 << (ww + 8)
        return (2 * e_lo << ww) // (one + q_hi), -((-(2 * e_hi << ww)) // (one + q_lo))

    v1 = theta(1, w)
    floors = [_ONE] + _table_floors(v1, exp_neg_bounds(lam, w), w, lambda g, f: f == 0,
                                    lambda g: floor_exact(lambda ww: theta(g, ww), BITS), _DIRECT_MAX)
    sigma, c = float(1 / lam), math.log(2.0 / (1.0 + math.exp(-float(lam))))

    def guess(a: np.ndarray) -> np.ndarray:  # u < K·q^m ⇔ m < (ln K − ln u)/λ
        x = np.log(a + 0.5)
        x -= c + BITS * math.log(2.0)
        x *= -sigma
        return x

    return _Inversion(floors, False, theta, guess)


@lru_cache(maxsize=64)
def _geometric_table(lam: Fraction) -> _Inversion:
    """One-sided geometric, θ(g) = q^g."""
    w = _precision(_DIRECT_MAX)

    def theta(g: int, ww: int) -> tuple[int, int]:
        return exp_neg_bounds(lam * g, ww)

    q = exp_neg_bounds(lam, w)
    floors = [_ONE] + _table_floors(q, q, w, lambda g, f: f == 0,
                                    lambda g: floor_exact(lambda ww: theta(g, ww), BITS), _DIRECT_MAX)
    sigma = float(1 / lam)

    def guess(a: np.ndarray) -> np.ndarray:
        x = np.log(a + 0.5)
        x -= BITS * math.log(2.0)
        x *= -sigma
        return x

    return _Inversion(floors, False, theta, guess)


@lru_cache(maxsize=64)
def _truncated_table(lam: Fraction, length: int) -> _Inversion:
    """R on [0, L) with P(R = r) ∝ q^r: θ(r) = (q^r − q^L)/(1 − q^L) for r < L, 0 from L on."""
    w = _precision(length)

    def theta(r: int, ww: int) -> tuple[int, int]:
        wx = ww + 16
        r_lo, r_hi = exp_neg_bounds(lam * r, wx)
        l_lo, l_hi = exp_neg_bounds(lam * length, wx)
        one = 1 << wx
        return (max(r_lo - l_hi, 0) << ww) // (one - l_lo), -((-((r_hi - l_lo) << ww)) // (one - l_hi))

    # θ(r)·2^w = q^r·2^w/(1 − q^L) − c: carry q^r/(1 − q^L) as the product, subtract c per entry.
    wx = w + 16
    l_lo, l_hi = exp_neg_bounds(lam * length, wx)
    one = 1 << wx
    inv_lo, inv_hi = (one << w) // (one - l_lo), -((-(one << w)) // (one - l_hi))  # 2^w/(1 − q^L)
    c_lo, c_hi = (l_lo << w) // (one - l_lo), -((-(l_hi << w)) // (one - l_hi))  # 2^w·q^L/(1 − q^L)
    q_lo, q_hi = exp_neg_bounds(lam, w)
    s = w - BITS
    floors = [_ONE]
    lo, hi = (inv_lo * q_lo) >> w, _ceil_shift(inv_hi * q_hi, w)
    for r in range(1, length):
        f = max(lo - c_hi, 0) >> s
        if max(hi - c_lo, 0) >> s != f:
            f = floor_exact(lambda ww, r=r: theta(r, ww), BITS)
        floors.append(f)
        lo, hi = (lo * q_lo) >> w, _ceil_shift(hi * q_hi, w)
    sigma, ql = float(1 / lam), math.exp(-float(lam * length))

    def guess(a: np.ndarray) -> np.ndarray:  # u < θ(r) ⇔ r < −ln(u(1 − q^L) + q^L)/λ
        x = (a + 0.5) * ((1.0 - ql) / _ONE)
        x += ql
        np.log(x, out=x)
        x *= -sigma
        return x

    return _Inversion(floors, True, theta, guess)


# -- samplers ---------------------------------------------------------------------------------------------
def prefixes(words: np.ndarray) -> np.ndarray:
    return (words >> np.uint64(64 - BITS)).view(np.int64)


class Geometric:
    """One-sided geometric: P(G ≥ g) = e^-λg. Direct table, or G = L·B + R (B geometric with λL)."""

    def __init__(self, lam: Fraction):
        self.lam = lam
        entries = 44 / float(lam)
        if entries <= _DIRECT_MAX:
            self.table, self.length, self.high = _geometric_table(lam), 0, None
        else:
            self.length = min(_DIRECT_MAX, max(2, math.isqrt(int(entries))))
            self.table = _truncated_table(lam, self.length)
            self.high = geometric(lam * self.length)

    def draw(self, n: int, words: WordSource) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            out[start:start + m] = self.sample(prefixes(words(m)), words)
        return out

    def sample(self, a: np.ndarray, words: WordSource) -> np.ndarray:
        """G for lanes whose first uniform has prefixes ``a``; further words as needed."""
        g = self.table.invert(a, words)
        if self.high is not None:
            b = self.high.sample(prefixes(words(a.size)), words)
            g += b * self.length
        return g


@lru_cache(maxsize=64)
def geometric(lam: Fraction) -> Geometric:
    return Geometric(lam)


class TwoSidedLaplace:
    """P(Y = y) = tanh(λ/2)·e^-λ|y| on the integers: the discrete Laplace of scale 1/λ."""

    def __init__(self, lam: Fraction):
        self.lam = lam
        self.direct = 44 / float(lam) <= _DIRECT_MAX
        self.table = _abs_laplace_table(lam) if self.direct else None
        self.geo = None if self.direct else geometric(lam)

    def sample(self, n: int, words: WordSource) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            out[start:start + m] = self._chunk(m, words)
        return out

    def _chunk(self, n: int, words: WordSource) -> np.ndarray:
        if self.direct:
            w = words(n)
            y = self.table.invert(prefixes(w), words)
            np.negative(y, out=y, where=(w & np.uint64(1)).astype(bool))
            return y
        y = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while todo.size:  # sign × one-sided geometric, "−0" rejected: probability (1 − q)/2 per round
            w = words(todo.size)
            g = self.geo.sample(prefixes(w), words)
            neg = (w & np.uint64(1)).astype(bool)
            np.negative(g, out=g, where=neg)
            redo = neg & (g == 0)
            y[todo] = g
            todo = todo[redo]
        return y


@lru_cache(maxsize=64)
def two_sided_laplace(lam: Fraction) -> TwoSidedLaplace:
    return TwoSidedLaplace(lam)


class DiscreteGaussian:
    """P(Y = y) ∝ exp(−y²/(2σ²)) on the integers, σ² rational (CKS 2020, Algorithm 3)."""

    def __init__(self, sigma2: Fraction):
        self.sigma2 = sigma2
        self.t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1  # ⌊σ⌋ + 1
        self.proposal = two_sided_laplace(Fraction(1, self.t))
        self.c = sigma2 / self.t
        self._c_int = int(self.c) if self.c.denominator == 1 else -1  # γ(y) = 0 exactly there
        self.fa = self._acceptance_table()
        self._floor_cache: dict[tuple[int, int], int | None] = {}

    def gamma(self, y: int) -> Fraction:
        return (y - self.c) ** 2 / (2 * self.sigma2)

    def _acceptance_table(self) -> np.ndarray:
        """⌊e^-γ(y)·2^BITS⌋ for y = 0..Y, then one 0 for every larger |y| (all of them floor to 0)."""
        c, s2 = self.c, self.sigma2
        ymax_est = int(float(c) + 9.5 * math.sqrt(float(s2))) + 2
        if ymax_est > _GAUSS_TABLE_MAX:
            raise ValueError(f"discrete Gaussian σ² = {float(s2):.4g} is above the supported range "
                             f"(σ ≤ {_GAUSS_TABLE_MAX / 10.5:.3g})")
        w = _precision(ymax_est) + 16
        e_lo, e_hi = exp_neg_bounds(self.gamma(0), w)  # e_{y+1} = e_y·ρ·β^y
        r_lo, r_hi = exp_bounds((2 * c - 1) / (2 * s2), w)
        b_lo, b_hi = exp_neg_bounds(1 / s2, w)
        p_lo = p_hi = 1 << w  # β^y
        s = w - BITS
        floors = []
        y = 0
        while True:
            if y == self._c_int:
                f = _ONE
            else:
                f = e_lo >> s
                if e_hi >> s != f:
                    f = floor_exact(lambda ww, y=y: exp_neg_bounds(self.gamma(y), ww), BITS)
            floors.append(f)
            if f == 0 and y > c:
                break
            m_lo, m_hi = (r_lo * p_lo) >> w, _ceil_shift(r_hi * p_hi, w)
            e_lo, e_hi = (e_lo * m_lo) >> w, _ceil_shift(e_hi * m_hi, w)
            p_lo, p_hi = (p_lo * b_lo) >> w, _ceil_shift(p_hi * b_hi, w)
            y += 1
        return np.array(floors, dtype=np.int64)

    def _floor_at(self, y: int, p: int) -> int | None:
        key = (y, p)
        if key not in self._floor_cache:
            g = self.gamma(y)
            self._floor_cache[key] = 1 << p if g == 0 else floor_exact(lambda w: exp_neg_bounds(g, w), p)
        return self._floor_cache[key]

    def sample(self, n: int, words: WordSource) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            out[start:start + m] = self._chunk(m, words)
        return out

    def _chunk(self, n: int, words: WordSource) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while todo.size:
            y = self.proposal.sample(todo.size, words)
            accept = self.accept(np.abs(y), prefixes(words(todo.size)), words)
            out[todo[accept]] = y[accept]
            todo = todo[~accept]
        return out

    def accept(self, mag: np.ndarray, a: np.ndarray, words: WordSource) -> np.ndarray:
        """Bernoulli(exp(−γ(|y|))) for proposals of magnitude ``mag``, uniforms with prefixes ``a``."""
        thr = self.fa[np.minimum(mag, self.fa.size - 1)]
        accept = a < thr
        tie = a == thr
        if tie.any():
            for i in np.flatnonzero(tie):
                yi = int(mag[i])
                u = _LazyUniform(int(a[i]), BITS, words)
                accept[i] = u.less_than(lambda p, yi=yi: self._floor_at(yi, p))
        return accept


@lru_cache(maxsize=8)  # a table holds ≈ 10.4·σ entries
def discrete_gaussian(sigma2: Fraction) -> DiscreteGaussian:
    return DiscreteGaussian(sigma2)
