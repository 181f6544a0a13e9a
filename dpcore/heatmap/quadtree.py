"""DP heatmaps (Ghazi et al., "Differentially Private Heatmaps", AAAI 2023): the building blocks.

Pipeline, all vectorised (no loop over points, users or cells; the only Python loop is over the
log2(Δ) tree levels):

1. **User-normalised input** (:func:`user_normalised_grid`). Each user's points inside the region
   become a distribution over the Δ × Δ pixel grid with total mass 1 (a user with m points puts
   c/m on a pixel holding c of them). The target heatmap is the sum of these distributions. Adding
   or removing one user changes the aggregate by a non-negative vector of L1 norm ≤ 1 — at *every*
   level of the quadtree, because a node's mass is the sum of its pixels. So each level's node
   masses have L1 sensitivity 1, whatever the number of points per user: no contribution bound k
   is needed for this mechanism.

   Published noise must not be float Laplace (Mironov 2012), so masses are held as integers in
   units of 1/Q (``quantum`` Q, default 2^20): a user's share of a pixel is ⌊Q·c/m⌋ units. Every
   user still contributes at most Q units per level, so the L1 sensitivity in units is exactly Q,
   i.e. 1 in mass, and *discrete* Laplace of scale Q/ε_level on the integer unit counts is the
   ε_level-DP Laplace mechanism. Flooring loses < (pixels of the user)/Q mass per user: invisible.

2. **Quadtree with top-w truncation** (:func:`measure_quadtree`). Level j (1 ≤ j ≤ L = log2 Δ)
   has 2^j × 2^j nodes. Level 1 measures the root's 4 children; at each level the top-w nodes by
   noisy mass are kept, and only their children are measured at the next level. Which nodes are
   measured depends only on earlier *noisy* output, so measuring a level is one Laplace mechanism
   on that level's node vector (of which only some coordinates are looked at) with sensitivity 1:
   the levels compose sequentially to Σ ε_j = ε. The root (level 0, mass = number of users, which is
   private) is never measured and never used.

3. **Reconstruction** (:func:`reconstruct`): the non-negative pixel vector x, supported on the
   kept leaves, whose node sums best match the noisy kept nodes. ``method="lp"`` solves the paper's
   linear program min Σ_v ε_v·|ŷ_v − Σ_{p∈v} x_p| with SciPy's HiGHS (the ε_v weights make it the
   maximum-likelihood fit under Laplace noise of level-dependent scale; with a uniform split they
   are all equal, i.e. the paper's LP); ``method="nnls"`` does weighted least squares with x ≥ 0
   (scipy ``lsq_linear``). Everything outside the kept leaves is zero. Post-processing: no budget.

4. **Rendering** (:func:`render_heatmaps`): released beside true, PNG via matplotlib's Agg backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog, lsq_linear

from dpcore import GeoDPError
from dpcore.grid.histogram import flat_cell_index
from dpcore.heatmap.mass import person_mass
from dpcore.privacy.budget import Accountant, split_epsilon
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import AnswerUnit, GridSynopsis

DEFAULT_QUANTUM = 1 << 20
LEVEL_SPLITS = ("uniform", "geometric")


class HeatmapError(GeoDPError, ValueError):
    pass


def check_resolution(resolution: int, power_of_two: bool = True) -> int:
    """Δ must be a positive int (a power of two ≥ 2 for the quadtree)."""
    try:
        d = int(resolution)
    except (TypeError, ValueError) as exc:
        raise HeatmapError(f"resolution must be an integer, got {resolution!r}") from exc
    if d != resolution or d < 1 or d > 4096:
        raise HeatmapError(f"resolution must be an integer in [1, 4096], got {resolution!r}")
    if power_of_two and (d < 2 or d & (d - 1)):
        raise HeatmapError(f"the quadtree needs a power-of-two resolution ≥ 2 (64, 128, 256, ...), got {d}")
    return d


# ---------------------------------------------------------------------------------------------
# 1. user-normalised input
# ---------------------------------------------------------------------------------------------
def _pixel_index(x: np.ndarray, y: np.ndarray, bounds: tuple[float, float, float, float],
                 resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat pixel index ix·Δ + iy, inside mask) of points; points outside bounds are masked out."""
    return flat_cell_index(x, y, bounds, resolution, resolution)


