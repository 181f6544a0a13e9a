"""The resolution rule of spatio-temporal releases: cells per side from public quantities, and the check
that the requested time slots can be carried at all.

Why: at user level every cell of an M × M × T histogram gets discrete Laplace noise of scale k/ε, while
a k-bounded sample of n points spreads over M²·T cells. On the public Gowalla sample cities (k = 20,
13 weekly slots, ε = 0.5) a 256² × 13 grid holds 0.001–0.004 points per cell against a noise std of 60,
no cell is above 2σ, and the noise summed over the grid (std 55 k) is 20× the whole sample (2.7 k
points): no denoiser can find structure there. Coarser cells add signal linearly and noise only as the
square root (``bench/st_resolution.py`` prints the measurement).

The release keeps the slots the user asked for; it never merges them (a merged slot spread back evenly
is flat, so forecasts and hotspots in time see nothing). Every input below is public:
- cells per side: the 2-D data-centred rule (decision 0012) applied to one slot's share of the sample,
  n̂/T, since the cells of one slot form a 2-D grid with the full ε (the slots are disjoint); rounded to
  a power of two (the quadtree output stages and the VQ-VAE's strides halve it) and clipped to
  [MIN_CELLS, MAX_CELLS];
- whether the slots can be carried: one slot on the coarsest grid (MIN_CELLS² cells) must hold, per
  cell, at least the cells' noise std √2·k/ε, i.e. a per-slot signal n·ε/(k·T) ≥ √2·MIN_CELLS²
  (``SLOT_SIGNAL`` ≈ 90.5). Below it a slot's map is mostly noise even at 8² cells. The check reads a
  public size only (a declared public total, which bounds the bounded sample n from above, or an
  already-paid n̂), so a refusal costs nothing: :func:`slot_refusal` names the finest slot width the
  size can carry. docs/decisions/0015-vdr-resolution.md has the history (the rule used to merge slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcore.grid.size_rule import data_grid_size

MIN_CELLS = 8
#: The finest grid the rule picks (a power of two, so a cluster's fine grid of this side serves every choice).
MAX_CELLS = 256
#: The per-slot signal n·ε/(k·T) a slot needs: MIN_CELLS² cells each holding one noise std (√2·k/ε).
SLOT_SIGNAL = math.sqrt(2.0) * MIN_CELLS ** 2
#: The query band the rule sizes cells for by default: the evaluation's two bands together.
DEFAULT_QUERY_SIDES_M = (100.0, 5000.0)


#: How a release's note starts when its paid n̂ shows slots mostly noise (the run's summary repeats it).
SLOT_WARNING = "slots kept as asked, but"


@dataclass(frozen=True)
class STResolution:
    """The chosen resolution: ``cells`` per side over the ``n_slots`` requested slots."""

    cells: int
    n_slots: int  #: input slots T, all kept
    signal: float  #: n̂·ε/k the choice was made from

    @property
    def slot_signal(self) -> float:
        return self.signal / self.n_slots

    def record(self) -> dict:
        # slot_factor 1: nothing merged (readers of older releases look for it)
        return {"cells": self.cells, "slot_factor": 1, "coarse_slots": self.n_slots, "signal": self.signal,
                "slot_signal": self.slot_signal}

    def note(self) -> str:
        return (f"resolution rule (public inputs: n̂, ε, k, T): {self.cells}² cells, the {self.n_slots} slots as "
                f"requested (signal n̂·ε/k per slot {self.slot_signal:.3g})")


def _power_of_two(m: float) -> int:
    return int(2 ** round(math.log2(max(m, 1.0))))


def st_resolution(n_hat: float, epsilon: float, sensitivity: float, n_slots: int,
                  query_sides_m: tuple[float, float] = DEFAULT_QUERY_SIDES_M, privacy_unit: str = "user",
                  max_cells: int = MAX_CELLS) -> STResolution:
    """Cells per side from public inputs only (n̂ paid or public, ε of the cells, k, T); slots are kept."""
    if not (epsilon > 0 and sensitivity > 0 and n_slots >= 1 and math.isfinite(n_hat)):
        raise ValueError(f"need ε, k > 0, T ≥ 1 and a finite n̂; got {epsilon}, {sensitivity}, {n_slots}, {n_hat}")
    n = max(float(n_hat), 1.0)
    m = data_grid_size(n / n_slots, epsilon, sensitivity, query_sides_m, privacy_unit, max_size=max_cells)
    cells = int(min(max(_power_of_two(m), MIN_CELLS), _power_of_two(max_cells)))
    return STResolution(cells, int(n_slots), n * float(epsilon) / float(sensitivity))


def carried_slots(n: float, epsilon: float, sensitivity: float, n_slots: int,
                  slot_signal: float = SLOT_SIGNAL) -> int:
    """How many slots (1 … T) a sample of n points carries at ε and k: floor(n·ε/k / slot_signal)."""
    signal = max(float(n), 0.0) * float(epsilon) / float(sensitivity)
    return int(min(max(math.floor(signal / slot_signal), 1), n_slots))


def slot_width_text(seconds: int) -> str:
    """A slot width as --slot takes it: whole weeks, days, hours, minutes, else seconds."""
    for suffix, unit in (("w", 604800), ("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % unit == 0:
            return f"{seconds // unit}{suffix}"
    return f"{seconds}s"


def slot_refusal(n_public: float, epsilon: float, sensitivity: float, n_slots: int, slot_seconds: int | None,
                 source: str, slot_signal: float = SLOT_SIGNAL) -> str | None:
    """None when a public size ``n_public`` carries the T requested slots at ε (the cells' share) and k;
    else the one-line refusal naming the finest slot width it carries (ceil(T / carried) slots merged)."""
    carried = carried_slots(n_public, epsilon, sensitivity, n_slots, slot_signal)
    if carried >= n_slots:
        return None
    factor = -(-int(n_slots) // carried)
    per_slot = max(float(n_public), 0.0) * float(epsilon) / float(sensitivity) / n_slots
    width = (f"--slot {slot_width_text(factor * int(slot_seconds))} or longer" if slot_seconds
             else f"slots {factor} times as long")
    return (f"the {n_slots} requested time slots cannot be carried: {source} gives a signal n·ε/k of "
            f"{per_slot:.3g} per slot at ε={epsilon:.3g}, k={sensitivity:g}, under the {slot_signal:.3g} a slot needs "
            f"(one noise std per cell on the coarsest {MIN_CELLS}x{MIN_CELLS} grid); the data carry at most "
            f"{carried} slot{'s' if carried > 1 else ''}: ask for {width}, or a larger ε")
