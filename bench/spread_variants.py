"""Models of a cut cell's spread that were tried against held-out data and refuted
(bench/results/2026-11-28-coverage-4.md), kept runnable for bench/fit_cut_spread.py and bench/fit_lump.py;
dpcore.synopsis.spread answers with the one-place model they are measured against.

- :class:`PowerShare`: a cut cell's share in the box varies as f^β·(1 − f) (β 1 is the product's).
- :func:`lump_spread`: a user-level cut cell's k-bounded count as lumps of at most L·k points, each in one
  place (Σ lumps² ≤ min(y, L·k)·y; the product takes the whole count at one place).
"""

from __future__ import annotations

import numpy as np

from dpcore.synopsis.spread import CellSpread, spread_of


class PowerShare(CellSpread):
    """The spread with a cut cell's variance weight f^β·(1 − f); set ``beta`` before asking."""

    beta = 1.0

    def _share(self, f: np.ndarray, u: np.ndarray) -> np.ndarray:
        return f ** self.beta * u


def lump_spread(synopsis, people: float | None) -> CellSpread:
    """The spread of a user-level release whose cut cells hold lumps of at most ``people`` × k points in one
    place (k: its count sensitivity); None, or a record-level release: the product's model."""
    privacy = getattr(synopsis, "privacy", None)
    k = getattr(privacy, "sensitivity", None)
    if people is None or getattr(privacy, "privacy_unit", None) != "user" or not k or not np.isfinite(k):
        return spread_of(synopsis)
    lump = float(k) * people

    class Lumps(CellSpread):
        def _squares(self, v: np.ndarray) -> np.ndarray:
            return np.minimum(v, lump) * v

    return spread_of(synopsis, cls=Lumps)
