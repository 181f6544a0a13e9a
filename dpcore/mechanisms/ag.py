"""AG: the two-level adaptive grid of Qardaji, Yang, Li (ICDE 2013).

Level 1 is an m1 × m1 grid, m1 = max(10, ⌈sqrt(N·ε/c)/4⌉), whose noisy counts v use α·ε. (One
deviation, for tiny N·ε only: when the UG size sqrt(N·ε/c) is below 10, the floor 10 is lowered to
⌈sqrt(N·ε/c)⌉, so AG never starts from a finer, noisier grid than UG would use; ``min_m1`` = 10.) Each
level-1 cell is then cut into an m2 × m2 grid with m2 = ⌈sqrt(v⁺·(1−α)·ε/c2)⌉, c2 = c/2, sized from
the *noisy* count v⁺ = max(v, 0) (post-processing, free), and its level-2 counts u use (1−α)·ε.
Defaults α = 0.5, c = 10; ``m1`` fixes the level-1 side instead (a public choice, e.g. a size rule's). Under user-level privacy every size rule divides by k, as in
:mod:`dpcore.mechanisms.ug` (N counted in units of k; identical to the paper at record level).

Budget (sequential composition over the two levels; cells within a level are disjoint, so each
level is one Laplace step of L1 sensitivity k (user) or 1 (record)):

- ``total_count``: ``total_fraction`` of ε to estimate N, unless ``FitInput.public_total`` is given;
- ``level1_counts``: α of what remains;
- ``level2_counts``: the rest.

Constrained inference (the paper's, with the variances of the two levels): the level-1 count and the
sum of its m2² children are two unbiased estimates of the same total, combined by inverse-variance
weights, v' = (α²·m2²·v + (1−α)²·Σu) / (α²·m2² + (1−α)²); the difference v' − Σu is then spread
equally over the children (mean consistency), so the children add up to v'. Negative leaf counts
that remain are kept (unbiased range sums); ``clamp_negative=True`` zeroes them after inference.

``levels=3`` adds a third level (dpcore.mechanisms.ag_levels): level 2 gets ``level2_fraction`` of what
remains after level 1, and every level-2 cell is cut into m3 × m3 cells, m3 = ⌈√(u⁺·ε3/(c3/2))⌉ from its
noisy count u (post-processing), whose counts use the rest (``level3_counts``); the three levels are made
consistent by least squares on the tree (AG's inference with two levels). With ``merge_unsplit`` (default) a
level-1 cell that level 2 would not cut (m2 = 1, from its noisy count) is not measured at level 2: its
level-3 cells, sized from the level-1 count, use level 2's ε as well; cells are disjoint, so every point's
path still spends level 1 + level 2 + level 3 = the budget.

The leaves are rasterised onto a public ``raster_size`` grid (default: ~10 m cells, at most 2048 per
axis), each leaf's count spread exactly uniformly over its area, so the synopsis answers by prefix
sums.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from dpcore.grid.histogram import cell_index
from dpcore.mechanisms.ag_levels import (
    BOOTSTRAP_GRID,
    AdaptiveGrid3Noise,
    ThreeLevelStructure,
    child_rects,
    point_child,
    tree_inference,
)
from dpcore.mechanisms.base import Mechanism
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Fraction, Positive, PositiveInt
from dpcore.mechanisms.tags import MechanismTags
from dpcore.mechanisms.ug import (
    DEFAULT_C,
    MAX_RASTER,
    RectangleRaster,
    grid_size_rule,
    private_total,
    rasterise_rectangles,
)
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis, Synopsis
from dpcore.synopsis.noise import BootstrapNoise, NoInterval, NoiseLaw, NoiseModel, draw_noise


def constrained_inference(v: np.ndarray, u: np.ndarray, n_children: np.ndarray, eps1: float,
                          eps2: float) -> np.ndarray:
    """AG's two-level inference, vectorised over level-1 cells.

    ``v``: noisy level-1 counts (ε1 each); ``u``: noisy level-2 counts (ε2 each) laid out cell after
    cell, ``n_children[i]`` of them for cell i. Both levels have the same sensitivity, so
    var(v) ∝ 1/ε1² and var(Σu) ∝ m2²/ε2²; the inverse-variance average is
    v' = (ε1²·m2²·v + ε2²·Σu) / (ε1²·m2² + ε2²), which with ε1 = αε, ε2 = (1−α)ε is the paper's
    formula. Returns the children shifted equally so that they sum to v'.
    """
    n_children = np.asarray(n_children, dtype=np.int64)
    leaf_cell = np.repeat(np.arange(n_children.size), n_children)
    child_sum = np.bincount(leaf_cell, weights=u, minlength=n_children.size)
    w_parent = (eps1 ** 2) * n_children.astype(np.float64)
    w_children = eps2 ** 2
    v_prime = (w_parent * np.asarray(v, dtype=np.float64) + w_children * child_sum) / (w_parent + w_children)
    return np.asarray(u, dtype=np.float64) + ((v_prime - child_sum) / n_children)[leaf_cell]


def split_sides(noisy_counts: np.ndarray, epsilon: float | np.ndarray, c: float, sensitivity: float,
                most: int) -> np.ndarray:
    """AG's rule for cutting each cell by its noisy count n (post-processing): an m × m grid with
    m = ⌈√(n⁺·ε / (c/2 · sensitivity))⌉, kept within [1, most]."""
    m = np.ceil(np.sqrt(np.maximum(noisy_counts, 0.0) * epsilon / ((c / 2.0) * sensitivity))).astype(np.int64)
    return np.clip(m, 1, int(most))


def points_in_region(data: PointsInput) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The points (or a fine grid's cell centres) inside the region, and their masses (None: one each)."""
    x, y, mass = data.point_masses()
    xmin, ymin, xmax, ymax = data.region.bounds_m
    inside = (x >= xmin) & (x < xmax) & (y >= ymin) & (y < ymax)
    return x[inside], y[inside], None if mass is None else mass[inside]


