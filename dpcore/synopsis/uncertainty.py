"""How uncertain a released answer is: 95% intervals for range counts, from the known noise law.

For a linear release — a grid whose cells each carry independent noise of a known law and nothing
else (the identity grid and UG, negatives kept, no scaling) — a range answer is the true count plus
Σ f_ij·N_ij, where f_ij is the fraction of cell (i, j) the box covers. The interval for the true count
is the answer minus the 97.5% and 2.5% quantiles of that sum: computed by Monte Carlo from the exact
law (interior cells, f = 1, add up to a difference of two negative binomials; border cells are drawn
one by one). This reads only the released synopsis and public noise parameters: post-processing.
"""

from __future__ import annotations

import numpy as np

from dpcore.synopsis.base import GridSynopsis, Synopsis

#: Mechanisms whose released grid is the noisy histogram itself (linear in the noise).
LINEAR_MECHANISMS = ("identity", "ug")


def linear_noise(synopsis: Synopsis) -> tuple[str, float] | None:
    """('laplace', scale) or ('gaussian', σ²) of every cell of a linear release, else None."""
    if not isinstance(synopsis, GridSynopsis) or type(synopsis) is not GridSynopsis:
        return None
    p = synopsis.privacy
    if p.mechanism not in LINEAR_MECHANISMS or p.params.get("clamp_negative"):
        return None
    cells = [c for c in p.charges if c.get("name") == "cell_counts"]
    if len(cells) != 1:
        return None
    c = cells[0]
    if c.get("noise") == "discrete_gaussian":
        return "gaussian", float(c["sensitivity"]) ** 2 / (2.0 * float(c["rho"]))
    if c.get("epsilon"):
        return "laplace", float(c["sensitivity"]) / float(c["epsilon"])
    return None


def _cover(lo: float, hi: float, n: int, extent: tuple[float, float]) -> np.ndarray:
    """Fraction of each of n cells over ``extent`` that [lo, hi) covers."""
    edges = np.linspace(extent[0], extent[1], n + 1)
    return np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None) / (edges[1] - edges[0])


def query_intervals(synopsis: Synopsis, boxes_m: np.ndarray, level: float = 0.95, draws: int = 4000,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """(lower, upper, method) for each box's true count; NaN bounds where no interval is known."""
    boxes = np.atleast_2d(np.asarray(boxes_m, dtype=np.float64))
    est = synopsis.answer(boxes)
    law = linear_noise(synopsis)
    if law is None:
        nan = np.full(len(boxes), np.nan)
        return nan, nan.copy(), "none: the release is post-processed or scaled (no interval from its noise law yet)"
    kind, param = law
    rng = np.random.default_rng(seed)
    xmin, ymin, xmax, ymax = synopsis.region.bounds_m
    nx, ny = synopsis.shape
    a = (1.0 - level) / 2.0
    lower, upper = np.empty(len(boxes)), np.empty(len(boxes))
    for q, (x0, y0, x1, y1) in enumerate(boxes):
        fx, fy = _cover(x0, x1, nx, (xmin, xmax)), _cover(y0, y1, ny, (ymin, ymax))
        w = np.outer(fx[fx > 0], fy[fy > 0]).ravel()
        if kind == "gaussian":  # a sum of independent discrete Gaussians: normal with the exact variance
            sd = np.sqrt(param * float(np.sum(w * w)))
            noise_q = np.array([-1.959963984540054, 1.959963984540054]) * sd
        else:
            t = np.exp(-1.0 / param)
            full = w >= 1.0 - 1e-12
            n_full = int(full.sum())
            total = rng.negative_binomial(n_full, 1 - t, draws) - rng.negative_binomial(n_full, 1 - t, draws) \
                if n_full else np.zeros(draws)
            partial = w[~full]
            if partial.size:
                g = rng.geometric(1 - t, (draws, partial.size)) - rng.geometric(1 - t, (draws, partial.size))
                total = total + g @ partial
            noise_q = np.quantile(total, [a, 1 - a])
        lower[q], upper[q] = est[q] - noise_q[1], est[q] - noise_q[0]
    method = ("exact noise law (discrete Laplace), Monte Carlo quantiles" if kind == "laplace"
              else "discrete Gaussian noise, normal quantiles with the exact variance")
    return lower, upper, method


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
    kind, param = law
    if kind == "laplace":
        t = np.exp(-1.0 / param)
        var = float(2 * t / (1 - t) ** 2)
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
