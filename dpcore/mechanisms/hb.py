"""HB: a hierarchy of noisy grid counts with least-squares consistency (Hay et al. VLDB 2010;
Qardaji, Yang, Li VLDB 2013 "Understanding hierarchical methods"; Cormode et al. ICDE 2012).

Structure: levels ℓ = 1..h, level ℓ being a bᶫ × bᶫ grid over the region (``branching`` b per axis,
default 4, so every node has b² = 16 children). h is chosen so that the leaf grid b^h is the power of
b closest to the UG size at the per-level budget, sqrt(N·(ε/h)/(c·k)) (c = 10, N in units of k as in
:mod:`dpcore.mechanisms.ug`), capped at ``max_leaf_grid``; ``levels`` fixes h instead (then N is not
needed). In 2-D a hierarchy mostly helps large queries; Qardaji et al. (ICDE 2013) found UG/AG
usually as good or better on city-scale data, and bench/uniform-centres.md agrees.
There is no root node: the top level's b × b counts are measured directly.

Budget: ``total_fraction`` of ε estimates N (unless ``FitInput.public_total`` is given or ``levels``
is set); the rest is split *uniformly* over the h levels, ε/h each (``level_split="geometric"``
gives the leaves more, as Cormode et al. 2012; the consistency below uses each level's variance). Within a level the cells are
disjoint, so each level is one Laplace step of L1 sensitivity k (user) or 1 (record); levels compose
sequentially.

Consistency: the ordinary least-squares estimate of all node counts under the constraint that each
node equals the sum of its children, by Hay et al.'s two passes written with per-level variances
(so it is also exact for non-uniform budgets):

- bottom-up, z = leaf value at the leaves; a parent combines its own count y and its children's
  sum by inverse-variance weights, z = (y/σ² + Σz_c/V_c) / (1/σ² + 1/V_c), V_c = Σ var(z_c);
- top-down, the top level keeps z; a child gets z_c + (x_parent − Σ z_siblings)·var(z_c)/V_c.

Each pass is a reshape-and-sum per level (no loop over nodes). Negative leaves after consistency are
kept (unbiased range sums); ``clamp_negative=True`` zeroes them for display. The synopsis is the
consistent leaf grid.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from dpcore.geo import Region
from dpcore.grid.histogram import block_sum, expand
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Fraction, Positive, PositiveInt, Whole
from dpcore.mechanisms.tags import MechanismTags
from dpcore.mechanisms.ug import DEFAULT_C, MAX_RASTER, grid_size_rule, private_total
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis, Synopsis
from dpcore.synopsis.noise import BootstrapNoise, NoInterval, NoiseLaw, NoiseModel, draw_noise

LEVEL_SPLITS = ("uniform", "geometric")


def level_budgets(epsilon: float, h: int, b: int, split: str) -> list[float]:
    """ε per level, top first. ``uniform``: ε/h each. ``geometric``: ε ∝ (b²)^(−height/6), height 0
    at the leaves — Cormode et al. (ICDE 2012)'s 2^(−height/3) for quadtrees, generalised to b² children
    — so the many leaves, which every small query uses, get the most."""
    if split == "uniform":
        return [epsilon / h] * h
    weights = np.array([(b * b) ** (-(h - 1 - lvl) / 6.0) for lvl in range(h)])
    return list(epsilon * weights / weights.sum())


def hierarchy_consistency(noisy: list[np.ndarray], variances: list[float], b: int) -> list[np.ndarray]:
    """Least-squares consistent counts of a b-ary (per axis) grid hierarchy.

    ``noisy[ℓ]`` is the (bᶫ⁺¹)² grid of level ℓ (top first), ``variances[ℓ]`` its per-node noise
    variance. Returns the consistent grids in the same order: every node equals its children's sum.
    """
    h = len(noisy)
    z: list[np.ndarray] = [np.empty(0)] * h
    var_z: list[float] = [0.0] * h
    z[-1] = np.asarray(noisy[-1], dtype=np.float64)
    var_z[-1] = float(variances[-1])
    for lvl in range(h - 2, -1, -1):
        child_sum = block_sum(z[lvl + 1], b)
        v_children = b * b * var_z[lvl + 1]
        prec_own, prec_children = 1.0 / variances[lvl], 1.0 / v_children
        z[lvl] = (np.asarray(noisy[lvl], dtype=np.float64) * prec_own + child_sum * prec_children) / (
            prec_own + prec_children)
        var_z[lvl] = 1.0 / (prec_own + prec_children)
    x = [z[0]]
    for lvl in range(1, h):
        gap = x[lvl - 1] - block_sum(z[lvl], b)
        # Equal children variances: the gap is spread equally, var(z_c)/V_c = 1/b².
        x.append(z[lvl] + expand(gap, b) / (b * b))
    return x


def choose_levels(total: float, epsilon: float, sensitivity: float, c: float, b: int, h_cap: int) -> int:
    """Number of levels h whose leaf grid b^h is closest, in ratio, to the UG size computed with the
    per-level budget ε/h. Each leaf carries ε/h of noise, so this is UG's noise/uniformity balance at
    the leaves; the upper levels then only add accuracy for large queries via consistency."""
    def gap(h: int) -> float:
        target = max(grid_size_rule(total, epsilon / h, sensitivity, c), 1.0)
        return abs(h * math.log(b) - math.log(target))
    return min(range(1, h_cap + 1), key=gap)


class HierarchicalGrid(Mechanism):
    """Grid hierarchy with uniform per-level budget and least-squares consistency (module docstring)."""

    name = "hb"
    tags = MechanismTags(supports_weights=True)

    def __init__(self, *, branching: Annotated[Whole, Field(ge=2)] = 4, levels: PositiveInt | None = None,
                 c: Positive = DEFAULT_C, total_fraction: Fraction = 0.05, max_leaf_grid: PositiveInt = MAX_RASTER,
                 level_split: Literal["uniform", "geometric"] = "uniform", clamp_negative: bool = False):
        self.branching = branching
        self.level_split = level_split
        self.levels = levels
        self.c = c
        self.total_fraction = total_fraction
        self.max_leaf_grid = max_leaf_grid
        self.clamp_negative = clamp_negative

    def _level_cap(self) -> int:
        """Deepest level allowed by the cap on the leaf grid (public parameters only)."""
        b = int(self.branching)
        return max(1, int(math.floor(math.log(max(int(self.max_leaf_grid), b)) / math.log(b) + 1e-9)))

    def fine_grid(self, region: Region) -> int | None:
        """b^h for the deepest level allowed: every leaf grid b^h' (h' ≤ h) divides it, so counts are exact."""
        b = int(self.branching)
        return b ** (int(self.levels) if self.levels is not None else self._level_cap())

    def check_params(self) -> None:
        if self.levels is not None:
            # The cap depends on branching and max_leaf_grid only, so it is known before any data.
            h_cap = self._level_cap()
            if not int(self.levels) <= h_cap:
                raise MechanismError(f"levels must be in [1, {h_cap}] for branching {self.branching}, "
                                     f"got {self.levels}")

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        from dpcore.mechanisms import charge_law

        if params.get("clamp_negative"):
            return NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
        laws = [charge_law(charges, f"level{lvl + 1}_counts") for lvl in range(int(extra.get("levels", 0)))]
        if not laws or any(law is None or law.kind != "laplace" for law in laws):
            return None
        return HierarchyNoise.make_spec(laws)

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> GridSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        b = int(self.branching)
        k = data.sensitivity
        notes: list[str] = []
        h_cap = self._level_cap()
        if self.levels is not None:
            h = int(self.levels)
            notes.append(f"{h} levels fixed by parameter (public)")
        else:
            total = private_total(data, acct, noise, float(self.total_fraction), notes)
            eps_rest = acct.epsilon - acct.spent
            h = choose_levels(total, eps_rest, k, self.c, b, h_cap)
            notes.append(f"h = {h}: leaf grid b^h = {b ** h} closest (in ratio) to the UG size at the per-level "
                         f"budget, sqrt(N·(ε/h)/(c·k)) = {grid_size_rule(total, eps_rest / h, k, self.c):.1f} "
                         f"(c = {self.c:g}); leaf grid capped at {self.max_leaf_grid}")
        leaf = b ** h
        counts_leaf = data.grid_counts(leaf, leaf)
        true_levels = [counts_leaf]
        for _ in range(h - 1):
            true_levels.insert(0, block_sum(true_levels[0], b))
        eps_levels = level_budgets(acct.epsilon - acct.spent, h, b, self.level_split)
        noisy, variances, laws = [], [], []
        for lvl, counts in enumerate(true_levels):
            side = counts.shape[0]
            if lvl == h - 1:
                eps_l = acct.spend_rest(f"level{lvl + 1}_counts", k,
                                        note=f"{side}x{side} grid (leaves); disjoint cells")
            else:
                eps_l = acct.spend(f"level{lvl + 1}_counts", eps_levels[lvl], k,
                                   note=f"{side}x{side} grid; disjoint cells")
            noisy.append(data.add_count_noise(counts, eps_l, noise).astype(np.float64))
            variances.append(data.count_noise_variance(eps_l))
            laws.append(data.count_noise_law(eps_l))
        consistent = hierarchy_consistency(noisy, variances, b)
        values = consistent[-1]
        notes.append(f"branching {b} per axis ({b * b} children per node), {h} levels, ε split "
                     f"{self.level_split} over levels; least-squares consistency (Hay et al. 2010)")
        if self.clamp_negative:
            values = np.maximum(values, 0.0)
            notes.append("negative leaves clamped to 0 after consistency")
        else:
            notes.append("negative leaves kept after consistency (unbiased range sums)")
        acct.describe(notes)
        noise_spec = (NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
                      if self.clamp_negative else HierarchyNoise.make_spec(laws))
        return GridSynopsis(values, data.region, None,
                            {"branching": b, "levels": h, "leaf_grid": leaf, "noise_model": noise_spec})


class HierarchyNoise(BootstrapNoise):
    """HB's answers are linear in the level noise (least-squares consistency): fresh level noise through
    the same consistency gives the error field on the leaves (a parametric bootstrap)."""

    def __init__(self, laws: list[NoiseLaw], branching: int, bounds: tuple[float, float, float, float]):
        leaf = branching ** len(laws)
        super().__init__(laws[-1], (leaf, leaf), bounds)
        self.laws, self.branching = laws, branching
        self.variances = [law.variance for law in laws]  # the same ones the release's consistency used
        self.method = "parametric bootstrap: fresh level noise through HB's least-squares consistency"

    def draw_errors(self, rng: np.random.Generator) -> np.ndarray:
        b = self.branching
        noisy = [draw_noise(rng, law, (b ** (lvl + 1), b ** (lvl + 1))) for lvl, law in enumerate(self.laws)]
        return hierarchy_consistency(noisy, self.variances, b)[-1]

    @staticmethod
    def make_spec(laws: list[NoiseLaw]) -> dict:
        return {"kind": f"{__name__}:HierarchyNoise", "laws": [law.to_dict() for law in laws]}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> NoiseModel:
        b, h = int(synopsis._extra.get("branching", 0)), int(synopsis._extra.get("levels", 0))
        laws = [NoiseLaw.from_dict(d) for d in spec["laws"]]
        if b < 2 or h != len(laws) or synopsis.shape != (b ** h, b ** h):
            return NoInterval("this HB release does not record its hierarchy (branching, levels)")
        return cls(laws, b, synopsis.region.bounds_m)
