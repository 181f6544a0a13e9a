"""AG's optional third level: every level-2 cell is cut again by its own noisy count, and the three levels
are made consistent by least squares on the tree.

Why: a record-level release asked squares of 25 m to 5 km at once (``auto`` with no declared band) needs
fine leaves where check-ins pile up on venues (small squares) and few, precise counts over large areas
(large squares). Two levels trade one against the other through c; a third level, sized from the noisy
level-2 counts, cuts finely only where those counts are high (as PrivTree's splits do), while level 1
keeps large squares' noise low (bench/auto_no_band_record.py).

Inference (generalised least squares on a tree with independent noise of known variance per level):
bottom-up, each cell's best estimate from its own noisy count and its children's estimates is their
inverse-variance average; top-down, the difference between a parent's final estimate and its children's
sum is shared among the children in proportion to their variances, so every level adds up. With two
levels and equal child variances this is AG's ``constrained_inference`` exactly. Everything here is
post-processing of noisy counts.
"""

from __future__ import annotations

import numpy as np

from dpcore.geo import Region
from dpcore.grid.histogram import cell_index
from dpcore.mechanisms.ug import RectangleRaster
from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.noise import BootstrapNoise, NoiseLaw, NoiseModel, draw_noise

Rects = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: The finest grid AG's bootstrap re-draws its error field on (two and three levels alike).
BOOTSTRAP_GRID = 256


