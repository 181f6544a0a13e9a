"""Identity grid: discrete Laplace noise on every cell of a fixed, public grid.

Sensitivity: one privacy unit changes the histogram's L1 norm by at most k (user) or 1 (record);
the whole ε goes to one Laplace step of that sensitivity. Negative cells are kept as they are
(unbiased for range sums); pass ``clamp_negative=True`` to zero them for display.

``cell_width_m="auto"`` (identity@ParamSelect): ρ comes from ParamSelect for the query band
``query_sides_m``, from public inputs and n; n is ``public_total`` or a paid sample-size estimate when
declared, else a noisy count that costs at most ``total_fraction`` of ε (steps ``total_count``,
``total_count_refine``; dpcore.paramselect.public_n_for_fit), and the grid gets the rest.
"""

from __future__ import annotations

import numpy as np

from dpcore.geo import Region
from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError, _jsonable
from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis, PrivacyInfo


def check_band(query_sides_m) -> None:
    try:
        lo, hi = (float(v) for v in query_sides_m)
    except (TypeError, ValueError) as exc:
        raise MechanismError(f"query_sides_m must be two numbers (lo, hi), e.g. [25, 100]; got {query_sides_m!r}") from exc
    if not 0 < lo <= hi:
        raise MechanismError(f"query_sides_m must satisfy 0 < lo ≤ hi, got {list(query_sides_m)}")


def cells_for_width(side_m: float, cell_width_m: float) -> int:
    if cell_width_m <= 0:
        raise MechanismError(f"cell_width_m must be > 0, got {cell_width_m}")
    return max(1, int(round(side_m / cell_width_m)))


class IdentityGrid(Mechanism):
    name = "identity"
    supports_zcdp = True
    supports_weights = True

    def __init__(self, *, cell_width_m: float | str = 100.0, grid_size: int | None = None,
                 clamp_negative: bool = False, query_sides_m: tuple[float, float] = (100.0, 1000.0),
                 total_fraction: float = 0.05, paramselect_model: str | None = None):
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

    def check_params(self) -> None:
        if self.grid_size is not None:
            if int(self.grid_size) < 1:
                raise MechanismError(f"grid_size must be ≥ 1, got {self.grid_size}")
        elif self._width_from_paramselect():
            from dpcore.mechanisms.ug import check_fraction

            check_band(self.query_sides_m)
            check_fraction(self.total_fraction, "total_fraction")
        # the width is only used when no grid size is given
        elif isinstance(self.cell_width_m, str) or not self.cell_width_m > 0:
            raise MechanismError(f"cell_width_m must be > 0 or 'auto' (ParamSelect), got {self.cell_width_m!r}")

    def fit_zcdp(self, data: FitInput, rho: float, noise: NoiseSource) -> GridSynopsis:
        """ρ-zCDP: discrete Gaussian noise of variance Δ₂²/(2ρ) on every cell. A person's ≤ k points move
        the histogram by at most k in L2 (all in one cell), 1 at record level."""
        if not (isinstance(rho, int | float) and 0 < rho <= 1e3):
            raise MechanismError(f"rho must be a number in (0, 1000], got {rho!r}")
        self.check_params()
        if data.weights is not None:
            raise MechanismError("weighted bounding is not available under zCDP; use k-sampling")
        if self._width_from_paramselect():
            raise MechanismError("cell_width_m='auto' spends part of the budget on n in pure ε; give a width "
                                 "under zCDP")
        m = int(self.grid_size) if self.grid_size is not None else cells_for_width(data.region.side_m,
                                                                                  float(self.cell_width_m))
        counts = data.grid_counts(m, m)
        l2 = float(data.sensitivity)
        noisy = noise.add_discrete_gaussian(counts, l2, rho).astype(np.float64)
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
        charge = {"name": "cell_counts", "epsilon": None, "rho": float(rho), "sensitivity": l2,
                  "sensitivity_norm": "L2", "noise": "discrete_gaussian",
                  "note": f"{m}x{m} grid; σ² = Δ₂²/(2ρ) = {l2 * l2 / (2 * rho):.6g}"}
        privacy = PrivacyInfo(self.name, _jsonable(self.get_params()), None, [charge], data.privacy_unit, l2,
                              data.max_points_per_user if data.privacy_unit == "user" else None,
                              noise.description, ["ρ-zCDP release (discrete Gaussian)"], rho=float(rho))
        return GridSynopsis(noisy, data.region, privacy, {"grid_size": m, "cell_width_m": data.region.side_m / m})

    def fine_grid(self, region: Region) -> int | None:
        """The release's own grid when the parameters fix it (the counts are then exact)."""
        if self.grid_size is not None:
            return int(self.grid_size)
        if not self._width_from_paramselect() and not isinstance(self.cell_width_m, str):
            return cells_for_width(region.side_m, float(self.cell_width_m))
        return super().fine_grid(region)

    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> GridSynopsis:
        notes = []
        if self.grid_size is not None:
            m = int(self.grid_size)
        elif self._width_from_paramselect():
            from dpcore.paramselect import cell_width_for_fit

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
        return GridSynopsis(noisy, data.region, self.privacy_info(data, acct, noise, notes, params=params),
                            {"grid_size": m, "cell_width_m": data.region.side_m / m})