def user_normalised_grid(x: np.ndarray, y: np.ndarray, user: np.ndarray | None,
                         bounds: tuple[float, float, float, float], resolution: int,
                         quantum: int | None = DEFAULT_QUANTUM) -> np.ndarray:
    """Sum over users of each user's distribution over the (Δ, Δ) grid, indexed [ix, iy].

    ``quantum=Q`` returns int64 masses in units of 1/Q with each user's share floored (≤ Q units per
    user, the integer form used under noise); ``quantum=None`` returns exact float64 masses (for
    evaluation truth). ``user=None`` means every point is its own unit (record-level privacy).
    Points outside ``bounds`` are ignored; a user's mass is spread over their points *inside*.
    """
    d = int(resolution)
    pix, inside = _pixel_index(x, y, bounds, d)
    if user is not None:
        user = np.asarray(user)[inside]
        if user.size != pix.size:
            raise HeatmapError("user must have one entry per point")
    cells, mass = person_mass(pix, user, d * d, quantum)
    grid = np.zeros(d * d)
    grid[cells] = mass
    grid = grid.reshape(d, d)
    if quantum is None:
        return grid
    # Masses are integers ≤ Q·n_users < 2^53, so the float sums above are exact.
    return np.rint(grid).astype(np.int64)


def pyramid(leaf: np.ndarray) -> list[np.ndarray]:
    """[level 0 (1×1), level 1 (2×2), ..., level L (Δ×Δ)] node masses of the quadtree over ``leaf``."""
    levels = [np.asarray(leaf)]
    while levels[-1].shape[0] > 1:
        a = levels[-1]
        h = a.shape[0] // 2
        levels.append(a.reshape(h, 2, h, 2).sum(axis=(1, 3)))
    return levels[::-1]


# ---------------------------------------------------------------------------------------------
# 2. noisy quadtree with top-w truncation
# ---------------------------------------------------------------------------------------------
def level_epsilons(epsilon: float, n_levels: int, split: str | float | list[float] = "uniform") -> list[float]:
    """ε_1..ε_L for the tree levels; they sum to ε (up to float round-off).

    ``"uniform"``: ε/L each (the paper's choice). ``"geometric"``: weight 2^{j/3} for level j, shifting
    budget toward deep levels. A number r: weight r^{j−1} (r < 1 favours the coarse levels, which
    matter most for EMD; r > 1 the fine ones, which matter for pixel-wise scores). A list gives
    explicit positive weights, one per level. Only ε and the public resolution enter: never the data.
    """
    if n_levels < 1:
        raise HeatmapError("the tree needs at least one level")
    if isinstance(split, str):
        try:
            split = float(split)
        except ValueError:
            pass
    if isinstance(split, str):
        if split == "uniform":
            weights = [1.0] * n_levels
        elif split == "geometric":
            weights = [2.0 ** (j / 3.0) for j in range(1, n_levels + 1)]
        else:
            raise HeatmapError(f"level split must be one of {LEVEL_SPLITS}, a ratio or a list of weights, "
                               f"got {split!r}")
    elif isinstance(split, int | float):
        r = float(split)
        if not (np.isfinite(r) and r > 0):
            raise HeatmapError(f"level split ratio must be a positive number, got {split!r}")
        weights = [r ** j for j in range(n_levels)]
    else:
        weights = [float(w) for w in split]
        if len(weights) != n_levels or any(not np.isfinite(w) or w <= 0 for w in weights):
            raise HeatmapError(f"level split needs {n_levels} positive weights, got {split!r}")
    parts = split_epsilon(epsilon, {f"level_{j + 1}": w for j, w in enumerate(weights)})
    return [parts[f"level_{j + 1}"] for j in range(n_levels)]


