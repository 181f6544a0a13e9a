"""UG: the uniform grid of Qardaji, Yang, Li (ICDE 2013), plus helpers shared by the classic methods.

The grid side is m = ⌈sqrt(N·ε/c)⌉ with c = 10: it balances the noise error of a query (grows with
the number of cells it covers, ∝ m·k/ε) against the error of the uniformity assumption inside the
cells it cuts (∝ N/m). Under user-level privacy the noise per cell has scale k/ε instead of 1/ε, so
the same balance gives m = ⌈sqrt(N·ε/(c·k))⌉: the paper's formula with N counted in units of k
points. At record level (k = 1) it is exactly the paper's formula.

N (the number of points) is private. It is taken either from ``FitInput.public_total`` (a count the
caller declares public; free, and recorded in the notes), or estimated with a stated fraction of ε
(``total_fraction``, default 5%) as n + DLap(k/ε_N), which is a charge of its own. The grid counts
use the rest of ε: one Laplace step on disjoint cells, L1 sensitivity k (user) or 1 (record).

``size_rule="data"`` replaces the ICDE rule by the data-centred rule of dpcore.grid.size_rule (fitted on
public data for queries centred where people are), for the query band ``query_sides_m``; N comes from
the same place and costs the same. The release's parameters record the rule's constants.

Negative cells are kept (unbiased range sums); ``clamp_negative=True`` zeroes them instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np

from dpcore.geo import Region
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Band, Fraction, Positive, PositiveInt
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis
from dpcore.synopsis.noise import CellNoise, NoInterval

#: The constant of the UG/AG grid-size rule (Qardaji et al. 2013 found c = 10 works across datasets).
DEFAULT_C = 10.0
#: Grid-size rules: Qardaji et al.'s (uniform query centres) and the data-centred one (dpcore.grid.size_rule).
SIZE_RULES = ("qardaji", "data")
SizeRule = Literal["qardaji", "data"]
#: Largest raster any classic mechanism publishes (2048² float64 = 32 MiB; ~10 m cells on 20 km).
MAX_RASTER = 2048

if TYPE_CHECKING:
    from scipy import sparse


def private_total(data: PointsInput, acct: Accountant, noise: NoiseSource, fraction: float,
                  notes: list[str]) -> float:
    """N for a grid-size rule: the declared public total, or a paid, noisy estimate of it.

    The estimate is n + DLap(sensitivity/ε_N) with ε_N = fraction·ε (adding or removing one privacy
    unit changes n by at most the count sensitivity), clamped to ≥ 1 by post-processing.
    """
    if data.sample_size is not None:
        notes.append(f"N = {data.sample_size:g}: the caller's already-paid DP estimate of the sample size (reused)")
        return max(float(data.sample_size), 1.0)
    if data.public_total is not None:
        total = float(data.public_total)
        if not math.isfinite(total) or total < 0:
            raise MechanismError(f"public_total must be a finite number ≥ 0, got {data.public_total!r}")
        notes.append(f"N = {total:g} taken from public_total (declared public by the caller; no budget)")
        return max(total, 1.0)
    eps_n = acct.spend_fraction("total_count", fraction, data.sensitivity,
                                note="noisy number of points, used only to size the grid")
    noisy = float(data.add_count_noise(np.array([data.mass]), eps_n, noise)[0])
    notes.append(f"N estimated with {fraction:.0%} of ε as n + DLap(sensitivity/ε_N) = {noisy:g}")
    return max(noisy, 1.0)


def grid_size_rule(total: float, epsilon: float, sensitivity: float, c: float) -> float:
    """sqrt(N·ε/(c·sensitivity)): Qardaji et al.'s rule with N in units of the count sensitivity."""
    return math.sqrt(max(total, 0.0) * epsilon / (c * sensitivity))


