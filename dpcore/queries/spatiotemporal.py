"""Queries on spatio-temporal releases and their error metrics.

- Range counts over box × slot range: workload generator and exact truth.
- Nearest hotspot: the closest cell to a location q, within a search radius (the *extent*), whose
  count over a slot range is ≥ v. Vectorised over queries and cells (chunked), with a brute-force
  reference used by the tests. Metrics: distance error and regret.
- Forecasting: statsmodels ``ThetaModel`` fitted on a released series; sMAPE against the truth.

Evaluation code here reads true data to *score* releases; nothing here feeds a release.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from dpcore import GeoDPError
from dpcore.geo import Region
from dpcore.grid.histogram import cell_index, cumulative_at, grid_counts, prefix_sums
from dpcore.queries.range import Centres, centre_draw


class STQueryError(GeoDPError, ValueError):
    pass


# -- range counts ---------------------------------------------------------------------------------
def st_range_workload(region: Region, n_slots: int, n_queries: int, side_min_m: float, side_max_m: float,
                      rng: np.random.Generator, *, max_slots: int | None = None,
                      snap_cells: int = 2048, centres: Centres | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Random box × slot-range queries.

    Boxes are squares with side uniform in [side_min, side_max] metres centred uniformly in the
    region, or on uniformly drawn points of ``centres`` (dpcore.queries.range.workload_centres), clipped to
    the region; slot ranges have length uniform in [1, max_slots] (default: all slots) and a uniform
    start. Box edges are snapped to a lattice of ``snap_cells`` per side so that the
    truth from a histogram at that resolution (:func:`true_st_counts`) is exact.
    """
    if n_queries < 1 or n_slots < 1:
        raise STQueryError("need at least one query and one slot")
    if not (0 < side_min_m <= side_max_m):
        raise STQueryError(f"query sides need 0 < min ≤ max, got {side_min_m}, {side_max_m}")
    xmin, ymin, xmax, ymax = region.bounds_m
    cx, cy = centre_draw(region, n_queries, rng, centres)
    half = rng.uniform(side_min_m, side_max_m, n_queries) / 2
    boxes = np.stack([cx - half, cy - half, cx + half, cy + half], axis=1)
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], xmin, xmax)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], ymin, ymax)
    step = region.side_m / snap_cells
    boxes = np.round((boxes - xmin) / step) * step + xmin
    boxes[:, 2] = np.maximum(boxes[:, 2], boxes[:, 0] + step)
    boxes[:, 3] = np.maximum(boxes[:, 3], boxes[:, 1] + step)
    longest = n_slots if max_slots is None else max(1, min(int(max_slots), n_slots))
    length = rng.integers(1, longest + 1, n_queries)
    t0 = rng.integers(0, n_slots - length + 1)
    return boxes, np.stack([t0, t0 + length], axis=1).astype(np.int64)


#: Points × boxes of a slot up to which true_st_counts sums per point (a few arrays of this many floats).
_DIRECT_MAX = 1 << 20


def _direct_counts(x: np.ndarray, y: np.ndarray, region: Region, resolution: int, gx0: np.ndarray,
                   gx1: np.ndarray, gy0: np.ndarray, gy1: np.ndarray) -> np.ndarray:
    """Per box, the sum over points of their lattice cell's fraction inside the box: what the bilinear
    prefix-table lookup gives (cumulative mass below-left of g in cell i is clip(g - i, 0, 1))."""
    xmin, ymin, xmax, ymax = region.bounds_m
    inside = (x >= xmin) & (x < xmax) & (y >= ymin) & (y < ymax)  # what grid_counts keeps
    i = cell_index(x[inside], xmin, xmax, resolution)[:, None]
    j = cell_index(y[inside], ymin, ymax, resolution)[:, None]
    wx = np.clip(gx1 - i, 0.0, 1.0) - np.clip(gx0 - i, 0.0, 1.0)
    wy = np.clip(gy1 - j, 0.0, 1.0) - np.clip(gy0 - j, 0.0, 1.0)
    return np.einsum("pq,pq->q", wx, wy)


