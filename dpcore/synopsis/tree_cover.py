"""Power sums of a box's covered fractions over a quadtree's leaves, for every box at once.

A leaf at depth d is a cell of the 2^d × 2^d grid; a box covers the fraction fx·fy of it (fx, fy the
covered fractions of its x and y sides). ``TreeCover.power_sums`` gives Σ (fx·fy)^p over the leaves,
depth by depth: per depth, the box's cells split into 3 × 3 blocks (first, inner and last rows times
first, inner and last columns), each of one weight, whose leaf counts come from the leaf count's prefix
table (exact, O(1) per box and depth). Every term is ≥ 0, so a box far smaller than a leaf keeps the
digits of its w⁴ (a sum written as 1 + (f^p − 1)·… loses them to rounding).

Two things keep this near O(boxes): a box can meet a leaf of depth d only if it meets the leaf's parent,
an inner node of depth d − 1, so each depth looks only at the boxes that met an inner node one depth up
(the inner node count has its own prefix table, packed with the leaf count's into one int64 so one
lookup reads both); and the boxes go through in blocks that keep the temporaries in the CPU's cache.
"""

from __future__ import annotations

import numpy as np

#: Boxes per block: the temporaries of one block stay in a core's L2 cache.
BLOCK = 32_768
_LOW = np.int64(0xFFFFFFFF)


class TreeCover:
    """Per-depth prefix tables of a quadtree given by its leaves (depth and x-major index in the 2^d grid)."""

    def __init__(self, leaf_depth: np.ndarray, leaf_index: np.ndarray):
        depth = np.asarray(leaf_depth, dtype=np.int64)
        index = np.asarray(leaf_index, dtype=np.int64)
        self.depths = [int(d) for d in np.unique(depth)]
        self.levels: list[tuple[int, np.ndarray]] = []  # (n, raveled packed prefix table)
        if not self.depths:
            return
        ix, iy = index // (2 ** depth), index % (2 ** depth)
        for d in range(self.depths[0], self.depths[-1] + 1):
            n = 2 ** d
            leaf = np.zeros((n, n), dtype=np.int64)
            leaf.ravel()[index[depth == d]] = 1
            inner = np.zeros((n, n), dtype=np.int64)
            deeper = depth > d  # every deeper leaf lies in an inner node of depth d
            inner[ix[deeper] >> (depth[deeper] - d), iy[deeper] >> (depth[deeper] - d)] = 1
            # leaf counts in the low 32 bits, inner node counts in the high ones: rectangle sums of the
            # packed table are the packed rectangle sums (each count ≤ 4^d < 2^32 for depths up to 15)
            packed = leaf + (inner << 32)
            prefix = np.zeros((n + 1, n + 1), dtype=np.int64)
            np.cumsum(np.cumsum(packed, axis=0), axis=1, out=prefix[1:, 1:])
            self.levels.append((n, prefix.ravel()))

    def power_sums(self, boxes: np.ndarray, bounds: tuple[float, float, float, float]) -> tuple[np.ndarray, np.ndarray]:
        """(Σ w², Σ w⁴) over the leaves, w = fx·fy the covered fraction of each leaf, for (q, 4) boxes
        (xmin, ymin, xmax, ymax in any order) in the coordinates of ``bounds``, the tree's root square."""
        out = (np.zeros(len(boxes)), np.zeros(len(boxes)))
        xmin, ymin, xmax, ymax = bounds
        for s in range(0, len(boxes), BLOCK):
            b = boxes[s:s + BLOCK]
            # [0, 1] over the root, lo ≤ hi, once for every depth
            x0 = np.clip((np.minimum(b[:, 0], b[:, 2]) - xmin) / (xmax - xmin), 0.0, 1.0)
            x1 = np.clip((np.maximum(b[:, 0], b[:, 2]) - xmin) / (xmax - xmin), 0.0, 1.0)
            y0 = np.clip((np.minimum(b[:, 1], b[:, 3]) - ymin) / (ymax - ymin), 0.0, 1.0)
            y1 = np.clip((np.maximum(b[:, 1], b[:, 3]) - ymin) / (ymax - ymin), 0.0, 1.0)
            keep = (x1 > x0) & (y1 > y0)  # boxes of no area cover nothing
            rows, unit = np.flatnonzero(keep), (x0[keep], y0[keep], x1[keep], y1[keep])
            for n, prefix in self.levels:
                if rows.size == 0:
                    break
                deeper, sums = _level(unit, rows, n, prefix)
                for o, (where, add) in zip(out, sums, strict=True):
                    o[s:s + BLOCK][where] += add
                if np.count_nonzero(deeper) < 0.9 * deeper.size:  # else carrying a few boxes costs less
                    rows, unit = rows[deeper], tuple(c[deeper] for c in unit)
        return out


