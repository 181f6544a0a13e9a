"""Heatmap baselines of Ghazi et al. (AAAI 2023): Laplace on every cell, optionally keeping the top t%.

Input is the same user-normalised grid as ``dpheatmap`` (each user has mass 1 over the Δ × Δ
grid), so the cell vector has **L1 sensitivity 1** whatever k is (:meth:`charge_sensitivity`).
The whole ε goes to one step: discrete Laplace of scale Q/ε on integer masses in units of 1/Q
(see dpcore.heatmap.quadtree). Post-processing: negatives are zeroed (``laplace``), and ``laplace-top``
further keeps only the ``top_percent`` % of cells with the largest noisy mass, zeroing the rest.
"""

from __future__ import annotations

import numpy as np

from dpcore.geo import Region
from dpcore.heatmap.quadtree import (
    DEFAULT_QUANTUM,
    HeatmapError,
    HeatmapSynopsis,
    check_resolution,
    heatmap_privacy,
)
from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError, _jsonable
from dpcore.mechanisms.dpheatmap import NORMALISATIONS, heatmap_units
from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource


class LaplaceHeatmap(Mechanism):
    """Discrete Laplace on every cell of the user-normalised Δ × Δ grid, negatives zeroed."""

    name = "laplace"

    def __init__(self, *, resolution: int = 256, normalisation: str = "user", quantum: int = DEFAULT_QUANTUM):
        self.resolution = resolution
        self.normalisation = normalisation
        self.quantum = quantum

    @staticmethod
    def charge_sensitivity(data: FitInput | None = None) -> float:
        """L1 sensitivity of the charge: 1 (one user's normalised mass), whatever k is."""
        return 1.0

    def fine_grid(self, region: Region) -> int | None:
        """None: the user-normalised grid spreads each person's unit mass over *their* points, so the
        fit reads the bounded points with their users, not counts."""
        return None

    def check_params(self) -> None:
        if self.normalisation not in NORMALISATIONS:
            raise MechanismError(f"normalisation must be one of {NORMALISATIONS}, got {self.normalisation!r}")
        try:
            check_resolution(self.resolution, power_of_two=False)
            if int(self.quantum) < 1:
                raise HeatmapError("quantum must be ≥ 1")
        except (HeatmapError, ValueError, TypeError) as exc:
            raise MechanismError(f"bad {self.name} parameter: {exc}") from exc

    def _noisy_cells(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> tuple[np.ndarray, int]:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        d = int(self.resolution)
        q = int(self.quantum)
        units = heatmap_units(data, d, q, self.normalisation)
        eps = acct.spend("cells", acct.epsilon, 1.0, note=(
            f"{d}x{d} user-normalised grid; each user adds mass ≤ 1: L1 sensitivity 1 (= {q} integer "
            f"units); discrete Laplace scale {q}/ε units"))
        noisy = (units + noise.discrete_laplace(q / eps, units.shape)) / q
        return np.maximum(noisy, 0.0), d

    def _post(self, noisy: np.ndarray) -> tuple[np.ndarray, list[str]]:
        return noisy, ["negatives zeroed"]

    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> HeatmapSynopsis:
        noisy, d = self._noisy_cells(data, acct, noise)
        grid, notes = self._post(noisy)
        notes = [(f"input: each {data.privacy_unit} has mass 1 over the {d}x{d} grid" if self.normalisation == "user"
                  else f"input: each point has mass 1/k (k = {data.max_points_per_user}), ≤ 1 per user"),
                 "charge has L1 sensitivity 1 (user mass), independent of k", *notes, "values are user mass"]
        privacy = heatmap_privacy(self.name, _jsonable(self.get_params()), acct, data.privacy_unit,
                                  data.max_points_per_user, noise, notes)
        return HeatmapSynopsis(grid, data.region, privacy, {"resolution": d, "units": "user_mass"})


class LaplaceTopHeatmap(LaplaceHeatmap):
    """:class:`LaplaceHeatmap` keeping only the ``top_percent`` % largest noisy cells."""

    name = "laplace-top"

    def __init__(self, *, resolution: int = 256, top_percent: float = 1.0, normalisation: str = "user",
                 quantum: int = DEFAULT_QUANTUM):
        super().__init__(resolution=resolution, normalisation=normalisation, quantum=quantum)
        self.top_percent = top_percent

    def check_params(self) -> None:
        super().check_params()
        try:
            ok = 0 < float(self.top_percent) <= 100
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise MechanismError(f"top_percent must be in (0, 100], got {self.top_percent!r}")

    def _post(self, noisy: np.ndarray) -> tuple[np.ndarray, list[str]]:
        t = float(self.top_percent)
        flat = noisy.ravel()
        keep = max(1, int(round(flat.size * t / 100.0)))
        out = np.zeros_like(flat)
        top = np.argpartition(-flat, keep - 1)[:keep]
        out[top] = flat[top]
        return out.reshape(noisy.shape), [f"negatives zeroed; only the top {t:g}% ({keep}) cells kept"]
