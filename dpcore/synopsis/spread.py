"""The error of spreading a released cell uniformly over the part of it a box covers, for every box at once.

A release answers a box that cuts a cell (a grid cell, a tree's leaf) with the covered fraction f of the
cell's count, as if the cell's points were spread evenly. They are not: check-ins pile up on venues, and a
box centred where people are often holds a venue, so its true share of the cell is anywhere between none
and all. Per box, over the cells it cuts (released counts y ≥ 0, covered fractions f):

- the hard bounds: the truth of the cut cells lies between none of them (the answer less E = Σ f·y) and
  all of them (the answer plus R = Σ (1 − f)·y);
- the spread: if each cut cell's points sat in one place, in the box or not, the error's variance would be
  V = Σ t²·f(1 − f) (t a cell's true count, read as y² + σ² with σ its noise's sd where the release's
  noise law gives it; the bound above adds the cut cells' own noise, z·σ·√Σ(1 − f)², as all of a cut
  cell is its released count less its noise); points spread over several places inside a cell make it
  smaller, a box that sits on a venue makes its error one-sided and heavy-tailed (a square centred where people are holds at least the
  venue it is centred on, so its truth lies above the answer far more often than below). With m =
  V²/Σ(y²·f(1 − f))² the effective number of cut cells, the half-widths are z·√V·(a0 + a1/m²) below the
  answer and z·√V·(b0 + b1/m²) above it, each within its hard bound: a fraction of z·√V where a box
  cuts many cells (whose errors partly cancel), up to none-to-all above where it cuts one.

The factors depend on how the release cut space (:data:`FACTORS`): a uniform grid's cells (identity, UG),
HB's leaf grid, AG's two-level leaves and a tree's leaves differ in how many places a cut cell holds (a
tree's and AG's leaves are cut where counts are high, so they hold few places each). A release scaled to
full counts from a k-bounded sample (user level) spreads bounded counts, whose places are thinner than the
full data's (each person adds at most k points to a venue): :data:`BOUNDED_SHARE` may take a share off its
factors (none is: held out, it under-covered). The spread and the noise model's half-width add as ‖·‖_P with P = :data:`NORM_P` (between a quadrature sum, P = 2, and a
linear one): the spread's error is heavy-tailed, so the two errors' sum reaches further than a quadrature
sum of their quantiles says.

Fitted on public data (bench/fit_spread.py): Gowalla NYC check-ins in the ``new-york`` box at record level,
ε 1, three whole-file releases and twelve single busy days (dense and sparse data); squares of 25–5000 m
centred on data points; per kind, the factors that bring each mechanism × band's coverage nearest 0.95.
bench/bench_coverage.py reports coverage on held-out data (the Gowalla 1,000-user sample's Austin and San
Francisco, other seeds; bench/results/2026-11-28-coverage-2.md).

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
#: Cells per axis of the coarse map of where each grid of leaves has cells: a box whose coarse cover meets
#: none of a grid's skips that grid (most boxes meet few of a tree's leaf sizes).
COARSE = 32


#: (a0, a1, b0, b1) per kind of cells: z·√V·(a0 + a1/m²) below, z·√V·(b0 + b1/m²) above (bench/fit_spread.py;
#: HB's 0.35 raised to 0.45, where NYC's whole-file 1–5 km squares covered 0.92 at 0.35 and 0.96 at 0.45).
FACTORS = {"grid": (0.45, 0.0, 0.45, 4.0), "hb": (0.45, 0.0, 0.45, 4.0), "ag": (0.55, 0.0, 0.55, 8.0),
           "tree": (0.35, 0.0, 0.35, 8.0)}
#: Exponents (g0, g1): the spread of a k-bounded sample that keeps a share κ of the points, scaled to full
#: counts, takes κ^g0·(a0, b0) and κ^g1·(a1, b1). 0: the full data's spread. Fitted on Gowalla NYC (0.82,
#: 5.0 with ProfiledNoise.BIAS_SHARE 0.6) they brought NYC's user-level coverage from 0.96–1.00 to 0.90–0.96
#: but the held-out Gowalla sample's Austin fell further short (UG 0.63/0.39/0.24 against 0.85/0.74/0.38 by
#: band; bench/results/2026-11-28-coverage-2.md), so nothing is taken off.
BOUNDED_SHARE = (0.0, 0.0)
#: The spread and the noise model's half-width add as (n^P + s^P)^(1/P).
NORM_P = 1.5


def add_halfwidths(noise: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """The half-width of the noise's and the spread's errors together (:data:`NORM_P`)."""
    n, s = np.abs(np.asarray(noise, dtype=np.float64)), np.abs(np.asarray(spread, dtype=np.float64))
    if NORM_P == 1.5:  # square roots and a cube root: a third of the time of two fractional powers
        return np.cbrt(n * np.sqrt(n) + s * np.sqrt(s)) ** 2
    return (n ** NORM_P + s ** NORM_P) ** (1.0 / NORM_P)


def rest_of(total: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The part of a half-width :func:`add_halfwidths` made of ``total`` beside ``noise``."""
    t = np.abs(np.asarray(total, dtype=np.float64))
    n = np.minimum(np.abs(np.asarray(noise, dtype=np.float64)), t)
    return np.maximum(t ** NORM_P - n ** NORM_P, 0.0) ** (1.0 / NORM_P)


