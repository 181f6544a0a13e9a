"""The resolution rule of spatio-temporal releases: cells per side and slot length from public quantities.

Why: at user level every cell of an M × M × T histogram gets discrete Laplace noise of scale k/ε, while
a k-bounded sample of n points spreads over M²·T cells. On the public Gowalla sample cities (k = 20,
13 weekly slots, ε = 0.5) a 256² × 13 grid holds 0.001–0.004 points per cell against a noise std of 60,
no cell is above 2σ, and the noise summed over the grid (std 55 k) is 20× the whole sample (2.7 k
points): no denoiser can find structure there. Coarser cells and longer slots add signal linearly and
noise only as the square root (``bench/st_resolution.py`` prints the measurement).

The rule, every input public (n̂ is a paid noisy count or the caller's already-paid estimate):
- signal s = n̂·ε_cells/k (as the 2-D rule, dpcore.grid.size_rule);
- coarse slots T_c = clip(floor(s / ``slot_signal``), 1, T): each coarse slot keeps a signal of at
  least ``slot_signal``; the release merges f = ceil(T / T_c) consecutive slots (the last group may be
  shorter) and spreads every merged slot evenly back over the slots it covers;
- cells per side: the 2-D data-centred rule (decision 0012) applied to one coarse slot's share of the
  sample, n̂/T_c, since the cells of one coarse slot form a 2-D grid with the full ε (the slots are
  disjoint); rounded to a power of two (the quadtree output stages and the VQ-VAE's strides halve it)
  and clipped to [MIN_CELLS, MAX_CELLS].

``slot_signal`` was chosen on public data only (Gowalla sample cities, synthetic check-ins; never the
held-out Gowalla NYC or SF cabs); see docs/decisions/0015-vdr-resolution.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpcore.grid.size_rule import data_grid_size

MIN_CELLS = 8
#: The finest grid the rule picks (a power of two, so a cluster's fine grid of this side serves every choice).
MAX_CELLS = 256
#: Signal s = n·ε/k a coarse slot keeps at least (fitted on public data, see the module docstring).
SLOT_SIGNAL = 400.0
#: The query band the rule sizes cells for by default: the evaluation's two bands together.
DEFAULT_QUERY_SIDES_M = (100.0, 5000.0)


#: How a release's note of merged slots starts (STResolution.note).
SLOTS_MERGED = "slots merged:"


@dataclass(frozen=True)
class STResolution:
    """The chosen resolution: ``cells`` per side, ``slot_factor`` input slots per released slot."""

    cells: int
    slot_factor: int
    n_slots: int  #: input slots T
    signal: float  #: n̂·ε/k the choice was made from

    @property
    def coarse_slots(self) -> int:
        return -(-self.n_slots // self.slot_factor)

    def record(self) -> dict:
        return {"cells": self.cells, "slot_factor": self.slot_factor, "coarse_slots": self.coarse_slots,
                "signal": self.signal}

    def note(self) -> str:
        """What the release says about its resolution; a merge of the requested slots starts with
        SLOTS_MERGED, which the release's terminal summary and artifacts repeat."""
        rule = f"resolution rule (public inputs: n̂, ε, k, T): {self.cells}² cells"
        if self.slot_factor <= 1:
            return f"{rule}, the {self.n_slots} slots as requested"
        return (f"{SLOTS_MERGED} the {self.n_slots} requested slots were merged {self.slot_factor} at a time into "
                f"{self.coarse_slots} (each spread evenly back over its slots: answers within one are flat); {rule}")


def _power_of_two(m: float) -> int:
    return int(2 ** round(math.log2(max(m, 1.0))))


def st_resolution(n_hat: float, epsilon: float, sensitivity: float, n_slots: int,
                  query_sides_m: tuple[float, float] = DEFAULT_QUERY_SIDES_M, privacy_unit: str = "user",
                  slot_signal: float = SLOT_SIGNAL, max_cells: int = MAX_CELLS) -> STResolution:
    """Cells per side and slot factor from public inputs only (n̂ paid or public, ε of the cells, k, T)."""
    if not (epsilon > 0 and sensitivity > 0 and slot_signal > 0 and n_slots >= 1 and math.isfinite(n_hat)):
        raise ValueError(f"need ε, k, slot_signal > 0, T ≥ 1 and a finite n̂; got {epsilon}, {sensitivity}, "
                         f"{slot_signal}, {n_slots}, {n_hat}")
    n = max(float(n_hat), 1.0)
    signal = n * float(epsilon) / float(sensitivity)
    coarse = int(min(max(math.floor(signal / slot_signal), 1), n_slots))
    factor = -(-int(n_slots) // coarse)
    coarse = -(-int(n_slots) // factor)
    m = data_grid_size(n / coarse, epsilon, sensitivity, query_sides_m, privacy_unit, max_size=max_cells)
    cells = int(min(max(_power_of_two(m), MIN_CELLS), _power_of_two(max_cells)))
    return STResolution(cells, factor, int(n_slots), signal)


def merge_slots(counts: np.ndarray, factor: int) -> np.ndarray:
    """(m, m, T) → (m, m, ceil(T / factor)): sums of ``factor`` consecutive slots (the last may be fewer)."""
    m1, m2, t = counts.shape
    coarse = -(-t // factor)
    padded = np.zeros((m1, m2, coarse * factor), dtype=counts.dtype)
    padded[:, :, :t] = counts
    return padded.reshape(m1, m2, coarse, factor).sum(axis=3)


def spread_slots(values: np.ndarray, factor: int, n_slots: int) -> np.ndarray:
    """Inverse of :func:`merge_slots` under uniformity in time: each merged slot's counts split evenly
    over the input slots it covers (mass preserved)."""
    lengths = np.minimum(factor, n_slots - factor * np.arange(values.shape[2]))
    per = values / lengths[None, None, :]
    return np.repeat(per, lengths, axis=2)

