"""Identity 3-D grid: discrete Laplace noise on every cell of a public M × M × T histogram.

Privacy: the caller bounds every user to ≤ k points over the *whole* release window (all slots
together, :func:`dpcore.privacy.bounding.bound_contributions`), so one user changes the L1 norm of the
M × M × T histogram by at most k (1 under record-level privacy). Cells are disjoint, so one
Laplace step of scale k/ε_cells covers all of them.

Scale to full counts: the histogram counts the bounded sample (n points), while analysts want counts
of all N points. N is private and has unbounded user-level sensitivity, so it is used only when the
caller declares it public (``FitInput.public_total``). n has sensitivity k; it is then estimated with
``count_fraction`` of ε (a recorded charge) and the release is scaled by N / n̂. Without a public
total nothing is spent on n and the release stays at the bounded-sample scale (stated in the notes).

This module also holds the helpers the other spatio-temporal mechanisms (vdr) share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpcore.geo import Region
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import SpatioTemporalInput
from dpcore.mechanisms.params import Fraction, Positive, PositiveInt
from dpcore.mechanisms.st_resolution import (
    DEFAULT_QUERY_SIDES_M,
    MAX_CELLS,
    SLOT_SIGNAL,
    STResolution,
    merge_slots,
    spread_slots,
    st_resolution,
)
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.noise import NoInterval, NoiseLaw
from dpcore.synopsis.scaled_noise import WindowCellNoise
from dpcore.synopsis.spatiotemporal import SpatioTemporalSynopsis

DEFAULT_GRID_SIZE = 256


def st_grid_size(data: SpatioTemporalInput, grid_size: int | None, cell_width_m: float | None) -> int:
    """Cells per side from public parameters only (see :func:`st_cells`)."""
    return st_cells(data.region, grid_size, cell_width_m)


def st_cells(region: Region, grid_size: int | None, cell_width_m: float | None) -> int:
    """Cells per side from public parameters only: grid size, else region side / cell width, else
    the default of 256 (so giving only a cell width is never silently overridden). The values have
    passed the mechanism's declared constraints (positive)."""
    if grid_size is not None:
        return int(grid_size)
    if cell_width_m is None:
        return DEFAULT_GRID_SIZE
    return max(1, int(round(region.side_m / cell_width_m)))


def st_counts(data: SpatioTemporalInput, m: int) -> np.ndarray:
    """int64 (m, m, T) histogram of the (bounded) points, or of their fine count grid."""
    return data.grid_counts_3d(m)


@dataclass(frozen=True)
class FullScale:
    """How released counts are scaled from the bounded sample to all points."""

    factor: float
    n_estimate: float | None
    public_total: float | None
    note: str


def full_scale(data: SpatioTemporalInput, n_exact: int, acct: Accountant, noise: NoiseSource,
               count_fraction: float, n_hat: float | None = None) -> FullScale:
    """N / n̂ when N is declared public (n̂ paid with ``count_fraction`` of ε), else 1 (sample scale).

    Under record-level privacy nothing is bounded, so n = N and scaling is 1 without any charge.
    ``n_hat``: an n̂ the fit has already paid (the resolution rule's), used and recorded instead.
    """
    if data.public_total is None:
        return FullScale(1.0, n_hat, None, "no public total given: counts are at the bounded-sample scale "
                                           "(≤ k points per user), not full counts")
    total = float(data.public_total)
    if not np.isfinite(total) or total < 0:
        raise MechanismError(f"public_total must be a finite count ≥ 0, got {data.public_total}")
    if data.privacy_unit == "record":
        return FullScale(1.0, n_hat, total, "record-level privacy: no bounding, counts are full counts")
    if n_hat is None:
        n_hat = paid_sample_size(data, n_exact, acct, noise, count_fraction,
                                 "n = points kept after bounding; one user changes it by ≤ k")
    return FullScale(total / n_hat, n_hat, total,
                     f"scaled by public total N={total:g} / noisy sample size n̂={n_hat:g}")


