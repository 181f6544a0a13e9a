"""Heatmap baselines of Ghazi et al. (AAAI 2023): Laplace on every cell, optionally keeping the top t%.

Input is the same user-normalised grid as ``dpheatmap`` (each user has mass 1 over the Δ × Δ
grid), so the cell vector has **L1 sensitivity 1** whatever k is (``tags.sensitivity == "unit"``).
The whole ε goes to one step: discrete Laplace of scale Q/ε on integer masses in units of 1/Q
(see dpcore.heatmap.quadtree). Post-processing: negatives are zeroed (``laplace``), and ``laplace-top``
further keeps only the ``top_percent`` % of cells with the largest noisy mass, zeroing the rest.
"""

from __future__ import annotations

import numpy as np

from dpcore.geo import Region
from dpcore.heatmap.mass import MassSpec
from dpcore.heatmap.quadtree import (
    DEFAULT_QUANTUM,
    HeatmapError,
    HeatmapSynopsis,
    check_resolution,
)
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord, PrivacyUnit
from dpcore.mechanisms.dpheatmap import Normalisation, Percent, heatmap_units, mass_spec
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import PositiveInt
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.noise import NoiseSource


class LaplaceHeatmap(Mechanism):
    """Discrete Laplace on every cell of the user-normalised Δ × Δ grid, negatives zeroed."""

    name = "laplace"
    tags = MechanismTags(sensitivity="unit", heatmap=True)

    def __init__(self, *, resolution: PositiveInt = 256, normalisation: Normalisation = "user",
                 quantum: PositiveInt = DEFAULT_QUANTUM):
        self.resolution = resolution
        self.normalisation = normalisation
        self.quantum = quantum

    def fine_grid(self, region: Region) -> int | None:
        """None: no count grid; the fit reads the mass grid of :meth:`fine_mass`."""
        return None

    def fine_mass(self, region: Region, unit: PrivacyUnit) -> MassSpec | None:
        """The same user-normalised mass grid as ``dpheatmap``'s, built by a cluster's workers."""
        return mass_spec(self.resolution, self.quantum, self.normalisation, unit)

    def check_params(self) -> None:
        try:
            check_resolution(self.resolution, power_of_two=False)
        except (HeatmapError, ValueError, TypeError) as exc:
            raise MechanismError(f"bad {self.name} parameter: {exc}") from exc

    def _noisy_cells(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> tuple[np.ndarray, int]:
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

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> HeatmapSynopsis:
        noisy, d = self._noisy_cells(data, acct, noise)
        grid, notes = self._post(noisy)
        notes = [(f"input: each {data.privacy_unit} has mass 1 over the {d}x{d} grid" if self.normalisation == "user"
                  else f"input: each point has mass 1/k (k = {data.max_points_per_user}), ≤ 1 per user"),
                 "charge has L1 sensitivity 1 (user mass), independent of k", *notes, "values are user mass"]
        acct.describe(notes)
        return HeatmapSynopsis(grid, data.region, None, {"resolution": d, "units": "user_mass"})


class LaplaceTopHeatmap(LaplaceHeatmap):
    """:class:`LaplaceHeatmap` keeping only the ``top_percent`` % largest noisy cells."""

    name = "laplace-top"

    def __init__(self, *, resolution: PositiveInt = 256, top_percent: Percent = 1.0,
                 normalisation: Normalisation = "user", quantum: PositiveInt = DEFAULT_QUANTUM):
        super().__init__(resolution=resolution, normalisation=normalisation, quantum=quantum)
        self.top_percent = top_percent

    def _post(self, noisy: np.ndarray) -> tuple[np.ndarray, list[str]]:
        t = float(self.top_percent)
        flat = noisy.ravel()
        keep = max(1, int(round(flat.size * t / 100.0)))
        out = np.zeros_like(flat)
        top = np.argpartition(-flat, keep - 1)[:keep]
        out[top] = flat[top]
        return out.reshape(noisy.shape), [f"negatives zeroed; only the top {t:g}% ({keep}) cells kept"]
