"""SNH step 2, augmentation (post-processing): training squares of every query side and their labels,
and the PUBLIC workload's loss weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpcore.geo import Region
from dpcore.grid.histogram import answer_boxes, prefix_sums
from dpcore.mechanisms.contract import MechanismError


def query_sides(lo: float, hi: float, n_sizes: int) -> np.ndarray:
    """r_i = l + (u − l)(i + ½)/k_s, i = 0..k_s−1 (the paper's uniform spacing)."""
    if not (0 < lo <= hi):
        raise MechanismError(f"query side range must satisfy 0 < l ≤ u, got [{lo}, {hi}]")
    if n_sizes < 1:
        raise MechanismError(f"n_sizes must be ≥ 1, got {n_sizes}")
    i = np.arange(n_sizes, dtype=np.float64)
    return lo + (hi - lo) * (i + 0.5) / n_sizes


def augment(noisy: np.ndarray, region: Region, side_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Training set of one query side: (centres (n, 2) in metres, labels (n,)).

    Squares of side ``side_m`` with their bottom-left corner on every cell corner of the grid such
    that the square stays inside the region. The label is the noisy mass covered, with partly covered
    cells contributing their area share (uniformity assumption), from the prefix-sum table.
    """
    xs, ys = sample_corners(noisy.shape, region, side_m)
    gx, gy = np.meshgrid(xs, ys, indexing="ij")
    x0 = gx.ravel()
    y0 = gy.ravel()
    boxes = np.stack([x0, y0, x0 + side_m, y0 + side_m], axis=1)
    labels = answer_boxes(prefix_sums(noisy), region.bounds_m, boxes)
    centres = np.stack([x0 + side_m / 2, y0 + side_m / 2], axis=1)
    return centres, labels


def sample_corners(noisy_shape: tuple[int, int], region: Region, side_m: float) -> tuple[np.ndarray, np.ndarray]:
    """x and y of the bottom-left corners of :func:`augment`'s squares (the grid's axes, each 1-D)."""
    nx, ny = noisy_shape
    xmin, ymin, xmax, ymax = region.bounds_m
    cw_x = (xmax - xmin) / nx
    cw_y = (ymax - ymin) / ny
    # Corners i·ρ with i·ρ + r ≤ side (at least one position even when r ≥ side).
    last_x = max(0, int(np.floor((xmax - xmin - side_m) / cw_x + 1e-9)))
    last_y = max(0, int(np.floor((ymax - ymin - side_m) / cw_y + 1e-9)))
    return xmin + cw_x * np.arange(last_x + 1), ymin + cw_y * np.arange(last_y + 1)


def workload_overlaps(noisy_shape: tuple[int, int], region: Region, side_m: float,
                      workload_m: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """w of every augmentation square of side ``side_m``: how many PUBLIC workload boxes overlap it.

    Same order as :func:`augment`'s samples. Rectangles overlap when their x and y intervals both do
    (open intervals: touching edges is no overlap), so the counts are Xᵀ·Y with X[b, i] = box b overlaps
    column i in x, Y[b, j] likewise in y — exact, and O(boxes · (columns + rows)) memory.
    """
    xs, ys = sample_corners(noisy_shape, region, side_m)
    b = np.atleast_2d(np.asarray(workload_m, dtype=np.float64))
    out = np.zeros((xs.size, ys.size), dtype=np.float64)
    for start in range(0, b.shape[0], chunk):
        c = b[start:start + chunk]
        ox = (c[:, 0:1] < xs[None, :] + side_m) & (c[:, 2:3] > xs[None, :])
        oy = (c[:, 1:2] < ys[None, :] + side_m) & (c[:, 3:4] > ys[None, :])
        out += ox.T.astype(np.float64) @ oy.astype(np.float64)
    return out.ravel()


def load_public_workload(path: str | Path, region: Region) -> np.ndarray:
    """A PUBLIC workload file → (q, 4) boxes in the region's metres.

    The same CSV as query files (min_lat,min_lon,max_lat,max_lon rows, header optional), or a ``.npy``
    of (q, 4) boxes already in metres (xmin, ymin, xmax, ymax).
    """
    p = Path(path)
    if not p.exists():
        raise MechanismError(f"public workload file {p} does not exist")
    if p.suffix == ".npy":
        boxes = np.load(p, allow_pickle=False)
    else:
        from dpcore.queries.range import read_boxes_csv

        boxes = region.box_latlon_to_m(read_boxes_csv(str(p)))
    return check_workload(boxes, str(p))


def check_workload(boxes, source: str) -> np.ndarray:
    b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
    if b.ndim != 2 or b.shape[1] != 4 or b.shape[0] == 0:
        raise MechanismError(f"public workload {source}: need a non-empty (q, 4) array of boxes, got {b.shape}")
    if not np.isfinite(b).all() or (b[:, 2] < b[:, 0]).any() or (b[:, 3] < b[:, 1]).any():
        raise MechanismError(f"public workload {source}: boxes must be finite with xmin ≤ xmax, ymin ≤ ymax")
    return b


def normalise_xy(xy: np.ndarray, region: Region) -> np.ndarray:
    """Metres → [-1, 1]² over the region (the nets' input)."""
    xmin, ymin, xmax, ymax = region.bounds_m
    out = np.empty_like(xy, dtype=np.float64)
    out[:, 0] = 2 * (xy[:, 0] - xmin) / (xmax - xmin) - 1
    out[:, 1] = 2 * (xy[:, 1] - ymin) / (ymax - ymin) - 1
    return out
