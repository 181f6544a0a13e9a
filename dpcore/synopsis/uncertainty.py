"""How uncertain a released answer is: 95% intervals for range counts, from the known noise law.

For a linear release — a grid whose cells each carry independent noise of a known law and nothing
else (the identity grid and UG, negatives kept, no scaling) — a range answer is the true count plus
Σ f_ij·N_ij, where f_ij is the fraction of cell (i, j) the box covers. The interval for the true count
is the answer minus the 97.5% and 2.5% quantiles of that sum: computed by Monte Carlo from the exact
law (interior cells, f = 1, add up to a difference of two negative binomials; border cells are drawn
one by one). This reads only the released synopsis and public noise parameters: post-processing.

Post-processed releases whose post-processing is linear in the noise (HB's least-squares consistency,
AG's constrained inference, and auto when it chose one of them or a linear grid) get intervals by a
parametric bootstrap (:func:`bootstrap_intervals`). A PrivTree release is linear in its leaf noise
(each noisy leaf count spread uniformly over its quadrant; the tree's shape is public), so it gets the
same exact-law Monte Carlo over the leaves a box touches, where the release stores its leaves. The
others (snh, clamped releases, PrivTree releases saved before their leaves were) get none, with the
reason.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from dpcore.synopsis.base import GridSynopsis, Synopsis
from dpcore.synopsis.spatiotemporal import SpatioTemporalSynopsis

#: Mechanisms whose released grid is the noisy histogram itself (linear in the noise).
LINEAR_MECHANISMS = ("identity", "ug")


def linear_noise(synopsis: Synopsis) -> tuple[str, float, float] | None:
    """('laplace', scale, quantum) or ('gaussian', σ², 1) of every cell of a linear release, else None
    (quantum: the lattice of the cells' discrete Laplace noise, 1 for integer counts)."""
    if not isinstance(synopsis, GridSynopsis) or type(synopsis) is not GridSynopsis:
        return None
    mechanism, params, charges = _effective(synopsis)
    if mechanism not in LINEAR_MECHANISMS or params.get("clamp_negative"):
        return None
    cells = [c for c in charges if c.get("name") == "cell_counts"]
    if len(cells) != 1:
        return None
    c = cells[0]
    if c.get("noise") == "discrete_gaussian":
        return "gaussian", float(c["sensitivity"]) ** 2 / (2.0 * float(c["rho"])), 1.0
    if c.get("epsilon"):
        return "laplace", float(c["sensitivity"]) / float(c["epsilon"]), float(c.get("quantum") or 1.0)
    return None


def _effective(synopsis: Synopsis) -> tuple[str, dict, list[dict]]:
    """(mechanism, params, charges) of what produced the synopsis: auto's chosen mechanism, with its
    charges' names unprefixed, or the synopsis's own."""
    p = synopsis.privacy
    chosen = p.params.get("chosen") if p.mechanism == "auto" else None
    if isinstance(chosen, dict):
        name = str(chosen.get("mechanism"))
        charges = [{**c, "name": c["name"].split("/", 1)[1]} for c in p.charges
                   if str(c.get("name", "")).startswith(name + "/")]
        return name, dict(chosen.get("params") or {}), charges
    return p.mechanism, dict(p.params), list(p.charges)


def _cover(lo: float, hi: float, n: int, extent: tuple[float, float]) -> np.ndarray:
    """Fraction of each of n cells over ``extent`` that [lo, hi) covers."""
    edges = np.linspace(extent[0], extent[1], n + 1)
    return np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None) / (edges[1] - edges[0])


def _noise_draws(rng: np.random.Generator, w: np.ndarray, kind: str, param: float, draws: int,
                 quantum: float = 1.0) -> np.ndarray:
    """``draws`` samples of Σ w_i·N_i over independent cells or leaves.

    ``kind`` 'gaussian': N_i discrete Gaussian of variance ``param`` (drawn as a normal with the exact
    variance). 'laplace': N_i discrete Laplace of scale ``param`` on the lattice quantum·ℤ (quantum 1:
    integers), from the exact law: the w = 1 terms add up to a difference of two negative binomials,
    the others are drawn one by one.
    """
    if kind == "gaussian":
        return rng.normal(0.0, np.sqrt(param * float(np.sum(w * w))), draws)
    p = -np.expm1(-quantum / param)  # 1 − t, t = exp(−quantum/scale): the law in units of quantum
    full = w >= 1.0 - 1e-12
    n_full = int(full.sum())
    total = (rng.negative_binomial(n_full, p, draws) - rng.negative_binomial(n_full, p, draws)).astype(np.float64) \
        if n_full else np.zeros(draws)
    partial = w[~full]
    if partial.size:
        g = rng.geometric(p, (draws, partial.size)) - rng.geometric(p, (draws, partial.size))
        total = total + g @ partial
    return total * quantum


