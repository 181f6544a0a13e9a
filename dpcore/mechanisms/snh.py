"""Spatial Neural Histograms (SNH): Zeighami, Ahuja, Ghinita, Shahabi, VLDB 2022.

Method (only step 1 reads data):

1. **Data collection.** ``data_collection="grid"`` (the paper's): an equi-width grid of cell width ρ
   over the (public) region with discrete Laplace noise of scale sensitivity/ε on every cell.
   ``"pyramid"`` (beyond the paper): noisy grids at three quadtree levels G/16, G/4, G
   (G = the power of two nearest 4·side/ρ; ε split 1 : 2 : 2), combined into one (G, G) estimate by
   inverse-variance consistency and coarse-to-fine Wiener shrinkage (:func:`pyramid_estimate`,
   post-processing). ``"auto"`` (default): the pyramid when ρ comes from ParamSelect — on Gowalla NYC
   it lowered SNH's error in all 12 measured cells (bench/README.md) — and the paper's grid when the
   caller fixes ``cell_width_m`` (the 4× finer rule is tied to ParamSelect's ρ; on smooth synthetic
   data at a caller-chosen fine ρ the pyramid was not better). Every level's cells are disjoint, so its L1 sensitivity
   is the per-unit contribution bound: k (``max_points_per_user``) under user-level privacy, 1 under
   record-level. When ρ is not given it is chosen by ParamSelect from public inputs (ε, the
   sensitivity, the public region, and n): n is ``public_total`` when the caller declares one,
   otherwise a noisy total paid with 1% of ε, and up to ``total_fraction`` only when 1% is too coarse
   (sensitivity k; dpcore.paramselect.public_n_for_fit) — the ledger says which.
   **Public denoiser** (``denoiser="auto"``, beyond the paper): when the shipped model
   (dpcore.models.pyramid_denoiser, trained only on public datasets) was not trained on data of this
   region, the pyramid is taken at the model's fixed grid (128², so no ρ and no paid n are needed) and
   its estimate is replaced by the model's output: a U-Net that has learned from simulated releases of
   public cities what a city's density looks like under this noise. Post-processing of the noisy
   levels; the nets then learn from its output. Two guards with the denoiser, also post-processing: the pyramid's total
   takes in the caller's already-paid sample size n̂ (user level: dpcore.privacy.scaling) or a record-level
   ``public_total`` by inverse variance (:func:`known_total`), and the denoised grid's blocks are capped
   at their own levels' combined counts + ``denoiser_cap_sigmas``·σ (:func:`cap_to_levels`), the
   excess dropped; the manifest says how much. The denoiser is applied only while the release's signal
   n̂·ε/s is below ``denoiser_max_signal`` (:data:`DENOISER_MAX_SIGNAL`): above it the counts alone
   resolve the density better, and the plain pyramid estimate at the model's grid is kept. Where a
   release's signal and privacy unit fall in the band a shipped specialist was trained on
   (``denoiser_bands``, :data:`BAND_DENOISER_PATH`: record level, signal 3,000–40,000), that model
   denoises it instead of the general one; the signal is post-processing, so this choice costs nothing.
2. **Augmentation** (post-processing). For k_s query sides r_i = l + (u − l)(i + ½)/k_s over
   [l, u], the label of every grid-aligned square of side r_i (bottom-left corner on a cell corner)
   is the mass of the (noisy or pyramid) grid it covers: whole cells plus the uniformity share of partly covered cells,
   computed from prefix sums (bilinear interpolation of the prefix table), no loops.
3. **Training** (post-processing). One small MLP per query side, all k_s trained together as one
   batched model (stacked weights + bmm); sine first activation, swish after; Adam; float32; loss
   = absolute error weighted per sample by w/max(y, ψ) (``loss="relative_l1"``: the metric the
   releases are judged by; the default with the pyramid) or the paper's squared error with the same
   weights (``loss="paper"``; the default with the flat grid), with w = the number of *public* workload queries that
   overlap the sample's square (``public_workload`` / ``public_workload_boxes``; w = 1 without one; a
   sample no workload query overlaps gets weight 0, as in the paper) and ψ = 0.1% of n̂,
   where n̂ is a paid estimate, ``public_total`` or the sum of the *noisy* grid (post-processing),
   never the raw n.
   Early stopping on the training loss.
4. **Answering** (post-processing). A query of side r (√(w·h) for rectangles) goes to the net whose
   r_i is nearest, evaluated at the query centre, scaled by (w·h)/r_i². Queries larger than the
   trained range (side > u) are answered from the noisy grid with prefix sums instead, where the
   uniformity assumption is accurate and a net would extrapolate.
   With the pyramid (``answer="auto"``) a query up to u gets a weighted geometric mean of the
   net's answer and the (denoised) grid's, nets^a · grid^(1−a) (``ANSWER_RULES``): on squares of 100 m
   and more the grid resolves more where the signal n̂·ε/s is large (record level), the nets are
   better where it is small (user level); a is set from n̂·ε/s and the query side by
   :func:`blend_nets_weights`, chosen on public data. Without the denoiser the nets answer alone below
   signal 4,000 (:data:`PLAIN_BLEND_MIN_SIGNAL`). The paper's flat grid keeps the paper's nets.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import torch

from dpcore.geo import Region
from dpcore.grid.histogram import (
    answer_boxes,
    block_sum,
    expand,
    prefix_sums,
    shrink_factor,
    split_to_parent,
)
from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError
from dpcore.mechanisms.ug import check_fraction
from dpcore.models.pyramid_denoiser import (
    BAND_DENOISER_PATH,
    DEFAULT_DENOISER_PATH,
    DENOISER_GRID,
    LEVEL_DIVISORS,
    LEVEL_WEIGHTS,
    denoise,
    load_denoiser,
    trained_band,
    usable_for,
)
from dpcore.privacy.budget import Accountant
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance
from dpcore.synopsis.base import PrivacyInfo, Synopsis, SynopsisError

log = logging.getLogger(__name__)

#: ψ = PSI_FRACTION · n (the relative-error floor of the SNH paper and of our metrics).
PSI_FRACTION = 1e-3


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
    return _check_workload(boxes, str(p))


def _check_workload(boxes, source: str) -> np.ndarray:
    b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
    if b.ndim != 2 or b.shape[1] != 4 or b.shape[0] == 0:
        raise MechanismError(f"public workload {source}: need a non-empty (q, 4) array of boxes, got {b.shape}")
    if not np.isfinite(b).all() or (b[:, 2] < b[:, 0]).any() or (b[:, 3] < b[:, 1]).any():
        raise MechanismError(f"public workload {source}: boxes must be finite with xmin ≤ xmax, ymin ≤ ymax")
    return b


def pyramid_upward(noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                   ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Hay et al.'s upward pass (inverse-variance form): for every level g from the finest up to the root,
    the best linear combination z[g] of its own measurement (when that level was measured) and the sum
    of its children's combined estimates, with its variance v[g] (post-processing)."""
    G = max(noisy_levels)
    if G & (G - 1) or any(g & (g - 1) for g in noisy_levels):
        raise MechanismError(f"pyramid levels must be powers of two, got {sorted(noisy_levels)}")
    z = {G: np.asarray(noisy_levels[G], dtype=np.float64)}
    v = {G: np.full((G, G), float(noise_var[G]))}
    g = G
    while g > 1:
        h = g // 2
        agg, agg_var = block_sum(z[g], 2), block_sum(v[g], 2)
        if h in noisy_levels:
            own_var = float(noise_var[h])
            w = agg_var / (agg_var + own_var)
            z[h] = w * np.asarray(noisy_levels[h], dtype=np.float64) + (1 - w) * agg
            v[h] = agg_var * own_var / (agg_var + own_var)
        else:
            z[h], v[h] = agg, agg_var
        g = h
    return z, v


