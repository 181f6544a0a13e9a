"""Counts from a fine histogram: what a mechanism reads when its input arrives as counts, not points.

A release built on a cluster hands each city's fit a *fine* count grid (R × R, or R × R × T with
time slots) over the region's bounds, summed over the input's partitions. A coarser grid of m cells
per side is the exact block sum when m divides R (the cell of a point at m cells is ⌊cell at R / (R/m)⌋).
Otherwise every fine cell is counted, whole, in the coarse cell holding its centre: each point moves by
at most half a fine cell before it is counted, the same deterministic move for every point, so a
person's points still add at most their bound to the coarse counts (the sensitivity is unchanged).
"""

from __future__ import annotations

import numpy as np

from dpcore.grid.histogram import block_sum, cell_index


def fine_centres(r: int, bounds: tuple[float, float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """x and y of the centres of an r × r grid's cells over bounds, one entry per cell (flat ix·r + iy)."""
    xmin, ymin, xmax, ymax = bounds
    cx = xmin + (np.arange(r) + 0.5) * ((xmax - xmin) / r)
    cy = ymin + (np.arange(r) + 0.5) * ((ymax - ymin) / r)
    return np.repeat(cx, r), np.tile(cy, r)


def coarsen(fine: np.ndarray, nx: int, ny: int | None = None) -> np.ndarray:
    """(nx, ny[, T]) int64 counts from a fine (R, R[, T]) grid over the same bounds (see the module)."""
    ny = nx if ny is None else ny
    fine = np.asarray(fine)
    r = fine.shape[0]
    if fine.shape[1] != r:
        raise ValueError("a fine grid is square")
    if nx == ny and r % nx == 0:
        return block_sum(fine, r // nx).astype(np.int64, copy=False)
    # Centre assignment: the coarse cell of each fine cell's centre (bounds are [0, 1) here).
    centre = (np.arange(r) + 0.5) / r
    ix = cell_index(centre, 0.0, 1.0, nx)
    iy = cell_index(centre, 0.0, 1.0, ny)
    out = np.zeros((nx, ny, *fine.shape[2:]), dtype=np.int64)
    rows = np.zeros((nx, r, *fine.shape[2:]), dtype=np.int64)
    np.add.at(rows, ix, fine)
    np.add.at(out.swapaxes(0, 1), iy, rows.swapaxes(0, 1))
    return out

