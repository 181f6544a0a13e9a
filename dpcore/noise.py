"""Integer-valued noise for published output: discrete Laplace (two-sided geometric).

Published noise is never float Laplace: the low-order bits of a floating-point Laplace sample leak
the input (Mironov, CCS 2012). We add integers to integer counts instead.

Sampling: X = G₁ − G₂ with G₁, G₂ i.i.d. geometric on {0, 1, …} with success probability 1 − t,
t = exp(−1/scale), gives P(X = x) = (1 − t)/(1 + t) · t^|x|, the discrete Laplace law of the
given scale (= sensitivity / ε). Each geometric is drawn by inversion, ⌊ln U / ln t⌋, from 53-bit
uniforms. In secure mode the uniforms come from the operating system's CSPRNG (``os.urandom``);
in seeded mode from numpy's PCG64, which is for experiments and tests only and is recorded as such
in every manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

_TWO_POW_53 = float(2**53)
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

    # -- uniforms -------------------------------------------------------------------------------
    def uniform_open(self, size: int) -> np.ndarray:
        """Uniforms in (0, 1], 53-bit resolution: safe to take the log of."""
        size = int(size)
        if self.secure_mode:
            out = np.empty(size, dtype=np.float64)
            for start in range(0, size, _CHUNK):
                m = min(_CHUNK, size - start)
                raw = np.frombuffer(os.urandom(8 * m), dtype=np.uint64)
                out[start:start + m] = ((raw >> np.uint64(11)).astype(np.float64) + 1.0) / _TWO_POW_53
            return out
        return 1.0 - self.rng.random(size)  # random() is [0, 1), so this is (0, 1]

    # -- published noise ------------------------------------------------------------------------
    def discrete_laplace(self, scale: float, size: int | tuple[int, ...]) -> np.ndarray:
        """int64 samples of the discrete Laplace law with P(x) ∝ exp(−|x|/scale)."""
        if not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"discrete Laplace scale must be a positive finite number, got {scale}")
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        n = int(np.prod(shape, dtype=np.int64))
        # ln t = −1/scale, so ⌊ln U / ln t⌋ = ⌊−scale · ln U⌋.
        g = np.floor(-scale * np.log(self.uniform_open(2 * n)))
        return (g[:n] - g[n:]).astype(np.int64).reshape(shape)

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


def discrete_laplace_pmf(x: np.ndarray, scale: float) -> np.ndarray:
    """Exact pmf of the discrete Laplace law, for tests and accounting."""
    t = np.exp(-1.0 / scale)
    return (1 - t) / (1 + t) * t ** np.abs(np.asarray(x, dtype=np.float64))


def discrete_laplace_variance(scale: float) -> float:
    t = np.exp(-1.0 / scale)
    return float(2 * t / (1 - t) ** 2)