def pyramid_estimate(noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                     kappa: float = 1.0, total_floor: float = 1.0,
                     total: tuple[float, float] | None = None) -> np.ndarray:
    """Combine noisy quadtree levels into one non-negative (G, G) estimate (post-processing only).

    ``noisy_levels[g]`` is a (g, g) noisy histogram for some powers of two g ≤ G (G, the finest, must be
    present); ``noise_var[g]`` its per-cell noise variance.

    1. Upward pass (:func:`pyramid_upward`): every node of every level up to the root gets the best
       linear combination of its own measurement and the sum of its four children's, with its variance.
    2. Downward pass: a node's final estimate P is split among its children as their combined estimates
       made to add up to P (the residual spread evenly), then each child's deviation d from the even
       share P/4 is shrunk by the positive-part Wiener factor max(0, 1 − κ·σ_d²/d²) (σ_d² = ¾ of the
       child's variance): structure that does not stand out from the noise is flattened, significant
       structure — a dense block next to an empty one — is kept. Children are clipped at 0 and rescaled
       to P, so no level adds or loses mass.

    ``total`` = (value, variance) is one more unbiased measurement of the grand total, independent of the
    levels (a user-level release's paid sample size n̂, or a public count with variance 0); it joins the
    root's combination with its inverse-variance weight. The levels' own root is poor at low signal: it
    sums the noise of every coarsest cell (64 of them at G = 128), so at n·ε/s ≈ 50 it is off by ~100%
    where n̂ paid with 10% of ε is off by ~25%.
    """
    G = max(noisy_levels)
    z, v = pyramid_upward(noisy_levels, noise_var)
    root, root_var = float(z[1][0, 0]), float(v[1][0, 0])
    if total is not None:
        value, variance = float(total[0]), float(total[1])
        root = value if variance <= 0 else (root / root_var + value / variance) / (1 / root_var + 1 / variance)
    est = np.array([[max(root, total_floor)]])
    g = 1
    while g < G:
        child = z[2 * g].reshape(g, 2, g, 2)
        parent = est[:, None, :, None]
        child = child + (parent - child.sum(axis=(1, 3), keepdims=True)) / 4.0
        d = child - parent / 4.0
        d_var = 0.75 * v[2 * g].reshape(g, 2, g, 2)
        lam = shrink_factor(d, d_var, kappa)
        c = split_to_parent(np.maximum(parent / 4.0 + lam * d, 0.0), parent)
        est = c.reshape(2 * g, 2 * g)
        g *= 2
    return est


def cap_to_levels(grid: np.ndarray, noisy_levels: dict[int, np.ndarray], noise_var: dict[int, float],
                  sigmas: float) -> tuple[np.ndarray, float]:
    """Cap a (G, G) estimate's block sums at every measured coarser level g < G to z + sigmas·σ, z the
    block's combined measurement (:func:`pyramid_upward`) and σ its standard deviation; the mass above the
    caps is dropped, not moved (post-processing). Returns (capped grid, fraction of mass dropped).

    The public denoiser outputs a distribution learned on other cities; where it puts more in a block
    than the block's own noisy counts allow, the counts are the better witness. Moving the excess
    elsewhere was tried and is worse: it lands in sparse blocks, where the relative error is largest.
    """
    z, v = pyramid_upward(noisy_levels, noise_var)
    G = grid.shape[0]
    out = np.asarray(grid, dtype=np.float64)
    before = float(out.sum())
    # Fine → coarse: a dump into one cell is cut at the smallest block that rules it out, so the larger
    # block around it keeps its other cells' mass.
    for g in sorted((k for k in noisy_levels if k < G), reverse=True):
        b = G // g
        have = block_sum(out, b)
        cap = np.maximum(z[g] + sigmas * np.sqrt(v[g]), 0.0)
        factor = np.where(have > cap, cap / np.maximum(have, 1e-300), 1.0)
        out = out * expand(factor, b)
    return out, (1.0 - float(out.sum()) / before) if before > 0 else 0.0


def release_pyramid(counts: dict[int, np.ndarray], sensitivity: float, level_epsilons: dict[int, float],
                    noise: NoiseSource, kappa: float = 1.0, total: tuple[float, float] | None = None,
                    ) -> tuple[np.ndarray, dict[int, np.ndarray], dict[int, float]]:
    """Discrete Laplace noise at each level's ε (levels in the order given), then :func:`pyramid_estimate`
    (``total``: an independent measurement of the grand total, see there).

    Returns (estimate, noisy levels, per-cell noise variances). The one place SNH's pyramid is noised:
    releases call it with the ε their accountant granted, the public denoiser's training with simulated ε.
    """
    noisy, var = {}, {}
    for g, eps in level_epsilons.items():
        noisy[g] = noise.add_discrete_laplace(counts[g], sensitivity, eps).astype(np.float64)
        var[g] = discrete_laplace_variance(sensitivity / eps)
    return pyramid_estimate(noisy, var, kappa, total=total), noisy, var


