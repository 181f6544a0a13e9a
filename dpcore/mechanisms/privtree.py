"""PrivTree (Zhang, Xiao, Xie, SIGMOD 2016): an adaptive quadtree whose split decisions are noisy and
biased, so its depth needs no budget-per-level split.

Tree (fanout β = 4, quadrants of the region): a node v at depth d with count c(v) gets the biased
count b(v) = max(c(v) − d·δ, θ − δ) and is split when b(v) + Lap(λ) > θ, where

    λ = s·(2β − 1) / ((β − 1)·ε_tree),   δ = λ·ln β,   θ = 0 by default,

and s is the count sensitivity: 1 at record level (the paper) and k at user level. Scaling λ and δ
by k is the paper's mechanism run on counts measured in units of k points: each of a user's ≤ k
points then weighs 1/k and moves the scaled counts only along its own root-to-leaf path; the
paper's per-path bound (the privacy loss along a path is ≤ ε_tree, thanks to the bias δ per level)
applies to each point with weight 1/k, so the user's total loss is ≤ k·ε_tree/k = ε_tree. With
weighted bounding (FitInput.weights) a point of weight w ≤ 1 weighs w/k in those units: it shifts the
node counts on its path by w/k of a unit, the Laplace ratios along the path grow by at most that
fraction of the unit shift's (e^{a/λ} − 1 ≤ a·(e^{1/λ} − 1) for a ≤ 1), and the person's weights add
up to ≤ k, so the total is again ≤ ε_tree. Depth is
capped so that leaves are no smaller than ``min_leaf_m`` (default 10 m; at most 11 levels, a
2048² raster) — a public rule, which only removes outputs and so costs nothing.

The split noise is never published, only each decision, so the decisions are drawn from their exact
law instead of adding a float Laplace (whose 53-bit uniforms reach no further than ~36λ: a tree shape
with probability 0 on one input and > 0 on a neighbour, a hidden δ). With s = (c − θ)/λ − d·ln 4, the
test max(c − dδ, θ − δ) + Lap(λ) > θ holds with probability 1 − ½e^(−s) for s ≥ 0, ½e^s for
−ln 4 ≤ s < 0 and ⅛ below (the clamp). Since e^(d·ln 4) = 4^d, these are e^(±r) for the rational
r = (c − θ)/λ times powers of two, and each decision compares a lazily read uniform with them in
integer arithmetic (dpcore.privacy.exact_noise): the tree shape has exactly the paper's law, so the
paper's pure ε-DP proof holds with no δ. λ is rounded up to a rational (more noise, never less).

Budget: ``tree_fraction`` of ε (default 0.5, as in the paper's experiments) is ε_tree; the leaf
counts use the rest (leaves are disjoint: one Laplace step, L1 sensitivity k or 1, integer discrete
Laplace). Nothing else reads the data: PrivTree needs no N.

Negative leaf counts are kept (unbiased range sums); ``clamp_negative=True`` zeroes them. Each leaf's
count is spread uniformly over its quadrant of a 2^D raster (D = the depth cap), vectorised level
by level: the whole frontier of a level is decided in one array operation. The leaves themselves
(depth and quadrant index per leaf) are saved with the raster, for the release's 95% intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction as Rational

import numpy as np

from dpcore.geo import Region
from dpcore.grid.histogram import block_sum, expand
from dpcore.mechanisms.base import Mechanism
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Fraction, Number, Positive
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.bounding import WEIGHT_QUANTUM
from dpcore.privacy.exact_noise import BITS, _LazyUniform, exp_bounds, floor_exact, rational_at_least
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis
from dpcore.synopsis.noise import LeafNoise, NoInterval

FANOUT = 4  # β: each split cuts a square node into 2 × 2 quadrants
MAX_DEPTH = 11  # 2^11 = 2048 raster cells per axis


def privtree_parameters(eps_tree: float, sensitivity: float, beta: int = FANOUT) -> tuple[float, float]:
    """(λ, δ) of PrivTree for a tree budget and a count sensitivity."""
    lam = sensitivity * (2 * beta - 1) / ((beta - 1) * eps_tree)
    return lam, lam * math.log(beta)


def _exp_below(x: Rational, m: int) -> bool:
    """e^x < 2^m, for rational x and integer m with e^x ≠ 2^m (x ≠ m·ln 2, true unless both are 0)."""
    w = 64 + abs(m)
    while True:
        lo, hi = exp_bounds(x, w)
        if hi < 1 << (w + m):
            return True
        if lo > 1 << (w + m):
            return False
        w *= 2


class SplitLaw:
    """The exact law of PrivTree's split decision at depth ``d`` for a node of count c (module docstring)."""

    def __init__(self, lam: Rational, theta: Rational):
        self.lam, self.theta = lam, theta

    def _tail(self, count: float, d: int) -> tuple[bool, int, Callable[[int], tuple[int, int]] | None]:
        """(s ≥ 0, ⌊q·2^BITS⌋, bounds of q·2^w or None when q is dyadic) for q = ½e^(−|s|) clamped at ⅛."""
        r = (Rational(float(count)) - self.theta) / self.lam
        if d == 0 and r == 0:
            return True, 1 << (BITS - 1), None  # s = 0: q = ½
        positive = _exp_below(-r, -2 * d)  # e^(−r) < 4^(−d): s > 0
        if positive:  # q = ½e^(−r)·4^d
            def bounds(w: int) -> tuple[int, int]:
                return exp_bounds(-r, w - 1 + 2 * d)
        elif (d == 1 and r == 0) or _exp_below(r, 2 * (d - 1)):  # s ≤ −ln 4: the clamp, q = ⅛
            return False, 1 << (BITS - 3), None
        else:  # −ln 4 < s < 0: q = ½e^r·4^(−d)
            def bounds(w: int) -> tuple[int, int]:
                return exp_bounds(r, w - 1 - 2 * d)
        return positive, floor_exact(bounds, BITS), bounds

    def decide(self, counts: np.ndarray, d: int, words: Callable[[int], np.ndarray]) -> np.ndarray:
        """Split decisions (bool) for nodes of depth ``d`` with these counts, each drawn exactly: U < q
        (s < 0) or not (s ≥ 0), U read lazily from ``words``. One exact threshold per distinct count."""
        uniq, inv = np.unique(counts, return_inverse=True)
        tails = [self._tail(c, d) for c in uniq]
        above = np.array([t[0] for t in tails], dtype=bool)[inv]
        floor = np.array([t[1] for t in tails], dtype=np.int64)[inv]
        prefix = (words(counts.size) >> np.uint64(64 - BITS)).astype(np.int64)
        less = prefix < floor
        for j in np.flatnonzero(prefix == floor):  # probability ≈ 2^-62 per node: read more bits
            bounds = tails[inv[j]][2]
            less[j] = bounds is not None and _LazyUniform(int(prefix[j]), BITS, words).less_than(
                lambda p, b=bounds: floor_exact(b, p))
        return np.where(above, ~less, less)