def true_st_counts(x: np.ndarray, y: np.ndarray, slot: np.ndarray, region: Region, n_slots: int,
                   boxes: np.ndarray, slot_ranges: np.ndarray, *, resolution: int = 2048) -> np.ndarray:
    """Exact counts of points in box × [t0, t1) for boxes on the ``resolution`` lattice.

    One 2-D prefix table per slot answers every box at once; the loop runs over slots (tens to
    hundreds), never over points or queries. A slot with few points × boxes (under ``_DIRECT_MAX``) sums
    each point's cell's covered fraction of every box instead: the same bilinear answer, without the
    ``resolution``² table (two cumsums of 4 M cells, ~90 ms a slot at 2048).
    """
    b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
    r = np.asarray(slot_ranges, dtype=np.int64)
    s = np.asarray(slot, dtype=np.int64)
    per_slot = np.zeros((n_slots + 1, b.shape[0]))
    order = np.argsort(s, kind="stable")
    bounds = np.searchsorted(s[order], np.arange(n_slots + 1))
    xmin, ymin, xmax, ymax = region.bounds_m
    sc = resolution / (xmax - xmin)
    gx0, gx1 = (b[:, 0] - xmin) * sc, (b[:, 2] - xmin) * sc
    gy0, gy1 = (b[:, 1] - ymin) * sc, (b[:, 3] - ymin) * sc
    for t in range(n_slots):
        idx = order[bounds[t]:bounds[t + 1]]
        if idx.size == 0:
            continue
        if idx.size * b.shape[0] <= _DIRECT_MAX:
            per_slot[t + 1] = _direct_counts(x[idx], y[idx], region, resolution, gx0, gx1, gy0, gy1)
            continue
        p = prefix_sums(grid_counts(x[idx], y[idx], region.bounds_m, resolution))
        per_slot[t + 1] = (cumulative_at(p, gx1, gy1) - cumulative_at(p, gx0, gy1)
                           - cumulative_at(p, gx1, gy0) + cumulative_at(p, gx0, gy0))
    cum = np.cumsum(per_slot, axis=0)
    q = np.arange(b.shape[0])
    return np.rint(cum[r[:, 1], q] - cum[r[:, 0], q])


# -- nearest hotspot ------------------------------------------------------------------------------
@dataclass(frozen=True)
class HotspotAnswer:
    """Per query: the reported cell (ix, iy), -1 when no cell qualifies, and its distance to q."""

    ix: np.ndarray
    iy: np.ndarray
    distance_m: np.ndarray

    @property
    def found(self) -> np.ndarray:
        return self.ix >= 0


def cell_centres(region: Region, nx: int, ny: int) -> tuple[np.ndarray, np.ndarray]:
    xmin, ymin, xmax, ymax = region.bounds_m
    return (xmin + (np.arange(nx) + 0.5) * (xmax - xmin) / nx, ymin + (np.arange(ny) + 0.5) * (ymax - ymin) / ny)


def _time_prefix(counts: np.ndarray) -> np.ndarray:
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim == 2:
        c = c[:, :, None]
    if c.ndim != 3:
        raise STQueryError("hotspot search needs (nx, ny) or (nx, ny, nt) counts")
    p = np.zeros((*c.shape[:2], c.shape[2] + 1))
    np.cumsum(c, axis=2, out=p[:, :, 1:])
    return p