def _level(unit: tuple[np.ndarray, ...], rows: np.ndarray, n: int, fp: np.ndarray):
    """One depth for boxes (unit coordinates x0, y0, x1, y1; positive area) that met an inner node one
    depth up: which of them meet an inner node of this depth (a mask), and per power (rows, Σ w^p over this
    depth's leaves) for p = 2 and 4."""
    a_x, b_x = unit[0] * n, unit[2] * n
    a_y, b_y = unit[1] * n, unit[3] * n
    # positive area inside [0, 1]: a < n, and the last cell ⌈b⌉ − 1 is never before the first ⌊a⌋
    i0, j0 = a_x.astype(np.int64), a_y.astype(np.int64)
    i1, j1 = np.ceil(b_x).astype(np.int64) - 1, np.ceil(b_y).astype(np.int64) - 1
    st = n + 1
    # the box's cells are rows i0..i1, columns j0..j1 of the grid: corners of its prefix-table rectangle
    r0, r1, j1p = i0 * st, (i1 + 1) * st, j1 + 1
    q00, q01, q10, q11 = fp.take(r0 + j0), fp.take(r0 + j1p), fp.take(r1 + j0), fp.take(r1 + j1p)
    packed = q11 - q01 - q10 + q00
    deeper = (packed >> 32) > 0
    t = np.flatnonzero(packed & _LOW)
    if t.size == 0:
        return deeper, ((t, 0.0), (t, 0.0))
    if t.size < 0.9 * rows.size:  # few boxes meet this depth's leaves: work on those alone
        i0, i1, j0, j1, r0, r1, j1p = i0[t], i1[t], j0[t], j1[t], r0[t], r1[t], j1p[t]
        q00, q01, q10, q11 = q00[t], q01[t], q10[t], q11[t]
        a_x, b_x, a_y, b_y, rows = a_x[t], b_x[t], a_y[t], b_y[t], rows[t]
    fx0, fx1 = np.minimum(i0 + 1, b_x) - a_x, b_x - i1  # covered fractions of the first and last cell
    fy0, fy1 = np.minimum(j0 + 1, b_y) - a_y, b_y - j1
    # the first, inner and last rows (columns) of the box: [i0, x1), [x1, x2), [x2, i1 + 1), empty where
    # the box has one or two; leaf counts of the 3 × 3 blocks from the prefix table at 4 × 4 points
    x1 = i0 + 1
    rx = (r0, x1 * st, np.maximum(i1, x1) * st, r1)
    y1 = j0 + 1
    cy = (j0, y1, np.maximum(j1, y1), j1p)
    known = {(0, 0): q00, (0, 3): q01, (3, 0): q10, (3, 3): q11}
    p = [[known[k, c] if (k, c) in known else fp.take(rx[k] + cy[c]) for c in range(4)] for k in range(4)]
    dx = [[p[k + 1][c] - p[k][c] for c in range(4)] for k in range(3)]
    block = [[((dx[k][c + 1] - dx[k][c]) & _LOW).astype(np.float64) for c in range(3)] for k in range(3)]
    sums = []
    sx, sy = (fx0 * fx0, fx1 * fx1), (fy0 * fy0, fy1 * fy1)
    for ux, uy in ((sx, sy), tuple(tuple(u * u for u in w) for w in (sx, sy))):  # f², then f⁴
        # Σ over the cells of ux·uy·member: every term ≥ 0, so tiny covered fractions keep their digits
        by_row = [uy[0] * block[k][0] + block[k][1] + uy[1] * block[k][2] for k in range(3)]
        sums.append((rows, ux[0] * by_row[0] + by_row[1] + ux[1] * by_row[2]))
    return deeper, tuple(sums)