def pyramid_size(side_m: float, rho_m: float) -> int:
    """Finest pyramid level G: the power of two nearest to 4·side/ρ (cells ≈ ρ/4), within [16, 512].

    ρ is the flat grid's width from ParamSelect; the pyramid's shrinkage removes the noise that makes
    the flat optimum coarse, so its finest level can be ~4× finer (Gowalla NYC: bench/README.md).
    """
    return int(2 ** int(np.clip(np.round(np.log2(4.0 * side_m / rho_m)), 4, 9)))


#: Training losses (per sample, y = label, ψ = 0.1% of n̂, w = workload weight):
#: ``"paper"``: w·(ŷ − y)²/max(y, ψ), the SNH paper's; ``"relative_l1"``: w·|ŷ − y|/max(y, ψ), the
#: relative error the releases are measured by. The absolute loss fits a local median rather than a
#: mean, so isolated noise peaks and lone venues in sparse areas are not learned as mass: on Gowalla NYC
#: with the pyramid it lowered SNH's error in 12 of 12 cells (ε ∈ {0.05, 0.1, 0.2} × both bands × both
#: privacy units; bench/README.md). With raw noisy labels (the flat grid) the weights 1/max(y, ψ) see the
#: label noise and pull the weighted median low, and on smooth dense data it was worse than the paper's
#: loss (tests/test_snh.py's bumps), so ``"auto"`` (default) takes ``"relative_l1"`` with the pyramid and
#: ``"paper"`` with the flat grid.
LOSSES = ("auto", "relative_l1", "paper")

#: How queries up to the trained side u are answered (larger ones always use the grid): ``"nets"`` (the
#: paper's), ``"grid"`` (prefix sums of the (denoised) grid), ``"geometric"`` (√(nets · grid)),
#: ``"blend"`` (nets^a · grid^(1−a), a from :func:`blend_nets_weights`). ``"auto"``: blend with the
#: pyramid (denoised or not), nets with the paper's flat grid.
ANSWER_RULES = ("auto", "nets", "grid", "geometric", "blend")

#: The blend's nets weight a on squares of 100 m and more, chosen on public data only (the Gowalla sample's
#: Kansas City, Chicago, Boston and Los Angeles, synthetic Milwaukee and Salt Lake City; checked on the
#: Gowalla sample's Austin and San Francisco and the SF taxis with a denoiser not trained on them;
#: bench/README.md, session 7): where the release's signal n̂·ε/s is large the denoised grid resolves what
#: the nets smooth away and answers alone (a = 0; at record level on the SF taxis ×0.46 of the geometric
#: mean's error); where it is small the nets, which shrink towards 0 where the grid spreads noise, keep
#: half the say (a = ½, the geometric mean). Squares under 100 m always get a = ½: on the real cities the
#: grid alone was worse there at every signal (it was better only on the smooth synthetic ones).
BLEND_SMALL_SIDE_M = 100.0
#: ``answer="geometric"``'s weights (small squares, large ones), and those of releases saved before the blend.
GEOMETRIC_NETS_WEIGHTS = (0.5, 0.5)
BLEND_NETS_WEIGHT_SMALL = 0.5
#: (signal at least, nets weight on squares ≥ 100 m), from the largest threshold down; below all: ½.
BLEND_LARGE_STEPS = ((8000.0, 0.0), (1000.0, 0.25))
BLEND_NETS_WEIGHT_LOW_SIGNAL = 0.5


#: Without the public denoiser (the plain pyramid) the nets answer alone below this signal, and the blend's
#: weights apply from it. The plain grid is noisier than the denoised one, so it earns its share later:
#: with the blend from signal 1,000, 100–1000 m squares were up to 17% worse below ~4,000 (Kansas City at
#: 1,800) and 3–56% better above (Kansas City at 7,000; the Gowalla sample's San Francisco at
#: 7,000–28,000 and Austin at 15,000–60,000). The nets alone were 2.5–9.5× worse than the blend on the SF
#: taxis' 100–1000 m at record level (signal 44 k–700 k). Public data only, denoiser off (bench/README.md,
#: session 10).
PLAIN_BLEND_MIN_SIGNAL = 4000.0


def release_signal(estimated_total: float, epsilon: float, sensitivity: float) -> float:
    """A release's signal n̂·ε/s: its collection's estimated total (post-processing; at least 1) times the
    collection's ε over its sensitivity. The denoiser gate and the blend's weights are set by it."""
    return max(float(estimated_total), 1.0) * float(epsilon) / float(sensitivity)


def blend_nets_weights(signal: float, denoised: bool = True) -> tuple[float, float]:
    """The blend's nets weights (squares under 100 m, larger ones) for a release whose signal n̂·ε/s
    (n̂ the noisy grid's total, ε the data collection's, s its sensitivity) is ``signal``; ``denoised``:
    whether the release's pyramid goes through the public denoiser (:data:`PLAIN_BLEND_MIN_SIGNAL`)."""
    if not denoised and signal < PLAIN_BLEND_MIN_SIGNAL:
        return 1.0, 1.0
    large = next((a for threshold, a in BLEND_LARGE_STEPS if signal >= threshold), BLEND_NETS_WEIGHT_LOW_SIGNAL)
    return BLEND_NETS_WEIGHT_SMALL, large


#: ``data_collection`` values: see the module docstring, step 1.
DATA_COLLECTIONS = ("auto", "grid", "pyramid")

#: Finest pyramid levels the public denoiser may be applied at. It is convolutional and learned at 128²
#: (156 m cells on a 20 km region); at 256² (78 m) the same model resolves small squares better on
#: real cities but loses on 100–1000 m ones at low signal (bench/README.md, session 8), so 128 stays the
#: default and 256 is for releases meant for small squares.
DENOISER_GRIDS = (128, 256)

#: The denoised grid's blocks at the measured coarser levels are capped at their combined noisy count + this
#: many standard deviations (:func:`cap_to_levels`). At low signal the shipped denoiser dumps mass into a
#: corner cell far from any data (Gowalla NYC user level, ε = 0.05: all 50 k points in one empty cell);
#: the cap removes it. On the choosing cities (Gowalla sample Kansas City, Chicago, Boston, Los Angeles,
#: which the denoiser never saw) and on NYC, record and user level, ε 0.05–1.6, 4 seeds, the capped grid
#: was as good or better in every cell and band (bench/README.md, session 9). Tighter caps scored better
#: still, but by dropping mass the denoiser had right (c = 1 drops 10% of NYC's record-level mass at
#: ε = 0.05); at 3σ a block's own counts rule the excess out at ~99% one-sided (discrete Laplace tails).
DENOISER_CAP_SIGMAS = 3.0