def default_raster(side_m: float, cell_m: float = 10.0) -> int:
    """Raster cells per axis: about ``cell_m`` metres each, between 16 and MAX_RASTER."""
    return int(min(MAX_RASTER, max(16, math.ceil(side_m / cell_m))))


class AdaptiveGrid(Mechanism):
    """Two-level adaptive grid; see the module docstring for sizes, budget split and inference."""

    name = "ag"
    tags = MechanismTags(supports_weights=True, auto_role="fixed")

    def __init__(self, *, alpha: Fraction = 0.5, c: Positive = DEFAULT_C, total_fraction: Fraction = 0.05,
                 min_m1: PositiveInt = 10, max_m2: PositiveInt = 256, raster_size: PositiveInt | None = None,
                 clamp_negative: bool = False, m1: PositiveInt | None = None, levels: Literal[2, 3] = 2,
                 level2_fraction: Fraction = 0.375, c3: Positive = 10.0, max_m3: PositiveInt = 64,
                 merge_unsplit: bool = True):
        self.merge_unsplit = merge_unsplit
        self.m1 = m1
        self.levels = levels
        self.level2_fraction = level2_fraction
        self.c3 = c3
        self.max_m3 = max_m3
        self.alpha = alpha
        self.min_m1 = min_m1
        self.c = c
        self.total_fraction = total_fraction
        self.max_m2 = max_m2
        self.raster_size = raster_size
        self.clamp_negative = clamp_negative

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        from dpcore.mechanisms import charge_law

        if params.get("clamp_negative"):
            return NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
        laws = [charge_law(charges, n) for n in ("level1_counts", "level2_counts")]
        eps = [next((c.get("epsilon") for c in charges if c.get("name") == n), None)
               for n in ("level1_counts", "level2_counts")]
        if extra.get("m2") is None or any(law is None or law.kind != "laplace" for law in laws) or None in eps:
            return None
        return AdaptiveGridNoise.make_spec(laws[0], laws[1], float(eps[0]), float(eps[1]))

    def _clamped(self, leaves: np.ndarray, notes: list[str]) -> np.ndarray:
        """The leaf counts after inference, negatives zeroed when ``clamp_negative`` (post-processing)."""
        if self.clamp_negative:
            notes.append("negative leaf counts clamped to 0 after inference")
            return np.maximum(leaves, 0.0)
        notes.append("negative leaf counts kept after inference (unbiased range sums)")
        return leaves

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> GridSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        alpha = float(self.alpha)
        raster_size = int(self.raster_size) if self.raster_size is not None else default_raster(data.region.side_m)
        k = data.sensitivity
        notes: list[str] = []
        total = private_total(data, acct, noise, float(self.total_fraction), notes)
        eps_rest = acct.epsilon - acct.spent
        m_ug = grid_size_rule(total, eps_rest, k, self.c)
        # The paper's floor of 10 assumes a large N·ε; when even UG would use fewer than 10 cells per
        # axis (tiny N·ε/k, e.g. user level at small ε), the floor is lowered to UG's size, so AG never
        # starts coarser-noisier than UG. For m_ug ≥ 10 this is exactly max(10, ⌈m_ug/4⌉).
        floor = min(int(self.min_m1), max(1, int(math.ceil(m_ug))))
        m1 = min(max(floor, int(math.ceil(m_ug / 4.0))) if self.m1 is None else int(self.m1), raster_size)

        # Level 1.
        xmin, ymin, xmax, ymax = data.region.bounds_m
        eps1 = acct.spend("level1_counts", alpha * eps_rest, k,
                          note=f"{m1}x{m1} level-1 grid; disjoint cells, L1 sensitivity = contribution bound")
        v = data.add_count_noise(data.grid_counts(m1, m1), eps1, noise)
        v = v.astype(np.float64).ravel()  # cell id = ix * m1 + iy

        # Level-2 sizes from the noisy level-1 counts (post-processing), then one leaf id per point.
        eps2_planned = eps_rest - eps1
        if int(self.levels) == 3:
            return self._fit_three_levels(data, acct, noise, v, eps1, eps_rest, m1, raster_size, notes)
        m2 = split_sides(v, eps2_planned, self.c, k, self.max_m2)
        n_leaves = m2 * m2
        offset = np.cumsum(n_leaves) - n_leaves
        px, py, pw = points_in_region(data)
        ix = cell_index(px, xmin, xmax, m1)
        iy = cell_index(py, ymin, ymax, m1)
        cell = ix * m1 + iy
        w1 = (xmax - xmin) / m1
        h1 = (ymax - ymin) / m1
        pm2 = m2[cell]
        # Position inside the level-1 cell, on that cell's own m2 × m2 sub-grid.
        lx = np.clip(np.floor((px - xmin - ix * w1) / w1 * pm2).astype(np.int64), 0, pm2 - 1)
        ly = np.clip(np.floor((py - ymin - iy * h1) / h1 * pm2).astype(np.int64), 0, pm2 - 1)
        leaf_counts = np.bincount(offset[cell] + lx * pm2 + ly, weights=pw, minlength=int(n_leaves.sum()))

        eps2 = acct.spend_rest("level2_counts", k,
                               note=f"{int(n_leaves.sum())} level-2 cells (m2 in [{m2.min()}, {m2.max()}]); "
                                    "disjoint, L1 sensitivity = contribution bound")
        u = data.add_count_noise(leaf_counts, eps2, noise).astype(np.float64)

        leaf_cell = np.repeat(np.arange(m1 * m1), n_leaves)
        u = constrained_inference(v, u, n_leaves, eps1, eps2)
        notes.append(f"alpha = {alpha:g}, c = {self.c:g}, c2 = c/2, m1 = {m1} (UG size {m_ug:.1f}); "
                     "constrained inference: "
                     "inverse-variance average of each level-1 count with its children's sum, then "
                     "mean-consistency spreading")
        u = self._clamped(u, notes)

        # Leaf rectangles for the raster.
        local = np.arange(u.size) - offset[leaf_cell]
        lm2 = m2[leaf_cell]
        lx, ly = local // lm2, local % lm2
        cx0 = xmin + (leaf_cell // m1) * w1
        cy0 = ymin + (leaf_cell % m1) * h1
        x0 = cx0 + lx * (w1 / lm2)
        y0 = cy0 + ly * (h1 / lm2)
        raster = rasterise_rectangles(x0, y0, x0 + w1 / lm2, y0 + h1 / lm2, u, data.region, raster_size)
        # m2 per level-1 cell (a function of the noisy level-1 counts: post-processing) lets a reader
        # redo the linear inference on fresh noise: the release's 95% intervals (dpcore.uncertainty).
        extra = {"m1": m1, "m2_min": int(m2.min()), "m2_max": int(m2.max()), "n_leaves": int(u.size),
                 "raster_size": raster_size, "m2": m2.astype(int).tolist(),
                 "noise_model": NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
                 if self.clamp_negative else AdaptiveGridNoise.make_spec(data.count_noise_law(eps1),
                                                                         data.count_noise_law(eps2), eps1, eps2)}
        acct.describe(notes)
        return GridSynopsis(raster, data.region, None, extra)

    def _fit_three_levels(self, data: PointsInput, acct: FitRecord, noise: NoiseSource, v: np.ndarray, eps1: float,
                          eps_rest: float, m1: int, raster_size: int, notes: list[str]) -> GridSynopsis:
        """Levels 2 and 3 after the noisy level-1 counts ``v`` (see dpcore.mechanisms.ag_levels)."""
        k = data.sensitivity
        merge = bool(self.merge_unsplit)
        eps2 = acct.spend("level2_counts", float(self.level2_fraction) * (eps_rest - eps1), k,
                          note="level-2 cells, m2 from the noisy level-1 counts; disjoint, L1 sensitivity = "
                               "contribution bound" + ("; a level-1 cell with m2 = 1 is not measured here: its "
                                                       "level-3 cells use this ε too" if merge else ""))
        eps3_planned = eps_rest - eps1 - eps2
        m2 = split_sides(v, eps2, self.c, k, self.max_m2)
        px, py, pw = points_in_region(data)
        xmin, ymin, xmax, ymax = data.region.bounds_m
        cell1 = cell_index(px, xmin, xmax, m1) * m1 + cell_index(py, ymin, ymax, m1)
        shape2 = ThreeLevelStructure(data.region, m1, m2, np.ones(int((m2 * m2).sum()), dtype=np.int64), merge)
        cell2 = point_child(shape2.level1, m2, px, py, cell1)
        measured = ~shape2.unmeasured
        u = np.zeros(shape2.parent2.size)
        u[measured] = data.add_count_noise(
            np.bincount(cell2, weights=pw, minlength=u.size)[measured], eps2, noise).astype(np.float64)
        # m3 from each level-2 cell's noisy count, or, where level 2 was skipped, the level-1 count with
        # level 2's ε added to level 3's
        basis = np.where(measured, u, v[shape2.parent2])
        eps_basis = np.where(measured, eps3_planned, eps2 + eps3_planned)
        m3 = split_sides(basis, eps_basis, float(self.c3), k, self.max_m3)
        shape = ThreeLevelStructure(data.region, m1, m2, m3, merge)
        leaf = point_child(shape.level2, m3, px, py, cell2)
        eps3 = acct.spend_rest("level3_counts", k,
                               note=f"{shape.parent3.size} level-3 cells (m3 in [{m3.min()}, {m3.max()}]); disjoint, "
                                    "L1 sensitivity = contribution bound"
                                    + ("; cells under an unmeasured level-2 cell use level 2's ε as well (each "
                                       "point's path still spends ε once)" if merge else ""))
        merged = shape.unmeasured[shape.parent3]
        true_leaf = np.bincount(leaf, weights=pw, minlength=shape.parent3.size)
        w = np.empty(true_leaf.size)
        w[~merged] = data.add_count_noise(true_leaf[~merged], eps3, noise)
        w[merged] = data.add_count_noise(true_leaf[merged], eps2 + eps3, noise)
        laws = tuple(data.count_noise_law(e) for e in (eps1, eps2, eps3, eps2 + eps3))
        leaves = tree_inference([v, u, w], shape.variances(laws), [shape.parent2, shape.parent3])
        notes.append(f"three levels: alpha = {float(self.alpha):g}, level-2 share {float(self.level2_fraction):g} of "
                     f"the rest, c = {self.c:g} (level 2), c3 = {float(self.c3):g}, m1 = {m1}, "
                     f"{int(measured.sum())} level-2 cells measured ({int((~measured).sum())} merged into level 3), "
                     f"{shape.parent3.size} level-3 cells; least squares on the tree (inverse-variance bottom-up, "
                     "variance-shared top-down)")
        leaves = self._clamped(leaves, notes)
        raster = rasterise_rectangles(*shape.leaves, leaves, data.region, raster_size)
        # m2 and m3 (functions of the noisy level-1 and level-2 counts: post-processing) let a reader redo the
        # linear inference on fresh noise: the release's 95% intervals.
        extra = {"m1": m1, "m2_min": int(m2.min()), "m2_max": int(m2.max()), "m3_min": int(m3.min()),
                 "m3_max": int(m3.max()), "n_leaves": int(leaves.size), "raster_size": raster_size,
                 "m2": m2.astype(int).tolist(),
                 "noise_model": NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
                 if self.clamp_negative else AdaptiveGrid3Noise.make_spec(laws, merge)}
        acct.describe(notes)
        return GridSynopsis(raster, data.region, None, extra, {"m3": m3.astype(np.uint16)})


class AdaptiveGridNoise(BootstrapNoise):
    """AG's answers are linear in the level-1 and level-2 noise (constrained inference on the leaf
    structure the release records: m2 per level-1 cell, itself from the noisy level-1 counts): fresh
    noise through the same inference, rasterised as the release is, gives the error field."""

    def __init__(self, laws: tuple[NoiseLaw, NoiseLaw], eps: tuple[float, float], m1: int, m2: np.ndarray,
                 region, raster_size: int):
        super().__init__(laws[0], (m1, m1), region.bounds_m)
        self.laws, self.eps, self.m1, self.region, self.raster_size = laws, eps, m1, region, raster_size
        self.n_leaves = m2 * m2
        leaf_cell = np.repeat(np.arange(m1 * m1), self.n_leaves)
        local = np.arange(int(self.n_leaves.sum())) - (np.cumsum(self.n_leaves) - self.n_leaves)[leaf_cell]
        lm2 = m2[leaf_cell]
        xmin, ymin, xmax, ymax = region.bounds_m
        w1, h1 = (xmax - xmin) / m1, (ymax - ymin) / m1
        x0 = xmin + (leaf_cell // m1) * w1 + (local // lm2) * (w1 / lm2)
        y0 = ymin + (leaf_cell % m1) * h1 + (local % lm2) * (h1 / lm2)
        self.rects = (x0, y0, x0 + w1 / lm2, y0 + h1 / lm2)
        self.m2 = np.asarray(m2, dtype=np.int64)
        self.method = "parametric bootstrap: fresh level noise through AG's constrained inference"

    def draw_errors(self, rng: np.random.Generator) -> np.ndarray:
        e = constrained_inference(draw_noise(rng, self.laws[0], self.m1 * self.m1),
                                  draw_noise(rng, self.laws[1], self.rects[0].size), self.n_leaves, *self.eps)
        self.note_leaf_errors(e)
        if getattr(self, "_raster", None) is None:  # the leaves' shares of the raster cells, found once
            self._raster = RectangleRaster(*self.rects, self.region, self.raster_size)
        return self._raster(e)

    def leaf_at(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        xmin, ymin, xmax, ymax = self.region.bounds_m
        cell = cell_index(x, xmin, xmax, self.m1) * self.m1 + cell_index(y, ymin, ymax, self.m1)
        if getattr(self, "_level1", None) is None:
            self._level1 = child_rects(tuple(np.array([v], dtype=np.float64) for v in (xmin, ymin, xmax, ymax)),
                                       np.array([self.m1]))[0]
        leaf = point_child(self._level1, self.m2, x, y, cell)
        return leaf, tuple(r[leaf] for r in self.rects)

    @staticmethod
    def make_spec(law1: NoiseLaw, law2: NoiseLaw, eps1: float, eps2: float) -> dict:
        return {"kind": f"{__name__}:AdaptiveGridNoise", "laws": [law1.to_dict(), law2.to_dict()],
                "eps": [float(eps1), float(eps2)]}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> NoiseModel:
        extra = synopsis._extra
        m1, m2 = int(extra["m1"]), np.asarray(extra["m2"], dtype=np.int64)
        laws = tuple(NoiseLaw.from_dict(d) for d in spec["laws"])
        # the error field on at most BOOTSTRAP_GRID² cells: leaves are rarely finer, and a box's variance
        # changes little with where inside a cell its edge falls
        return cls(laws, tuple(spec["eps"]), m1, m2, synopsis.region, min(int(synopsis.shape[0]), BOOTSTRAP_GRID))