def depth_cap(side_m: float, min_leaf_m: float) -> int:
    """Deepest level whose quadrants are still ≳ min_leaf_m wide (rounded), at most MAX_DEPTH."""
    return int(min(MAX_DEPTH, max(0, round(math.log2(side_m / min_leaf_m)))))


class PrivTree(Mechanism):
    """PrivTree with fanout 4; see the module docstring for the privacy argument and budget split."""

    name = "privtree"
    tags = MechanismTags(supports_weights=True, auto_role="fixed")

    def __init__(self, *, tree_fraction: Fraction = 0.5, theta: Number = 0.0, min_leaf_m: Positive = 10.0,
                 clamp_negative: bool = False):
        self.tree_fraction = tree_fraction
        self.theta = theta
        self.min_leaf_m = min_leaf_m
        self.clamp_negative = clamp_negative

    def fine_grid(self, region: Region) -> int | None:
        """The deepest level's grid: the whole count pyramid is block sums of it, exactly."""
        return 2 ** depth_cap(region.side_m, float(self.min_leaf_m))

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        from dpcore.mechanisms import charge_law

        law = charge_law(charges, "leaf_counts")
        if params.get("clamp_negative"):
            return NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
        if law is None:
            return None
        if law.quantum == 1.0 and extra.get("leaf_noise_quantum"):  # releases before charges recorded it
            law = type(law)(law.kind, law.param, float(extra["leaf_noise_quantum"]))
        return LeafNoise.make_spec(law, "PrivTree's leaves")

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> GridSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        fraction = float(self.tree_fraction)
        theta = float(self.theta)
        k = data.sensitivity
        depth_max = depth_cap(data.region.side_m, float(self.min_leaf_m))
        eps_tree = acct.spend_fraction(
            "tree_splits", fraction, k, noise="exact law of the Laplace(λ) split test, decisions only",
            note=f"biased split decisions, fanout {FANOUT}, λ and δ scaled by the sensitivity; depth ≤ {depth_max}")
        lam, delta = privtree_parameters(eps_tree, k)
        exact_lam = rational_at_least(lam, "PrivTree's λ", 2.0 ** 52)
        lam, delta = float(exact_lam), float(exact_lam) * math.log(FANOUT)
        law = SplitLaw(exact_lam, Rational(theta))

        # Count pyramid: pyramid[d] is the 2^d × 2^d grid of node counts at depth d.
        fine = data.grid_counts(2 ** depth_max, 2 ** depth_max)
        pyramid = [fine]
        for _ in range(depth_max):
            pyramid.insert(0, block_sum(pyramid[0], 2))

        active = np.ones((1, 1), dtype=bool)  # nodes of the tree at the current depth
        leaf_masks: list[np.ndarray] = []
        for d in range(depth_max + 1):
            split = np.zeros_like(active)
            if d < depth_max:
                idx = np.flatnonzero(active)
                split.ravel()[idx] = law.decide(pyramid[d].ravel()[idx], d, noise.random_words)
            leaf_masks.append(active & ~split)
            if d < depth_max:
                active = expand(split, 2)

        # Leaf counts: one Laplace step over disjoint leaves (sensitivity k).
        leaf_depth = np.concatenate([np.full(int(m.sum()), d) for d, m in enumerate(leaf_masks)])
        leaf_index = np.concatenate([np.flatnonzero(m) for m in leaf_masks])
        true_leaf = np.concatenate([pyramid[d].ravel()[np.flatnonzero(m)] for d, m in enumerate(leaf_masks)])
        eps_leaf = acct.spend_rest("leaf_counts", k,
                                   note=f"{leaf_index.size} disjoint leaves, L1 sensitivity = contribution bound")
        noisy = data.add_count_noise(true_leaf, eps_leaf, noise).astype(np.float64)
        notes = [f"PrivTree fanout {FANOUT}: λ = {lam:.4g}, δ = λ·ln 4 = {delta:.4g}, θ = {theta:g}, "
                 f"ε_tree = {eps_tree:.4g}; {leaf_index.size} leaves, depth ≤ {depth_max}"]
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
            notes.append("negative leaf counts clamped to 0")
        else:
            notes.append("negative leaf counts kept (unbiased range sums)")

        # Raster: per depth, put each leaf's density (count / cells it covers) on that depth's grid,
        # then cascade down, splitting every cell's density into its 4 quadrants.
        raster = np.zeros((1, 1), dtype=np.float64)
        for d in range(depth_max + 1):
            if d > 0:
                raster = expand(raster, 2) / 4.0
            sel = leaf_depth == d
            if sel.any():
                flat = raster.ravel()
                np.add.at(flat, leaf_index[sel], noisy[sel])
        # The leaves (depth, flat index in that depth's 2^d × 2^d grid, x-major) are the tree's shape,
        # public already (noisy split decisions), and the leaf noise law is public (s/ε_leaf, on the
        # weights' lattice when weighted): with them a reader gets exact-law 95% intervals
        # (dpcore.synopsis.uncertainty), since every range answer is linear in the leaf noise.
        extra = {"fanout": FANOUT, "max_depth": depth_max, "n_leaves": int(leaf_index.size),
                 "lambda": lam, "delta": delta, "theta": theta,
                 "leaf_noise_scale": float(k) / float(eps_leaf),
                 "leaf_noise_quantum": WEIGHT_QUANTUM if data.weighted else 1.0,
                 "noise_model": NoInterval("negative counts were clamped to 0 (not linear in the noise)").spec()
                 if self.clamp_negative else LeafNoise.make_spec(data.count_noise_law(eps_leaf), "PrivTree's leaves")}
        arrays = {"leaf_depth": leaf_depth.astype(np.uint8), "leaf_index": leaf_index.astype(np.uint32)}
        acct.describe(notes)
        return GridSynopsis(raster, data.region, None, extra, arrays)