def paid_sample_size(data: SpatioTemporalInput, n_exact: int, acct: Accountant, noise: NoiseSource,
                     count_fraction: float, note: str) -> float:
    """n̂ of the bounded sample's ``n_exact`` points: the caller's already-paid estimate (reused, not paid
    twice), else n + DLap(k/ε_n) with ε_n = ``count_fraction``·ε, charged as step ``sample_size``."""
    if data.sample_size is not None:
        return float(max(1.0, data.sample_size))
    eps_n = acct.spend_fraction("sample_size", count_fraction, data.sensitivity, note=note)
    return float(max(1, n_exact + int(noise.discrete_laplace(data.sensitivity / eps_n, 1)[0])))


def rule_max_cells(region: Region, grid_size: int | None, cell_width_m: float | None) -> int:
    """The largest grid the resolution rule may pick: MAX_CELLS, or a given grid when it is coarser."""
    if grid_size is None and cell_width_m is None:
        return MAX_CELLS
    return min(st_cells(region, grid_size, cell_width_m), MAX_CELLS)


def paid_resolution(data: SpatioTemporalInput, acct: Accountant, noise: NoiseSource, count_fraction: float,
                    slot_signal: float, max_cells: int, query_sides_m: tuple[float, float] = DEFAULT_QUERY_SIDES_M,
                    ) -> tuple[float, STResolution, np.ndarray]:
    """n̂ (:func:`paid_sample_size`), the rule's resolution (dpcore.mechanisms.st_resolution) for the ε
    left to the cells, and the histogram at that resolution (merged slots; spread them back with
    spread_slots after the noise). Nothing private reaches the rule except through n̂."""
    n_hat = paid_sample_size(data, int(data.grid_counts_3d(1).sum()), acct, noise, count_fraction,
                             "n = points kept after bounding; one unit changes it by ≤ k; "
                             "sets the grid and slot length (resolution rule) and the scale")
    res = st_resolution(n_hat, acct.remaining, data.sensitivity, int(data.n_slots), tuple(query_sides_m),
                        data.unit.kind, slot_signal=slot_signal, max_cells=max_cells)
    return n_hat, res, merge_slots(st_counts(data, res.cells), res.slot_factor)


def st_extra(data: SpatioTemporalInput, m: int, scale: FullScale) -> dict:
    return {"grid_size": m, "cell_width_m": data.region.side_m / m, "n_slots": int(data.n_slots or 0),
            "scale_factor": scale.factor, "n_estimate": scale.n_estimate, "public_total": scale.public_total}


