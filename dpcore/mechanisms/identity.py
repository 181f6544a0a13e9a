"""Identity grid: discrete Laplace noise on every cell of a fixed, public grid.

Sensitivity: one privacy unit changes the histogram's L1 norm by at most k (user) or 1 (record);
the whole ε goes to one Laplace step of that sensitivity. Negative cells are kept as they are
(unbiased for range sums); pass ``clamp_negative=True`` to zero them for display.

``cell_width_m="auto"`` (identity@ParamSelect): ρ comes from ParamSelect for the query band
``query_sides_m``, from public inputs and n; n is ``public_total`` or a paid sample-size estimate when
declared, else a noisy count that costs at most ``total_fraction`` of ε (steps ``total_count``,
``total_count_refine``; dpcore.mechanisms.sample_size.public_n_for_fit), and the grid gets the rest.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from dpcore.geo import Region
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord, ZCDPRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Band, Fraction, Positive, PositiveInt
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis
from dpcore.synopsis.noise import CellNoise, NoInterval, NoiseLaw

CLAMPED = NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()


def cells_for_width(side_m: float, cell_width_m: float) -> int:
    if cell_width_m <= 0:
        raise MechanismError(f"cell_width_m must be > 0, got {cell_width_m}")
    return max(1, int(round(side_m / cell_width_m)))


class IdentityGrid(Mechanism):
    name = "identity"
    tags = MechanismTags(supports_zcdp=True, supports_weights=True, auto_role="width")

    def __init__(self, *, cell_width_m: Positive | Literal["auto"] = 100.0, grid_size: PositiveInt | None = None,
                 clamp_negative: bool = False, query_sides_m: Band = (100.0, 1000.0),
                 total_fraction: Fraction = 0.05, paramselect_model: str | None = None):
        self.cell_width_m = cell_width_m
        self.grid_size = grid_size
        self.clamp_negative = clamp_negative
        self.query_sides_m = query_sides_m
        self.total_fraction = total_fraction
        self.paramselect_model = paramselect_model

    def _width_from_paramselect(self) -> bool:
        return self.grid_size is None and self.cell_width_m == "auto"

    def tuned_band_parameter(self) -> str | None:
        return "query_sides_m" if self._width_from_paramselect() else None

    def fine_grid(self, region: Region) -> int | None:
        """The release's own grid when the parameters fix it (the counts are then exact)."""
        if self.grid_size is not None:
            return int(self.grid_size)
        if not self._width_from_paramselect() and not isinstance(self.cell_width_m, str):
            return cells_for_width(region.side_m, float(self.cell_width_m))
        return super().fine_grid(region)

    def _fit_zcdp(self, data: PointsInput, record: ZCDPRecord, noise: NoiseSource) -> GridSynopsis:
        """ρ-zCDP: discrete Gaussian noise of variance Δ₂²/(2ρ) on every cell. A person's ≤ k points move
        the histogram by at most k in L2 (all in one cell), 1 at record level."""
        if self._width_from_paramselect():
            raise MechanismError("cell_width_m='auto' spends part of the budget on n in pure ε; give a width "
                                 "under zCDP")
        m = int(self.grid_size) if self.grid_size is not None else cells_for_width(data.region.side_m,
                                                                                  float(self.cell_width_m))
        counts = data.grid_counts(m, m)
        l2 = float(data.sensitivity)
        rho = record.spend("cell_counts", record.rho, l2,
                           note=f"{m}x{m} grid; σ² = Δ₂²/(2ρ) = {l2 * l2 / (2 * record.rho):.6g}")
        noisy = noise.add_discrete_gaussian(counts, l2, rho).astype(np.float64)
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
        record.describe(["ρ-zCDP release (discrete Gaussian)"])
        law = NoiseLaw("gaussian", l2 * l2 / (2.0 * rho))
        return GridSynopsis(noisy, data.region, None, {"grid_size": m, "cell_width_m": data.region.side_m / m,
                                                       "noise_model": self._noise_spec(law)})

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> GridSynopsis:
        notes = []
        if self.grid_size is not None:
            m = int(self.grid_size)
        elif self._width_from_paramselect():
            from dpcore.mechanisms.sample_size import cell_width_for_fit

            rho, note = cell_width_for_fit(data, acct, noise, mechanism="identity",
                                           band=tuple(float(v) for v in self.query_sides_m),
                                           total_fraction=self.total_fraction, model_path=self.paramselect_model)
            m = cells_for_width(data.region.side_m, rho)
            notes.append(note)
        else:
            m = cells_for_width(data.region.side_m, float(self.cell_width_m))
        counts = data.grid_counts(m, m)
        eps = acct.spend_rest("cell_counts", data.sensitivity,
                              note=f"{m}x{m} grid; disjoint cells, L1 sensitivity = per-unit contribution bound")
        noisy = data.add_count_noise(counts, eps, noise).astype(np.float64)
        notes.append("negatives clamped to 0" if self.clamp_negative else "negatives kept (unbiased range sums)")
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
        params = self.get_params()
        if self._width_from_paramselect():
            # "auto" alone would not say which width the release used.
            params["chosen_cell_width_m"] = data.region.side_m / m
        acct.describe(notes, params=params)
        return GridSynopsis(noisy, data.region, None,
                            {"grid_size": m, "cell_width_m": data.region.side_m / m,
                             "noise_model": self._noise_spec(data.count_noise_law(eps))})

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        from dpcore.mechanisms import charge_law

        law = charge_law(charges, "cell_counts")
        if params.get("clamp_negative"):
            return CLAMPED
        return None if law is None else CellNoise.make_spec(law)

    def _noise_spec(self, law: NoiseLaw) -> dict:
        """Every cell carries its own noise and nothing else, unless negatives were clamped."""
        return CLAMPED if self.clamp_negative else CellNoise.make_spec(law)