def choose_depth(n_hat: float, epsilon: float, max_levels: int, w: int,
                 split: str | float | list[float] = "uniform", signal_to_noise: float = 1.0) -> int:
    """Deepest level D ≤ max_levels worth measuring, from a *noisy* user count n̂ (post-processing).

    Spreading ε over D levels puts noise of scale 1/ε_j on each of the (at most min(4^j, w)) nodes
    kept at level j, so the kept nodes of all levels carry about Σ_j min(4^j, w)/ε_j of noise mass
    against n̂ of signal. D is the largest depth with Σ_j min(4^j, w)/ε_j ≤ n̂ / signal_to_noise
    (at least 1). With few users or a small ε this stops the tree after 2–3 levels and gives them
    the whole budget, instead of drowning every level in noise (the paper's fixed-depth split
    fails there); a deeper tree is only chosen when every one of its levels keeps enough budget.
    """
    best = 1
    for depth in range(1, max_levels + 1):
        split_d = split[:depth] if isinstance(split, list) else split
        eps_d = level_epsilons(epsilon, depth, split_d)
        noise_mass = sum(min(4.0 ** (j + 1), float(w)) / e for j, e in enumerate(eps_d))
        if noise_mass <= max(n_hat, 0.0) / signal_to_noise:
            best = depth
    return best


@dataclass
class NoisyQuadtree:
    """What the noisy measurement released: per level, the kept nodes and their noisy masses.

    ``kept[j]`` is an (m_j, 2) int array of [ix, iy] at level j+1 (level 1 first); ``noisy[j]`` the
    noisy masses (in users) of those nodes; ``epsilons[j]`` the budget of that level.
    """

    resolution: int
    w: int
    epsilons: list[float]
    kept: list[np.ndarray] = field(default_factory=list)
    noisy: list[np.ndarray] = field(default_factory=list)
    measured: list[int] = field(default_factory=list)
    #: (noisy root mass, ε) when the root was measured (to choose the depth), else None.
    root: tuple[float, float] | None = None
    #: Second measurement of the pruned tree's leaves with the budget of the levels never reached:
    #: (level, nodes, noisy masses, ε) per terminal level.
    remeasured: list[tuple[int, np.ndarray, np.ndarray, float]] = field(default_factory=list)

    @property
    def n_levels(self) -> int:
        return len(self.epsilons)


def _children(nodes: np.ndarray) -> np.ndarray:
    """(4m, 2) children [2i+a, 2j+b] of (m, 2) nodes."""
    off = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.int64)
    return (2 * nodes[:, None, :] + off[None, :, :]).reshape(-1, 2)