class IdentityGrid3D(Mechanism):
    """Noisy M × M × T histogram, scaled to full counts when a public total is given.

    Budget: ``count_fraction`` of ε for n̂ (only with a public total under user-level privacy),
    the rest for the cells, both at sensitivity k. Negative cells are kept (unbiased range sums)
    unless ``clamp_negative``.
    """

    name = "identity3d"
    tags = MechanismTags(input_type=SpatioTemporalInput, scales_to_public_total=True)

    def __init__(self, *, grid_size: PositiveInt | None = None, cell_width_m: Positive | None = None,
                 count_fraction: Fraction = 0.05, clamp_negative: bool = False,
                 resolution: Literal["fixed", "rule"] = "fixed", slot_signal: Positive | None = None,
                 rule_query_sides_m: tuple[Positive, Positive] = DEFAULT_QUERY_SIDES_M):
        self.grid_size = grid_size
        self.cell_width_m = cell_width_m
        self.count_fraction = count_fraction
        self.clamp_negative = clamp_negative
        self.resolution = resolution
        self.slot_signal = slot_signal
        self.rule_query_sides_m = tuple(rule_query_sides_m)

    def get_params(self) -> dict:
        params = super().get_params()
        params["rule_query_sides_m"] = list(self.rule_query_sides_m)
        return params

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        from dpcore.mechanisms import charge_law

        if params.get("clamp_negative"):
            return NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
        law, factor = charge_law(charges, "cell_counts"), float(extra.get("scale_factor") or 1.0)
        n_law = charge_law(charges, "sample_size") if factor != 1.0 else None
        if law is None or law.kind != "laplace" or (factor != 1.0 and n_law is None):
            return None
        slot_factor = int((extra.get("resolution") or {}).get("slot_factor") or 1)
        return WindowCellNoise(law, (1, 1, 1), (0.0, 0.0, 1.0, 1.0), factor, n_law, extra.get("n_estimate"),
                               extra.get("public_total"), slot_factor).spec()

    def _noise_spec(self, data: SpatioTemporalInput, acct: FitRecord, eps: float, scale: FullScale,
                    slot_factor: int) -> dict:
        """Cells with independent discrete Laplace noise (on merged slots, spread evenly, under the rule),
        times N/n̂ with n̂'s own law when scaled."""
        if self.clamp_negative:
            return NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
        law = NoiseLaw("laplace", float(data.sensitivity) / float(eps))
        n_law = None
        if scale.factor != 1.0:
            paid = next((c for c in acct.charges if c.name == "sample_size"), None)
            if paid is None:
                return NoInterval("the scale factor's noise (sample_size) is not recorded").spec()
            n_law = NoiseLaw("laplace", float(paid.sensitivity) / float(paid.epsilon))
        return WindowCellNoise(law, (1, 1, 1), (0.0, 0.0, 1.0, 1.0), scale.factor, n_law, scale.n_estimate,
                               scale.public_total, slot_factor).spec()

    def fine_grid(self, region: Region) -> int | None:
        """The release's own m × m × T grid (public parameters): its counts are exact. Under the
        resolution rule (dpcore.mechanisms.st_resolution), the largest grid the rule may pick."""
        if self.resolution == "rule":
            return rule_max_cells(region, self.grid_size, self.cell_width_m)
        return st_cells(region, self.grid_size, self.cell_width_m)

    def _fit(self, data: SpatioTemporalInput, acct: FitRecord, noise: NoiseSource) -> SpatioTemporalSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        res = None
        if self.resolution == "rule":
            # n̂ is paid first (even without a public total); grid and slot length follow from public inputs
            n_hat, res, counts = paid_resolution(data, acct, noise, self.count_fraction,
                                                 float(self.slot_signal or SLOT_SIGNAL), self.fine_grid(data.region),
                                                 self.rule_query_sides_m)
            m = res.cells
            scale = full_scale(data, int(counts.sum()), acct, noise, self.count_fraction, n_hat=n_hat)
        else:
            m = st_grid_size(data, self.grid_size, self.cell_width_m)
            counts = st_counts(data, m)
            scale = full_scale(data, int(counts.sum()), acct, noise, self.count_fraction)
        eps = acct.spend_rest("cell_counts", data.sensitivity,
                              note=f"{m}x{m}x{counts.shape[2]} disjoint cells; L1 sensitivity = per-unit bound "
                                   "over the whole window")
        noisy = noise.add_discrete_laplace(counts, data.sensitivity, eps).astype(np.float64) * scale.factor
        notes = [scale.note, "negatives clamped to 0" if self.clamp_negative else "negatives kept (unbiased)"]
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
        extra = st_extra(data, m, scale)
        if res is not None:
            noisy = spread_slots(noisy, res.slot_factor, res.n_slots)
            notes.append(res.note())
            extra["resolution"] = res.record()
        extra["noise_model"] = self._noise_spec(data, acct, eps, scale, 1 if res is None else res.slot_factor)
        acct.describe(notes)
        return SpatioTemporalSynopsis(noisy, data.region, None,
                                      slot_seconds=data.slot_seconds, window_start_s=data.window_start_s,
                                      extra=extra)
