"""Grid counting (2-D and 3-D) and prefix-sum range answering under the uniformity assumption.

Arrays are indexed ``counts[ix, iy]`` (x east, y north) and ``counts[ix, iy, it]`` for time slots.
"""

from __future__ import annotations

import numpy as np


def block_sum(a: np.ndarray, s: int, *, pad: bool = False) -> np.ndarray:
    """Sums of s × s blocks over the first two axes of an (nx, ny, ...) array; trailing axes are kept.

    Partial blocks at the high edges are dropped, or with ``pad`` counted as if zero-padded (so no
    cell is lost).
    """
    a = np.asarray(a)
    if s == 1:
        return a
    nx, ny = a.shape[:2]
    if pad:
        bx, by = -(-nx // s), -(-ny // s)
        if (bx * s, by * s) != (nx, ny):
            padded = np.zeros((bx * s, by * s, *a.shape[2:]), dtype=a.dtype)
            padded[:nx, :ny] = a
            a = padded
    else:
        bx, by = nx // s, ny // s
    return a[:bx * s, :by * s].reshape(bx, s, by, s, *a.shape[2:]).sum(axis=(1, 3))


def expand(a: np.ndarray, b: int) -> np.ndarray:
    """Repeat each cell of a into a b × b block over the first two axes (parent value broadcast to its
    children; the inverse of :func:`block_sum`'s shape change)."""
    return np.repeat(np.repeat(a, b, axis=0), b, axis=1)


def shrink_factor(deviation: np.ndarray, variance: np.ndarray | float, kappa: float) -> np.ndarray:
    """Positive-part Wiener factor max(0, 1 − κ·σ²/d²) of a deviation d with noise variance σ²: 0 where d
    looks like noise (|d| ≤ √κ·σ), towards 1 where it stands far out of it."""
    d = np.asarray(deviation, dtype=np.float64)
    return np.maximum(0.0, 1.0 - kappa * np.asarray(variance) / np.maximum(d * d, 1e-300))


def split_to_parent(children: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Children (g, s, g, s, ...) of a quadtree level rescaled so each s × s group sums to its parent
    (g, 1, g, 1, ...); a group whose children sum to 0 gets the even split parent/s², so no mass is
    lost or made."""
    have = children.sum(axis=(1, 3), keepdims=True)
    n_children = children.shape[1] * children.shape[3]
    return np.where(have > 0, children * np.divide(parent, have, out=np.zeros_like(have), where=have > 0),
                    np.broadcast_to(parent / n_children, children.shape))


def cell_index(v: np.ndarray, lo: float, hi: float, n: int) -> np.ndarray:
    """Cell of each coordinate on an n-cell axis over [lo, hi); values at hi land in the last cell."""
    idx = np.floor((np.asarray(v, dtype=np.float64) - lo) * (n / (hi - lo))).astype(np.int64)
    return np.clip(idx, 0, n - 1)


def flat_cell_index(x: np.ndarray, y: np.ndarray, bounds: tuple[float, float, float, float], nx: int,
                    ny: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat cell index ix·ny + iy of the points inside bounds, inside mask over all points)."""
    xmin, ymin, xmax, ymax = bounds
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    inside = (x >= xmin) & (x < xmax) & (y >= ymin) & (y < ymax)
    ix = cell_index(x[inside], xmin, xmax, nx)
    iy = cell_index(y[inside], ymin, ymax, ny)
    return ix * ny + iy, inside


def grid_counts(x: np.ndarray, y: np.ndarray, bounds: tuple[float, float, float, float], nx: int,
                ny: int | None = None, weights: np.ndarray | None = None) -> np.ndarray:
    """int64 (nx, ny) counts of points over bounds (xmin, ymin, xmax, ymax); points outside are ignored.

    With ``weights`` (one per point): float64 sums of the weights per cell instead. Weights on the
    dpcore.privacy.bounding lattice give exact sums (see WEIGHT_QUANTUM)."""
    ny = nx if ny is None else ny
    flat, inside = flat_cell_index(x, y, bounds, nx, ny)
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)[inside]
        return np.bincount(flat, weights=w, minlength=nx * ny).reshape(nx, ny)
    return np.bincount(flat, minlength=nx * ny).reshape(nx, ny).astype(np.int64)


def grid_counts_3d(x: np.ndarray, y: np.ndarray, slot: np.ndarray, bounds: tuple[float, float, float, float],
                   nx: int, ny: int, n_slots: int) -> np.ndarray:
    """int64 (nx, ny, n_slots) counts; points with slot < 0 or ≥ n_slots, or outside bounds, are ignored."""
    xmin, ymin, xmax, ymax = bounds
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    s = np.asarray(slot, dtype=np.int64)
    inside = (x >= xmin) & (x < xmax) & (y >= ymin) & (y < ymax) & (s >= 0) & (s < n_slots)
    ix = cell_index(x[inside], xmin, xmax, nx)
    iy = cell_index(y[inside], ymin, ymax, ny)
    flat = (ix * ny + iy) * n_slots + s[inside]
    return np.bincount(flat, minlength=nx * ny * n_slots).reshape(nx, ny, n_slots).astype(np.int64)


def prefix_sums(values: np.ndarray) -> np.ndarray:
    """(nx+1, ny+1) table P with P[i, j] = sum of values[:i, :j]."""
    v = np.asarray(values, dtype=np.float64)
    p = np.zeros((v.shape[0] + 1, v.shape[1] + 1), dtype=np.float64)
    np.cumsum(np.cumsum(v, axis=0), axis=1, out=p[1:, 1:])
    return p


def cumulative_at(p: np.ndarray, gx: np.ndarray, gy: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
    """Mass below-left of fractional grid coordinates: bilinear interpolation of the prefix table.

    With mass spread uniformly inside each cell, the cumulative mass is exactly bilinear between
    grid nodes, so interpolating P gives the uniformity-assumption answer with no per-cell loop.
    For a stack of tables ``p[:, :, t]`` (spatio-temporal prefix sums), ``t`` picks each query's.
    """
    nx, ny = p.shape[0] - 1, p.shape[1] - 1
    gx = np.clip(gx, 0.0, nx)
    gy = np.clip(gy, 0.0, ny)
    # clipped to ≥ 0 (or NaN): truncation is the floor
    i0 = np.minimum(gx.astype(np.int64), nx - 1)
    j0 = np.minimum(gy.astype(np.int64), ny - 1)
    fx = gx - i0
    fy = gy - j0
    if t is None:  # one table: flat gathers (np.take) cost a fraction of 2-D fancy indexing
        flat, node = p.ravel(), i0 * (ny + 1) + j0
        p00, p10 = flat.take(node), flat.take(node + (ny + 1))
        p01, p11 = flat.take(node + 1), flat.take(node + (ny + 2))
    else:
        p00 = p[i0, j0, t]
        p10 = p[i0 + 1, j0, t]
        p01 = p[i0, j0 + 1, t]
        p11 = p[i0 + 1, j0 + 1, t]
    p00, p10, p01, p11 = (a.astype(np.float64, copy=False) for a in (p00, p10, p01, p11))
    return _mix(p00, p10, p01, p11, fx, 1 - fx, fy, 1 - fy)


def _mix(p00: np.ndarray, p10: np.ndarray, p01: np.ndarray, p11: np.ndarray, fx: np.ndarray, ax: np.ndarray,
         fy: np.ndarray, ay: np.ndarray) -> np.ndarray:
    """p00·(1 − fx)·(1 − fy) + p10·fx·(1 − fy) + p01·(1 − fx)·fy + p11·fx·fy, in that order, in place
    (``ax``, ``ay``: 1 − fx, 1 − fy); the four node values are overwritten."""
    p00 *= ax
    p00 *= ay
    p10 *= fx
    p10 *= ay
    p00 += p10
    p01 *= ax
    p01 *= fy
    p00 += p01
    p11 *= fx
    p11 *= fy
    p00 += p11
    return p00


def answer_boxes(prefix: np.ndarray, bounds: tuple[float, float, float, float], boxes: np.ndarray) -> np.ndarray:
    """Range counts for (q, 4) boxes [xmin, ymin, xmax, ymax] (metres) from a prefix table over bounds:
    :func:`cumulative_at` at the four corners, each box's cell and fractions found once per edge, in blocks
    whose temporaries stay in a core's cache (the same numbers, operation for operation)."""
    b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
    xmin, ymin, xmax, ymax = bounds
    nx, ny = prefix.shape[0] - 1, prefix.shape[1] - 1
    sx = nx / (xmax - xmin)
    sy = ny / (ymax - ymin)
    flat, st = prefix.ravel(), ny + 1
    out = np.empty(len(b))
    for s in range(0, len(b), ANSWER_BLOCK):
        blk = b[s:s + ANSWER_BLOCK]
        # per edge: the node row (column) below it, its fraction past that node, and 1 − the fraction
        xe = [_edge((blk[:, c] - xmin) * sx, nx) for c in (0, 2)]
        ye = [_edge((blk[:, c] - ymin) * sy, ny) for c in (1, 3)]
        node = [[xe[i][0] * st + ye[j][0] for j in (0, 1)] for i in (0, 1)]
        corner = [[_bilinear_at(flat, node[i][j], st, xe[i], ye[j]) for j in (0, 1)] for i in (0, 1)]
        out[s:s + ANSWER_BLOCK] = corner[1][1] - corner[0][1] - corner[1][0] + corner[0][0]
    return out


#: Boxes per block of :func:`answer_boxes`.
ANSWER_BLOCK = 32_768


def _edge(g: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node index i0, fraction g − i0, 1 − fraction) of fractional grid coordinates, as cumulative_at."""
    g = np.clip(g, 0.0, n)
    i0 = np.minimum(g.astype(np.int64), n - 1)
    f = g - i0
    return i0, f, 1 - f


def _bilinear_at(flat: np.ndarray, node: np.ndarray, st: int, ex: tuple, ey: tuple) -> np.ndarray:
    """cumulative_at's bilinear read of one table at nodes ``node`` (x-major, row stride ``st``), its
    products and sums in the same order."""
    _, fx, ax = ex
    _, fy, ay = ey
    p00, p10, p01, p11 = (flat.take(i).astype(np.float64, copy=False)
                          for i in (node, node + st, node + 1, node + (st + 1)))
    return _mix(p00, p10, p01, p11, fx, ax, fy, ay)


def resample_grid(values: np.ndarray, nx: int, ny: int | None = None) -> np.ndarray:
    """Re-grid a density array onto (nx, ny) cells over the same extent, preserving mass (uniformity)."""
    ny = nx if ny is None else ny
    v = np.asarray(values, dtype=np.float64)
    p = prefix_sums(v)
    gx = np.linspace(0, v.shape[0], nx + 1)
    gy = np.linspace(0, v.shape[1], ny + 1)
    gxx, gyy = np.meshgrid(gx, gy, indexing="ij")
    c = cumulative_at(p, gxx.ravel(), gyy.ravel()).reshape(nx + 1, ny + 1)
    return c[1:, 1:] - c[:-1, 1:] - c[1:, :-1] + c[:-1, :-1]
