"""The error of spreading a released cell uniformly over the part of it a box covers, for every box at once.

A release answers a box that cuts a cell (a grid cell, a tree's leaf) with the covered fraction f of the
cell's count, as if the cell's points were spread evenly. They are not: check-ins pile up on venues, and a
box centred where people are often holds a venue, so its true share of the cell is anywhere between none
and all. Per box, over the cells it cuts (released counts y ≥ 0, covered fractions f):

- the hard bounds: the truth of the cut cells lies between none of them (the answer less E = Σ f·y) and
  all of them (the answer plus R = Σ (1 − f)·y);
- the spread: if each cut cell's points sat in one place, in the box or not, the error's variance would be
  V = Σ y²·f(1 − f); points spread over several places inside a cell make it smaller, a box that sits on a
  venue makes its error one-sided and heavy-tailed (a square centred where people are holds at least the
  venue it is centred on, so its truth lies above the answer far more often than below). With m =
  V²/Σ(y²·f(1 − f))² the effective number of cut cells, the half-widths are z·√V·(1/2 + 4/m²) above the
  answer and z·√V·(1/2 + 1/(2m²)) below it, each within its hard bound: about z·√V/2 where a box cuts
  many cells (whose errors partly cancel), up to none-to-all above where it cuts one.

The factors were fitted on public data only (the Gowalla 1,000-user sample's San Francisco, Austin and New
York check-ins; data-centred squares of the three bands on uniform grids of 100 m to 2 km of true counts:
coverage 0.90–1.00, mean distance from 0.95 of 0.030, against 0.68–1.00 and 0.074 for z·√V·(1/2 + 1/m)
both ways). bench/bench_coverage.py measures the full intervals of every mechanism on the held-out Gowalla
New York check-ins.

Cells are the release's own where it is a uniform grid; an adaptive release (a tree's or AG's leaves)
is read leaf by leaf: the commonest leaf sizes each on their own grid, exactly, the others on dyadic
grids (:meth:`CellSpread.of_leaves`). Everything reads only the released values and their public
structure: post-processing.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from dpcore.synopsis.noise import Intervals, axis_cover

#: Boxes per block: the temporaries of one block stay in a core's cache.
BLOCK = 65_536
#: The finest dyadic grid leaves of several sizes are read on (cells of ~40 m on a 20 km region).
FINEST = 512
#: Leaf sizes read on their own grid (exactly); leaves of other sizes share dyadic grids.
EXACT_GRIDS = 8


class CellSpread:
    """Half-widths of the spreading error of an (nx, ny) grid of released counts over ``bounds``."""

    method = ("the spread inside partly covered cells (within none to all of a cut cell's released count, "
              "z·√V·(1/2 + 4/m²) above and z·√V·(1/2 + 1/(2m²)) below, V = Σ y²·f(1 − f) over the cut cells)")

    def __init__(self, grids: list[np.ndarray], bounds: tuple[float, float, float, float]):
        """``grids``: released counts of disjoint cells, each array a uniform grid over ``bounds`` (0 where
        its grid has no cell of the release)."""
        self.bounds = bounds
        self.grids = []
        for values in grids:
            v = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
            # prefix tables of y, y² and y⁴ packed per node, so one gather reads all three
            stack = np.stack([v, v * v, (v * v) ** 2], axis=-1)
            p = np.zeros((v.shape[0] + 1, v.shape[1] + 1, 3))
            np.cumsum(np.cumsum(stack, axis=0), axis=1, out=p[1:, 1:])
            self.grids.append((v.shape, p.reshape(-1, 3)))

    @classmethod
    def of_leaves(cls, cx: np.ndarray, cy: np.ndarray, width: np.ndarray, count: np.ndarray,
                  bounds: tuple[float, float, float, float]) -> CellSpread:
        """Leaves of several sizes (centres, sides, released counts), each a cell of the grid of side/width
        cells per axis (a quadtree's and an adaptive grid's leaves are: AG's lie on the grid of m1·m2(·m3)
        cells), one grid per size for the EXACT_GRIDS sizes holding most leaves up to FINEST cells per axis;
        any other leaf lies in the cell holding its centre of the finest dyadic grid no finer than it (it
        adds up with its neighbours there: a wider spread)."""
        xmin, ymin, xmax, ymax = bounds
        side = xmax - xmin
        n = np.round(side / np.asarray(width, dtype=np.float64)).astype(np.int64)
        sizes, leaves = np.unique(n[n <= FINEST], return_counts=True)
        exact = set(sizes[np.argsort(leaves)[::-1][:EXACT_GRIDS]].tolist())
        dyadic = 2 ** np.clip(np.floor(np.log2(np.maximum(n, 1)) + 1e-9), 0, np.log2(FINEST)).astype(np.int64)
        grid = np.where(np.isin(n, list(exact)), n, dyadic)
        grids = []
        for g_n in np.unique(grid):
            g_n, sel = int(g_n), grid == g_n
            ix = np.clip(((cx[sel] - xmin) * g_n / side).astype(np.int64), 0, g_n - 1)
            iy = np.clip(((cy[sel] - ymin) * g_n / (ymax - ymin)).astype(np.int64), 0, g_n - 1)
            g = np.zeros(g_n * g_n)
            np.add.at(g, ix * g_n + iy, np.clip(count[sel], 0.0, None))
            grids.append(g.reshape(g_n, g_n))
        return cls(grids, bounds)

    def halfwidths(self, boxes: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """(below, above): how far below and above the answer each box's truth may lie from spreading."""
        boxes = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        below, above = np.zeros(len(boxes)), np.zeros(len(boxes))
        z = NormalDist().inv_cdf((1.0 + level) / 2.0)
        for s in range(0, len(boxes), BLOCK):
            b = boxes[s:s + BLOCK]
            v, w, e, r = (np.zeros(len(b)) for _ in range(4))
            for shape, p in self.grids:
                rows, sums = self._sums(b, shape, p)
                for total, part in zip((v, w, e, r), sums, strict=True):
                    total[rows] += part
            v, w = np.maximum(v, 0.0), np.maximum(w, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                inv_m = np.where(v > 0, w / np.where(v > 0, v * v, 1.0), 0.0)
            sd, inv_m2 = z * np.sqrt(v), inv_m * inv_m
            below[s:s + BLOCK] = np.minimum(sd * (0.5 + 0.5 * inv_m2), e)
            above[s:s + BLOCK] = np.minimum(sd * (0.5 + 4.0 * inv_m2), r)
        return below, above

    def _sums(self, b: np.ndarray, shape: tuple[int, int], prefix: np.ndarray) -> tuple[np.ndarray, ...]:
        """(rows, (V, W, E, R)): the boxes that cut a cell of this grid holding a count, and for each, over
        the cut cells, V = Σ y²·g, W = Σ y⁴·g², E = Σ f·y and R = Σ (1 − f)·y (g = f(1 − f))."""
        xmin, ymin, xmax, ymax = self.bounds
        nx, ny = shape
        ix0, ix1, fx0, fx1, sx = axis_cover(b[:, 0], b[:, 2], nx, (xmin, xmax))
        iy0, iy1, fy0, fy1, sy = axis_cover(b[:, 1], b[:, 3], ny, (ymin, ymax))
        # a box whose cells on this grid hold no released count cuts none (the grid of one leaf size is
        # mostly empty): the rest works on the others only
        st = ny + 1
        c0 = prefix[:, 0]
        held = (c0[(ix1 + 1) * st + iy1 + 1] - c0[ix0 * st + iy1 + 1] - c0[(ix1 + 1) * st + iy0]
                + c0[ix0 * st + iy0]) > 0
        rows = np.flatnonzero(held & sx & sy)
        if rows.size < 0.9 * len(b):
            ix0, ix1, fx0, fx1, iy0, iy1, fy0, fy1 = (a[rows] for a in (ix0, ix1, fx0, fx1, iy0, iy1, fy0, fy1))
            b = b[rows]
        else:
            rows = np.arange(len(b))
        # the first, inner and last columns (rows) of the box: node bounds [i0, i0+1), [i0+1, i1), [i1, i1+1)
        # (the last empty where the box has one column: then f1 = 0)
        xs = (ix0, ix0 + 1, np.maximum(ix1, ix0 + 1), ix1 + 1)
        ys = (iy0, iy0 + 1, np.maximum(iy1, iy0 + 1), iy1 + 1)
        stride = ny + 1
        node = [[prefix[xs[k] * stride + ys[c]] for c in range(4)] for k in range(4)]
        fx = (fx0, np.ones_like(fx0), fx1)
        fy = (fy0, np.ones_like(fy0), fy1)
        v = np.zeros(len(b))
        w, e, r = v.copy(), v.copy(), v.copy()
        for k in range(3):
            for c in range(3):
                if k == 1 and c == 1:
                    continue  # the inner block: whole cells, exactly counted
                blk = node[k + 1][c + 1] - node[k][c + 1] - node[k + 1][c] + node[k][c]
                f = fx[k] * fy[c]
                g = f * (1.0 - f)
                v += g * blk[:, 1]
                w += g * g * blk[:, 2]
                e += f * blk[:, 0]
                r += (1.0 - f) * blk[:, 0]
        return rows, (v, w, e, r)


def _cut(x0: np.ndarray, y0: np.ndarray, w: np.ndarray, m: np.ndarray):
    """Squares (corner x0, y0, side w) each cut into an m × m grid (x-major): the children's corners and
    sides, and their parents."""
    n = m * m
    parent = np.repeat(np.arange(m.size), n)
    local = np.arange(int(n.sum())) - (np.cumsum(n) - n)[parent]
    cw = w[parent] / m[parent]
    return x0[parent] + (local // m[parent]) * cw, y0[parent] + (local % m[parent]) * cw, cw, parent


def leaf_squares(synopsis) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(x0, y0, side) of every leaf of a release whose public structure records leaves of several sizes (a
    tree's leaf depths; an adaptive grid's m1, m2 and m3), in region metres; None for a uniform grid."""
    extra, arrays = getattr(synopsis, "_extra", {}), getattr(synopsis, "arrays", {})
    xmin, ymin, xmax, _ = synopsis.region.bounds_m
    side = xmax - xmin
    if "leaf_depth" in arrays and "leaf_index" in arrays:
        cells = 2 ** arrays["leaf_depth"].astype(np.int64)
        index = arrays["leaf_index"].astype(np.int64)
        w = side / cells
        return xmin + (index // cells) * w, ymin + (index % cells) * w, w
    if "m1" in extra and "m2" in extra:
        m1 = int(extra["m1"])
        i = np.arange(m1 * m1)
        x0, y0, w, _ = _cut(xmin + (i // m1) * (side / m1), ymin + (i % m1) * (side / m1),
                            np.full(m1 * m1, side / m1), np.asarray(extra["m2"], dtype=np.int64))
        if "m3" in arrays:
            x0, y0, w, _ = _cut(x0, y0, w, np.asarray(arrays["m3"], dtype=np.int64))
        return x0, y0, w
    return None


def spread_of(synopsis) -> CellSpread:
    """The spreading error of a grid release: its own cells, or its leaves (:func:`leaf_squares`) with their
    released counts."""
    bounds = synopsis.region.bounds_m
    leaves = leaf_squares(synopsis)
    if leaves is None:
        return CellSpread([synopsis.values], bounds)
    x0, y0, w = leaves
    count = synopsis.answer(np.stack([x0, y0, x0 + w, y0 + w], axis=1))
    return CellSpread.of_leaves(x0 + w / 2, y0 + w / 2, w, count, bounds)


def widen(iv: Intervals, est: np.ndarray, spread: CellSpread | None, boxes: np.ndarray, level: float = 0.95,
          factor: float = 1.0) -> Intervals:
    """The noise model's interval widened by the spreading error (``factor`` × the spread's half-widths, for
    answers scaled from the spread's counts): the two half-widths of each side added in quadrature, as
    independent errors' are. NaN bounds (no interval) stay NaN."""
    if spread is None or not iv.known:
        return iv
    below, above = spread.halfwidths(boxes, level)
    noise = iv.noise or (np.maximum(est - iv.lower, 0.0), np.maximum(iv.upper - est, 0.0))
    lower = est - np.hypot(np.maximum(est - iv.lower, 0.0), factor * below)
    upper = est + np.hypot(np.maximum(iv.upper - est, 0.0), factor * above)
    # the spread recurs from release to release where the same venues are cut (bench/bench_coverage.py
    # --daily: counted as independent, 3-day sums of record-level releases covered 0.64–0.97 where a day's
    # rows covered 0.93–0.99), so only the noise is the releases' own, independent part
    independent = noise
    return Intervals(lower, upper, f"{iv.method}; widened by {spread.method}", independent)