#: A release whose cap dropped at least this fraction of the mass says so to whoever queries it
#: (:meth:`SNHSynopsis.caveats`): on Gowalla NYC that is user level at small ε, where hotspots are starved.
CAVEAT_DROPPED_FRACTION = 0.10

#: The denoiser is applied only below this signal n̂·ε/s (the pyramid's estimated total × the collection's ε
#: over the sensitivity); at or above it the plain pyramid estimate is the grid. Where the counts pin the
#: density down, the denoiser's learned prior only adds bias: on 1–5 km squares the plain estimate was
#: better in every release above ~14,000 (×0.40–0.98) and on 100–1000 m ones above ~25,000 (×0.87–0.98),
#: and within 2% on 25–100 m. Chosen with a denoiser not trained on them on the SF taxis (1% and 4% of the
#: fleet), the Gowalla sample's Austin and San Francisco, and with the shipped one on the choosing cities
#: and Gowalla NYC; record level, ε 0.05–1.6, 3 seeds (bench/README.md, session 10). User-level releases
#: of these data stay far below it.
DENOISER_MAX_SIGNAL = 25_000.0

#: Name snh's post-processing rules in ParamSelect's row cache, so changing one recomputes the rows it
#: changes: the denoised snh's (answer blend, cap, the paid n̂ in the pyramid's root, the signal gate, the
#: specialist's choice by signal and unit; its weights are keyed by ParamSelect's flow) and
#: the plain pyramid's (the blend from PLAIN_BLEND_MIN_SIGNAL).
BLEND_KEY = "blend:" + ":".join(
    f"{v:g}" for v in (BLEND_SMALL_SIDE_M, BLEND_NETS_WEIGHT_SMALL, *np.ravel(BLEND_LARGE_STEPS),
                       BLEND_NETS_WEIGHT_LOW_SIGNAL))
DENOISED_RULES_KEY = (BLEND_KEY + f"|cap:{DENOISER_CAP_SIGMAS:g}|root:sample_size"
                      f"|max_signal:{DENOISER_MAX_SIGNAL:g}|bands:signal+unit@{DENOISER_GRID}")
PLAIN_RULES_KEY = BLEND_KEY + f"|plain_from:{PLAIN_BLEND_MIN_SIGNAL:g}"

#: Pyramid levels as divisors of G (coarse → fine) and their shares of the budget (one definition, shared
#: with the public denoiser that learns from simulated pyramids).
PYRAMID_DIVISORS = LEVEL_DIVISORS
PYRAMID_WEIGHTS = LEVEL_WEIGHTS


def known_total(data: FitInput) -> tuple[tuple[float, float] | None, str]:
    """An independent measurement (value, variance) of the noised points' total for the pyramid's root,
    with a note for the manifest: a paid sample size the caller hands over, or at record level a public
    total (the region's count, exact). None when there is neither, or a paid size comes without its variance."""
    if data.sample_size is not None and data.sample_size_variance is not None:
        return ((float(data.sample_size), float(data.sample_size_variance)),
                "; its total joined by the already-paid sample size n̂ (inverse-variance)")
    if data.sample_size is None and data.public_total is not None and data.privacy_unit == "record":
        return (float(data.public_total), 0.0), "; its total set to public_total"
    return None, ""


def _check_optional_number(name: str, value, minimum: float, *, inclusive: bool) -> None:
    """None, or a real number (not a bool, not NaN) at least (``inclusive``) or above ``minimum``."""
    if value is None:
        return
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (number and (value >= minimum if inclusive else value > minimum)):
        raise MechanismError(f"{name} must be a number {'≥' if inclusive else '>'} {minimum:g} or None, "
                             f"got {value!r}")


def normalise_xy(xy: np.ndarray, region: Region) -> np.ndarray:
    """Metres → [-1, 1]² over the region (the nets' input)."""
    xmin, ymin, xmax, ymax = region.bounds_m
    out = np.empty_like(xy, dtype=np.float64)
    out[:, 0] = 2 * (xy[:, 0] - xmin) / (xmax - xmin) - 1
    out[:, 1] = 2 * (xy[:, 1] - ymin) / (ymax - ymin) - 1
    return out


