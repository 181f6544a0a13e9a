"""How many empty bins pass the threshold, drawn exactly: N ~ Binomial(n, p) with p = P(DLap ≥ m) =
e^(−mλ)/(1 + e^(−λ)), the discrete Laplace's tail at the threshold (λ = 1/scale, the exact rational the
published noise uses). The draw inverts the binomial CDF against a uniform whose bits are read lazily
from the noise source: each CDF value is bounded by integers at W bits (e^−x bounded by
dpcore.privacy.exact_noise.exp_neg_bounds, every product rounded outward), and where the uniform's
known bits cannot yet tell which side it lies on, 64 more bits are read and W grows. The result has the
binomial law exactly, with no float inversion (scipy's binom.ppf rounds, and its law is not the one the
ledger charges for).
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpcore.privacy.exact_noise import MAX_SCALE, exp_neg_bounds, rational_at_least
from dpcore.privacy.noise import NoiseSource


def tail_lambda(scale: float | Fraction) -> Fraction:
    """λ of the published discrete Laplace noise at ``scale``: 1 / (scale rounded up to a rational),
    as NoiseSource.discrete_laplace and NoiseSource.geometric take it."""
    return 1 / rational_at_least(scale, "discrete Laplace scale", MAX_SCALE)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _pow_bounds(lo: int, hi: int, n: int, w: int) -> tuple[int, int]:
    """Bounds on (v/2^w)^n·2^w for lo ≤ v ≤ hi (all in [0, 2^w]), by squaring with outward rounding."""
    one = 1 << w
    rl, rh, bl, bh = one, one, lo, hi
    while n:
        if n & 1:
            rl, rh = (rl * bl) >> w, _ceil_div(rh * bh, one)
        n >>= 1
        if n:
            bl, bh = (bl * bl) >> w, _ceil_div(bh * bh, one)
    return rl, min(rh, one)


class _PassingCdf:
    """Integer bounds [lo, hi] on P(N ≤ j)·2^w for N ~ Binomial(n, p(λ, m)), j = 0, 1, … in turn."""

    def __init__(self, n: int, lam: Fraction, m: int, w: int):
        one = 1 << w
        tl, th = exp_neg_bounds(lam, w)
        al, ah = exp_neg_bounds(lam * m, w)
        pl, ph = (al << w) // (one + th), min(_ceil_div(ah << w, one + tl), one)
        self.n, self.w = n, w
        self.rl = (pl << w) // max(one - pl, 1)  # p/(1 − p), bounded outward
        self.rh = _ceil_div(ph << w, one - ph) if ph < one else None
        self.cl, self.ch = _pow_bounds(one - ph, one - pl, n, w)  # P(N = 0) = (1 − p)^n
        self.fl, self.fh = self.cl, self.ch
        self.j = 0

    def next(self) -> None:
        """Move from j to j + 1: P(N = j + 1) = P(N = j)·(n − j)/(j + 1)·p/(1 − p)."""
        one, k = 1 << self.w, self.n - self.j
        self.j += 1
        self.cl = self.cl * k * self.rl // (self.j * one)
        self.ch = one if self.rh is None else min(_ceil_div(self.ch * k * self.rh, self.j * one), one)
        self.fl, self.fh = min(self.fl + self.cl, one), min(self.fh + self.ch, one)
        if self.j == self.n:
            self.fl = self.fh = one  # P(N ≤ n) = 1 exactly


def passing_count(n: int, lam: Fraction, m: int, noise: NoiseSource) -> int:
    """N ~ Binomial(n, e^(−mλ)/(1 + e^(−λ))), drawn exactly (module docstring); m ≥ 1, λ > 0."""
    if n <= 0:
        return 0
    # working precision: enough bits below P(N = 0) ≈ e^(−np) for a first try (any W is exact; more
    # only saves refinements)
    mean = n * math.exp(-float(lam) * m) / (1 + math.exp(-float(lam)))
    w = 64 + 2 * n.bit_length() + math.ceil(1.5 * mean) + 16
    u, p = int(noise.random_words(1)[0]), 64  # U in [u/2^p, (u + 1)/2^p)
    target = 0
    while True:
        cdf = _PassingCdf(n, lam, m, w)
        while cdf.j < target:
            cdf.next()
        while True:
            lo_u, hi_u = u << (w - p), (u + 1) << (w - p)  # U·2^w lies in [lo_u, hi_u)
            if hi_u <= cdf.fl:
                return cdf.j  # U < P(N ≤ j), and U ≥ P(N ≤ j − 1) was shown before
            if lo_u >= cdf.fh:
                cdf.next()  # U ≥ P(N ≤ j)
                continue
            break  # undecided at these bits: read 64 more, and work at 64 more bits
        target = cdf.j
        u, p = (u << 64) | int(noise.random_words(1)[0]), p + 64
        w = max(w, p) + 64


__all__ = ["passing_count", "tail_lambda"]
