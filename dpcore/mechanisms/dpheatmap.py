"""DP heatmaps of Ghazi et al. (AAAI 2023): user-normalised quadtree, top-w per level, LP reconstruction.

Privacy (user level, or record level with every record its own user):
- input: each user's points in the region → a distribution over the Δ × Δ grid with mass 1;
- one Laplace step per quadtree level j = 1..L (L = log2 Δ), each of **L1 sensitivity 1** (a user
  adds a non-negative vector of mass ≤ 1 to every level) — *not* k: the per-user normalisation, not
  the contribution bound, limits a user's influence, so this mechanism's tags declare
  ``sensitivity="unit"`` (every charge calibrated to 1 per user);
- with ``depth="auto"`` (default) a first step spends ``root_fraction``·ε on the total user mass
  (sensitivity 1) to pick how many levels D ≤ L the remaining budget can carry;
- budget split over the D levels: ``level_split="uniform"`` gives ε/D per level (the paper's), a
  ratio r gives weights r^{j−1}, ``"geometric"`` weights 2^{j/3}; the parts sum to ε (tested);
- a public threshold (``threshold_factor`` noise scales) stops the descent where noise dominates;
  the budget of levels never reached re-measures the pruned tree's leaves (disjoint: sensitivity 1);
- noise: discrete Laplace of scale Q/ε_j on integer masses in units of 1/Q (see dpcore.heatmap.quadtree);
- nodes measured at level j are the children of the top-w noisy nodes at level j−1: chosen from
  noisy output only (adaptive sequential composition);
- large-ε plan (``depth="auto"`` only, no reserve): when the depth rule reaches the pixel level L,
  the descent is replaced by two measurements — the whole level k = L − ``pixel_jump`` (all 4^k
  nodes, sensitivity 1) with (1 − ``pixel_fraction``) of the tree budget, then every pixel under
  its top-``pixel_w`` noisy nodes (pixel level, sensitivity 1) with the rest. Released: the
  ``pixel_top`` % of Δ² heaviest noisy pixels, the rest of each kept node's noisy mass spread over
  its other pixels. Charges: root + level_k + pixels = ε. Pixel-wise scores (Pearson) at large ε
  are decided by a few heavy pixels; an 8-level descent leaves each level too little budget to
  find and measure them, while one cheap coarse look shrinks the candidate pixels ~10× against
  flat Laplace on all Δ² pixels, so fewer noise pixels out-rank true heavy ones;
- reconstruction (LP with HiGHS, or non-negative least squares), a background mixed into it
  (``smooth_weight`` of the mass blurred, ``floor_weight`` spread evenly: dpcore.heatmap.background),
  normalisation, rendering and range
  answers are post-processing.
The root mass (= number of users, private) is only used through its noisy, paid-for measurement.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from dpcore.geo import Region
from dpcore.heatmap.background import with_background
from dpcore.heatmap.mass import MassError, MassSpec, heatmap_mass_spec, mass_grid
from dpcore.heatmap.quadtree import (
    DEFAULT_QUANTUM,
    HeatmapError,
    HeatmapSynopsis,
    check_resolution,
    choose_depth,
    level_epsilons,
    measure_quadtree,
    reconstruct,
    user_normalised_grid,
)
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord, PrivacyUnit
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Fraction, NonNegative, OptionalFraction, Positive, PositiveInt
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource

NORMALISATIONS = ("user", "bound")
#: Output background (dpcore.heatmap.background): the blurred copy's share, its Gaussian σ as a fraction of the
#: region's side, and the uniform floor's share; chosen on the Gowalla sample's Austin and San Francisco.
SMOOTH_WEIGHT = 0.35
SMOOTH_SIGMA = 1 / 16
FLOOR_WEIGHT = 0.005
Normalisation = Literal["user", "bound"]
#: A share of the cells in percent: (0, 100].
Percent = Annotated[float, Field(gt=0, le=100)]


def heatmap_units(data: PointsInput, resolution: int, quantum: int, normalisation: str = "user") -> np.ndarray:
    """Integer masses (units of 1/Q) of the heatmap input, each privacy unit adding at most Q.

    ``"user"`` (the paper's): each user's points share mass 1. Given points, the points in this
    region; in a release, the release's data pass shares it over the user's points in all of its
    regions (dpcore.heatmap.mass), so a user's mass over the whole multi-region release is ≤ 1 and
    the regions compose in parallel. ``"bound"``: every point has mass 1/k with the release-wide
    bound k (≤ k points per user over all regions), also ≤ 1 over the release. Record level: each
    record is its own unit with mass 1 (both normalisations agree).

    A release's input is the mass grid its data pass summed over the workers' partitions
    (``data.fine_mass``, declared by :func:`mass_spec`); it must hold exactly this mass. Points (an
    evaluation, a notebook) are spread here.
    """
    if normalisation not in NORMALISATIONS:
        raise MechanismError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    spec = mass_spec(resolution, quantum, normalisation, data.unit)
    if data.fine_mass is not None:
        if data.fine_mass.spec != spec:
            raise MechanismError(f"the input's mass grid holds {data.fine_mass.spec}; this fit reads {spec}")
        return data.fine_mass.units
    if spec.point_units is not None:  # Q per record, or ⌊Q/k⌋ per point
        return mass_grid(data.x, data.y, None, data.region.bounds_m, spec).units
    if data.user is None:
        raise MechanismError("a user-level heatmap needs the user of every point (FitInput.user)")
    return user_normalised_grid(data.x, data.y, data.user, data.region.bounds_m, resolution, quantum)


def mass_spec(resolution: int, quantum: int, normalisation: str, unit: PrivacyUnit) -> MassSpec:
    """The mass grid a heatmap with these parameters reads under ``unit`` (Mechanism.fine_mass)."""
    try:
        return heatmap_mass_spec(resolution, quantum, normalisation, unit.kind, unit.recorded_k)
    except MassError as exc:
        raise MechanismError(str(exc)) from exc


class DPHeatmap(Mechanism):
    """Quadtree of user-normalised mass, Laplace per level, top-``w`` nodes kept per level,
    non-negative reconstruction. ``resolution`` Δ is a power of two; ``w`` the nodes kept per level.

    Defaults (w=30, threshold_factor=1, level_split=1.3, root_fraction=0.1, signal_to_noise=0.25) come
    from public held-out data, not the evaluation data (docs/decisions/0009-dpheatmap-plans.md).
    ``depth="auto"`` spends ``root_fraction`` of ε on the noisy user count n̂ and measures only the
    levels whose noise that count can carry (:func:`dpcore.heatmap.quadtree.choose_depth`); ``depth=L,
    level_split="uniform", threshold_factor=0`` is the paper's fixed-depth algorithm. The large-ε
    plan's defaults (pixel_fraction=0.85, pixel_jump=4, pixel_w=10, pixel_top=0.03) come from the same
    data; ``pixel_fraction=0`` turns it off.
    """

    name = "dpheatmap"
    tags = MechanismTags(sensitivity="unit", heatmap=True)

    def __init__(self, *, resolution: PositiveInt = 256, w: PositiveInt = 30, threshold_factor: NonNegative = 1.0,
                 level_split: str | float | list[float] = 1.3, depth: Literal["auto"] | PositiveInt = "auto",
                 root_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1, signal_to_noise: Positive = 0.25,
                 remeasure_fraction: OptionalFraction = 0.0, reconstruction: Literal["lp", "nnls"] = "lp",
                 normalisation: Normalisation = "user", quantum: PositiveInt = DEFAULT_QUANTUM,
                 pixel_fraction: OptionalFraction = 0.85, pixel_jump: PositiveInt = 4, pixel_top: Percent = 0.03,
                 pixel_w: PositiveInt = 10, background: NonNegative = 1.0,
                 smooth_weight: OptionalFraction = SMOOTH_WEIGHT, smooth_sigma: Fraction = SMOOTH_SIGMA,
                 floor_weight: OptionalFraction = FLOOR_WEIGHT):
        self.smooth_weight = smooth_weight
        self.smooth_sigma = smooth_sigma
        self.floor_weight = floor_weight
        self.pixel_w = pixel_w
        self.background = background
        self.pixel_fraction = pixel_fraction
        self.pixel_jump = pixel_jump
        self.pixel_top = pixel_top
        self.remeasure_fraction = remeasure_fraction
        self.normalisation = normalisation
        self.resolution = resolution
        self.depth = depth
        self.root_fraction = root_fraction
        self.signal_to_noise = signal_to_noise
        self.w = w
        self.threshold_factor = threshold_factor
        self.level_split = level_split
        self.reconstruction = reconstruction
        self.quantum = quantum

    def fine_grid(self, region: Region) -> int | None:
        """None: no count grid; the fit reads the mass grid of :meth:`fine_mass`."""
        return None

    def fine_mass(self, region: Region, unit: PrivacyUnit) -> MassSpec | None:
        """The user-normalised mass on the Δ × Δ grid: a cluster's workers spread each person's mass
        over their own points and sum the partitions (dpcore.heatmap.mass)."""
        return mass_spec(self.resolution, self.quantum, self.normalisation, unit)

    def check_params(self) -> None:
        # Rules that tie parameters together (single values are declared in __init__'s annotations).
        try:
            d = check_resolution(self.resolution)
            max_levels = d.bit_length() - 1
            if float(self.smooth_weight) + float(self.floor_weight) >= 1:
                raise HeatmapError("smooth_weight + floor_weight must be below 1 (the reconstruction keeps the rest)")
            if self.depth != "auto" and not int(self.depth) <= max_levels:
                raise HeatmapError(f"depth must be 'auto' or an integer in [1, {max_levels}], got {self.depth!r}")
            # The split's validity does not depend on ε (only its shape is checked), so any ε > 0 does.
            level_epsilons(1.0, max_levels, self.level_split)
        except (HeatmapError, ValueError, TypeError) as exc:
            raise MechanismError(f"bad {self.name} parameter: {exc}") from exc

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> HeatmapSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        d = int(self.resolution)
        max_levels = d.bit_length() - 1
        auto_depth = self.depth == "auto"
        if not auto_depth:
            depth = int(self.depth)
        q = int(self.quantum)
        units = heatmap_units(data, d, q, self.normalisation)
        root = None
        eps_tree = acct.epsilon
        if auto_depth:
            eps_root = acct.spend_fraction("root", float(self.root_fraction), 1.0, note=(
                "total user mass (= number of users) for choosing the tree depth; a user adds ≤ 1: "
                f"L1 sensitivity 1 (= {q} integer units); discrete Laplace scale {q}/ε units"))
            n_hat = float(units.sum() + noise.discrete_laplace(q / eps_root, 1)[0]) / q
            root = (n_hat, eps_root)
            eps_tree = acct.epsilon - eps_root
            depth = choose_depth(n_hat, eps_tree * (1 - float(self.remeasure_fraction)), max_levels, int(self.w), self.level_split,
                                 float(self.signal_to_noise))
        # Large-ε plan: when the depth rule reaches the pixel level L, the descent through every level
        # is replaced by two measurements (see :meth:`_coarse_then_pixels`): the whole level
        # k = L − pixel_jump with (1 − pixel_fraction) of the tree budget, then every pixel under its
        # top-``pixel_w`` nodes with the rest. Public rule: ε, Δ and the depth chosen from the noisy
        # user count only.
        pf = float(self.pixel_fraction)
        pixel_phase = (auto_depth and pf > 0 and float(self.remeasure_fraction) == 0 and depth == max_levels
                       and depth - int(self.pixel_jump) >= 1)
        n_pixels = 0
        if pixel_phase:
            level = depth - int(self.pixel_jump)
            eps_levels = [eps_tree * (1 - pf), eps_tree * pf]
            grid, n_pixels, kept_nodes = self._coarse_then_pixels(units, level, d, eps_levels[0], eps_levels[1],
                                                                   q, noise, acct)
            kept_leaves = n_pixels
        else:
            split = self.level_split[:depth] if isinstance(self.level_split, list) else self.level_split
            reserve = float(self.remeasure_fraction) * eps_tree
            eps_levels = level_epsilons(eps_tree - reserve, depth, split)
            tree = measure_quadtree(units, self.w, eps_levels, q, noise, acct, float(self.threshold_factor), reserve)
            tree.root = root
            grid = reconstruct(tree, self.reconstruction)
            kept_leaves = int(tree.kept[-1].shape[0])
        sw, fw = float(self.smooth_weight), float(self.floor_weight)
        grid = with_background(grid, sw, float(self.smooth_sigma) * d, fw)
        notes = [
            (f"input: each {data.privacy_unit} has mass 1 over the {d}x{d} grid" if self.normalisation == "user"
             else f"input: each point has mass 1/k (k = {data.max_points_per_user}), ≤ 1 per user over the release"),
            (f"root measured with ε={root[1]:.4g} (noisy users {root[0]:.1f}) to choose depth {depth}"
             if root else f"fixed depth {depth}"),
            f"{depth} of {max_levels} levels, ε per level ({self.level_split}): "
            + ", ".join(f"{e:.4g}" for e in eps_levels),
            "charges have L1 sensitivity 1 (user mass per level), independent of k",
            f"top-{self.w} nodes kept per level; reconstruction: {self.reconstruction}; values are user mass",
        ]
        if sw > 0 or fw > 0:
            notes.append(f"post-processing: {sw:g} of the mass blurred (Gaussian σ = {self.smooth_sigma:g} of the side), "
                         f"{fw:g} spread evenly (covers cells the reconstruction left at 0)")
        if pixel_phase:
            notes.append(f"large-ε plan: all of level {level} measured with ε={eps_levels[0]:.4g}, the pixels under its "
                         f"{kept_nodes} kept nodes with ε={eps_levels[1]:.4g}; the {n_pixels} heaviest pixels released")
        acct.describe(notes)
        return HeatmapSynopsis(grid, data.region, None, {
            "resolution": d, "w": int(self.w), "depth": depth, "level_epsilons": eps_levels, "units": "user_mass",
            "kept_leaves": kept_leaves, "large_epsilon_plan": bool(pixel_phase)})

    def _coarse_then_pixels(self, units: np.ndarray, level: int, d: int, eps_coarse: float, eps_pixels: float,
                            q: int, noise: NoiseSource, acct: Accountant) -> tuple[np.ndarray, int, int]:
        """Large-ε plan. (1) Every node of quadtree level ``level`` is measured with ``eps_coarse``
        (one level's mass vector: L1 sensitivity 1); the top-``pixel_w`` by noisy mass, among those at
        least ``threshold_factor`` noise scales, are kept. (2) Every pixel under the kept nodes is
        measured with ``eps_pixels`` (the pixel level's mass vector: L1 sensitivity 1; which pixels
        depends on noisy output only). Release: the ``pixel_top`` % of Δ² heaviest pixels at their
        noisy mass; the rest of each kept node's noisy mass spread uniformly over its other pixels
        (clamped at 0). Charges: ε_coarse + ε_pixels. All else is post-processing."""
        side = 1 << level
        f = d >> level
        coarse = units.reshape(side, f, side, f).sum(axis=(1, 3)).reshape(-1)
        acct.spend(f"level_{level}", eps_coarse, 1.0, note=(
            f"all {side}x{side} nodes of quadtree level {level}; a user adds mass ≤ 1 to a level: L1 sensitivity 1 "
            f"(= {q} integer units); discrete Laplace scale {q}/ε units"))
        noisy_c = (coarse + noise.discrete_laplace(q / eps_coarse, coarse.shape)).astype(np.float64) / q
        order = np.argsort(-noisy_c, kind="stable")[:int(self.pixel_w)]
        order = order[noisy_c[order] >= float(self.threshold_factor) / eps_coarse]
        out = np.zeros((d, d))
        if order.size == 0:
            acct.spend("pixels", eps_pixels, 1.0, note="pixel level: no kept nodes, nothing measured")
            return out, 0, 0
        nodes = np.stack(np.divmod(order.astype(np.int64), side), axis=1)
        off = np.stack(np.divmod(np.arange(f * f, dtype=np.int64), f), axis=1)
        pix = (nodes[:, None, :] * f + off[None, :, :]).reshape(-1, 2)
        acct.spend("pixels", eps_pixels, 1.0, note=(
            f"{pix.shape[0]} pixels under the {nodes.shape[0]} kept level-{level} nodes; a user adds mass ≤ 1 "
            f"to the pixel level: L1 sensitivity 1 (= {q} integer units); discrete Laplace scale {q}/ε units"))
        true_units = units[pix[:, 0], pix[:, 1]]
        noisy = (true_units + noise.discrete_laplace(q / eps_pixels, true_units.shape)).astype(np.float64) / q
        n_top = max(1, int(round(float(self.pixel_top) / 100.0 * d * d)))
        top = np.argsort(-noisy, kind="stable")[:n_top]
        top = top[noisy[top] > 0]
        node_of_top = top // (f * f)  # pix is node-major: f·f pixels per kept node
        taken = np.bincount(node_of_top, weights=noisy[top], minlength=nodes.shape[0])
        count = np.bincount(node_of_top, minlength=nodes.shape[0])
        rest = np.maximum(noisy_c[order] - taken, 0.0) * float(self.background)
        spread = np.where(count < f * f, rest / np.maximum(f * f - count, 1), 0.0)
        blocks = out.reshape(side, f, side, f)
        blocks[nodes[:, 0], :, nodes[:, 1], :] = spread[:, None, None]
        out[pix[top, 0], pix[top, 1]] = noisy[top]
        return out, int(top.size), int(nodes.shape[0])
