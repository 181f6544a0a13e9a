"""Identity grid: discrete Laplace noise on every cell of a fixed, public grid.

Sensitivity: one privacy unit changes the histogram's L1 norm by at most k (user) or 1 (record);
the whole ε goes to one Laplace step of that sensitivity. Negative cells are kept as they are
(unbiased for range sums); pass ``clamp_negative=True`` to zero them for display.
"""

from __future__ import annotations

import numpy as np

from dpcore.budget import Accountant
from dpcore.histogram import grid_counts
from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError
from dpcore.noise import NoiseSource
from dpcore.synopsis import GridSynopsis


def cells_for_width(side_m: float, cell_width_m: float) -> int:
    if cell_width_m <= 0:
        raise MechanismError(f"cell_width_m must be > 0, got {cell_width_m}")
    return max(1, int(round(side_m / cell_width_m)))


class IdentityGrid(Mechanism):
    name = "identity"

    def __init__(self, *, cell_width_m: float = 100.0, grid_size: int | None = None,
                 clamp_negative: bool = False):
        self.cell_width_m = cell_width_m
        self.grid_size = grid_size
        self.clamp_negative = clamp_negative

    def check_params(self) -> None:
        if self.grid_size is not None:
            if int(self.grid_size) < 1:
                raise MechanismError(f"grid_size must be ≥ 1, got {self.grid_size}")
        elif not self.cell_width_m > 0:  # the width is only used when no grid size is given
            raise MechanismError(f"cell_width_m must be > 0, got {self.cell_width_m}")

    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> GridSynopsis:
        m = int(self.grid_size) if self.grid_size is not None else cells_for_width(data.region.side_m,
                                                                                     self.cell_width_m)
        counts = grid_counts(data.x, data.y, data.region.bounds_m, m, m)
        eps = acct.spend("cell_counts", acct.epsilon, data.sensitivity,
                         note=f"{m}x{m} grid; disjoint cells, L1 sensitivity = per-unit contribution bound")
        noisy = noise.add_discrete_laplace(counts, data.sensitivity, eps).astype(np.float64)
        notes = ["negatives clamped to 0" if self.clamp_negative else "negatives kept (unbiased range sums)"]
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
        return GridSynopsis(noisy, data.region, self.privacy_info(data, acct, noise, notes),
                            {"grid_size": m, "cell_width_m": data.region.side_m / m})
