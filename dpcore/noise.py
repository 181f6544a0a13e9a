"""Integer-valued noise for published output: discrete Laplace (two-sided geometric).

Published noise is never float Laplace: the low-order bits of a floating-point Laplace sample leak
the input (Mironov, CCS 2012). We add integers to integer counts instead.

Sampling: P(X = x) = (1 − t)/(1 + t) · t^|x| with t = exp(−1/scale), scale = sensitivity / ε, drawn
by inverting the law of |X| from one 52-bit uniform plus an independent sign bit per sample (see
:meth:`NoiseSource.discrete_laplace`). In secure mode the random words come from the operating
system's CSPRNG (``os.urandom``);
in seeded mode from numpy's PCG64, which is for experiments and tests only and is recorded as such
in every manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

# Above this many values a secure draw is taken in chunks to bound the memory of the random bytes.
_CHUNK = 1 << 22


@dataclass
class NoiseSource:
    """Where random numbers come from. ``NoiseSource.secure()`` for releases, ``.seeded(s)`` for tests.

    Besides published noise, mechanisms use ``rng`` for their *non-published* randomness (sampling
    which points a user keeps, shuffling). In secure mode that generator is itself seeded with 256
    bits from the OS CSPRNG, so it cannot be predicted or replayed.
    """

    secure_mode: bool
    seed: int | None = None
    rng: np.random.Generator = field(repr=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.rng is None:
            if self.secure_mode:
                self.rng = np.random.Generator(np.random.PCG64(int.from_bytes(os.urandom(32), "little")))
            else:
                self.rng = np.random.default_rng(self.seed)

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
            return "secure:os.urandom"
        return f"seeded:numpy.PCG64(seed={self.seed}) -- NOT FOR PUBLICATION"

    def spawn(self, key: int) -> NoiseSource:
        """An independent source for a sub-task (e.g. one per city), reproducible in seeded mode."""
        if self.secure_mode:
            return NoiseSource.secure()
        return NoiseSource.seeded(int(np.random.SeedSequence([self.seed, int(key)]).generate_state(1)[0]))

    # -- raw random words -----------------------------------------------------------------------
    def random_words(self, size: int) -> np.ndarray:
        """uint64 random words: the OS CSPRNG in secure mode, PCG64 in seeded mode."""
        size = int(size)
        if not self.secure_mode:
            return self.rng.bit_generator.random_raw(size).astype(np.uint64, copy=False)
        out = np.empty(size, dtype=np.uint64)
        for start in range(0, size, _CHUNK):
            m = min(_CHUNK, size - start)
            out[start:start + m] = np.frombuffer(os.urandom(8 * m), dtype=np.uint64)
        return out

    def uniform_open(self, size: int) -> np.ndarray:
        """Uniforms in (0, 1] with 52-bit resolution: safe to take the log of."""
        return _words_to_open_uniform(self.random_words(size))

    # -- published noise ------------------------------------------------------------------------
    def discrete_laplace(self, scale: float, size: int | tuple[int, ...]) -> np.ndarray:
        """int64 samples of the discrete Laplace law with P(x) ∝ exp(−|x|/scale).

        One 64-bit word per sample: bit 0 is the sign, bits 12–63 a uniform V in (0, 1], and
        |X| = max(0, ⌊−scale · ln(V (1 + t) / 2)⌋) has P(|X| ≥ m) = 2tᵐ/(1 + t) for m ≥ 1, which with
        an independent sign is exactly the two-sided geometric law. The 52-bit V truncates the tail
        beyond ≈ 36·scale, an event of probability below 1e-15.
        """
        if not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"discrete Laplace scale must be a positive finite number, got {scale}")
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        n = int(np.prod(shape, dtype=np.int64))
        words = self.random_words(n)
        v = _words_to_open_uniform(words)
        t = np.exp(-1.0 / scale)
        v *= (1.0 + t) / 2.0
        np.log(v, out=v)
        v *= -scale
        np.floor(v, out=v)
        np.maximum(v, 0.0, out=v)
        mag = v.astype(np.int64)
        negative = (words & np.uint64(1)).astype(bool)
        np.negative(mag, out=mag, where=negative)
        return mag.reshape(shape)

    def add_discrete_laplace(self, counts: np.ndarray, sensitivity: float, epsilon: float) -> np.ndarray:
        """counts + DLap(sensitivity/ε): the ε-DP Laplace mechanism on integer counts of L1 sensitivity."""
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if sensitivity <= 0:
            raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
        c = np.asarray(counts)
        return np.rint(c).astype(np.int64) + self.discrete_laplace(sensitivity / epsilon, c.shape)

    def snapped_laplace(self, values: np.ndarray, scale: float, granularity: float) -> np.ndarray:
        """Noise for real-valued statistics without float-Laplace leakage.

        Values are rounded to a grid of step ``granularity`` and receive ``granularity`` times a
        discrete Laplace of scale ``scale / granularity``: the output lies on the grid, so its low
        bits carry nothing. The rounding moves a neighbouring pair's L1 distance by at most
        ``granularity`` per coordinate, which the caller must add to the sensitivity (and say so).
        """
        if granularity <= 0:
            raise ValueError("granularity must be > 0")
        v = np.asarray(values, dtype=np.float64)
        return granularity * (np.rint(v / granularity) + self.discrete_laplace(scale / granularity, v.shape))

    def add_lattice_laplace(self, values: np.ndarray, sensitivity: float, epsilon: float,
                            quantum: float) -> np.ndarray:
        """values + DLap on the lattice quantum·ℤ: the ε-DP Laplace mechanism for weighted counts.

        The values (e.g. sums of contribution weights, dpcore.sampling) must already lie on the
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
        return self.snapped_laplace(v, sensitivity / epsilon, quantum)


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