def _noise_quantiles(rng: np.random.Generator, w: np.ndarray, kind: str, param: float, draws: int,
                     level: float, quantum: float = 1.0) -> np.ndarray:
    """The (1 − level)/2 and (1 + level)/2 quantiles of Σ w_i·N_i (:func:`_noise_draws`); exact normal
    quantiles for Gaussian noise."""
    a = (1.0 - level) / 2.0
    if kind == "gaussian":
        sd = np.sqrt(param * float(np.sum(w * w)))
        return np.array([-1.0, 1.0]) * NormalDist().inv_cdf(1.0 - a) * sd
    return np.quantile(_noise_draws(rng, w, kind, param, draws, quantum), [a, 1 - a])


def _privtree_leaves(synopsis: Synopsis):
    """None unless the synopsis is a PrivTree release; else its leaves' boxes and noise law,
    ((x0, y0, width, height) per leaf, scale, quantum), or the reason ('none: …') it has none."""
    mechanism, params, charges = _effective(synopsis)
    if mechanism != "privtree":
        return None
    if type(synopsis) is not GridSynopsis:
        return f"none: unexpected {type(synopsis).__name__} for privtree"
    if params.get("clamp_negative"):
        return "none: negative counts were clamped to 0 (not linear in the noise)"
    depth, index = synopsis.arrays.get("leaf_depth"), synopsis.arrays.get("leaf_index")
    if depth is None or index is None:
        return ("none: this PrivTree release stores its tree only as a raster (released before its "
                "leaves were stored), not the leaves its noise law needs")
    laws = _laplace_laws(charges, ["leaf_counts"])
    if laws is None:
        return "none: PrivTree leaf noise other than discrete Laplace is not modelled"
    (scale, recorded), = laws
    # Releases made before charges recorded their lattice keep it in the synopsis.
    quantum = recorded if recorded != 1.0 else float(synopsis._extra.get("leaf_noise_quantum", 1.0))
    n = 2 ** depth.astype(np.int64)
    index = index.astype(np.int64)
    xmin, ymin, xmax, ymax = synopsis.region.bounds_m
    wx, wy = (xmax - xmin) / n, (ymax - ymin) / n
    return (xmin + (index // n) * wx, ymin + (index % n) * wy, wx, wy), scale, quantum


def _noise_model(synopsis: Synopsis):
    """How a release's range answers carry noise: (weights, kind, param, quantum, method) where
    ``weights(box)`` are the fractions of the noisy cells or leaves the box covers; or a reason string
    ('none: …'); or None when only a bootstrap through the post-processing can tell."""
    law = linear_noise(synopsis)
    if law is not None:
        kind, param, quantum = law
        xmin, ymin, xmax, ymax = synopsis.region.bounds_m
        nx, ny = synopsis.shape

        def weights(box: np.ndarray) -> np.ndarray:
            fx, fy = _cover(box[0], box[2], nx, (xmin, xmax)), _cover(box[1], box[3], ny, (ymin, ymax))
            return np.outer(fx[fx > 0], fy[fy > 0]).ravel()

        method = (f"exact noise law (discrete Laplace{_lattice_words(quantum)}), Monte Carlo quantiles"
                  if kind == "laplace" else "discrete Gaussian noise, normal quantiles with the exact variance")
        return weights, kind, param, quantum, method
    tree = _privtree_leaves(synopsis)
    if tree is None or isinstance(tree, str):
        return tree
    (x0, y0, wx, wy), param, quantum = tree

    def leaf_weights(box: np.ndarray) -> np.ndarray:  # the fraction of each leaf's quadrant in the box
        f = (np.clip(np.minimum(x0 + wx, box[2]) - np.maximum(x0, box[0]), 0, None) / wx
             * np.clip(np.minimum(y0 + wy, box[3]) - np.maximum(y0, box[1]), 0, None) / wy)
        return f[f > 0]

    return (leaf_weights, "laplace", param, quantum,
            f"exact noise law (discrete Laplace{_lattice_words(quantum)}) over PrivTree's leaves, Monte Carlo "
            "quantiles")


def _lattice_words(quantum: float) -> str:
    return "" if quantum == 1.0 else f" on the 2^{np.log2(quantum):g} lattice"


def query_intervals(synopsis: Synopsis, boxes_m: np.ndarray, level: float = 0.95, draws: int = 4000,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """(lower, upper, method) for each box's true count; NaN bounds where no interval is known.

    A linear grid's answer is the truth plus Σ f·noise over the cells a box covers; a PrivTree
    release's is the same over its leaves (each leaf's noisy count is spread uniformly over its
    quadrant). Both take the exact noise law's Monte Carlo quantiles (:func:`_noise_quantiles`).
    A release scaled to full counts gets :func:`scaled_intervals`."""
    boxes = np.atleast_2d(np.asarray(boxes_m, dtype=np.float64))
    if getattr(synopsis, "kind", None) == "scaled":
        return scaled_intervals(synopsis, boxes, level, draws, seed)
    if isinstance(synopsis, SpatioTemporalSynopsis) and synopsis.window_start_s is not None:
        start = float(synopsis.window_start_s)
        end = start + float(synopsis.slot_seconds) * synopsis.n_slots
        return spatio_temporal_intervals(synopsis, boxes, np.full(len(boxes), start), np.full(len(boxes), end),
                                         level, draws, seed)
    est = synopsis.answer(boxes)
    model = _noise_model(synopsis)
    if model is None:
        return bootstrap_intervals(synopsis, boxes, est, level, seed=seed)
    if isinstance(model, str):
        nan = np.full(len(boxes), np.nan)
        return nan, nan.copy(), model
    weights, kind, param, quantum, method = model
    rng = np.random.default_rng(seed)
    lower, upper = np.empty(len(boxes)), np.empty(len(boxes))
    for q, box in enumerate(boxes):
        noise_q = _noise_quantiles(rng, weights(box), kind, param, draws, level, quantum)
        lower[q], upper[q] = est[q] - noise_q[1], est[q] - noise_q[0]
    return lower, upper, method


def scaled_intervals(synopsis: Synopsis, boxes: np.ndarray, level: float = 0.95, draws: int = 4000,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Intervals of a release scaled to full counts, ŷ = N·û/n̂ (dpcore.privacy.scaling), by a
    parametric bootstrap over both noises: û's (the inner release's exact law) and n̂'s (discrete
    Laplace of the recorded ``sample_total_for_scaling`` charge, clamped as the fit clamps it). The
    interval is for N·u/n, the bounded sample's count scaled by its true size: it covers the noise,
    not the bias of bounding each person to k points (post-processing: it reads only the release)."""
    nan = np.full(len(boxes), np.nan)
    inner = synopsis.inner
    model = _noise_model(inner)
    if model is None or isinstance(model, str):
        why = model[len("none: "):] if isinstance(model, str) else \
            f"{_effective(inner)[0]}'s post-processing has no scaled bootstrap"
        return nan, nan.copy(), f"none: a release scaled to full counts whose inner release has no exact law ({why})"
    if getattr(synopsis, "profile", None) is not None:
        return profiled_intervals(synopsis, boxes, model, level, draws, seed)
    laws = _laplace_laws(synopsis.privacy.charges, ["sample_total_for_scaling"])
    if laws is None:
        return nan, nan.copy(), "none: the scale factor's noise (sample_total_for_scaling) is not recorded"
    weights, kind, param, quantum, _ = model
    total = float(synopsis.total_points)
    n_hat = total / float(synopsis.factor)
    floor = max(laws[0][0], 1.0)
    rng = np.random.default_rng(seed)
    inner_est = inner.answer(boxes)
    est = synopsis.answer(boxes)
    n_star = np.clip(n_hat + _dlap(rng, *laws[0], draws), floor, total)
    a = (1.0 - level) / 2.0
    lower, upper = np.empty(len(boxes)), np.empty(len(boxes))
    for q, box in enumerate(boxes):
        noise = _noise_draws(rng, weights(box), kind, param, draws, quantum)
        dev = _scaled_deviation(total, inner_est[q], noise, n_star, est[q], a)
        lower[q], upper[q] = est[q] - dev[1], est[q] - dev[0]
    return lower, upper, ("parametric bootstrap of the scaled answer N·û/n̂ over û's exact noise law and n̂'s; "
                          "covers the noise, not the bias of bounding each person to k points")


def profiled_intervals(synopsis: Synopsis, boxes: np.ndarray, model: tuple, level: float = 0.95,
                       draws: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Intervals of full counts from a release scaled by 1/κ̂ of its paid contribution profile
    (dpcore.privacy.profile): quantiles of plausible full counts f*·(û + e*) + b*, with e* the inner
    release's exact noise law (symmetric: û + e* is as likely a bounded count as û − e*), f* the factor
    given the noisy profile (ContributionProfile.factor_draws) and b* the bounding's bias that varies
    from box to box (normal, sd ContributionProfile.cell_bias_sd of the box's bounded count). It covers the noise and the bias of bounding each person to k points, as
    far as the profile tells it (post-processing: it reads only the release)."""
    from dpcore.privacy.profile import ContributionProfile

    profile = ContributionProfile.from_dict(synopsis.profile)
    k = int(synopsis.profile["k"])
    weights, kind, param, quantum, inner_method = model
    rng = np.random.default_rng(seed)
    inner_est = synopsis.inner.answer(boxes)
    factor = profile.factor_draws(k, draws, rng)
    bias_sd = profile.cell_bias_sd(k, inner_est)
    a = (1.0 - level) / 2.0
    lower, upper = np.empty(len(boxes)), np.empty(len(boxes))
    for q, box in enumerate(boxes):
        noise = _noise_draws(rng, weights(box), kind, param, draws, quantum)
        plausible = factor * (inner_est[q] + noise) + rng.normal(0.0, bias_sd[q], draws)
        lower[q], upper[q] = np.quantile(plausible, [a, 1 - a])
    return lower, upper, (f"parametric bootstrap of the full count 1/κ̂·û over û's noise ({inner_method}), κ̂'s "
                          "given the paid contribution profile, and the bounding's bias from box to box; covers the "
                          "noise and the bias of bounding each person to k points")


def _scaled_deviation(total: float, inner: float, noise: np.ndarray, n_star: np.ndarray, est: float,
                      a: float) -> np.ndarray:
    """Quantiles a, 1 − a of N·(û + e*)/n̂* − ŷ: a scaled answer's re-drawn error, both noises at once."""
    return np.quantile(total * (inner + noise) / n_star - est, [a, 1 - a])


def spatio_temporal_intervals(synopsis: Synopsis, boxes: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                              level: float = 0.95, draws: int = 4000,
                              seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Intervals of box × time-window counts of an identity3d release: Σ f·noise over the cells and
    slots a query covers (pro rata in space and time, as the answer counts them), with the cells' exact
    discrete Laplace law. A release scaled to full counts (N / n̂) also re-draws n̂'s noise, by a
    parametric bootstrap like :func:`scaled_intervals`. Others get NaN and why."""
    boxes = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
    nan = np.full(len(boxes), np.nan)
    mechanism, params, charges = _effective(synopsis)
    if mechanism != "identity3d":
        post = "VDR's denoiser is not linear in the noise" if mechanism == "vdr" else \
            f"{mechanism} has no noise model for intervals"
        return nan, nan.copy(), f"none: {post}"
    if params.get("clamp_negative"):
        return nan, nan.copy(), "none: negative counts were clamped to 0 (not linear in the noise)"
    cell_law = _laplace_laws(charges, ["cell_counts"])
    if cell_law is None or synopsis.slot_seconds is None or synopsis.window_start_s is None:
        return nan, nan.copy(), "none: this release records no cell noise law or no time window"
    extra = synopsis._extra
    factor = float(extra.get("scale_factor") or 1.0)
    n_law = _laplace_laws(charges, ["sample_size"]) if factor != 1.0 else None
    if factor != 1.0 and n_law is None:
        return nan, nan.copy(), "none: the scale factor's noise (sample_size) is not recorded"
    xmin, ymin, xmax, ymax = synopsis.region.bounds_m
    nx, ny, nt = synopsis.shape
    est = synopsis.answer_st_time(boxes, start_s, end_s)
    g0 = np.clip((np.broadcast_to(start_s, (len(boxes),)) - synopsis.window_start_s) / synopsis.slot_seconds, 0, nt)
    g1 = np.clip((np.broadcast_to(end_s, (len(boxes),)) - synopsis.window_start_s) / synopsis.slot_seconds, 0, nt)
    rng = np.random.default_rng(seed)
    a = (1.0 - level) / 2.0
    lower, upper = np.empty(len(boxes)), np.empty(len(boxes))
    if factor != 1.0:
        total, n_hat = float(extra["public_total"]), float(extra["n_estimate"])
        n_star = np.maximum(1.0, n_hat + _dlap(rng, *n_law[0], draws))
    for q, box in enumerate(boxes):
        fx, fy = _cover(box[0], box[2], nx, (xmin, xmax)), _cover(box[1], box[3], ny, (ymin, ymax))
        ft = _cover(g0[q], g1[q], nt, (0.0, float(nt)))
        w = np.einsum("i,j,k->ijk", fx[fx > 0], fy[fy > 0], ft[ft > 0]).ravel()
        noise = _noise_draws(rng, w, "laplace", cell_law[0][0], draws, cell_law[0][1])
        if factor == 1.0:
            dev = np.quantile(noise, [a, 1 - a])
        else:  # ŷ = N·(u + e)/n̂: re-draw both noises around the released values
            dev = _scaled_deviation(total, est[q] / factor, noise, n_star, est[q], a)
        lower[q], upper[q] = est[q] - dev[1], est[q] - dev[0]
    if factor == 1.0:
        return lower, upper, "exact noise law (discrete Laplace) over the cells and slots, Monte Carlo quantiles"
    return lower, upper, ("parametric bootstrap of the scaled answer N·û/n̂ over the cells' exact noise law and "
                          "n̂'s; covers the noise, not the bias of bounding each person to k points")


#: Re-draws of a post-processed release's noise per query batch (its quantiles' Monte Carlo error at
#: 95% is about ±1% of coverage); fewer, down to BOOTSTRAP_MIN_DRAWS, where one draw re-noises more than
#: BOOTSTRAP_WORK / BOOTSTRAP_DRAWS counts, so a query of a fine hierarchy answers in seconds.
BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_MIN_DRAWS = 200
BOOTSTRAP_WORK = 5e7


def _laplace_laws(charges: list[dict], names: list[str]) -> list[tuple[float, float]] | None:
    """(scale = sensitivity/ε, lattice quantum) of each named charge's discrete Laplace noise (quantum 1:
    integers; weighted bounding's weight sums record theirs); None unless every one is discrete Laplace
    (a zCDP release is not modelled here)."""
    out = []
    for name in names:
        c = next((c for c in charges if c.get("name") == name), None)
        if c is None or c.get("noise") != "discrete_laplace" or not c.get("epsilon"):
            return None
        out.append((float(c["sensitivity"]) / float(c["epsilon"]), float(c.get("quantum") or 1.0)))
    return out


def _dlap(rng: np.random.Generator, scale: float, quantum: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Discrete Laplace of ``scale`` on the lattice quantum·ℤ: quantum × DLap(scale/quantum)."""
    q = -np.expm1(-quantum / scale)  # 1 − t, t = exp(−quantum/scale)
    return quantum * (rng.geometric(q, size) - rng.geometric(q, size)).astype(np.float64)


def _hb_sampler(synopsis: GridSynopsis, params: dict, charges: list[dict], boxes: np.ndarray):
    """HB: fresh noise on every level, through the same least-squares consistency (linear)."""
    from dpcore.mechanisms.hb import hierarchy_consistency
    from dpcore.privacy.noise import discrete_laplace_variance

    b, h = int(synopsis._extra.get("branching", 0)), int(synopsis._extra.get("levels", 0))
    if b < 2 or h < 1 or synopsis.shape != (b ** h, b ** h):
        return None, "none: this HB release does not record its hierarchy (branching, levels)"
    laws = _laplace_laws(charges, [f"level{lvl + 1}_counts" for lvl in range(h)])
    if laws is None:
        return None, "none: HB noise other than discrete Laplace (zCDP) is not modelled"
    # The same per-level variances the release's consistency used (PointsInput.count_noise_variance).
    variances = [quantum ** 2 * discrete_laplace_variance(scale / quantum) for scale, quantum in laws]
    xmin, ymin, xmax, ymax = synopsis.region.bounds_m
    leaf = b ** h
    fx = np.stack([_cover(x0, x1, leaf, (xmin, xmax)) for x0, _, x1, _ in boxes])
    fy = np.stack([_cover(y0, y1, leaf, (ymin, ymax)) for _, y0, _, y1 in boxes])

    def draw(rng: np.random.Generator) -> np.ndarray:
        noisy = [_dlap(rng, scale, quantum, (b ** (lvl + 1), b ** (lvl + 1)))
                 for lvl, (scale, quantum) in enumerate(laws)]
        e = hierarchy_consistency(noisy, variances, b)[-1]
        return np.einsum("qi,ij,qj->q", fx, e, fy)

    draw.size = sum(b ** (2 * (lvl + 1)) for lvl in range(h))  # type: ignore[attr-defined]
    return draw, "parametric bootstrap: fresh level noise through HB's least-squares consistency"


def _ag_sampler(synopsis: GridSynopsis, params: dict, charges: list[dict], boxes: np.ndarray):
    """AG: fresh level-1 and level-2 noise through the same constrained inference (linear), on the
    leaf structure the release records (m2 per level-1 cell, itself from the noisy level-1 counts)."""
    from dpcore.mechanisms.ag import constrained_inference

    m1, m2 = synopsis._extra.get("m1"), synopsis._extra.get("m2")
    if m1 is None or m2 is None:
        return None, "none: this AG release does not record its level-2 sizes (released before they were stored)"
    m1, m2 = int(m1), np.asarray(m2, dtype=np.int64)
    c1 = [c for c in charges if c.get("name") == "level1_counts"]
    c2 = [c for c in charges if c.get("name") == "level2_counts"]
    laws = _laplace_laws(charges, ["level1_counts", "level2_counts"])
    if laws is None or m2.size != m1 * m1:
        return None, "none: AG noise other than discrete Laplace (zCDP) is not modelled"
    eps1, eps2 = float(c1[0]["epsilon"]), float(c2[0]["epsilon"])
    n_leaves = m2 * m2
    leaf_cell = np.repeat(np.arange(m1 * m1), n_leaves)
    local = np.arange(int(n_leaves.sum())) - (np.cumsum(n_leaves) - n_leaves)[leaf_cell]
    lm2 = m2[leaf_cell]
    xmin, ymin, xmax, ymax = synopsis.region.bounds_m
    w1, h1 = (xmax - xmin) / m1, (ymax - ymin) / m1
    x0 = xmin + (leaf_cell // m1) * w1 + (local // lm2) * (w1 / lm2)
    y0 = ymin + (leaf_cell % m1) * h1 + (local % lm2) * (h1 / lm2)
    lw, lh = w1 / lm2, h1 / lm2
    cover = np.stack([np.clip(np.minimum(x0 + lw, bx1) - np.maximum(x0, bx0), 0, None) / lw
                      * np.clip(np.minimum(y0 + lh, by1) - np.maximum(y0, by0), 0, None) / lh
                      for bx0, by0, bx1, by1 in boxes])

    def draw(rng: np.random.Generator) -> np.ndarray:
        e = constrained_inference(_dlap(rng, *laws[0], m1 * m1), _dlap(rng, *laws[1], leaf_cell.size),
                                  n_leaves, eps1, eps2)
        return cover @ e

    draw.size = m1 * m1 + leaf_cell.size  # type: ignore[attr-defined]
    return draw, "parametric bootstrap: fresh level noise through AG's constrained inference"


def bootstrap_intervals(synopsis: Synopsis, boxes: np.ndarray, est: np.ndarray, level: float = 0.95,
                        draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Intervals of a post-processed release by a parametric bootstrap: the error of a range answer is a
    function of the noise alone (HB's consistency and AG's inference are linear in it), so fresh draws
    of the recorded noise law, pushed through the same post-processing, give the error's law; the
    interval is the answer minus its quantiles. It reads only the release and its public parameters.
    Releases whose post-processing is not linear, or whose structure is not recorded, get NaN and why."""
    nan = np.full(len(boxes), np.nan)
    mechanism, params, charges = _effective(synopsis)
    samplers = {"hb": _hb_sampler, "ag": _ag_sampler}
    if mechanism not in samplers:
        why = {"privtree": "PrivTree's intervals come from its leaves' exact noise law (query_intervals)",
               "snh": "SNH's neural denoiser is not linear in the noise; its bootstrap is not implemented",
               }.get(mechanism, f"{mechanism} has no noise model for intervals")
        return nan, nan.copy(), f"none: {why}"
    if type(synopsis) is not GridSynopsis:
        return nan, nan.copy(), f"none: unexpected {type(synopsis).__name__} for {mechanism}"
    if params.get("clamp_negative"):
        return nan, nan.copy(), "none: negative counts were clamped to 0 (not linear in the noise)"
    draw, method = samplers[mechanism](synopsis, params, charges, boxes)
    if draw is None:
        return nan, nan.copy(), method
    draws = int(np.clip(BOOTSTRAP_WORK / max(draw.size, 1), BOOTSTRAP_MIN_DRAWS, draws))
    rng = np.random.default_rng(seed)
    errors = np.stack([draw(rng) for _ in range(draws)], axis=1)  # (boxes, draws)
    a = (1.0 - level) / 2.0
    q_lo, q_hi = np.quantile(errors, [a, 1 - a], axis=1)
    return est - q_hi, est - q_lo, f"{method}, {draws} draws"


DEFAULT_BANDS = ((25.0, 100.0), (100.0, 1000.0), (1000.0, 5000.0))


def release_quality(synopsis: Synopsis, bands: tuple[tuple[float, float], ...] = DEFAULT_BANDS,
                    queries: int = 500, seed: int = 0) -> dict:
    """How good a release is, from public quantities and the release itself (post-processing).

    Per band of square sides: the noise standard deviation of an answer (cells covered × the cells'
    noise variance, for linear releases), the typical released count of such a square centred where
    the release puts mass, and whether the noise is expected to exceed that count — then the band is
    expected to tell less than a blank map (answering 0 everywhere).
    """
    law = linear_noise(synopsis)
    if law is None:
        return {"noise_sd_per_cell": None, "bands": [],
                "statement": "no noise-law summary: this release is post-processed (consistency, trees, nets)"}
    kind, param, quantum = law
    if kind == "laplace":
        t = np.exp(-quantum / param)
        var = float(quantum ** 2 * 2 * t / (1 - t) ** 2)
    else:
        var = float(param)
    sd = float(np.sqrt(var))
    nx, _ = synopsis.shape
    width = synopsis.region.side_m / nx
    mass = np.clip(synopsis.density(nx), 0, None).ravel()
    rng = np.random.default_rng(seed)
    half = synopsis.region.half_m
    rows = []
    for lo, hi in bands:
        side = rng.uniform(lo, hi, queries)
        if mass.sum() > 0:
            cell = rng.choice(mass.size, queries, p=mass / mass.sum())
            cx = -half + (cell // nx + rng.uniform(0, 1, queries)) * width
            cy = -half + (cell % nx + rng.uniform(0, 1, queries)) * width
        else:
            cx, cy = rng.uniform(-half, half, (2, queries))
        boxes = np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)
        typical = float(np.median(np.abs(synopsis.answer(boxes))))
        # an answer covers about (side/width)² cells, at least one (a part of one cell still carries its noise)
        noise_sd = float(sd * np.median(np.maximum(side / width, 1.0)))
        worse = noise_sd * np.sqrt(2 / np.pi) >= typical
        rows.append({"query_sides_m": [lo, hi], "noise_sd": noise_sd, "typical_released_count": typical,
                     "expected_abs_error": noise_sd * float(np.sqrt(2 / np.pi)), "worse_than_blank_map": bool(worse)})
    worse = [f"{r['query_sides_m'][0]:g}–{r['query_sides_m'][1]:g} m" for r in rows if r["worse_than_blank_map"]]
    statement = (f"noise sd per cell {sd:.3g} ({kind}); " +
                 (f"expected to be worse than a blank map for squares of {', '.join(worse)}" if worse
                  else "every band's expected noise is below the typical released count"))
    return {"noise_sd_per_cell": sd, "cell_width_m": width, "bands": rows, "statement": statement}