def child_rects(rects: Rects, m: np.ndarray) -> tuple[Rects, np.ndarray]:
    """Cut rectangle i into an m[i] × m[i] grid (x-major): the children's rectangles and their parents."""
    x0, y0, x1, y1 = rects
    n = m * m
    parent = np.repeat(np.arange(m.size), n)
    local = np.arange(int(n.sum())) - (np.cumsum(n) - n)[parent]
    lm = m[parent]
    w, h = (x1 - x0)[parent] / lm, (y1 - y0)[parent] / lm
    cx, cy = x0[parent] + (local // lm) * w, y0[parent] + (local % lm) * h
    return (cx, cy, cx + w, cy + h), parent


def point_child(rects: Rects, m: np.ndarray, px: np.ndarray, py: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Each point's child id (in :func:`child_rects`' order) given its cell at the level above."""
    x0, y0, x1, y1 = rects
    n = m * m
    pm = m[cell]
    lx = np.clip(np.floor((px - x0[cell]) / (x1 - x0)[cell] * pm).astype(np.int64), 0, pm - 1)
    ly = np.clip(np.floor((py - y0[cell]) / (y1 - y0)[cell] * pm).astype(np.int64), 0, pm - 1)
    return (np.cumsum(n) - n)[cell] + lx * pm + ly


def tree_inference(noisy: list[np.ndarray], variances: list[np.ndarray | float],
                   parents: list[np.ndarray]) -> np.ndarray:
    """Least-squares leaf estimates of a tree of noisy counts: ``noisy[l]`` the counts of level l with
    variances ``variances[l]`` (one per cell, or one for the level; ``inf`` for a cell not measured),
    ``parents[l]`` the level-l parent of every level-(l+1) cell. The leaves returned add up to every
    level's final estimate."""
    var = [np.broadcast_to(np.asarray(s, dtype=np.float64), np.shape(v)).copy() for v, s in zip(noisy, variances,
                                                                                                strict=True)]
    est = [np.where(np.isinf(s), 0.0, np.asarray(v, dtype=np.float64)) for v, s in zip(noisy, var, strict=True)]
    sums = []
    for lvl in range(len(noisy) - 2, -1, -1):  # bottom-up: own count with the children's estimates
        n = est[lvl].size
        s = np.bincount(parents[lvl], est[lvl + 1], n)
        vs = np.bincount(parents[lvl], var[lvl + 1], n)
        combined = 1.0 / (1.0 / var[lvl] + 1.0 / vs)
        est[lvl] = combined * (est[lvl] / var[lvl] + s / vs)
        var[lvl] = combined
        sums.insert(0, (s, vs))
    for lvl, (s, vs) in enumerate(sums):  # top-down: share each parent's residual by the children's variance
        est[lvl + 1] = est[lvl + 1] + ((est[lvl] - s) / vs)[parents[lvl]] * var[lvl + 1]
    return est[-1]


class ThreeLevelStructure:
    """The released shape of a three-level AG (m1, m2 per level-1 cell, m3 per level-2 cell: functions of
    noisy counts): cells, parents and leaf rectangles."""

    def __init__(self, region: Region, m1: int, m2: np.ndarray, m3: np.ndarray, merge_unsplit: bool = False):
        xmin, ymin, xmax, ymax = region.bounds_m
        root = tuple(np.array([v], dtype=np.float64) for v in (xmin, ymin, xmax, ymax))
        self.m1, self.m2, self.m3 = m1, np.asarray(m2, dtype=np.int64), np.asarray(m3, dtype=np.int64)
        self.level1, _ = child_rects(root, np.array([m1]))
        self.level2, self.parent2 = child_rects(self.level1, self.m2)
        self.leaves, self.parent3 = child_rects(self.level2, self.m3)
        #: level-2 cells not measured: the only cell of a level-1 cell that level 2 does not cut, whose
        #: level-3 cells get level 2's ε as well
        self.unmeasured = (self.m2 == 1)[self.parent2] if merge_unsplit else np.zeros(self.parent2.size, dtype=bool)

    def variances(self, laws: tuple[NoiseLaw, NoiseLaw, NoiseLaw, NoiseLaw]) -> list[np.ndarray | float]:
        """Per level, each cell's noise variance: laws of level 1, 2, 3 and of merged level-3 cells."""
        merged = self.unmeasured[self.parent3]
        return [laws[0].variance, np.where(self.unmeasured, np.inf, laws[1].variance),
                np.where(merged, laws[3].variance, laws[2].variance)]

    def sizes(self) -> tuple[int, int, int]:
        return self.m1 * self.m1, self.parent2.size, self.parent3.size


class AdaptiveGrid3Noise(BootstrapNoise):
    """The three-level AG's answers are linear in the three levels' noise: fresh noise through the same
    inference on the recorded structure, rasterised as the release is, gives the error field."""

    def __init__(self, laws: tuple[NoiseLaw, NoiseLaw, NoiseLaw, NoiseLaw], structure: ThreeLevelStructure, region: Region,
                 raster_size: int):
        super().__init__(laws[-1], (raster_size, raster_size), region.bounds_m)
        self.laws, self.structure, self.region, self.raster_size = laws, structure, region, raster_size
        self.method = "parametric bootstrap: fresh level noise through the three-level AG's least squares"

    def draw_errors(self, rng: np.random.Generator) -> np.ndarray:
        s = self.structure
        n1, n2, n3 = s.sizes()
        merged = s.unmeasured[s.parent3]
        noise = [draw_noise(rng, self.laws[0], n1), np.where(s.unmeasured, 0.0, draw_noise(rng, self.laws[1], n2)),
                 np.where(merged, draw_noise(rng, self.laws[3], n3), draw_noise(rng, self.laws[2], n3))]
        leaves = tree_inference(noise, s.variances(self.laws), [s.parent2, s.parent3])
        self.note_leaf_errors(leaves)
        if getattr(self, "_raster", None) is None:  # the leaves' shares of the raster cells, found once
            self._raster = RectangleRaster(*s.leaves, self.region, self.raster_size)
        return self._raster(leaves)

    def leaf_at(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        s = self.structure
        xmin, ymin, xmax, ymax = self.region.bounds_m
        cell1 = cell_index(x, xmin, xmax, s.m1) * s.m1 + cell_index(y, ymin, ymax, s.m1)
        leaf = point_child(s.level2, s.m3, x, y, point_child(s.level1, s.m2, x, y, cell1))
        return leaf, tuple(r[leaf] for r in s.leaves)

    @staticmethod
    def make_spec(laws: tuple[NoiseLaw, NoiseLaw, NoiseLaw, NoiseLaw], merge_unsplit: bool) -> dict:
        return {"kind": f"{__name__}:AdaptiveGrid3Noise", "laws": [law.to_dict() for law in laws],
                "merge_unsplit": bool(merge_unsplit)}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> NoiseModel:
        extra, arrays = synopsis._extra, synopsis.arrays
        structure = ThreeLevelStructure(synopsis.region, int(extra["m1"]), np.asarray(extra["m2"]), arrays["m3"],
                                        bool(spec.get("merge_unsplit", False)))
        laws = tuple(NoiseLaw.from_dict(d) for d in spec["laws"])
        return cls(laws, structure, synopsis.region, min(int(synopsis.shape[0]), BOOTSTRAP_GRID))