def measure_quadtree(leaf_units: np.ndarray, w: int, level_eps: list[float], quantum: int,
                     noise: NoiseSource | None, acct: Accountant | None = None,
                     threshold_factor: float = 0.0, reserve_epsilon: float = 0.0) -> NoisyQuadtree:
    """Noisy top-w descent of the quadtree over ``leaf_units`` (int64 masses in units of 1/Q).

    At each level the children of the previous level's kept nodes are measured and the top-``w``
    by noisy mass are kept, among those whose noisy mass is at least ``threshold_factor / ε_j``
    (θ times the level's noise scale in user mass; 0 keeps plain top-w, the paper's rule). The
    threshold is public (ε and θ only), so it is post-processing of the level's noisy vector; it
    stops the descent where noise dominates instead of keeping w nodes of pure noise, whose
    selection bias (the top of many Laplace draws is far above zero) would add spurious mass.

    ``reserve_epsilon`` (on top of the level budgets) is spent after the descent on measuring the
    pruned tree's leaves a second time, together with the budget of any level never reached.

    ``noise=None`` measures exactly (no noise, no charge): for tests of the reconstruction only.
    With an accountant, each level is charged ε_j at L1 sensitivity 1 (user mass) before its noise.
    """
    if reserve_epsilon < 0:
        raise HeatmapError("reserve_epsilon must be ≥ 0")
    d = leaf_units.shape[0]
    levels = pyramid(leaf_units)
    n_levels = len(level_eps)
    if not 1 <= n_levels <= len(levels) - 1:
        raise HeatmapError(f"the tree has {len(levels) - 1} levels; got {n_levels} level budgets")
    w = int(w)
    if w < 1:
        raise HeatmapError(f"w (nodes kept per level) must be ≥ 1, got {w}")
    tree = NoisyQuadtree(d, w, list(level_eps))
    parents = np.zeros((1, 2), dtype=np.int64)  # the root
    for j in range(1, n_levels + 1):
        eps_j = level_eps[j - 1]
        if parents.shape[0] == 0:
            # The descent stopped (no node passed the threshold): deeper levels are not measured,
            # so they read nothing and are not charged; their planned ε_j stays unspent.
            tree.kept.append(parents)
            tree.noisy.append(np.zeros(0))
            tree.measured.append(0)
            continue
        cand = _children(parents)
        true_units = levels[j][cand[:, 0], cand[:, 1]]
        if noise is None:
            noisy_units = true_units.astype(np.float64)
        else:
            if acct is not None:
                acct.spend(f"level_{j}", eps_j, 1.0, note=(
                    f"{2 ** j}x{2 ** j} quadtree level, {cand.shape[0]} nodes measured (children of the "
                    f"kept nodes of level {j - 1}); each user adds mass ≤ 1 to a level: L1 sensitivity 1 "
                    f"(= {quantum} integer units); discrete Laplace scale {quantum}/ε_j units"))
            noisy_units = (true_units + noise.discrete_laplace(quantum / eps_j, true_units.shape)).astype(np.float64)
        order = np.argsort(-noisy_units, kind="stable")[:w]
        if threshold_factor > 0:
            order = order[noisy_units[order] >= threshold_factor * quantum / eps_j]
        tree.kept.append(cand[order])
        tree.noisy.append(noisy_units[order] / quantum)
        tree.measured.append(int(cand.shape[0]))
        parents = cand[order]
    unspent = float(reserve_epsilon) + float(sum(level_eps[j] for j in range(n_levels) if tree.measured[j] == 0))
    terms = _terminals(tree)
    if unspent > 0 and terms:
        # The reserve, plus the planned budget of levels the descent never reached, measures the
        # pruned tree's leaves again: they are disjoint nodes, so their mass vector has L1
        # sensitivity 1; which nodes they are depends on noisy output only. The descent needs only
        # to *find* the heavy leaves; this second look makes their values precise.
        n_terms = sum(n.shape[0] for _, n in terms)
        if noise is not None and acct is not None:
            unspent = min(unspent, acct.remaining)
            acct.spend("terminal_nodes", unspent, 1.0, note=(
                f"reserve + budget of levels the descent never reached, re-measuring the {n_terms} leaves of the "
                f"pruned tree (disjoint nodes: L1 sensitivity 1); discrete Laplace scale {quantum}/ε units"))
        for j, nodes in terms:
            true_units = levels[j][nodes[:, 0], nodes[:, 1]]
            if noise is None:
                noisy_units = true_units.astype(np.float64)
            else:
                noisy_units = (true_units + noise.discrete_laplace(quantum / unspent, true_units.shape))
            tree.remeasured.append((j, nodes, np.asarray(noisy_units, dtype=np.float64) / quantum, unspent))
    return tree


# ---------------------------------------------------------------------------------------------
# 3. reconstruction
# ---------------------------------------------------------------------------------------------
RECONSTRUCTION_METHODS = ("lp", "nnls")


