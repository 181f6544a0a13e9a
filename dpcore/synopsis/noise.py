"""Noise models: how a release's range answers carry noise, for 95% intervals of every box at once.

A mechanism knows the law of the noise it drew and what its post-processing does with it, so it builds
the noise model and stores its spec (``{"kind": "module:Class", ...}``) with the synopsis; readers ask
the synopsis (``Synopsis.noise_model()``, ``Synopsis.intervals(boxes)``) and never name a mechanism.

Every model gives, per box, the variance of the answer's error and its effective number of terms
m = (Σw²)²/Σw⁴ (the noise is symmetric; m sets the kurtosis, γ₁/m). The interval is the answer ± the quantile of the error's law:
for a sum Σ w_i·N_i of independent terms of one discrete law, the exact law of the sum of m iid terms
(tabulated once per release by FFT of the discrete pmf) at the effective count m = (Σw²)²/Σw⁴ (exact
when all w are equal, as for a box of whole cells), scaled to the exact variance; beyond the table,
the Cornish–Fisher expansion in the kurtosis γ₁/m. Everything reads only the release and its public noise
parameters: post-processing, no budget.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcore.synopsis.tree_cover import TreeCover

if TYPE_CHECKING:
    from dpcore.synopsis.base import Synopsis

#: Sums of up to this many iid terms get the tabulated exact law; more are near normal (CF expansion).
TABLE_TERMS = 48
#: Boxes at least this many bootstrap cells wide each way read their re-drawn errors at the nearest nodes.
NEAREST_CELLS = 4
#: A law whose scale exceeds this many lattice steps is tabulated on bins of scale/BINS_PER_SCALE.
BINS_PER_SCALE = 16


@dataclass(frozen=True)
class NoiseLaw:
    """One cell's noise: ``laplace`` (discrete Laplace of scale ``param`` = sensitivity/ε on the lattice
    quantum·ℤ) or ``gaussian`` (discrete Gaussian of variance ``param``)."""

    kind: str
    param: float
    quantum: float = 1.0

    @property
    def _t(self) -> float:
        return float(np.exp(-self.quantum / self.param))

    @property
    def variance(self) -> float:
        if self.kind == "gaussian":
            return float(self.param)
        t = self._t
        return float(self.quantum ** 2 * 2.0 * t / (1.0 - t) ** 2)

    @property
    def excess_kurtosis(self) -> float:
        """κ4/κ2² of one term: (1 + 4t + t²)/(2t) for the two-sided geometric law (3 in the continuum)."""
        if self.kind == "gaussian":
            return 0.0
        t = self._t
        return float((1.0 + 4.0 * t + t * t) / (2.0 * t)) if t > 0 else float("inf")

    def words(self) -> str:
        if self.kind == "gaussian":
            return "discrete Gaussian"
        lattice = "" if self.quantum == 1.0 else f" on the 2^{np.log2(self.quantum):g} lattice"
        return f"discrete Laplace{lattice}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "param": float(self.param), "quantum": float(self.quantum)}

    @classmethod
    def from_dict(cls, d: dict) -> NoiseLaw:
        return cls(str(d["kind"]), float(d["param"]), float(d.get("quantum", 1.0)))

    def halfwidth(self, level: float, variance: np.ndarray, terms: np.ndarray) -> np.ndarray:
        """The (1 + level)/2 quantile of a symmetric error of this variance, read as a sum of ``terms`` iid
        terms of this law (the effective count (Σw²)²/Σw⁴; inf: normal)."""
        var = np.asarray(variance, dtype=np.float64)
        z_normal = NormalDist().inv_cdf((1.0 + level) / 2.0)
        if self.kind == "gaussian":
            return z_normal * np.sqrt(var)
        m = np.asarray(terms, dtype=np.float64)
        m = np.where(np.isnan(m), 1.0, np.maximum(m, 1.0))
        table = _sum_quantiles(self.param / self.quantum, level)  # z of 1..TABLE_TERMS terms
        g1 = self.excess_kurtosis
        g = np.where(np.isfinite(m), g1 / np.where(np.isfinite(m), m, 1.0), 0.0) if np.isfinite(g1) else 0.0
        zcf = z_normal + (z_normal ** 3 - 3.0 * z_normal) * g / 24.0
        # Cornish–Fisher holds for a small kurtosis; a law far below its lattice step (γ₁/m large even past
        # the table) takes the table's last exact z, or the normal one where that is 0 (conservative)
        zcf = np.where(g <= 0.1, zcf, table[-1] if table[-1] > 0 else z_normal)
        lo = np.clip(np.floor(np.minimum(m, TABLE_TERMS)), 1, TABLE_TERMS).astype(np.int64)
        hi = np.clip(lo + 1, 1, TABLE_TERMS)
        frac = np.clip(m - lo, 0.0, 1.0)
        z_tab = table[lo - 1] * (1 - frac) + table[hi - 1] * frac
        z = np.where(m <= TABLE_TERMS, z_tab, zcf)
        return z * np.sqrt(var)


@lru_cache(maxsize=64)
def _sum_quantiles(scale_steps: float, level: float) -> np.ndarray:
    """z_m = q_m / sd_m for m = 1..TABLE_TERMS: q_m the smallest lattice value with P(S_m ≤ q) ≥ (1+level)/2,
    S_m the sum of m iid discrete Laplace terms of ``scale_steps`` lattice steps (binned to scale/16 when
    coarser steps would need a long table)."""
    step = max(1.0, scale_steps / BINS_PER_SCALE)
    b = scale_steps / step  # scale in bins
    radius = int(np.ceil(32.0 * b)) + 1
    k = np.arange(-radius, radius + 1, dtype=np.float64)
    if step == 1.0:
        t = np.exp(-1.0 / b)
        pmf = (1.0 - t) / (1.0 + t) * t ** np.abs(k)
    else:  # the continuous Laplace law's mass per bin (the lattice is far finer than the scale)
        cdf = lambda x: np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / b), 1 - 0.5 * np.exp(-np.maximum(x, 0) / b))  # noqa: E731
        pmf = cdf(k + 0.5) - cdf(k - 0.5)
    pmf /= pmf.sum()
    n = 1 << int(np.ceil(np.log2(TABLE_TERMS * (2 * radius + 1))))
    centred = np.zeros(n)
    centred[:radius + 1] = pmf[radius:]
    centred[n - radius:] = pmf[:radius]
    phi = np.fft.rfft(centred)
    var1 = float(np.sum(pmf * k * k))
    target = (1.0 + level) / 2.0
    out = np.empty(TABLE_TERMS)
    for m in range(1, TABLE_TERMS + 1):
        p = np.fft.irfft(phi ** m, n)
        p = np.concatenate([p[n // 2:], p[:n // 2]])  # values −n/2 .. n/2 − 1
        cdf = np.cumsum(np.clip(p, 0.0, None))
        cdf /= cdf[-1]
        q = np.searchsorted(cdf, target - 1e-12) - n // 2
        # a scale far below the lattice step: the noise is 0 (all but surely), and so is the quantile
        out[m - 1] = q / np.sqrt(m * var1) if var1 > 0 else 0.0
    return out


# ---------------------------------------------------------------------------------------------
# box geometry: power sums of the covered fractions, vectorised over boxes
# ---------------------------------------------------------------------------------------------
def axis_cover(lo: np.ndarray, hi: np.ndarray, n: int, extent: tuple[float, float]):
    """Per box: first and last covered cell (i0, i1), their covered fractions (f0, f1; f1 = 0 when
    i1 == i0, and then f0 is the one cell's fraction), and whether anything is covered."""
    e0, e1 = extent
    a = np.clip((np.minimum(lo, hi) - e0) * (n / (e1 - e0)), 0.0, n)
    b = np.clip((np.maximum(lo, hi) - e0) * (n / (e1 - e0)), 0.0, n)
    some = b > a
    i0 = np.minimum(np.floor(a), n - 1).astype(np.int64)
    i1 = np.maximum(np.ceil(b).astype(np.int64) - 1, i0)
    one = i1 == i0
    f0 = np.where(one, b - a, (i0 + 1) - a)
    f1 = np.where(one, 0.0, b - i1)
    return i0, i1, np.where(some, f0, 0.0), np.where(some, f1, 0.0), some


def axis_power_sum(lo: np.ndarray, hi: np.ndarray, n: int, extent: tuple[float, float], p: int) -> np.ndarray:
    """Σ_i f_i^p over the n cells of an axis, f_i the fraction of cell i inside [lo, hi)."""
    return axis_power_sums(lo, hi, n, extent, (p,))[0]


def axis_power_sums(lo: np.ndarray, hi: np.ndarray, n: int, extent: tuple[float, float],
                    powers: tuple[int, ...] = (2, 4)) -> tuple[np.ndarray, ...]:
    """:func:`axis_power_sum` for each of ``powers``, from one cover of the axis."""
    i0, i1, f0, f1, some = axis_cover(lo, hi, n, extent)
    inner = np.maximum(i1 - i0 - 1, 0)
    return tuple(np.where(some, f0 ** p + f1 ** p + inner, 0.0) for p in powers)


def grid_power_sums(boxes: np.ndarray, shape: tuple[int, int],
                    bounds: tuple[float, float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(Σ w², Σ w⁴) over the cells of an (nx, ny) grid over ``bounds``, w = fx·fy each cell's covered fraction
    (in blocks of POWER_BLOCK boxes, whose temporaries stay in a core's cache: half the time of whole columns)."""
    xmin, ymin, xmax, ymax = bounds
    s2, s4 = np.empty(len(boxes)), np.empty(len(boxes))
    for s in range(0, len(boxes), POWER_BLOCK):
        b = boxes[s:s + POWER_BLOCK]
        x2, x4 = axis_power_sums(b[:, 0], b[:, 2], shape[0], (xmin, xmax))
        y2, y4 = axis_power_sums(b[:, 1], b[:, 3], shape[1], (ymin, ymax))
        np.multiply(x2, y2, out=s2[s:s + POWER_BLOCK])
        np.multiply(x4, y4, out=s4[s:s + POWER_BLOCK])
    return s2, s4


#: Boxes per block of :func:`grid_power_sums`.
POWER_BLOCK = 32_768


# ---------------------------------------------------------------------------------------------
# the models
# ---------------------------------------------------------------------------------------------
@dataclass
class Intervals:
    """Per box: lower and upper bound of the interval (NaN where none), and how they were computed.
    ``noise``: the half-widths (below, above) of the part that is the release's own noise, independent from
    release to release (None: all of it; the rest, the spread inside cut cells and the bounding's bias,
    recurs where the same places and people do)."""

    lower: np.ndarray
    upper: np.ndarray
    method: str
    noise: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def known(self) -> bool:
        return not self.method.startswith("none")


class NoiseModel(ABC):
    """How one release's range answers carry noise. Built by the mechanism that drew the noise."""

    method: str = ""
    #: What the interval covers, in words an analyst reads beside it.
    covers: str = "noise"

    @abstractmethod
    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(variance, effective number of terms) of each box's answer error."""

    @property
    def law(self) -> NoiseLaw | None:
        """The law the error is read as a sum of (None: normal / Cornish–Fisher only)."""
        return None

    def intervals(self, boxes: np.ndarray, est: np.ndarray, level: float = 0.95) -> Intervals:
        var, terms = self.moments(boxes)
        if self.law is not None:
            h = self.law.halfwidth(level, var, terms)
            return Intervals(est - h, est + h, self.method)
        h = NormalDist().inv_cdf((1.0 + level) / 2.0) * np.sqrt(var)
        return Intervals(est - h, est + h, self.method)

    def sd(self, boxes: np.ndarray) -> np.ndarray:
        return np.sqrt(self.moments(boxes)[0])

    def spec(self) -> dict:
        """What a release stores to rebuild this model (with ``from_spec``); JSON-able."""
        return {"kind": f"{type(self).__module__}:{type(self).__qualname__}"}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> NoiseModel:
        raise NotImplementedError


class NoInterval(NoiseModel):
    """A release whose answers have no stated interval, and why."""

    def __init__(self, reason: str):
        self.reason = reason
        self.method = f"none: {reason}"

    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nan = np.full(len(boxes), np.nan)
        return nan, nan.copy()

    def intervals(self, boxes: np.ndarray, est: np.ndarray, level: float = 0.95) -> Intervals:
        nan = np.full(len(boxes), np.nan)
        return Intervals(nan, nan.copy(), self.method)

    def spec(self) -> dict:
        return {**super().spec(), "reason": self.reason}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> NoInterval:
        return cls(str(spec["reason"]))


class CellNoise(NoiseModel):
    """A grid whose cells each carry independent noise of one law and nothing else: a box's error is
    Σ fx·fy·N over the cells it covers (fractions pro rata, as the answer counts them)."""

    def __init__(self, law: NoiseLaw, shape: tuple[int, int], bounds: tuple[float, float, float, float]):
        self._law, self.shape, self.bounds = law, (int(shape[0]), int(shape[1])), bounds
        self.method = (f"exact noise law ({law.words()}), tabulated quantiles of the sum" if law.kind == "laplace"
                       else "discrete Gaussian noise, normal quantiles with the exact variance")

    @property
    def law(self) -> NoiseLaw:
        return self._law

    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s2, s4 = grid_power_sums(boxes, self.shape, self.bounds)
        return self._law.variance * s2, terms(s2, s4)

    @staticmethod
    def make_spec(law: NoiseLaw) -> dict:
        return {"kind": f"{__name__}:CellNoise", "law": law.to_dict()}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> CellNoise:
        return cls(NoiseLaw.from_dict(spec["law"]), synopsis.shape[:2], synopsis.region.bounds_m)


def terms(s2: np.ndarray, s4: np.ndarray) -> np.ndarray:
    """The effective number of terms (Σw²)²/Σw⁴ of a weighted sum (inf where no term counts)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s4 > 0, s2 * s2 / np.where(s4 > 0, s4, 1.0), np.inf)


class LeafNoise(NoiseModel):
    """Independent noise of one law on the leaves of a quadtree (depth d, x-major index in the 2^d grid),
    each leaf's noisy count spread uniformly over its quadrant: Σ over depths of the per-depth grid sums
    (``dpcore.synopsis.tree_cover``)."""

    def __init__(self, law: NoiseLaw, leaf_depth: np.ndarray, leaf_index: np.ndarray,
                 bounds: tuple[float, float, float, float], name: str = "the tree's leaves"):
        self._law, self.bounds = law, bounds
        self.cover = TreeCover(leaf_depth, leaf_index)
        self.method = f"exact noise law ({law.words()}) over {name}, tabulated quantiles of the sum"

    @property
    def law(self) -> NoiseLaw:
        return self._law

    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s2, s4 = self.cover.power_sums(boxes, self.bounds)
        return self._law.variance * s2, terms(s2, s4)

    @staticmethod
    def make_spec(law: NoiseLaw, name: str) -> dict:
        return {"kind": f"{__name__}:LeafNoise", "law": law.to_dict(), "name": name}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> NoiseModel:
        arrays = getattr(synopsis, "arrays", {})
        if "leaf_depth" not in arrays or "leaf_index" not in arrays:
            return NoInterval("this release stores its tree only as a raster, not the leaves its noise law needs")
        return cls(NoiseLaw.from_dict(spec["law"]), arrays["leaf_depth"], arrays["leaf_index"],
                   synopsis.region.bounds_m, spec.get("name", "the tree's leaves"))


class BootstrapNoise(NoiseModel):
    """A post-processing linear in the noise (consistency, constrained inference): fresh draws of the
    recorded noise pushed through the same post-processing give the error field on the released grid;
    the draws are shared by every box (each box's error per draw is a prefix-table lookup), and give its
    variance. The error is read as a sum of terms of ``law`` with the term count of the box's own cover
    of the finest noisy grid (``cell_grid``)."""

    #: Re-draws of the noise per release: the variance's relative standard error is √(2/draws) ≈ 14%, the
    #: interval width's 7% (it moves a 95% interval's coverage by a few tenths of a percent).
    DRAWS = 100
    #: An error field of at most this many cells gives a box's variance over the draws as w·C·w, C the
    #: cells' error covariance over the draws and w the box's covered fractions (the same sum, in a few
    #: products per box instead of a read of every draw).
    SMALL_GRID = 64
    #: Boxes per block of draws read: the (boxes, draws) temporaries stay in a core's cache.
    BLOCK = 1024
    #: A field of at most this many cells gives a box narrower than NEAREST_CELLS cells each way its sum of
    #: squares as w·S·w over the (NEAREST_CELLS + 1)² cells from its first one, S those cells' products of
    #: errors summed over the draws, tabulated per first cell (625 numbers a cell; 5 MB at 1,024 cells).
    WINDOW_GRID = 1024

    def __init__(self, law: NoiseLaw, cell_grid: tuple[int, int], bounds: tuple[float, float, float, float],
                 seed: int = 0):
        self._law, self.cell_grid, self.bounds, self.seed = law, cell_grid, bounds, seed
        self._prefix: np.ndarray | None = None
        self._cov: np.ndarray | None = None
        self._window: np.ndarray | None = None
        #: Σ over the draws of each leaf's squared error, where the field rasterises leaves (note_leaf_errors)
        self._leaf_sq: np.ndarray | None = None
        self._leaf_draws = 0

    @property
    def law(self) -> NoiseLaw:
        return self._law

    @abstractmethod
    def draw_errors(self, rng: np.random.Generator) -> np.ndarray:
        """One re-drawn error field on the released grid (nx, ny)."""

    def note_leaf_errors(self, errors: np.ndarray) -> None:
        """Record one draw's errors of the leaves a field rasterises (for :meth:`leaf_at`'s variance floor)."""
        e = np.asarray(errors, dtype=np.float64)
        self._leaf_sq = e * e if self._leaf_sq is None else self._leaf_sq + e * e
        self._leaf_draws += 1

    def leaf_at(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]] | None:
        """The leaf holding each point and its rectangle (x0, y0, x1, y1), where the error field rasterises
        leaves that may be finer than its cells (None: the field's cells are the leaves)."""
        return None

    def _error_prefix(self) -> np.ndarray:
        """(nx+1, ny+1, draws) prefix tables of the re-drawn error fields (float32, computed once); a field of
        at most SMALL_GRID cells also keeps the cells' error covariance over the draws (float64)."""
        if self._prefix is None:
            rng = np.random.default_rng(self.seed)
            # draws first: contiguous copies and cumsums (half the time of the draws-last stack); the same
            # sums in the same order, so the same table; e is the (nx, ny, draws) view of the fields
            stacked = np.stack([self.draw_errors(rng) for _ in range(self.DRAWS)])
            e = stacked.transpose(1, 2, 0)
            c = np.cumsum(stacked, axis=1)
            np.cumsum(c, axis=2, out=c)
            p = np.zeros((e.shape[0] + 1, e.shape[1] + 1, e.shape[2]), dtype=np.float32)
            p[1:, 1:] = c.transpose(1, 2, 0)
            if e.shape[0] * e.shape[1] <= self.SMALL_GRID:
                cells = e.reshape(-1, e.shape[2]).astype(np.float64)
                self._cov = cells @ cells.T / e.shape[2]
            elif e.shape[0] * e.shape[1] <= self.WINDOW_GRID:
                self._window = _window_sums(e.astype(np.float64), NEAREST_CELLS + 1)
            self._prefix = p
        return self._prefix

    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The error field's moments (:meth:`field_moments`), with a box narrower than NEAREST_CELLS field
        cells taking at least its own leaves' variance (:meth:`_leaf_floor`)."""
        var, m, small = self.field_moments(boxes)
        if self._leaf_sq is not None and small.any():
            self._leaf_floor(boxes, small, var, m)
        return var, m

    def field_moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(variance, terms, small) of each box's error read on the re-drawn error fields; ``small``: the
        boxes narrower than NEAREST_CELLS cells each way, which interpolate the field."""
        p = self._error_prefix()
        nx, ny = p.shape[0] - 1, p.shape[1] - 1
        xmin, ymin, xmax, ymax = self.bounds
        gx = [np.clip((np.minimum(boxes[:, 0], boxes[:, 2]) - xmin) * nx / (xmax - xmin), 0, nx),
              np.clip((np.maximum(boxes[:, 0], boxes[:, 2]) - xmin) * nx / (xmax - xmin), 0, nx)]
        gy = [np.clip((np.minimum(boxes[:, 1], boxes[:, 3]) - ymin) * ny / (ymax - ymin), 0, ny),
              np.clip((np.maximum(boxes[:, 1], boxes[:, 3]) - ymin) * ny / (ymax - ymin), 0, ny)]
        # a box at least NEAREST_CELLS cells wide each way reads its error at the nearest grid nodes (its
        # variance moves little when an edge moves by half a cell, and it costs a quarter of the
        # bilinear read); smaller boxes interpolate, or they could shrink to nothing
        near = (gx[1] - gx[0] >= NEAREST_CELLS) & (gy[1] - gy[0] >= NEAREST_CELLS)
        if self._cov is not None:
            var = self._small_grid_variance(self._cov, nx, ny, near, gx, gy)
        else:
            var = np.empty(len(boxes))
            flat, st = p.reshape(-1, p.shape[2]), ny + 1
            at = np.flatnonzero(near)
            if at.size:
                ix0, ix1, iy0, iy1 = (np.rint(g[at]).astype(np.int64) for g in (*gx, *gy))
                var[at] = _corner_sum_squares(flat, (ix1 * st + iy1, ix0 * st + iy1, ix1 * st + iy0,
                                                     ix0 * st + iy0), self.BLOCK)
            small = ~near
            if self._window is not None:
                # a box narrower than NEAREST_CELLS cells each way lies in NEAREST_CELLS + 1 cells from its first
                at = np.flatnonzero(small & (gx[1] - gx[0] < NEAREST_CELLS) & (gy[1] - gy[0] < NEAREST_CELLS))
                var[at] = _window_sum_squares(self._window, nx, ny, NEAREST_CELLS + 1, [g[at] for g in gx],
                                              [g[at] for g in gy], 8 * self.BLOCK)
                small[at] = False
            at = np.flatnonzero(small)
            if at.size:
                var[at] = _bilinear_sum_squares(flat, st, nx, ny, [g[at] for g in gx], [g[at] for g in gy],
                                                self.BLOCK)
            var /= p.shape[2]
        s2, s4 = grid_power_sums(boxes, self.cell_grid, self.bounds)
        return var, terms(s2, s4), ~near

    def _leaf_floor(self, boxes: np.ndarray, small: np.ndarray, var: np.ndarray, m: np.ndarray) -> None:
        """A box narrower than NEAREST_CELLS field cells reads the field's cells, each the sum of the leaves
        it rasterises: a box inside one leaf finer than a cell then gets that cell's error spread evenly,
        not its own leaf's (f_leaf²·Var(leaf) exceeds f_cell²·Var(cell) by the leaves per cell; AG's 30 m
        leaves in 78 m cells held 0.85 of 25–100 m squares' noise-free answers on Gowalla NYC). Each such box takes at least
        Σ f²·Var over the leaves it cuts, read on the grid of the leaf under its centre (its neighbours
        taken as of the same size), as independent terms; in place."""
        rows = np.flatnonzero(small)
        b = boxes[rows]
        leaf, (x0, y0, x1, y1) = self.leaf_at(0.5 * (b[:, 0] + b[:, 2]), 0.5 * (b[:, 1] + b[:, 3]))
        v = self._leaf_sq[leaf] / max(self._leaf_draws, 1)
        wx, wy = x1 - x0, y1 - y0
        ax, bx = (np.minimum(b[:, 0], b[:, 2]) - x0) / wx, (np.maximum(b[:, 0], b[:, 2]) - x0) / wx
        ay, by = (np.minimum(b[:, 1], b[:, 3]) - y0) / wy, (np.maximum(b[:, 1], b[:, 3]) - y0) / wy
        s2 = _unit_power_sum(ax, bx, 2) * _unit_power_sum(ay, by, 2)
        s4 = _unit_power_sum(ax, bx, 4) * _unit_power_sum(ay, by, 4)
        floor, t = v * s2, terms(s2, s4)
        # the leaves under the box's corners, each counted once with its own size and variance: a box at the
        # edge of a coarse leaf may cover most of a fine neighbour (a box inside its centre's leaf has none)
        out = np.flatnonzero((np.minimum(b[:, 0], b[:, 2]) < x0) | (np.maximum(b[:, 0], b[:, 2]) > x1)
                             | (np.minimum(b[:, 1], b[:, 3]) < y0) | (np.maximum(b[:, 1], b[:, 3]) > y1))
        if out.size:
            self._corner_floor(b[out], out, floor, t)
        wins = floor > var[rows]
        var[rows[wins]] = floor[wins]
        m[rows[wins]] = t[wins]

    def _corner_floor(self, b: np.ndarray, at: np.ndarray, floor: np.ndarray, t: np.ndarray) -> None:
        """Σ f²·Var over the distinct leaves under the corners of boxes ``b`` (rows ``at`` of ``floor`` and
        ``t``, raised in place where it is larger)."""
        seen, c2, c4 = [], np.zeros(len(b)), np.zeros(len(b))
        for px, py in ((b[:, 0], b[:, 1]), (b[:, 0], b[:, 3]), (b[:, 2], b[:, 1]), (b[:, 2], b[:, 3])):
            lf, (lx0, ly0, lx1, ly1) = self.leaf_at(np.nextafter(px, 0.5 * (b[:, 0] + b[:, 2])),
                                                    np.nextafter(py, 0.5 * (b[:, 1] + b[:, 3])))
            f = (np.clip(np.minimum(b[:, 2], lx1) - np.maximum(b[:, 0], lx0), 0.0, None)
                 * np.clip(np.minimum(b[:, 3], ly1) - np.maximum(b[:, 1], ly0), 0.0, None)
                 / ((lx1 - lx0) * (ly1 - ly0)))
            new = np.logical_and.reduce([lf != s_ for s_ in seen]) if seen else np.ones(len(b), dtype=bool)
            seen.append(lf)
            w = np.where(new, f * f * self._leaf_sq[lf] / max(self._leaf_draws, 1), 0.0)
            c2 += w
            c4 += w * w
        corners = c2 > floor[at]
        floor[at[corners]] = c2[corners]
        t[at[corners]] = terms(c2, c4)[corners]

    def _small_grid_variance(self, cov: np.ndarray, nx: int, ny: int, near: np.ndarray, gx: list[np.ndarray],
                             gy: list[np.ndarray]) -> np.ndarray:
        """Σ_kl w_k·C_kl·w_l per box, w = fx ⊗ fy the covered fractions of the cells (pro rata, as the
        bilinear read of the prefix tables counts them; whole cells where the box reads the nearest nodes)."""
        g = [np.where(near, np.rint(c), c) for c in (*gx, *gy)]
        var = np.empty(len(near))
        i, j = np.arange(nx, dtype=np.float64), np.arange(ny, dtype=np.float64)
        for s in range(0, len(near), 16 * self.BLOCK):
            x0, x1, y0, y1 = (c[s:s + 16 * self.BLOCK, None] for c in g)
            fx = np.clip(np.minimum(x1, i + 1.0) - np.maximum(x0, i), 0.0, 1.0)
            fy = np.clip(np.minimum(y1, j + 1.0) - np.maximum(y0, j), 0.0, 1.0)
            w = (fx[:, :, None] * fy[:, None, :]).reshape(len(fx), nx * ny)
            var[s:s + 16 * self.BLOCK] = np.einsum("qk,qk->q", w @ cov, w)
        return np.maximum(var, 0.0)  # w·C·w ≥ 0: a rounding below 0 is 0


def _unit_power_sum(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    """Σ f^p over the unit cells of an axis (cells [i, i + 1), every integer i), f the fraction of each
    inside [a, b)."""
    i0 = np.floor(a)
    i1 = np.maximum(np.ceil(b) - 1.0, i0)
    one = i1 == i0
    f0 = np.where(one, b - a, i0 + 1.0 - a)
    f1 = np.where(one, 0.0, b - i1)
    return f0 ** p + f1 ** p + np.maximum(i1 - i0 - 1.0, 0.0)


def _window_sums(e: np.ndarray, w: int) -> np.ndarray:
    """(nx·ny, w², w²): per cell (i, j), x-major, the products of the errors of the w × w cells from (i, j) on
    (0 past the field's edge), summed over the draws of ``e`` (nx, ny, draws)."""
    nx, ny, d = e.shape
    pad = np.zeros((nx + w - 1, ny + w - 1, d))
    pad[:nx, :ny] = e
    win = np.lib.stride_tricks.sliding_window_view(pad, (w, w), axis=(0, 1)).reshape(nx * ny, d, w * w)
    return np.matmul(win.transpose(0, 2, 1), win)


def _window_sum_squares(sums: np.ndarray, nx: int, ny: int, w: int, gx: list[np.ndarray], gy: list[np.ndarray],
                        block: int) -> np.ndarray:
    """Σ over the draws of the box's error squared for boxes within w cells each way of their first cell:
    f·S·f with f = fx ⊗ fy their covered fractions of those cells (pro rata, as the bilinear read of the
    prefix tables counts them) and S the window's tabulated sums (:func:`_window_sums`).

    The boxes go through grouped by their first cell, so that each group's f·S is one matrix product with
    its cell's S (BLAS), not one small product per box."""
    out = np.empty(len(gx[0]))
    a = np.arange(w, dtype=np.float64)
    i0, j0 = np.minimum(np.floor(gx[0]), nx - 1), np.minimum(np.floor(gy[0]), ny - 1)
    # (a field of at most WINDOW_GRID cells: int16 keys take numpy's radix sort)
    cell = (i0 * ny + j0).astype(np.int16 if nx * ny < 2 ** 15 else np.int64)
    order = np.argsort(cell, kind="stable")
    cell = cell[order]
    x0, x1, y0, y1, i0, j0 = (c[order] for c in (gx[0], gx[1], gy[0], gy[1], i0, j0))
    starts = np.flatnonzero(np.diff(cell)) + 1
    for s, e in zip([0, *starts.tolist()], [*starts.tolist(), len(cell)], strict=True):
        for t in range(s, e, block):
            u = min(t + block, e)
            fx = np.clip(np.minimum(x1[t:u, None], i0[t:u, None] + a + 1.0) - np.maximum(x0[t:u, None], i0[t:u, None] + a),
                         0.0, 1.0)
            fy = np.clip(np.minimum(y1[t:u, None], j0[t:u, None] + a + 1.0) - np.maximum(y0[t:u, None], j0[t:u, None] + a),
                         0.0, 1.0)
            f = (fx[:, :, None] * fy[:, None, :]).reshape(u - t, w * w)
            out[order[t:u]] = np.einsum("qk,qk->q", f @ sums[cell[t]].T, f)
    return np.maximum(out, 0.0)  # f·S·f ≥ 0: a rounding below 0 is 0


def _corner_sum_squares(flat: np.ndarray, nodes: tuple[np.ndarray, ...], block: int) -> np.ndarray:
    """Σ over the draws of (P[n0] − P[n1] − P[n2] + P[n3])² per box, ``flat`` the (nodes, draws) prefix
    tables: rows gathered with np.take into buffers reused block by block (a tenth of the time of fancy
    indexing; the temporaries stay in the cache)."""
    n0, n1, n2, n3 = nodes
    out = np.empty(len(n0))
    err, tmp = np.empty((block, flat.shape[1]), flat.dtype), np.empty((block, flat.shape[1]), flat.dtype)
    for s in range(0, len(n0), block):
        k = min(block, len(n0) - s)
        e, t = err[:k], tmp[:k]
        flat.take(n0[s:s + k], axis=0, out=e)
        flat.take(n1[s:s + k], axis=0, out=t)
        e -= t
        flat.take(n2[s:s + k], axis=0, out=t)
        e -= t
        flat.take(n3[s:s + k], axis=0, out=t)
        e += t
        out[s:s + k] = np.einsum("ij,ij->i", e, e)
    return out


def _bilinear_sum_squares(flat: np.ndarray, st: int, nx: int, ny: int, gx: list[np.ndarray],
                          gy: list[np.ndarray], block: int) -> np.ndarray:
    """Σ over the draws of the box's error squared, the prefix tables read bilinearly at its four corners."""
    out = np.empty(len(gx[0]))
    for s in range(0, len(out), block):
        fx, fy = [g[s:s + block] for g in gx], [g[s:s + block] for g in gy]
        err = (_bilinear(flat, st, nx, ny, fx[1], fy[1]) - _bilinear(flat, st, nx, ny, fx[0], fy[1])
               - _bilinear(flat, st, nx, ny, fx[1], fy[0]) + _bilinear(flat, st, nx, ny, fx[0], fy[0]))
        out[s:s + block] = np.einsum("ij,ij->i", err, err)
    return out


def _bilinear(flat: np.ndarray, st: int, nx: int, ny: int, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """(boxes, draws) values of prefix tables (``flat``: (nodes, draws), node ix·st + iy, an (nx+1, ny+1)
    grid of nodes) at fractional grid coordinates (bilinear, as answers are)."""
    ix = np.minimum(np.floor(gx).astype(np.int64), nx - 1)
    iy = np.minimum(np.floor(gy).astype(np.int64), ny - 1)
    fx, fy = (gx - ix).astype(np.float32)[:, None], (gy - iy).astype(np.float32)[:, None]
    node = ix * st + iy
    lo = flat.take(node, axis=0)
    lo += fy * (flat.take(node + 1, axis=0) - lo)
    hi = flat.take(node + st, axis=0)
    hi += fy * (flat.take(node + st + 1, axis=0) - hi)
    lo += fx * (hi - lo)
    return lo


def draw_noise(rng: np.random.Generator, law: NoiseLaw, size: int | tuple[int, ...]) -> np.ndarray:
    if law.kind == "gaussian":
        return rng.normal(0.0, np.sqrt(law.param), size)
    q = -np.expm1(-law.quantum / law.param)
    return law.quantum * (rng.geometric(q, size) - rng.geometric(q, size)).astype(np.float64)



def model_from_spec(spec: dict | None, synopsis: Synopsis, missing: str) -> Any:
    """The noise model a release stored (its class named by ``kind``, inside dpcore), or NoInterval(missing)."""
    if not spec:
        return NoInterval(missing)
    module_name, _, cls_name = str(spec.get("kind", "")).partition(":")
    if not module_name.startswith("dpcore."):
        return NoInterval(f"refusing a noise model from outside dpcore ({spec.get('kind')!r})")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls.from_spec(spec, synopsis)