def _query_arrays(points: np.ndarray, slot_ranges: np.ndarray | None, threshold: float | np.ndarray,
                  nt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = np.atleast_2d(np.asarray(points, dtype=np.float64))
    if q.shape[1] != 2:
        raise STQueryError("hotspot locations must be a (q, 2) array of (x, y) metres")
    r = np.array([[0, nt]]) if slot_ranges is None else np.atleast_2d(np.asarray(slot_ranges, dtype=np.int64))
    r = np.clip(np.broadcast_to(r, (q.shape[0], 2)), 0, nt)
    v = np.broadcast_to(np.asarray(threshold, dtype=np.float64), (q.shape[0],))
    return q, r, v


def nearest_hotspot(counts: np.ndarray, region: Region, points: np.ndarray, threshold: float | np.ndarray,
                    extent_m: float, slot_ranges: np.ndarray | None = None,
                    chunk_cells: int = 1 << 22) -> HotspotAnswer:
    """Nearest cell (centre distance) within ``extent_m`` of each q whose count over its slot range ≥ v.

    ``counts`` is (nx, ny) or (nx, ny, nt); slot ranges default to the whole window. Vectorised: a
    chunk of queries is one (chunk, nx, ny) array of masked distances and one argmin.
    """
    p = _time_prefix(counts)
    nx, ny, nt = p.shape[0], p.shape[1], p.shape[2] - 1
    q, r, v = _query_arrays(points, slot_ranges, threshold, nt)
    cx, cy = cell_centres(region, nx, ny)
    nq = q.shape[0]
    ix = np.full(nq, -1, dtype=np.int64)
    iy = np.full(nq, -1, dtype=np.int64)
    dist = np.full(nq, np.inf)
    step = max(1, chunk_cells // (nx * ny))
    for a in range(0, nq, step):  # loop over chunks of queries, bounded memory
        sl = slice(a, min(nq, a + step))
        window = np.moveaxis(p[:, :, r[sl, 1]] - p[:, :, r[sl, 0]], 2, 0)  # (chunk, nx, ny)
        d = np.sqrt((cx[None, :, None] - q[sl, 0, None, None]) ** 2 + (cy[None, None, :] - q[sl, 1, None, None]) ** 2)
        d = np.where((window >= v[sl, None, None]) & (d <= extent_m), d, np.inf)
        flat = d.reshape(d.shape[0], -1)
        best = np.argmin(flat, axis=1)
        bd = flat[np.arange(flat.shape[0]), best]
        ok = np.isfinite(bd)
        ix[sl] = np.where(ok, best // ny, -1)
        iy[sl] = np.where(ok, best % ny, -1)
        dist[sl] = bd
    return HotspotAnswer(ix, iy, dist)


def nearest_hotspot_brute(counts: np.ndarray, region: Region, points: np.ndarray,
                          threshold: float | np.ndarray, extent_m: float,
                          slot_ranges: np.ndarray | None = None) -> HotspotAnswer:
    """Reference implementation with plain loops over queries and cells (tests only)."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[:, :, None] if c.ndim == 2 else c
    nx, ny, nt = c.shape
    q, r, v = _query_arrays(points, slot_ranges, threshold, nt)
    cx, cy = cell_centres(region, nx, ny)
    ix, iy, dist = [], [], []
    for k in range(q.shape[0]):
        best = (np.inf, -1, -1)
        for i in range(nx):
            for j in range(ny):
                total = c[i, j, r[k, 0]:r[k, 1]].sum()
                d = float(np.hypot(cx[i] - q[k, 0], cy[j] - q[k, 1]))
                if total >= v[k] and d <= extent_m and d < best[0]:
                    best = (d, i, j)
        dist.append(best[0])
        ix.append(best[1])
        iy.append(best[2])
    return HotspotAnswer(np.array(ix), np.array(iy), np.array(dist))


def report_nothing(n_queries: int) -> HotspotAnswer:
    """The baseline that reports no hotspot for any query (what a blank release says)."""
    none = np.full(n_queries, -1, dtype=np.int64)
    return HotspotAnswer(none, none.copy(), np.full(n_queries, np.inf))


def hotspot_errors(released: HotspotAnswer, true: HotspotAnswer, true_counts: np.ndarray, region: Region,
                   threshold: float | np.ndarray, extent_m: float,
                   slot_ranges: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(distance error m, regret) per query.

    Distance error: distance between the reported cell and the true nearest hotspot; 0 when neither
    exists; ``extent_m`` (the largest possible miss) when exactly one of them exists.
    Regret: max(0, v − true count of the reported cell over the slot range); v when nothing is
    reported although a true hotspot exists; 0 when neither exists.
    """
    p = _time_prefix(true_counts)
    nx, ny, nt = p.shape[0], p.shape[1], p.shape[2] - 1
    _, r, v = _query_arrays(np.zeros((released.ix.size, 2)), slot_ranges, threshold, nt)
    cx, cy = cell_centres(region, nx, ny)
    rf, tf = released.found, true.found
    rix, riy = np.maximum(released.ix, 0), np.maximum(released.iy, 0)
    tix, tiy = np.maximum(true.ix, 0), np.maximum(true.iy, 0)
    both = np.hypot(cx[rix] - cx[tix], cy[riy] - cy[tiy])
    dist_err = np.where(rf & tf, both, np.where(rf | tf, float(extent_m), 0.0))
    reported_true = p[rix, riy, r[:, 1]] - p[rix, riy, r[:, 0]]
    regret = np.where(rf, np.maximum(0.0, v - reported_true), np.where(tf, v, 0.0))
    return dist_err, regret


# -- forecasting ----------------------------------------------------------------------------------
def smape(forecast: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Symmetric MAPE per series (last axis), in [0, 2]: mean of 2|F − A| / (|F| + |A|), 0/0 counted as 0."""
    f = np.asarray(forecast, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if f.shape != a.shape:
        raise STQueryError(f"forecast shape {f.shape} differs from actual {a.shape}")
    den = np.abs(f) + np.abs(a)
    term = np.divide(2 * np.abs(f - a), den, out=np.zeros_like(den), where=den > 0)
    return term.mean(axis=-1)


def season_period(slot_seconds: int | None) -> int | None:
    """The natural period in slots: a day of hourly slots, a week of daily slots."""
    if slot_seconds is None:
        return None
    if 86400 % slot_seconds == 0 and slot_seconds < 86400:
        return 86400 // slot_seconds
    if slot_seconds == 86400:
        return 7
    return None


def forecast_theta(series: np.ndarray, horizon: int, period: int | None = None) -> np.ndarray:
    """Forecast h steps of each row of ``series`` (q, t) with statsmodels ``ThetaModel``.

    The model chooses for itself: a seasonality test decides whether to deseasonalise (when the
    series holds two full periods), and ``method="auto"`` picks multiplicative decomposition for
    positive series, additive otherwise. Constant or too-short series fall back to their mean.
    The loop is over series: ThetaModel fits one series at a time.
    """
    from statsmodels.tsa.forecasting.theta import ThetaModel

    s = np.atleast_2d(np.asarray(series, dtype=np.float64))
    h = int(horizon)
    if h < 1:
        raise STQueryError(f"forecast horizon must be ≥ 1, got {horizon}")
    out = np.empty((s.shape[0], h))
    for k, row in enumerate(s):
        out[k] = _theta_one(ThetaModel, row, h, period)
    return out


def _theta_one(model_cls, row: np.ndarray, h: int, period: int | None) -> np.ndarray:
    if row.size < 4 or np.ptp(row) == 0 or not np.all(np.isfinite(row)):
        return np.full(h, float(np.nanmean(row)) if row.size else 0.0)
    seasonal = period is not None and period > 1 and row.size >= 2 * period
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_cls(row, period=period if seasonal else 1, deseasonalize=seasonal, use_test=seasonal,
                              method="auto" if np.all(row > 0) else "additive")
            fc = np.asarray(model.fit().forecast(h), dtype=np.float64)
    except (ValueError, np.linalg.LinAlgError):
        fc = np.full(h, row.mean())
    if not np.all(np.isfinite(fc)):
        fc = np.full(h, row.mean())
    return fc


def forecast_theta_interval(series: np.ndarray, horizon: int, period: int | None = None, level: float = 0.95,
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(forecast, lower, upper, method) of one released series: ThetaModel's prediction interval. The
    released series carries the release's noise, so the model's residual spread, and its interval, include
    it (post-processing of the release only). Constant or too-short series: their mean ± the normal
    quantile of their spread."""
    from statistics import NormalDist

    from statsmodels.tsa.forecasting.theta import ThetaModel

    row = np.asarray(series, dtype=np.float64).ravel()
    h = int(horizon)
    if h < 1:
        raise STQueryError(f"forecast horizon must be ≥ 1, got {horizon}")
    fc = _theta_one(ThetaModel, row, h, period)
    method = "ThetaModel prediction interval on the released series (its spread includes the release's noise)"
    if row.size >= 4 and np.ptp(row) > 0 and np.all(np.isfinite(row)):
        seasonal = period is not None and period > 1 and row.size >= 2 * period
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = ThetaModel(row, period=period if seasonal else 1, deseasonalize=seasonal, use_test=seasonal,
                                   method="auto" if np.all(row > 0) else "additive")
                pi = model.fit().prediction_intervals(h, alpha=1.0 - level)
            lo, hi = np.asarray(pi["lower"], dtype=np.float64), np.asarray(pi["upper"], dtype=np.float64)
            if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):
                # centred on the forecast shown (the fallback keeps the model's width)
                half = (hi - lo) / 2.0
                return fc, fc - half, fc + half, method
        except (ValueError, np.linalg.LinAlgError):
            pass
    sd = float(np.std(row, ddof=1)) if row.size > 1 else float("nan")
    half = NormalDist().inv_cdf((1.0 + level) / 2.0) * sd * np.sqrt(1.0 + 1.0 / max(row.size, 1))
    return fc, fc - half, fc + half, "the series' mean ± the normal quantile of its spread (too short or flat to model)"


def forecast_workload(region: Region, n_queries: int, side_min_m: float, side_max_m: float,
                      rng: np.random.Generator, centres: Centres | None = None) -> np.ndarray:
    """Boxes whose series are forecast: the whole region first, then random squares (centred as in
    :func:`st_range_workload`)."""
    boxes, _ = st_range_workload(region, 1, max(1, n_queries - 1), side_min_m, side_max_m, rng, centres=centres)
    whole = np.array([region.bounds_m], dtype=np.float64)
    return np.vstack([whole, boxes])[:n_queries]