def _terminals(tree: NoisyQuadtree) -> list[tuple[int, np.ndarray]]:
    """Kept nodes none of whose children were kept, as (level, (m, 2) nodes): the pruned tree's leaves."""
    out = []
    for j in range(1, tree.n_levels + 1):
        nodes = tree.kept[j - 1]
        if nodes.shape[0] == 0:
            continue
        if j == tree.n_levels:
            out.append((j, nodes))
            continue
        child_parents = tree.kept[j] >> 1
        side = 1 << j
        has_child = np.isin(nodes[:, 0] * side + nodes[:, 1], child_parents[:, 0] * side + child_parents[:, 1])
        if (~has_child).any():
            out.append((j, nodes[~has_child]))
    return out


def _design(tree: NoisyQuadtree) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]:
    """(A, ŷ, row weights, terminals). Rows: kept nodes at every level. Columns: the terminal nodes
    (pixels when the descent reached the bottom, coarser nodes where it stopped), each a block of
    mass spread uniformly over its pixels. A[v, t] = 1 when terminal t lies inside kept node v; every
    ancestor of a kept node is kept (children are measured only under kept parents)."""
    terms = _terminals(tree)
    if not terms:
        return sp.csr_matrix((0, 0)), np.zeros(0), np.zeros(0), terms
    t_level = np.concatenate([np.full(n.shape[0], j) for j, n in terms])
    t_nodes = np.concatenate([n for _, n in terms])
    col_ids = np.arange(t_nodes.shape[0])
    rows, cols, ys, wts = [], [], [], []
    row0 = 0
    for j in range(1, tree.n_levels + 1):
        nodes = tree.kept[j - 1]
        below = t_level >= j
        if nodes.shape[0] == 0 or not below.any():
            continue
        anc = t_nodes[below] >> (t_level[below] - j)[:, None]
        side = 1 << j
        node_key = nodes[:, 0] * side + nodes[:, 1]
        order = np.argsort(node_key)
        node_of_term = order[np.searchsorted(node_key[order], anc[:, 0] * side + anc[:, 1])]
        used, row_of_term = np.unique(node_of_term, return_inverse=True)
        rows.append(row0 + row_of_term)
        cols.append(col_ids[below])
        ys.append(tree.noisy[j - 1][used])
        wts.append(np.full(used.size, tree.epsilons[j - 1]))
        row0 += used.size
    start = 0
    for (j, nodes), (jr, nodes_r, noisy_r, eps_r) in zip(terms, tree.remeasured, strict=False):
        # The re-measured terminals are exactly the columns, in the same order (or there are none).
        if j != jr or nodes.shape != nodes_r.shape:  # pragma: no cover - built together above
            raise HeatmapError("re-measured terminals do not match the pruned tree")
        m = nodes.shape[0]
        rows.append(row0 + np.arange(m))
        cols.append(col_ids[start:start + m])
        ys.append(noisy_r)
        wts.append(np.full(m, eps_r))
        row0 += m
        start += m
    if tree.root is not None:
        rows.append(np.full(t_nodes.shape[0], row0))
        cols.append(col_ids)
        ys.append(np.array([tree.root[0]]))
        wts.append(np.array([tree.root[1]]))
        row0 += 1
    a = sp.csr_matrix((np.ones(sum(r.size for r in rows)), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(row0, t_nodes.shape[0]))
    return a, np.concatenate(ys), np.concatenate(wts), terms


def reconstruct(tree: NoisyQuadtree, method: str = "lp") -> np.ndarray:
    """(Δ, Δ) non-negative masses fitted to the noisy kept nodes; zero outside the kept nodes.

    A terminal node above pixel level (the descent stopped there) spreads its fitted mass uniformly
    over its pixels: with nothing measured below it, uniform is the least-committal choice.
    """
    if method not in RECONSTRUCTION_METHODS:
        raise HeatmapError(f"reconstruction must be one of {RECONSTRUCTION_METHODS}, got {method!r}")
    a, y, wt, terms = _design(tree)
    grid = np.zeros((tree.resolution, tree.resolution))
    if not terms:
        return grid
    n_x, n_r = a.shape[1], a.shape[0]
    if method == "lp":
        # min Σ wt·t  s.t.  A x − t ≤ ŷ,  −A x − t ≤ −ŷ,  x ≥ 0, t ≥ 0.
        eye = sp.identity(n_r, format="csr")
        a_ub = sp.vstack([sp.hstack([a, -eye]), sp.hstack([-a, -eye])], format="csr")
        b_ub = np.concatenate([y, -y])
        c = np.concatenate([np.zeros(n_x), wt])
        res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
        if res.status != 0:  # pragma: no cover - the LP is always feasible and bounded
            raise HeatmapError(f"heatmap LP failed: {res.message}")
        x = res.x[:n_x]
    else:
        sw = np.sqrt(wt)
        res = lsq_linear(sp.diags(sw) @ a, sw * y, bounds=(0, np.inf), method="trf", lsmr_tol="auto")
        x = res.x
    x = np.maximum(x, 0.0)
    start = 0
    for j, nodes in terms:
        f = tree.resolution >> j  # pixels per node side at level j
        xs = x[start:start + nodes.shape[0]] / (f * f)
        start += nodes.shape[0]
        if f == 1:
            grid[nodes[:, 0], nodes[:, 1]] = xs
        else:
            block = grid.reshape(1 << j, f, 1 << j, f)
            block[nodes[:, 0], :, nodes[:, 1], :] = xs[:, None, None]
    return grid


# ---------------------------------------------------------------------------------------------
# the released structure
# ---------------------------------------------------------------------------------------------
class HeatmapSynopsis(GridSynopsis):
    """A released heatmap: a (Δ, Δ) grid of non-negative *user mass* (each user counts 1 in total).

    Range answers (prefix sums, uniformity inside cells) and densities are therefore in users'
    worth of activity, not in points: Σ over users of the fraction of the user's points in the box.
    :meth:`heatmap` gives the normalised distribution that heatmap metrics compare.
    """

    kind = "heatmap"

    def unit(self) -> AnswerUnit:
        return AnswerUnit("people")

    def heatmap(self) -> np.ndarray:
        return normalise(self.values)


def normalise(grid: np.ndarray) -> np.ndarray:
    """Non-negative part scaled to sum 1; an all-zero grid becomes uniform (a release with no mass
    carries no information about where the mass is)."""
    g = np.maximum(np.asarray(grid, dtype=np.float64), 0.0)
    s = g.sum()
    if s <= 0:
        return np.full(g.shape, 1.0 / g.size)
    return g / s


# ---------------------------------------------------------------------------------------------
# 4. rendering
# ---------------------------------------------------------------------------------------------
def render_heatmaps(panels: list[tuple[str, np.ndarray]], path: str | Path, gamma: float = 0.5,
                    suptitle: str | None = None, display_side: int | None = 128) -> Path:
    """Write a PNG with one panel per (title, grid[ix, iy]) side by side (x east, y north).

    Grids finer than ``display_side`` are block-summed to it (a 256² heatmap of check-ins is a few
    bright pixels on a screen-sized figure otherwise). Each panel is normalised to sum 1, its colour
    scale tops out at its 99.9th percentile, and a power law (``gamma`` < 1) lifts faint cells, so
    released and true heatmaps are visually comparable.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import colors
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * len(panels), 3.4), dpi=80)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, grid) in zip(axes, panels, strict=True):
        g = normalise(grid)
        side = g.shape[0]
        if display_side and side > display_side and side % display_side == 0 and g.shape[1] == side:
            f = side // display_side
            g = g.reshape(display_side, f, display_side, f).sum(axis=(1, 3))
        vmax = max(float(np.quantile(g, 0.999)), 1e-12)
        ax.imshow(g.T, origin="lower", cmap="inferno", norm=colors.PowerNorm(gamma, vmin=0.0, vmax=vmax, clip=True),
                  interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