def _spans(lo: np.ndarray, hi: np.ndarray, axis_lo: float, axis_hi: float,
           n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval, cell, fraction): the fraction of each interval [lo, hi) lying in each of the n cells it meets
    (the entries of :func:`_overlaps`' matrix, interval by interval)."""
    w = (axis_hi - axis_lo) / n
    a = (np.asarray(lo, dtype=np.float64) - axis_lo) / w
    b = (np.asarray(hi, dtype=np.float64) - axis_lo) / w
    first = np.clip(np.floor(a).astype(np.int64), 0, n - 1)
    last = np.clip(np.ceil(b).astype(np.int64) - 1, 0, n - 1)
    last = np.maximum(last, first)
    span = last - first + 1
    rows = np.repeat(np.arange(a.size), span)
    starts = np.repeat(np.cumsum(span) - span, span)
    cols = np.repeat(first, span) + (np.arange(rows.size) - starts)
    overlap = np.minimum(b[rows], cols + 1.0) - np.maximum(a[rows], cols.astype(np.float64))
    length = np.maximum(b - a, 1e-300)[rows]
    frac = np.clip(overlap, 0.0, None) / length
    return rows, cols, frac


def _overlaps(lo: np.ndarray, hi: np.ndarray, axis_lo: float, axis_hi: float, n: int) -> sparse.csr_matrix:
    """Sparse (len(lo), n) matrix of the fraction of each interval [lo, hi) lying in each of n cells."""
    from scipy import sparse  # here, not at import: answering a release never needs it

    rows, cols, frac = _spans(lo, hi, axis_lo, axis_hi, n)
    return sparse.csr_matrix((frac, (rows, cols)), shape=(np.size(lo), n))


class RectangleRaster:
    """:func:`rasterise_rectangles` of many masses on the same rectangles (a bootstrap re-draws every leaf's
    error on one structure): each rectangle's share of each raster cell, fx·fy, is found once, and a mass
    vector becomes a raster in one weighted bincount (no scipy, a tenth of the sparse products' time)."""

    def __init__(self, x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray, region: Region, size: int):
        xmin, ymin, xmax, ymax = region.bounds_m
        rx, cx, fx = _spans(x0, x1, xmin, xmax, size)
        ry, cy, fy = _spans(y0, y1, ymin, ymax, size)
        k = np.size(x0)
        ny = np.bincount(ry, minlength=k)  # y entries per rectangle, which come in rectangle order
        y_first = np.cumsum(ny) - ny
        # every x entry of a rectangle paired with each of its y entries
        reps = ny[rx]
        xe = np.repeat(np.arange(rx.size), reps)
        ye = np.repeat(y_first[rx], reps) + (np.arange(xe.size) - np.repeat(np.cumsum(reps) - reps, reps))
        self.size, self.rect, self.cell = size, rx[xe], cx[xe] * size + cy[ye]
        self.fx, self.fy = fx[xe], fy[ye]

    def __call__(self, mass: np.ndarray) -> np.ndarray:
        """The (size, size) raster of the rectangles' ``mass``, each spread uniformly over its area."""
        w = self.fx * (np.asarray(mass, dtype=np.float64)[self.rect] * self.fy)  # as OXᵀ·(diag(mass)·OY) multiplies
        return np.bincount(self.cell, weights=w, minlength=self.size * self.size).reshape(self.size, self.size)


def rasterise_rectangles(x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray, mass: np.ndarray,
                         region: Region, size: int) -> np.ndarray:
    """(size, size) grid of the mass of axis-aligned rectangles, each spread uniformly over its area.

    Exact under the uniformity assumption: a rectangle's share of a raster cell is the product of
    its x- and y-overlap fractions, so the raster is OXᵀ·diag(mass)·OY with sparse overlap
    matrices (no loop over rectangles or cells).
    """
    from scipy import sparse

    xmin, ymin, xmax, ymax = region.bounds_m
    ox = _overlaps(x0, x1, xmin, xmax, size)
    oy = _overlaps(y0, y1, ymin, ymax, size)
    weighted = sparse.diags(np.asarray(mass, dtype=np.float64)) @ oy
    return np.asarray((ox.T @ weighted).todense(), dtype=np.float64)


class UniformGrid(Mechanism):
    """Uniform grid with the ICDE 2013 size rule; see the module docstring for the budget split.

    ``grid_size`` overrides the rule (then N is not needed and all of ε goes to the cells).
    ``size_rule``: ``"qardaji"`` (the ICDE 2013 rule, default) or ``"data"`` (dpcore.grid.size_rule for
    the band ``query_sides_m``).
    """

    name = "ug"
    tags = MechanismTags(supports_weights=True, auto_role="fixed")

    def __init__(self, *, c: Positive = DEFAULT_C, total_fraction: Fraction = 0.05,
                 grid_size: PositiveInt | None = None, max_grid: PositiveInt = MAX_RASTER,
                 clamp_negative: bool = False, size_rule: SizeRule = "qardaji",
                 query_sides_m: Band = (100.0, 1000.0)):
        self.c = c
        self.size_rule = size_rule
        self.query_sides_m = query_sides_m
        self.total_fraction = total_fraction
        self.grid_size = grid_size
        self.max_grid = max_grid
        self.clamp_negative = clamp_negative

    def tuned_band_parameter(self) -> str | None:
        return "query_sides_m" if self.size_rule == "data" and self.grid_size is None else None

    def fine_grid(self, region: Region) -> int | None:
        """The fixed grid, else the largest the rule may choose (max_grid): every size up to it is served."""
        return int(self.grid_size) if self.grid_size is not None else int(self.max_grid)

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        from dpcore.mechanisms import charge_law

        law = charge_law(charges, "cell_counts")
        if params.get("clamp_negative"):
            return NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
        return None if law is None else CellNoise.make_spec(law)

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> GridSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        notes: list[str] = []
        extra: dict = {}
        if self.grid_size is not None:
            m = int(self.grid_size)
            notes.append(f"grid size {m} fixed by parameter (public)")
        else:
            total = private_total(data, acct, noise, float(self.total_fraction), notes)
            eps_cells = acct.epsilon - acct.spent
            if self.size_rule == "data":
                from dpcore.grid.size_rule import data_grid_size, rule_record

                band = tuple(float(v) for v in self.query_sides_m)
                m = data_grid_size(total, eps_cells, data.sensitivity, band, data.privacy_unit,
                                   max_size=int(self.max_grid))
                rec = rule_record(band, data.privacy_unit)
                extra["size_rule_constants"] = rec
                notes.append(f"m = {m} by the data-centred rule a·(N·ε_cells/k)^b with a = {rec['a']:.4g}, "
                             f"b = {rec['b']:.4g} for {band[0]:g}–{band[1]:g} m queries, capped at {self.max_grid}")
            else:
                m = int(math.ceil(grid_size_rule(total, eps_cells, data.sensitivity, self.c)))
                m = min(max(m, 1), int(self.max_grid))
                notes.append(f"m = ceil(sqrt(N·ε_cells/(c·k))) = {m} with c = {self.c:g}, capped at {self.max_grid}")
        counts = data.grid_counts(m, m)
        eps = acct.spend_rest("cell_counts", data.sensitivity,
                              note=f"{m}x{m} uniform grid; disjoint cells, L1 sensitivity = contribution bound")
        noisy = data.add_count_noise(counts, eps, noise).astype(np.float64)
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
            notes.append("negative cells clamped to 0")
        else:
            notes.append("negative cells kept (unbiased range sums)")
        acct.describe(notes, params={**self.get_params(), **extra} if extra else None)
        noise_spec = (NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
                      if self.clamp_negative else CellNoise.make_spec(data.count_noise_law(eps)))
        return GridSynopsis(noisy, data.region, None,
                            {"grid_size": m, "cell_width_m": data.region.side_m / m, "noise_model": noise_spec})