class CellSpread:
    """Half-widths of the spreading error of an (nx, ny) grid of released counts over ``bounds``."""

    def __init__(self, grids: list[np.ndarray], bounds: tuple[float, float, float, float], kind: str = "grid",
                 cells: list[np.ndarray] | None = None, cell_sd: float = 0.0):
        """``grids``: released counts of disjoint cells, each array a uniform grid over ``bounds`` (0 where
        its grid has no cell of the release); ``kind``: how the release cut space (a key of FACTORS);
        ``cells``: per grid, 1 where it holds a cell of the release (every cell when None); ``cell_sd``: the
        sd of each cell's own noise where the release's noise law gives it (0: not known)."""
        self.bounds, self.kind, self.cell_sd = bounds, kind, float(cell_sd)
        a0, a1, b0, b1 = FACTORS[kind]
        self.method = (f"the spread inside partly covered cells ({kind}: within none to all of a cut cell's "
                       f"released count, z·√V·({a0:g} + {a1:g}/m²) below and z·√V·({b0:g} + {b1:g}/m²) above, "
                       "V = Σ y²·f(1 − f) over the cut cells, fitted on public data)")
        self.grids, self._coarse = [], []
        for i, values in enumerate(grids):
            v = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
            held = np.ones_like(v) if cells is None else np.asarray(cells[i], dtype=np.float64)
            # a cell's true count is y less its noise: its square is y² + σ² on average over the noise (a
            # cell released as 0 may hold a point a box sits on)
            sq = self._squares(v) + self.cell_sd ** 2 * held
            # prefix tables of y, y² + σ², its square and the cells held, packed per node: one gather reads all
            stack = np.stack([v, sq, sq * sq, held], axis=-1)
            p = np.zeros((v.shape[0] + 1, v.shape[1] + 1, 4))
            np.cumsum(np.cumsum(stack, axis=0), axis=1, out=p[1:, 1:])
            # the cells-held table alone, contiguous: the first gathers (does a box meet a cell?) read it
            full = cells is None or bool(held.all())
            self.grids.append((v.shape, p.reshape(-1, 4), np.ascontiguousarray(p[..., 3]).ravel(), full))
            self._coarse.append(None if full else _coarse_map(held))

    @classmethod
    def of_leaves(cls, cx: np.ndarray, cy: np.ndarray, width: np.ndarray, count: np.ndarray,
                  bounds: tuple[float, float, float, float], kind: str = "tree", cell_sd: float = 0.0,
                  ) -> CellSpread:
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
        grids, cells = [], []
        for g_n in np.unique(grid):
            g_n, sel = int(g_n), grid == g_n
            ix = np.clip(((cx[sel] - xmin) * g_n / side).astype(np.int64), 0, g_n - 1)
            iy = np.clip(((cy[sel] - ymin) * g_n / (ymax - ymin)).astype(np.int64), 0, g_n - 1)
            g = np.zeros(g_n * g_n)
            np.add.at(g, ix * g_n + iy, np.clip(count[sel], 0.0, None))
            grids.append(g.reshape(g_n, g_n))
            c = np.zeros(g_n * g_n)
            c[ix * g_n + iy] = 1.0
            cells.append(c.reshape(g_n, g_n))
        return cls(grids, bounds, kind, cells, cell_sd)

    def _squares(self, v: np.ndarray) -> np.ndarray:
        """A cell's count squared: all of its points in one place, in the box or not (what V sums)."""
        return v * v

    def _share(self, f: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The variance weight of a cell a box covers a fraction f (u = 1 − f) of: f(1 − f), one place in
        or out."""
        return f * u

    def halfwidths(self, boxes: np.ndarray, level: float = 0.95,
                   kept: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(below, above): how far below and above the answer each box's truth may lie from spreading
        (``kept``: the share κ of the points a k-bound kept, where the cells count a bounded sample that is
        scaled to full counts)."""
        boxes = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        below, above = np.zeros(len(boxes)), np.zeros(len(boxes))
        z = NormalDist().inv_cdf((1.0 + level) / 2.0)
        a0, a1, b0, b1 = FACTORS[self.kind]
        kappa = float(np.clip(kept, 1e-6, 1.0))
        s0, s1 = kappa ** BOUNDED_SHARE[0], kappa ** BOUNDED_SHARE[1]
        a0, b0, a1, b1 = a0 * s0, b0 * s0, a1 * s1, b1 * s1
        buf = np.empty((16, min(BLOCK, len(boxes)), 4))  # the gathered nodes of every grid and block
        for s in range(0, len(boxes), BLOCK):
            b = boxes[s:s + BLOCK]
            v, w, e, r, q = (np.zeros(len(b)) for _ in range(5))
            near = self._coarse_cover(b) if any(c is not None for c in self._coarse) else None
            for grid, coarse in zip(self.grids, self._coarse, strict=True):
                if coarse is None:
                    rows, sums = self._sums(b, *grid, buf=buf)
                else:
                    # the boxes whose coarse cover meets a coarse cell holding one of this grid's cells: the
                    # rest meet none of its cells and add nothing (the sums of the others are unchanged)
                    x0, x1, y0, y1 = near
                    st = COARSE + 1
                    some = np.flatnonzero(coarse.take(x1 * st + y1) - coarse.take(x0 * st + y1)
                                          - coarse.take(x1 * st + y0) + coarse.take(x0 * st + y0) > 0)
                    rows, sums = self._sums(b[some], *grid, buf=buf)
                    rows = some[rows]
                for total, part in zip((v, w, e, r, q), sums, strict=True):
                    total[rows] += part
            v, w = np.maximum(v, 0.0), np.maximum(w, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                inv_m = np.where(v > 0, w / np.where(v > 0, v * v, 1.0), 0.0)
            sd, inv_m2 = z * np.sqrt(v), inv_m * inv_m
            below[s:s + BLOCK] = np.minimum(sd * (a0 + a1 * inv_m2), e)
            # all of a cut cell is its released count less its own noise: the bound above takes the noise
            # of the cut cells' uncovered parts, Σ (1 − f)·noise
            above[s:s + BLOCK] = np.minimum(sd * (b0 + b1 * inv_m2), r + z * self.cell_sd * np.sqrt(q))
        return below, above

    def _coarse_cover(self, b: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per box, the prefix-table nodes of its cover of the COARSE grid widened by a cell each way (so that
        no rounding of a finer grid's edges reaches past it): (x0, x1, y0, y1)."""
        xmin, ymin, xmax, ymax = self.bounds
        ix0, ix1, _, _, _ = axis_cover(b[:, 0], b[:, 2], COARSE, (xmin, xmax))
        iy0, iy1, _, _, _ = axis_cover(b[:, 1], b[:, 3], COARSE, (ymin, ymax))
        return (np.maximum(ix0 - 1, 0), np.minimum(ix1 + 2, COARSE), np.maximum(iy0 - 1, 0),
                np.minimum(iy1 + 2, COARSE))

    def _sums(self, b: np.ndarray, shape: tuple[int, int], prefix: np.ndarray, held_prefix: np.ndarray,
              full: bool, buf: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """(rows, (V, W, E, R, Q)): the boxes whose border (the cells they cut) meets a cell of this grid the
        release has, and for each, over the cut cells, V = Σ y²·g, W = Σ y⁴·g², E = Σ f·y, R = Σ (1 − f)·y
        and Q = Σ (1 − f)² over the cells the release has (g = f(1 − f)); ``buf``: (16, ≥ boxes, 4) room
        for the gathered prefix-table nodes (reused from grid to grid: no new pages per gather)."""
        xmin, ymin, xmax, ymax = self.bounds
        nx, ny = shape
        ix0, ix1, fx0, fx1, sx = axis_cover(b[:, 0], b[:, 2], nx, (xmin, xmax))
        iy0, iy1, fy0, fy1, sy = axis_cover(b[:, 1], b[:, 3], ny, (ymin, ymax))
        st = ny + 1
        # node rows (columns) of the first, inner and last columns (rows) of each box's cover: [x0, x1),
        # [x1, x2), [x2, x3) (the inner empty where the box has one or two, the last where it has one: f1 = 0)
        x2, y2 = np.maximum(ix1, ix0 + 1), np.maximum(iy1, iy0 + 1)
        xs = (ix0 * st, (ix0 + 1) * st, x2 * st, (ix1 + 1) * st)
        ys = (iy0, iy0 + 1, y2, iy1 + 1)
        if full:  # every cell of the grid is one of the release's: a box meets one where it covers any area
            keep = sx & sy
        else:
            # a box adds nothing where its border (its cover less the whole cells inside) meets no cell the
            # release has on this grid (the grid of one leaf size is mostly empty): the rest works on the
            # others only (np.take: a row gather of a 2-D table costs a tenth of fancy indexing)
            c0 = held_prefix
            cover = (c0.take(xs[3] + ys[3]) - c0.take(xs[0] + ys[3]) - c0.take(xs[3] + ys[0])
                     + c0.take(xs[0] + ys[0]))
            inner = (c0.take(xs[2] + ys[2]) - c0.take(xs[1] + ys[2]) - c0.take(xs[2] + ys[1])
                     + c0.take(xs[1] + ys[1]))
            keep = (cover > inner) & sx & sy
        rows = np.flatnonzero(keep)
        if rows.size < 0.9 * len(b):
            fx0, fx1, fy0, fy1 = (a[rows] for a in (fx0, fx1, fy0, fy1))
            xs, ys = tuple(a[rows] for a in xs), tuple(a[rows] for a in ys)
        else:
            rows = np.arange(len(b))
        n = len(rows)
        if buf is None or len(buf[0]) < n:
            buf = np.empty((16, n, 4))
        node = [[prefix.take(xs[k] + ys[c], axis=0, out=buf[4 * k + c, :n]) for c in range(4)] for k in range(4)]
        fx, fy = (fx0, None, fx1), (fy0, None, fy1)
        v, w, e, r, q = (np.zeros(n) for _ in range(5))
        for k in range(3):
            for c in range(3):
                if k == 1 and c == 1:
                    continue  # the inner block: whole cells, exactly counted
                # (in the inner column or row a cell's covered fraction is the other axis's alone)
                blk = node[k + 1][c + 1] - node[k][c + 1]
                blk -= node[k + 1][c]
                blk += node[k][c]
                f = fy[c] if k == 1 else fx[k] if c == 1 else fx[k] * fy[c]
                u = 1.0 - f
                g = self._share(f, u)
                v += g * blk[:, 1]
                g *= g
                w += g * blk[:, 2]
                e += f * blk[:, 0]
                r += u * blk[:, 0]
                u *= u
                q += u * blk[:, 3]
        return rows, (v, w, e, r, q)


def _coarse_map(held: np.ndarray) -> np.ndarray:
    """Flat (COARSE + 1)² prefix table of the COARSE × COARSE cells that meet a held cell of an (nx, ny) grid
    over the same bounds (cell i spans [i, i + 1)·COARSE/n: coarse cells ⌊i·C/n⌋ … ⌈(i + 1)·C/n⌉ − 1)."""
    nx, ny = held.shape
    ix, iy = np.nonzero(held > 0)
    occ = np.zeros((COARSE, COARSE))
    x0, x1 = ix * COARSE // nx, -(-(ix + 1) * COARSE // nx)
    y0, y1 = iy * COARSE // ny, -(-(iy + 1) * COARSE // ny)
    for a, b, c, d in zip(x0.tolist(), x1.tolist(), y0.tolist(), y1.tolist(), strict=True):
        occ[a:b, c:d] = 1.0
    p = np.zeros((COARSE + 1, COARSE + 1))
    np.cumsum(np.cumsum(occ, axis=0), axis=1, out=p[1:, 1:])
    return p.ravel()


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


def spread_of(synopsis, cls: type[CellSpread] = CellSpread) -> CellSpread:
    """The spreading error of a grid release: its own cells, or its leaves (:func:`leaf_squares`) with their
    released counts (``cls``: a CellSpread of another model of a cut cell, for benches that try one)."""
    bounds = synopsis.region.bounds_m
    law = getattr(synopsis.noise_model(), "law", None)
    cell_sd = float(np.sqrt(law.variance)) if law is not None else 0.0  # one law on every cell or leaf
    leaves = leaf_squares(synopsis)
    if leaves is None:
        hb = "branching" in (getattr(synopsis, "_extra", None) or {})
        return cls([synopsis.values], bounds, "hb" if hb else "grid", cell_sd=cell_sd)
    x0, y0, w = leaves
    count = synopsis.answer(np.stack([x0, y0, x0 + w, y0 + w], axis=1))
    kind = "tree" if "leaf_depth" in getattr(synopsis, "arrays", {}) else "ag"
    return cls.of_leaves(x0 + w / 2, y0 + w / 2, w, count, bounds, kind, cell_sd)


def widen(iv: Intervals, est: np.ndarray, spread: CellSpread | None, boxes: np.ndarray, level: float = 0.95,
          factor: float = 1.0, halfwidths: tuple[np.ndarray, np.ndarray] | None = None) -> Intervals:
    """The noise model's interval widened by the spreading error (``factor`` × the spread's half-widths, for
    answers scaled from the spread's counts; ``halfwidths``: the spread's (below, above) where the caller has
    them already): each side's two half-widths added by :func:`add_halfwidths`. NaN bounds (no interval)
    stay NaN."""
    if spread is None or not iv.known:
        return iv
    below, above = spread.halfwidths(boxes, level) if halfwidths is None else halfwidths
    noise = iv.noise or (np.maximum(est - iv.lower, 0.0), np.maximum(iv.upper - est, 0.0))
    lower = est - add_halfwidths(np.maximum(est - iv.lower, 0.0), factor * below)
    upper = est + add_halfwidths(np.maximum(iv.upper - est, 0.0), factor * above)
    # the spread partly recurs from release to release where the same venues are cut (series sums take it
    # as correlated, dpcore.queries.series), so only the noise is the releases' own, independent part
    return Intervals(lower, upper, f"{iv.method}; widened by {spread.method}", noise)