class SpatialNeuralHistogram(Mechanism):
    """SNH mechanism. See the module docstring for the method and its privacy accounting.

    Defaults are chosen so a 20 × 20 km release trains in well under 2 minutes on a 2-core CPU
    (``bench/bench_snh.py``: 12–26 s under load): 8 query sides, nets of 3 hidden layers × 64 units,
    sine frequency ω₀ = m/6 for an m × m grid (clipped to [4, 40]), ≤ 40 epochs of 32k samples per
    net, early stopping on the training loss, one CPU training thread. By default the shipped public
    denoiser is used (``denoiser="auto"``) and the pyramid's finest level is its grid (``denoiser_grid``:
    128², or 256² for small squares at record level, see :data:`DENOISER_GRIDS`); where
    it may not be used (its training regions overlap the release's, or ``denoiser="none"``) and
    ``cell_width_m`` is not given, ρ comes from ParamSelect: the identity grid's ρ (the shipped
    table's SNH rows are measured at this choice, not searched over ρ), and with the pyramid ρ only
    sets the finest level, G ≈ 4·side/ρ.
    """

    name = "snh"

    def __init__(self, *, cell_width_m: float | None = None, query_sides_m: tuple[float, float] = (25.0, 1000.0),
                 n_sizes: int = 8, hidden: int = 64, depth: int = 3, omega0: float | None = None, lr: float = 1e-3,
                 batch_size: int = 1024, max_epochs: int = 40, patience: int = 4, samples_per_epoch: int = 32768,
                 total_fraction: float = 0.05, paramselect_model: str | None = None, device: str | None = None,
                 public_workload: str | None = None, public_workload_boxes: list | None = None,
                 data_collection: str = "auto", pyramid_kappa: float = 1.0, loss: str = "auto",
                 denoiser: str = "auto", answer: str = "auto", denoiser_grid: int = DENOISER_GRID,
                 denoiser_cap_sigmas: float | None = DENOISER_CAP_SIGMAS,
                 denoiser_max_signal: float | None = DENOISER_MAX_SIGNAL, denoiser_bands: bool = True):
        self.cell_width_m = cell_width_m
        self.query_sides_m = query_sides_m
        self.n_sizes = n_sizes
        self.hidden = hidden
        self.depth = depth
        self.omega0 = omega0
        self.lr = lr
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.samples_per_epoch = samples_per_epoch
        self.total_fraction = total_fraction
        self.paramselect_model = paramselect_model
        self.device = device
        self.public_workload = public_workload
        self.public_workload_boxes = public_workload_boxes
        self.data_collection = data_collection
        self.pyramid_kappa = pyramid_kappa
        self.loss = loss
        self.denoiser = denoiser
        self.answer = answer
        self.denoiser_grid = denoiser_grid
        self.denoiser_cap_sigmas = denoiser_cap_sigmas
        self.denoiser_max_signal = denoiser_max_signal
        self.denoiser_bands = denoiser_bands

    # -- step 1: the only step that reads data --------------------------------------------------
    def _choose_cell_width(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> tuple[float, str]:
        if self.cell_width_m is not None:
            return float(self.cell_width_m), "cell width given as a public parameter"
        from dpcore.paramselect import cell_width_for_fit

        return cell_width_for_fit(data, acct, noise, mechanism="snh", band=tuple(float(v) for v in self.query_sides_m),
                                  total_fraction=self.total_fraction, model_path=self.paramselect_model)

    def _workload(self, region: Region) -> tuple[np.ndarray | None, str]:
        """The PUBLIC workload that sets the loss weights w (None: w = 1), and a note for the release."""
        if self.public_workload is not None:
            boxes = load_public_workload(self.public_workload, region)
            source = f"file {self.public_workload}"
        elif self.public_workload_boxes is not None:
            boxes = _check_workload(self.public_workload_boxes, "public_workload_boxes")
            source = "public_workload_boxes"
        else:
            return None, "loss weight w = 1 (no public workload)"
        return boxes, (f"loss weight w = number of the {boxes.shape[0]} public workload queries ({source}) "
                       "overlapping each training square: public configuration, no budget")

    def _denoiser_for(self, region: Region) -> tuple[object | None, str]:
        """The public denoiser to apply (None: plain pyramid) and why; decided from public inputs only.

        ``"auto"`` uses the shipped model when the release uses the pyramid (ρ not fixed by the caller),
        the model file is present, and none of its training regions overlaps this region; a path must
        name a model that was not trained on this region (refused otherwise)."""
        if self.denoiser == "none":
            return None, "no denoiser (denoiser='none')"
        if self.denoiser == "auto":
            if self.cell_width_m is not None or self.data_collection == "grid":
                return None, "no denoiser (the paper's flat grid at a given ρ)"
            path = DEFAULT_DENOISER_PATH
            if not path.exists():
                return None, f"no denoiser: {path.name} is not installed"
        else:
            path = Path(self.denoiser)
        model, meta = _read_denoiser(path)
        ok, why = usable_for(meta, region)
        if ok:
            return model, why
        if self.denoiser == "auto":
            return None, f"no denoiser: {why}"
        raise MechanismError(f"denoiser {path}: {why}; a city is never denoised by a model trained on it")

    def _band_denoiser(self, region: Region) -> tuple[object, tuple[float, float, bool]] | None:
        """The shipped specialist that may replace the general denoiser on this region, with its band
        (lowest signal, highest signal, record level only); None where there is none. Public inputs only:
        the default (``denoiser="auto"``, ``denoiser_bands``) at the grid the specialist was measured at,
        and only a model not trained on the region."""
        if self.denoiser != "auto" or not self.denoiser_bands or int(self.denoiser_grid) != DENOISER_GRID:
            return None
        path = BAND_DENOISER_PATH
        if not path.exists():
            return None
        model, meta = _read_denoiser(path)
        band = trained_band(meta)
        if band is None or not usable_for(meta, region)[0]:
            return None
        return model, band

    def _collect_pyramid(self, data: FitInput, acct: Accountant, noise: NoiseSource,
                         rho: float, denoiser=None, specialist=None) -> tuple[np.ndarray, int, str, dict]:
        """Noisy quadtree levels G/16, G/4, G (budget 1 : 2 : 2), combined by :func:`pyramid_estimate`.

        Each level is a partition of the region, so its L1 sensitivity is the per-unit bound; the levels
        compose sequentially and their ε add up to what is left. The combined (G, G) estimate replaces the
        flat noisy grid as the source of SNH's labels and of large-query answers (post-processing).
        ``specialist``: a denoiser (model, (lowest signal, highest signal, record level only)) that replaces
        ``denoiser`` on the releases it was trained for.
        Returns (estimate, G, note, facts for the config: the estimated total before the denoised grid's cap,
        whether the public denoiser was applied, the band of the specialist that was (None: the general
        model or none), the fraction of mass its cap dropped).
        """
        s = float(data.sensitivity)
        G = int(self.denoiser_grid) if denoiser is not None else pyramid_size(data.region.side_m, rho)
        levels = [max(1, G // d) for d in PYRAMID_DIVISORS]
        weights = np.asarray(PYRAMID_WEIGHTS, dtype=np.float64)
        collection_eps = acct.remaining
        level_eps = {}
        for i, (g, share) in enumerate(zip(levels, weights / weights.sum(), strict=True)):
            note = (f"pyramid level {g}x{g} ({data.region.side_m / g:.0f} m cells); disjoint cells, L1 "
                    "sensitivity = per-unit contribution bound")
            level_eps[g] = acct.spend_rest(f"pyramid_{g}", s, note=note) if i == len(levels) - 1 \
                else acct.spend(f"pyramid_{g}", collection_eps * share, s, note=note)
        counts = {g: data.grid_counts(g, g) for g in levels}
        # Only the denoised path takes in a known total: ParamSelect's rows of the plain pyramid were
        # measured without it (their cache key does not name it).
        total, total_note = known_total(data) if denoiser is not None else (None, "")
        est, noisy_levels, noise_var = release_pyramid(counts, s, level_eps, noise, float(self.pyramid_kappa),
                                                       total=total)
        note = (f"data collection: noisy pyramid {levels} (ε shares {list(PYRAMID_WEIGHTS)}), combined "
                f"by inverse-variance consistency and Wiener shrinkage (κ={self.pyramid_kappa:g}){total_note}")
        estimated_total = float(est.sum())
        dropped = 0.0
        band_used = None
        signal = release_signal(estimated_total, collection_eps, s)
        if denoiser is not None and self.denoiser_max_signal is not None and signal >= self.denoiser_max_signal:
            note += (f"; the public denoiser not applied: signal n̂·ε/s = {signal:,.0f} ≥ "
                     f"{self.denoiser_max_signal:,.0f}, where the counts alone resolve the density better")
            denoiser = None
        elif denoiser is not None:
            if specialist is not None:
                model, (low, high, record_only) = specialist
                if low <= signal < high and (data.privacy_unit == "record" or not record_only):
                    denoiser, band_used = model, [low, high]
                    note += (f"; signal n̂·ε/s = {signal:,.0f} is in the band {low:,.0f}–{high:,.0f} the shipped "
                             f"specialist denoiser was trained on{' (record level)' if record_only else ''}, "
                             "so it replaces the general one")
            est = denoise(denoiser, est, noisy_levels, noise_var)
            note += "; then the public denoiser (post-processing of the noisy levels)"
            if self.denoiser_cap_sigmas is not None:
                est, dropped = cap_to_levels(est, noisy_levels, noise_var, float(self.denoiser_cap_sigmas))
                note += (f", its blocks capped at their levels' combined counts + {self.denoiser_cap_sigmas:g}σ "
                         f"({dropped:.1%} of the mass dropped)")
        return est, G, note, {"estimated_total": estimated_total, "denoised": denoiser is not None,
                               "denoiser_band": band_used, "dropped_fraction": dropped}

    def check_params(self) -> None:
        if self.loss not in LOSSES:
            raise MechanismError(f"loss must be one of {sorted(LOSSES)}, got {self.loss!r}")
        if self.cell_width_m is not None:
            if not self.cell_width_m > 0:
                raise MechanismError(f"cell_width_m must be > 0, got {self.cell_width_m}")
        else:
            # total_fraction is only spent when ParamSelect needs a paid n.
            check_fraction(self.total_fraction, "total_fraction")
        if self.data_collection not in DATA_COLLECTIONS:
            raise MechanismError(f"data_collection must be 'auto', 'grid' or 'pyramid', got {self.data_collection!r}")
        if self.answer not in ANSWER_RULES:
            raise MechanismError(f"answer must be one of {list(ANSWER_RULES)}, got {self.answer!r}")
        _check_optional_number("denoiser_cap_sigmas", self.denoiser_cap_sigmas, 0.0, inclusive=True)
        _check_optional_number("denoiser_max_signal", self.denoiser_max_signal, 0.0, inclusive=False)
        if not isinstance(self.denoiser_bands, bool):
            raise MechanismError(f"denoiser_bands must be true or false, got {self.denoiser_bands!r}")
        if self.denoiser_grid not in DENOISER_GRIDS:
            raise MechanismError(f"denoiser_grid must be one of {list(DENOISER_GRIDS)}, got {self.denoiser_grid!r}")
        if self.denoiser_grid != DENOISER_GRID and (self.denoiser == "none" or self.cell_width_m is not None
                                                     or self.data_collection == "grid"):
            raise MechanismError("denoiser_grid sets the grid the public denoiser works on: it needs the pyramid "
                                 "and a denoiser (not denoiser='none', cell_width_m or data_collection='grid')")
        if not isinstance(self.denoiser, str):
            raise MechanismError(f"denoiser must be 'auto', 'none' or a model file path, got {self.denoiser!r}")
        if self.denoiser not in ("auto", "none"):
            if not Path(self.denoiser).exists():
                raise MechanismError(f"denoiser model file {self.denoiser} does not exist")
            if self.data_collection == "grid" or self.cell_width_m is not None:
                raise MechanismError("a denoiser works on the pyramid at its own grid: do not combine it with "
                                     "data_collection='grid' or cell_width_m")
        try:
            lo, hi = (float(v) for v in self.query_sides_m)
            n_sizes = int(self.n_sizes)
        except (TypeError, ValueError) as exc:
            raise MechanismError(f"query_sides_m must be two numbers (l, u) and n_sizes an integer: {exc}") from exc
        query_sides(lo, hi, n_sizes)
        if self.public_workload is not None and self.public_workload_boxes is not None:
            raise MechanismError("give public_workload (a file) or public_workload_boxes, not both")
        if self.public_workload_boxes is not None:
            # Boxes given inline need no region (already metres); a workload file is read in _fit.
            _check_workload(self.public_workload_boxes, "public_workload_boxes")
        if self.public_workload is not None and not Path(self.public_workload).exists():
            # Its contents need the region, but a missing file is known before any budget is reserved.
            raise MechanismError(f"public workload file {self.public_workload} does not exist")

    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> SNHSynopsis:
        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        lo, hi = (float(v) for v in self.query_sides_m)
        sides = query_sides(lo, hi, int(self.n_sizes))
        side = data.region.side_m
        denoiser, denoiser_note = self._denoiser_for(data.region)
        if denoiser is not None:
            # The denoiser works on its own fixed grid and does the smoothing that ParamSelect's ρ would
            # otherwise trade off, so no ρ (and no paid n) is needed.
            G = int(self.denoiser_grid)
            rho, rho_note = side / G, f"finest pyramid level fixed at {G} by the public denoiser"
        else:
            rho, rho_note = self._choose_cell_width(data, acct, noise)
        collection_eps = acct.remaining  # the data collection spends all that is left
        collection = self.data_collection
        if collection == "auto":  # the paper's grid when the caller fixes ρ, else the pyramid
            collection = "grid" if self.cell_width_m is not None else "pyramid"
        if collection == "grid":
            m = max(1, int(round(side / rho)))
            counts = data.grid_counts(m, m)
            eps = acct.spend_rest("cell_counts", data.sensitivity,
                                  note=f"{m}x{m} grid (ρ={side / m:.1f} m); disjoint cells, L1 sensitivity = "
                                       "per-unit contribution bound")
            noisy = noise.add_discrete_laplace(counts, data.sensitivity, eps).astype(np.float64)
            noisy_total = float(noisy.sum())
            collection_note = "data collection: one flat noisy grid (the paper's)"
            facts = {"estimated_total": noisy_total, "denoised": False, "denoiser_band": None, "dropped_fraction": 0.0}
        else:  # "pyramid"
            specialist = self._band_denoiser(data.region) if denoiser is not None else None
            noisy, m, collection_note, facts = self._collect_pyramid(data, acct, noise, rho, denoiser, specialist)
            noisy_total = facts["estimated_total"]
        # ---- everything below is post-processing of `noisy` ----
        if data.sample_size is not None:
            n_hat = float(data.sample_size)
        elif data.public_total is not None:
            n_hat = float(data.public_total)
        else:
            n_hat = max(noisy_total, 1.0)
        psi = PSI_FRACTION * n_hat
        # The sine layer's frequency sets the finest detail the nets can draw; scale it with the grid
        # (ω₀ ≈ m/6: ~8 for a 50-cell grid, tuned on Gowalla NYC and synthetic bumps) unless given.
        omega0 = float(self.omega0) if self.omega0 is not None else float(np.clip(m / 6.0, 4.0, 40.0))
        loss = self.loss if self.loss != "auto" else ("relative_l1" if collection == "pyramid" else "paper")
        answer_rule = self.answer if self.answer != "auto" else ("blend" if collection == "pyramid" else "nets")
        # The collection's estimated total (post-processing; before the denoised grid's cap) is the size of
        # the data the noise was added to: the bounded sample at user level, which n̂ for ψ need not be
        # (public_total is the full data's).
        signal = release_signal(noisy_total, collection_eps, float(data.sensitivity))
        nets_weights = {"geometric": GEOMETRIC_NETS_WEIGHTS,
                        "blend": blend_nets_weights(signal, facts["denoised"])}.get(answer_rule)
        if nets_weights is not None:
            answer_note = (f"queries up to {hi:g} m answered by {answer_rule}: nets^a · grid^(1−a) with a = "
                           f"{nets_weights[0]:g} under {BLEND_SMALL_SIDE_M:g} m, {nets_weights[1]:g} above "
                           f"(signal n̂·ε/s = {signal:.3g})")
        else:
            answer_note = f"queries up to {hi:g} m answered by {answer_rule}"
        workload, workload_note = self._workload(data.region)
        device_ = _device(self.device)
        seed = int(noise.rng.integers(0, 2**63 - 1))  # non-published randomness: init + shuffling
        gen = torch.Generator().manual_seed(seed)
        net, scales, train = train_snh(noisy, data.region, sides, psi, hidden=int(self.hidden),
                                       depth=int(self.depth), omega0=omega0, lr=float(self.lr),
                                       batch_size=int(self.batch_size), max_epochs=int(self.max_epochs),
                                       patience=int(self.patience), samples_per_epoch=int(self.samples_per_epoch),
                                       device=device_, generator=gen, workload=workload, loss=loss)
        n_source = ("paid sample-size estimate" if data.sample_size is not None
                    else "public_total" if data.public_total is not None else "noisy grid sum")
        notes = [rho_note, collection_note, denoiser_note, f"ψ = 0.1% of n̂ = {psi:.3g} (n̂ from {n_source})", f"training loss {loss}",
                 "augmentation, training and answering are post-processing of the noisy grid", workload_note,
                 f"trained {train['epochs']} epochs in {train['seconds']:.1f} s on {device_}",
                 answer_note]
        params = {**self.get_params(), "query_sides_m": [lo, hi]}  # JSON-native, so save/load round-trips
        if self.public_workload_boxes is not None:
            params["public_workload_boxes"] = np.asarray(self.public_workload_boxes, dtype=np.float64).tolist()
        privacy = self.privacy_info(data, acct, noise, notes, params=params)
        config = {"sides_m": sides.tolist(), "hidden": int(self.hidden), "depth": int(self.depth),
                  "omega0": omega0, "label_scales": scales.tolist(), "grid_size": m,
                  "cell_width_m": side / m, "psi": psi, "query_sides_m": [lo, hi], "training": train,
                  "data_collection": collection, "loss": loss, **facts,
                  "answer": answer_rule, "signal": signal}
        if nets_weights is not None:
            config["nets_weights"] = list(nets_weights)
        return SNHSynopsis(noisy, net, config, data.region, privacy)


@functools.lru_cache(maxsize=4)
def _load_denoiser(path: str, mtime_ns: int):
    """A denoiser file read once per process and version (``mtime_ns`` makes a retrained file a new entry)."""
    return load_denoiser(path)


def _read_denoiser(path: Path):
    """(model, metadata) of a denoiser file from the per-process cache, so a fit reads neither file again;
    an unreadable or malformed file is reported as a MechanismError."""
    try:
        return _load_denoiser(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise MechanismError(f"cannot read denoiser model {path}: {exc}") from exc


def _device(device: str | None) -> torch.device:
    from dpcore.models.snh_net import pick_device

    return pick_device(device)


def train_snh(noisy: np.ndarray, region: Region, sides: np.ndarray, psi: float, *, hidden: int = 64,
              depth: int = 3, omega0: float = 8.0, lr: float = 1e-3, batch_size: int = 1024,
              max_epochs: int = 40, patience: int = 4, samples_per_epoch: int = 32768,
              device: torch.device | None = None, generator: torch.Generator | None = None,
              workload: np.ndarray | None = None, loss: str = "relative_l1"):
    """Augment the noisy grid and train the k_s nets together. Returns (net, label_scales, info).

    ``workload``: PUBLIC (q, 4) boxes in metres; each sample's loss weight is multiplied by the number of
    them overlapping its square (:func:`workload_overlaps`). None: every sample counts once.

    Labels of net i are divided by a scale s_i (mean |label|, at least ψ) so every net regresses
    values of order 1; the loss weight s_i²/max(y, ψ) makes the normalised loss equal the paper's
    w/max(y, ψ)-weighted MSE on raw counts, up to a global constant.
    """
    from dpcore.models.snh_net import BatchedSineSwishMLP, TrainConfig, train_batched

    if loss not in ("relative_l1", "paper"):
        raise MechanismError(f"loss must be 'relative_l1' or 'paper', got {loss!r}")
    device = device or _device(None)
    generator = generator or torch.Generator().manual_seed(0)
    inputs, targets, weights, scales = [], [], [], []
    for r in sides:
        centres, labels = augment(noisy, region, float(r))
        s = max(float(np.mean(np.abs(labels))), psi, 1e-9)
        # In units of the normalised labels y/s: s²·(·)² or s·|·| gives back the loss on raw counts.
        w = (s * s if loss == "paper" else s) / np.maximum(labels, psi)
        if workload is not None:
            w = w * workload_overlaps(noisy.shape, region, float(r), workload)
        inputs.append(normalise_xy(centres, region).astype(np.float32))
        targets.append((labels / s).astype(np.float32))
        weights.append(w.astype(np.float32))
        scales.append(s)
    # One global normalisation of the weights keeps Adam's effective step the same across datasets.
    w_mean = float(np.mean(np.concatenate(weights)))
    if not w_mean > 0:
        raise MechanismError("the public workload overlaps no training square of the region")
    weights = [w / w_mean for w in weights]
    net = BatchedSineSwishMLP(len(sides), 2, hidden, depth, omega0, generator=generator)
    cfg = TrainConfig(lr=lr, batch_size=batch_size, max_epochs=max_epochs, patience=patience,
                      samples_per_epoch=samples_per_epoch, loss="mse" if loss == "paper" else "l1")

    def _progress(epoch: int, loss: float) -> None:
        log.info("snh epoch %d/%d loss %.5g", epoch, max_epochs, loss)

    res = train_batched(net, inputs, targets, weights, cfg, device, generator, progress=_progress)
    info = {"epochs": res.epochs, "losses": [float(v) for v in res.losses], "seconds": res.seconds,
            "stopped_early": res.stopped_early, "samples_per_size": [int(a.shape[0]) for a in inputs],
            "weighted_by_workload": workload is not None,
            "zero_weight_samples": [int(np.count_nonzero(w == 0)) for w in weights]}
    return net.cpu(), np.asarray(scales), info


class SNHSynopsis(Synopsis):
    """Noisy grid + k_s trained nets. Saves as weights (npz, no pickle) + config; loads without training."""

    kind = "snh"

    def __init__(self, noisy: np.ndarray, net, config: dict, region: Region, privacy: PrivacyInfo):
        self.noisy = np.asarray(noisy, dtype=np.float64)
        self.net = net
        self.config = dict(config)
        self.region = region
        self.privacy = privacy
        self.sides = np.asarray(config["sides_m"], dtype=np.float64)
        self.scales = np.asarray(config["label_scales"], dtype=np.float64)
        self._prefix = prefix_sums(self.noisy)
        self._device = _device(None)
        self.net.to(self._device)
        self.net.eval()

    @property
    def training_losses(self) -> list[float]:
        return list(self.config.get("training", {}).get("losses", []))

    def answer(self, boxes: np.ndarray) -> np.ndarray:
        from dpcore.models.snh_net import predict_grouped

        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        if b.shape[1] != 4:
            raise SynopsisError(f"boxes must have shape (q, 4), got {b.shape}")
        w = np.maximum(b[:, 2] - b[:, 0], 0.0)
        h = np.maximum(b[:, 3] - b[:, 1], 0.0)
        area = w * h
        r = np.sqrt(area)
        out = np.empty(b.shape[0], dtype=np.float64)
        large = r > self.config["query_sides_m"][1]
        if large.any():
            out[large] = answer_boxes(self._prefix, self.region.bounds_m, b[large])
        small = np.flatnonzero(~large)
        rule = self.config.get("answer", "nets")  # releases saved before the rule existed used the nets
        if small.size and rule == "grid":
            out[small] = answer_boxes(self._prefix, self.region.bounds_m, b[small])
        elif small.size:
            which = np.abs(r[small, None] - self.sides[None, :]).argmin(axis=1)
            centres = np.stack([(b[small, 0] + b[small, 2]) / 2, (b[small, 1] + b[small, 3]) / 2], axis=1)
            pred = predict_grouped(self.net, normalise_xy(centres, self.region).astype(np.float32), which,
                                   self._device)
            nets = pred * self.scales[which] * area[small] / self.sides[which] ** 2
            if rule in ("geometric", "blend"):
                # Releases saved before the blend stored no weights: theirs is the geometric rule.
                small_w, large_w = self.config.get("nets_weights", GEOMETRIC_NETS_WEIGHTS)
                a = np.where(r[small] < BLEND_SMALL_SIDE_M, small_w, large_w)
                grid = answer_boxes(self._prefix, self.region.bounds_m, b[small])
                # 0^0 = 1, so a = 0 gives the grid even where the nets say 0.
                nets = np.maximum(nets, 0.0) ** a * np.maximum(grid, 0.0) ** (1.0 - a)
            out[small] = nets
        return out

    def caveats(self) -> list[str]:
        dropped = float(self.config.get("dropped_fraction", 0.0))  # releases saved before it recorded none
        if dropped < CAVEAT_DROPPED_FRACTION:
            return []
        return [f"the public denoiser's cap dropped {dropped:.0%} of this release's mass (its noisy counts could "
                "not place it), so its counts are low, most of all in dense areas; for hotspots release with "
                "--param denoiser=none (README: 'Caveat')"]

    def density(self, nx: int, ny: int | None = None) -> np.ndarray:
        """Counts on an (nx, ny) grid: each cell answered as a range query (nets or grid by cell size)."""
        ny = nx if ny is None else ny
        xmin, ymin, xmax, ymax = self.region.bounds_m
        ex = np.linspace(xmin, xmax, nx + 1)
        ey = np.linspace(ymin, ymax, ny + 1)
        x0, y0 = np.meshgrid(ex[:-1], ey[:-1], indexing="ij")
        x1, y1 = np.meshgrid(ex[1:], ey[1:], indexing="ij")
        boxes = np.stack([x0.ravel(), y0.ravel(), x1.ravel(), y1.ravel()], axis=1)
        return self.answer(boxes).reshape(nx, ny)

    def extra_meta(self) -> dict:
        return {"config": self.config}

    def _save_arrays(self, directory: Path) -> list[str]:
        np.savez_compressed(directory / "snh_grid.npz", values=self.noisy)
        np.savez(directory / "snh_weights.npz", **self.net.state_arrays())
        return ["snh_grid.npz", "snh_weights.npz"]

    @classmethod
    def _load_arrays(cls, directory: Path, meta: dict, region: Region, privacy: PrivacyInfo) -> SNHSynopsis:
        from dpcore.models.snh_net import BatchedSineSwishMLP

        config = meta["extra"]["config"]
        with np.load(directory / "snh_grid.npz") as z:
            noisy = z["values"]
        with np.load(directory / "snh_weights.npz") as z:
            arrays = {k: z[k] for k in z.files}
        net = BatchedSineSwishMLP(len(config["sides_m"]), 2, int(config["hidden"]), int(config["depth"]),
                                  float(config["omega0"]))
        net.load_state_arrays(arrays)
        return cls(noisy, net, config, region, privacy)

