"""DP heatmaps of Ghazi et al. (AAAI 2023): user-normalised quadtree, top-w per level, LP reconstruction.

Privacy (user level, or record level with every record its own user):
- input: each user's points in the region → a distribution over the Δ × Δ grid with mass 1;
- one Laplace step per quadtree level j = 1..L (L = log2 Δ), each of **L1 sensitivity 1** (a user
  adds a non-negative vector of mass ≤ 1 to every level) — *not* k: the per-user normalisation, not
  the contribution bound, limits a user's influence, so this mechanism's charges declare 1
  (:meth:`DPHeatmap.charge_sensitivity`);
- with ``depth="auto"`` (default) a first step spends ``root_fraction``·ε on the total user mass
  (sensitivity 1) to pick how many levels D ≤ L the remaining budget can carry;
- budget split over the D levels: ``level_split="uniform"`` gives ε/D per level (the paper's), a
  ratio r gives weights r^{j−1}, ``"geometric"`` weights 2^{j/3}; the parts sum to ε (tested);
- a public threshold (``threshold_factor`` noise scales) stops the descent where noise dominates;
  the budget of levels never reached re-measures the pruned tree's leaves (disjoint: sensitivity 1);
- noise: discrete Laplace of scale Q/ε_j on integer masses in units of 1/Q (see dpcore.heatmap);
- nodes measured at level j are the children of the top-w noisy nodes at level j−1: chosen from
  noisy output only (adaptive sequential composition);
- reconstruction (LP with HiGHS, or non-negative least squares), normalisation, rendering and range
  answers are post-processing.
The root mass (= number of users, private) is only used through its noisy, paid-for measurement.
"""

from __future__ import annotations

import numpy as np

from dpcore.budget import Accountant
from dpcore.heatmap import (
    DEFAULT_QUANTUM,
    RECONSTRUCTION_METHODS,
    HeatmapError,
    HeatmapSynopsis,
    check_resolution,
    choose_depth,
    heatmap_privacy,
    level_epsilons,
    measure_quadtree,
    reconstruct,
    user_normalised_grid,
)
from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError, _jsonable
from dpcore.noise import NoiseSource

NORMALISATIONS = ("user", "bound")


def heatmap_units(data: FitInput, resolution: int, quantum: int, normalisation: str = "user") -> np.ndarray:
    """Integer masses (units of 1/Q) of the heatmap input, each privacy unit adding at most Q.

    ``"user"`` (the paper's): each user's points *in this region* share mass 1. A user present in
    several regions of one release then has mass 1 in each, so every region's heatmap is a separate
    ε-release for that user (the ledger must charge each). ``"bound"``: every point has mass 1/k with
    the release-wide bound k (≤ k points per user over all regions), so a user's mass over the whole
    multi-region release is ≤ 1 and the regions compose in parallel. Record level: each record is
    its own unit with mass 1 (both normalisations agree).
    """
    if normalisation not in NORMALISATIONS:
        raise MechanismError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    bounds = data.region.bounds_m
    if data.privacy_unit == "record":
        return user_normalised_grid(data.x, data.y, None, bounds, resolution, quantum)
    if normalisation == "bound":
        k = data.max_points_per_user
        if k is None or int(k) < 1:
            raise MechanismError("normalisation='bound' needs the release-wide bound max_points_per_user (k)")
        unit = user_normalised_grid(data.x, data.y, None, bounds, resolution, quantum)  # Q per point
        return (unit // quantum) * (quantum // int(k))  # ⌊Q/k⌋ units per point: ≤ Q per user
    if data.user is None:
        raise MechanismError("a user-level heatmap needs the user of every point (FitInput.user)")
    return user_normalised_grid(data.x, data.y, data.user, bounds, resolution, quantum)


class DPHeatmap(Mechanism):
    """Quadtree of user-normalised mass, Laplace per level, top-``w`` nodes kept per level,
    non-negative reconstruction. ``resolution`` Δ is a power of two; ``w`` the nodes kept per level.

    Defaults (w=30, threshold_factor=1, level_split=1.3, root_fraction=0.1, signal_to_noise=0.25) were
    chosen (8 trials per setting, n = 200, Δ = 256, ε ∈ {0.2, 1, 5}) on the
    Austin and San Francisco boxes of the public Gowalla sample, not on the New York evaluation data.
    ``depth="auto"`` spends ``root_fraction`` of ε on the noisy user count n̂ and measures only the
    levels whose noise that count can carry (:func:`dpcore.heatmap.choose_depth`); ``depth=L,
    level_split="uniform", threshold_factor=0`` is the paper's fixed-depth algorithm.
    """

    name = "dpheatmap"

    def __init__(self, *, resolution: int = 256, w: int = 30, threshold_factor: float = 1.0,
                 level_split: str | float = 1.3, depth: str | int = "auto", root_fraction: float = 0.1,
                 signal_to_noise: float = 0.25, remeasure_fraction: float = 0.0, reconstruction: str = "lp",
                 normalisation: str = "user", quantum: int = DEFAULT_QUANTUM):
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

    @staticmethod
    def charge_sensitivity(data: FitInput | None = None) -> float:
        """L1 sensitivity of every charge: 1 (one user's normalised mass per level), whatever k is."""
        return 1.0

    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> HeatmapSynopsis:
        try:
            d = check_resolution(self.resolution)
            if self.reconstruction not in RECONSTRUCTION_METHODS:
                raise HeatmapError(f"reconstruction must be one of {RECONSTRUCTION_METHODS}")
            if int(self.quantum) < 1:
                raise HeatmapError("quantum must be ≥ 1")
            max_levels = d.bit_length() - 1
            auto_depth = self.depth == "auto"
            if not auto_depth:
                depth = int(self.depth)
                if not 1 <= depth <= max_levels:
                    raise HeatmapError(f"depth must be 'auto' or an integer in [1, {max_levels}], got {self.depth!r}")
            elif not 0 < float(self.root_fraction) < 1:
                raise HeatmapError(f"root_fraction must be in (0, 1), got {self.root_fraction!r}")
            if not 0 <= float(self.remeasure_fraction) < 1:
                raise HeatmapError(f"remeasure_fraction must be in [0, 1), got {self.remeasure_fraction!r}")
            if int(self.w) < 1 or float(self.threshold_factor) < 0 or not float(self.signal_to_noise) > 0:
                raise HeatmapError("need w ≥ 1, threshold_factor ≥ 0 and signal_to_noise > 0")
            level_epsilons(acct.epsilon, max_levels, self.level_split)  # validates the split early
        except (HeatmapError, ValueError, TypeError) as exc:
            raise MechanismError(f"bad {self.name} parameter: {exc}") from exc
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
        split = self.level_split[:depth] if isinstance(self.level_split, list) else self.level_split
        reserve = float(self.remeasure_fraction) * eps_tree
        eps_levels = level_epsilons(eps_tree - reserve, depth, split)
        tree = measure_quadtree(units, self.w, eps_levels, q, noise, acct, float(self.threshold_factor), reserve)
        tree.root = root
        grid = reconstruct(tree, self.reconstruction)
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
        privacy = heatmap_privacy(self.name, _jsonable(self.get_params()), acct, data.privacy_unit,
                                  data.max_points_per_user, noise, notes)
        return HeatmapSynopsis(grid, data.region, privacy, {
            "resolution": d, "w": int(self.w), "depth": depth, "level_epsilons": eps_levels, "units": "user_mass",
            "kept_leaves": int(tree.kept[-1].shape[0])})
