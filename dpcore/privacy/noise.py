"""Integer-valued noise for published output: exact discrete Laplace and discrete Gaussian.

Published noise is never float Laplace: the low-order bits of a floating-point Laplace sample leak
the input (Mironov, CCS 2012). We add integers to integer counts instead, drawn EXACTLY from their
laws (:mod:`dpcore.privacy.exact_noise`): no float inversion, whose 52-bit uniforms leave holes in the far
tail where a neighbour's output would have probability 0 (a hidden δ ≈ scale·2^-52 per draw).

* ``discrete_laplace``: P(x) ∝ exp(−|x|/scale), the ε-DP Laplace mechanism with scale Δ₁/ε.
* ``discrete_gaussian``: P(x) ∝ exp(−x²/(2σ²)) (Canonne–Kamath–Steinke, NeurIPS 2020), the
  ρ-zCDP Gaussian mechanism with σ² = Δ₂²/(2ρ).

Scales are rounded UP to exact rationals (denominator ≤ 2^20), so the noise is never smaller than
asked for. In secure mode the random words are the AES-256-CTR keystream under a key of 32 bytes
from the operating system's CSPRNG (``os.urandom``), a fresh key per source and per process; in
seeded mode they come from numpy's PCG64, which is for experiments and tests only and is recorded
as such in every manifest.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from dpcore.privacy import exact_noise

# Keystream bytes per AES call: bounds the zero buffer the cipher reads.
_CHUNK_BYTES = 1 << 20
_ZEROS = memoryview(bytes(_CHUNK_BYTES))
_SAMPLER = "exact discrete Laplace/Gaussian"


@dataclass
class NoiseSource:
    """Where random numbers come from. ``NoiseSource.secure()`` for releases, ``.seeded(s)`` for tests.

    Besides published noise, mechanisms use ``rng`` for their *non-published* randomness (sampling
    which points a user keeps, shuffling). In secure mode that generator is itself seeded with 256
    bits from the OS CSPRNG, so it cannot be predicted or replayed.

    A secure source is never duplicated: a pickled or deep-copied one, or one used after a fork,
    draws a fresh key (two copies sharing a keystream would add the same noise twice).
    """

    secure_mode: bool
    seed: int | None = None
    rng: np.random.Generator = field(repr=False, default=None)  # type: ignore[assignment]
    _aes: object = field(init=False, repr=False, compare=False, default=None)
    _aes_pid: int = field(init=False, repr=False, compare=False, default=-1)
    _lock: threading.Lock = field(init=False, repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # the cipher context is not safe to share between threads
        if self.rng is None:
            if self.secure_mode:
                self.rng = np.random.Generator(np.random.PCG64(int.from_bytes(os.urandom(32), "little")))
            else:
                self.rng = np.random.default_rng(self.seed)

    def __reduce__(self):
        if self.secure_mode:
            return (NoiseSource.secure, ())
        return (NoiseSource, (False, self.seed, self.rng))

    @classmethod
    def secure(cls) -> NoiseSource:
        return cls(secure_mode=True)

    @classmethod
    def seeded(cls, seed: int) -> NoiseSource:
        return cls(secure_mode=False, seed=int(seed))

    @property
    def description(self) -> str:
        """What the release manifest records as its noise source."""
        if self.secure_mode:
            return f"secure:aes-256-ctr(os.urandom key), {_SAMPLER}"
        return f"seeded:numpy.PCG64(seed={self.seed}), {_SAMPLER} -- NOT FOR PUBLICATION"

    def spawn(self, key: int) -> NoiseSource:
        """An independent source for a sub-task (e.g. one per city), reproducible in seeded mode."""
        if self.secure_mode:
            return NoiseSource.secure()
        return NoiseSource.seeded(int(np.random.SeedSequence([self.seed, int(key)]).generate_state(1)[0]))

    # -- raw random words -----------------------------------------------------------------------
    def random_words(self, size: int) -> np.ndarray:
        """uint64 random words: AES-256-CTR keystream in secure mode, PCG64 in seeded mode."""
        size = int(size)
        if not self.secure_mode:
            return self.rng.bit_generator.random_raw(size).astype(np.uint64, copy=False)
        nbytes = 8 * size
        buf = bytearray(nbytes + 15)  # update_into wants room for one block beyond the data
        view = memoryview(buf)
        with self._lock:
            if self._aes is None or self._aes_pid != os.getpid():
                # Counter mode from block 0 is safe because the key is new: (key, counter) never repeats.
                self._aes = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor()
                self._aes_pid = os.getpid()
            for start in range(0, nbytes, _CHUNK_BYTES):
                m = min(_CHUNK_BYTES, nbytes - start)
                self._aes.update_into(_ZEROS[:m], view[start:start + m + 15])
        return np.frombuffer(buf, dtype=np.uint64, count=size)

    def uniform_open(self, size: int) -> np.ndarray:
        """Uniforms in (0, 1] with 52-bit resolution: safe to take the log of."""
        return _words_to_open_uniform(self.random_words(size))

    # -- published noise ------------------------------------------------------------------------
    def discrete_laplace(self, scale: float | Fraction, size: int | tuple[int, ...]) -> np.ndarray:
        """int64 samples of the discrete Laplace law with P(x) ∝ exp(−|x|/scale), drawn exactly.

        ``scale`` is first rounded UP to a rational with denominator ≤ 2^20 (see
        :func:`dpcore.privacy.exact_noise.rational_at_least`): the noise is never smaller than asked for.
        """
        sampler = _laplace_sampler(_as_number(scale))
        shape, n = _shape(size)
        return sampler.sample(n, self.random_words).reshape(shape)

    def geometric(self, scale: float | Fraction, size: int | tuple[int, ...]) -> np.ndarray:
        """int64 samples G ≥ 0 with P(G ≥ g) = exp(−g/scale), drawn exactly (scale rounded up).

        The one-sided tail of the discrete Laplace: given |X| ≥ m, |X| − m has this law (memoryless).
        """
        lam = 1 / _rounded_up(_as_number(scale), "geometric scale")
        shape, n = _shape(size)
        return exact_noise.geometric(lam).draw(n, self.random_words).reshape(shape)

    def add_discrete_laplace(self, counts: np.ndarray, sensitivity: float, epsilon: float) -> np.ndarray:
        """counts + DLap(sensitivity/ε): the ε-DP Laplace mechanism on integer counts of L1 sensitivity.

        The scale is the exact ratio sensitivity/ε of the two floats, rounded up (never a float
        quotient that could round down).
        """
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if not sensitivity > 0:
            raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
        c = np.asarray(counts)
        scale = _exact_ratio(float(sensitivity), float(epsilon))
        return np.rint(c).astype(np.int64) + self.discrete_laplace(scale, c.shape)

    def discrete_gaussian(self, sigma2: float | Fraction, size: int | tuple[int, ...]) -> np.ndarray:
        """int64 samples of the discrete Gaussian P(x) ∝ exp(−x²/(2σ²)), drawn exactly (CKS 2020).

        ``sigma2`` (σ²) is rounded UP to a rational with denominator ≤ 2^20, as for the Laplace scale.
        """
        sampler = _gaussian_sampler(_as_number(sigma2))
        shape, n = _shape(size)
        return sampler.sample(n, self.random_words).reshape(shape)

    def add_discrete_gaussian(self, counts: np.ndarray, l2_sensitivity: float, rho: float) -> np.ndarray:
        """counts + N_Z(0, σ²) with σ² = Δ₂²/(2ρ): ρ-zCDP for integer counts of L2 sensitivity Δ₂.

        ρ-zCDP implies (ρ + 2√(ρ·ln(1/δ)), δ)-DP for every δ > 0 (Bun–Steinke 2016).
        """
        if not rho > 0:
            raise ValueError(f"rho must be > 0, got {rho}")
        if not l2_sensitivity > 0:
            raise ValueError(f"l2_sensitivity must be > 0, got {l2_sensitivity}")
        c = np.asarray(counts)
        sigma2 = _fraction(l2_sensitivity, "l2_sensitivity") ** 2 / (2 * _fraction(rho, "rho"))
        return np.rint(c).astype(np.int64) + self.discrete_gaussian(sigma2, c.shape)

    def snapped_laplace(self, values: np.ndarray, scale: float, granularity: float) -> np.ndarray:
        """Noise for real-valued statistics without float-Laplace leakage.

        Values are rounded to a grid of step ``granularity`` and receive ``granularity`` times a
        discrete Laplace of scale ``scale / granularity``: the output lies on the grid, so its low
        bits carry nothing. The rounding moves a neighbouring pair's L1 distance by at most
        ``granularity`` per coordinate, which the caller must add to the sensitivity (and say so).
        """
        if not granularity > 0:
            raise ValueError("granularity must be > 0")
        v = np.asarray(values, dtype=np.float64)
        unit_scale = _exact_ratio(float(scale), float(granularity))
        return granularity * (np.rint(v / granularity) + self.discrete_laplace(unit_scale, v.shape))

    def add_lattice_laplace(self, values: np.ndarray, sensitivity: float, epsilon: float,
                            quantum: float) -> np.ndarray:
        """values + DLap on the lattice quantum·ℤ: the ε-DP Laplace mechanism for weighted counts.

        The values (e.g. sums of contribution weights, dpcore.privacy.bounding) must already lie on the
        lattice; they are then integers in units of ``quantum`` with L1 sensitivity sensitivity/quantum,
        and get integer discrete Laplace noise of scale (sensitivity/ε)/quantum in those units
        (:meth:`snapped_laplace` with granularity ``quantum``). Nothing is rounded, so, unlike a
        general snapping, no granularity is added to the sensitivity: it stays ``sensitivity``. Values
        off the lattice are refused, since rounding them could move each cell by up to one step.
        """
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if sensitivity <= 0:
            raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
        v = np.asarray(values, dtype=np.float64)
        if not np.array_equal(np.rint(v / quantum) * quantum, v):
            raise ValueError("weighted counts must lie on the lattice of the weights' quantum")
        unit_scale = _exact_ratio(float(sensitivity), float(epsilon)) / _fraction(quantum, "quantum")
        return quantum * (np.rint(v / quantum) + self.discrete_laplace(unit_scale, v.shape))


def _as_number(x: float | Fraction) -> float | Fraction:
    return x if isinstance(x, Fraction) else float(x)


@lru_cache(maxsize=4096)
def _exact_ratio(a: float, b: float) -> Fraction:
    """a/b exactly (the float quotient could round below it)."""
    return _fraction(a, "numerator") / _fraction(b, "denominator")


def _fraction(x: float, what: str) -> Fraction:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{what} must be finite, got {x}")
    return Fraction(x)


def _laplace_sampler(scale: float | Fraction) -> exact_noise.TwoSidedLaplace:
    return exact_noise.two_sided_laplace(1 / _rounded_up(scale, "discrete Laplace scale"))


def _gaussian_sampler(sigma2: float | Fraction) -> exact_noise.DiscreteGaussian:
    return exact_noise.discrete_gaussian(_rounded_up(sigma2, "discrete Gaussian σ²"))


@lru_cache(maxsize=4096)
def _rounded_up(x: float | Fraction, what: str) -> Fraction:
    return exact_noise.rational_at_least(x, what, exact_noise.MAX_SCALE)


def _shape(size: int | tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    shape = (int(size),) if isinstance(size, int | np.integer) else tuple(int(s) for s in size)
    return shape, int(np.prod(shape, dtype=np.int64))

def _words_to_open_uniform(words: np.ndarray) -> np.ndarray:
    # Put the top 52 bits in the mantissa of a double in [1, 2): exact, no int→float rounding.
    u = ((words >> np.uint64(12)) | np.uint64(0x3FF0000000000000)).view(np.float64)
    return 2.0 - u  # (0, 1]


def discrete_laplace_pmf(x: np.ndarray, scale: float) -> np.ndarray:
    """Exact pmf of the discrete Laplace law, for tests and accounting."""
    # (1 − t)/(1 + t) = tanh(1/(2·scale)) and t^|x| = exp(−|x|/scale), t = exp(−1/scale): the direct form
    # loses the digits of 1 − t at large scales, as discrete_laplace_variance explains.
    return np.tanh(0.5 / scale) * np.exp(-np.abs(np.asarray(x, dtype=np.float64)) / scale)


def discrete_laplace_variance(scale: float) -> float:
    """Variance 2t/(1 − t)² of the discrete Laplace law of ``scale``, t = exp(−1/scale); → 2·scale² for large scales."""
    # 1 − t via expm1: for large scales t rounds to a double next to 1 and 1 − t keeps only
    # ~16 − log10(scale) digits (wrong by 19% at scale 1e16, a division by zero beyond).
    x = 1.0 / scale
    return float(2 * np.exp(-x) / np.expm1(-x) ** 2)


def discrete_gaussian_pmf(x: np.ndarray, sigma2: float) -> np.ndarray:
    """pmf exp(−x²/(2σ²))/Z of the discrete Gaussian, for tests and accounting."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-(x * x) / (2.0 * sigma2)) / _gaussian_normaliser(sigma2)


def discrete_gaussian_variance(sigma2: float) -> float:
    """Variance Σ x²·pmf(x) of the discrete Gaussian: below σ², and σ² to double precision once σ ≥ 10."""
    if sigma2 >= 100.0:
        return float(sigma2)
    x = _gaussian_support(sigma2)
    return float(np.sum(x * x * discrete_gaussian_pmf(x, sigma2)))


def _gaussian_support(sigma2: float) -> np.ndarray:
    cut = int(np.ceil(40.0 * math.sqrt(sigma2))) + 2  # e^-800 beyond: nothing a double can hold
    return np.arange(-cut, cut + 1, dtype=np.float64)


def _gaussian_normaliser(sigma2: float) -> float:
    # Poisson summation: Z = √(2π)σ·(1 + 2Σ_k e^(−2π²σ²k²)); for σ ≥ 10 the correction is below e^-1973.
    if sigma2 >= 100.0:
        return math.sqrt(2.0 * math.pi * sigma2)
    x = _gaussian_support(sigma2)
    return float(np.sum(np.exp(-(x * x) / (2.0 * sigma2))))
