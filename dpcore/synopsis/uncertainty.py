"""How uncertain a released answer is: 95% intervals of range counts, and a release's quality summary.

Each mechanism builds its release's noise model (``dpcore/synopsis/noise.py``), so this module only asks
the synopsis: it never names a mechanism. This reads only the released synopsis and public noise
parameters: post-processing.
"""

from __future__ import annotations

import numpy as np

from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.noise import CellNoise


def query_intervals(synopsis: Synopsis, boxes_m: np.ndarray,
                    level: float = 0.95) -> tuple[np.ndarray, np.ndarray, str]:
    """(lower, upper, method) for each box's true count, every box at once; NaN bounds and the reason
    where the release has no interval."""
    _, iv = synopsis.intervals(np.atleast_2d(np.asarray(boxes_m, dtype=np.float64)), level)
    return iv.lower, iv.upper, iv.method


def noise_intervals(synopsis: Synopsis, boxes_m: np.ndarray,
                    level: float = 0.95) -> tuple[np.ndarray, np.ndarray, str]:
    """(lower, upper, method) of the noise model alone: an interval of the noise-free answer, not widened by
    the spread inside partly covered cells (what a check of the noise law compares with)."""
    _, iv = synopsis.intervals(np.atleast_2d(np.asarray(boxes_m, dtype=np.float64)), level, spread=False)
    return iv.lower, iv.upper, iv.method


def spatio_temporal_intervals(synopsis: Synopsis, boxes: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                              level: float = 0.95) -> tuple[np.ndarray, np.ndarray, str]:
    """Intervals of box × [start, end) counts of a spatio-temporal release."""
    _, iv = synopsis.window_intervals(boxes, start_s, end_s, level)
    return iv.lower, iv.upper, iv.method


DEFAULT_BANDS = ((25.0, 100.0), (100.0, 1000.0), (1000.0, 5000.0))


def release_quality(synopsis: Synopsis, bands: tuple[tuple[float, float], ...] = DEFAULT_BANDS,
                    queries: int = 500, seed: int = 0) -> dict:
    """How good a release is, from public quantities and the release itself (post-processing).

    Per band of square sides: the noise standard deviation of an answer (cells covered × the cells'
    noise variance, for linear releases), the typical released count of such a square centred where
    the release puts mass, and whether the noise is expected to exceed that count — then the band is
    expected to tell less than a blank map (answering 0 everywhere).
    """
    model = synopsis.noise_model()
    if not isinstance(model, CellNoise):
        return {"noise_sd_per_cell": None, "bands": [],
                "statement": "no noise-law summary: this release is post-processed (consistency, trees, nets)"}
    kind = model.law.kind
    sd = float(np.sqrt(model.law.variance))
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
