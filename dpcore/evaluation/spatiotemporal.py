"""Evaluation harness for spatio-temporal mechanisms (identity3d, vdr, ...) on one region and window.

Protocol (stated in every report):
- Region and window are public configuration; only points inside both are used.
- User-level: each trial bounds every user to k points over the *whole window* (all slots), then the
  mechanism runs. Truth is exact over *all* points, so releases are scaled to full counts with
  N = the region-window point count, declared a public input of the protocol
  (``total_points_source``); mechanisms pay for their own n̂ (see identity3d / vdr).
- Query locations (``workload``, dpcore.queries.range.parse_workload): by default (``data``) drawn from the
  evaluated points, where people are; ``uniform`` over the region; or ``public:PATH`` points.
- Range counts: box × slot-range workloads (squares with side uniform in [a, b] m centred on the
  workload's locations; slot ranges of uniform length in [1, max_query_slots]); relative error
  |est − truth| / max(truth, ψ), ψ = 0.1% of N. Reference: answering 0.
- Nearest hotspot: at the workload's locations (``data``: a drawn point's location and its own slot;
  otherwise one uniform slot each), search radius ``hotspot_extent_m``, thresholds v (counts of all
  points in a cell of the ``hotspot_grid`` grid over that slot); distance error and regret as defined
  in dpcore.queries.spatiotemporal, beside the baseline that reports no hotspot.
- Forecasting: per-slot series of the whole region and 1–5 km squares centred as the range queries;
  ThetaModel fitted on the released series of the first T − h slots, sMAPE against the true last h
  slots.
- The same workloads serve every mechanism, ε and trial; noise is seeded (experiments only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpcore import GeoDPError
from dpcore.data.points import DataError, Points, clip_to_region
from dpcore.evaluation.metrics import psi_for, relative_error
from dpcore.geo import Region, time_slots
from dpcore.grid.histogram import grid_counts_3d
from dpcore.mechanisms import PrivacyUnit, PrivateSample, get_mechanism, get_mechanism_class, input_for
from dpcore.privacy.bounding import bound_contributions, check_privacy_unit
from dpcore.privacy.budget import check_epsilon
from dpcore.privacy.noise import NoiseSource
from dpcore.queries.range import DEFAULT_WORKLOAD, centre_draw, parse_workload, workload_centres
from dpcore.queries.spatiotemporal import (
    forecast_theta,
    forecast_workload,
    hotspot_errors,
    nearest_hotspot,
    report_nothing,
    season_period,
    smape,
    st_range_workload,
    true_st_counts,
)
from dpcore.synopsis.base import Synopsis

Progress = Callable[[int, int, str], None]
DEFAULT_ST_MAX_POINTS_PER_USER = 50
DEFAULT_ST_QUERY_SIDES_M: tuple[tuple[float, float], ...] = ((100.0, 1000.0), (1000.0, 5000.0))


class STEvalError(GeoDPError, ValueError):
    pass


@dataclass(frozen=True)
class STFitDiagnostics:
    """What one fit of the protocol saw and released, for operator diagnostics (images, forecast plots).

    Holds *true* counts: evaluation output, never a publication. Arrays are the protocol's own (not
    copies); a consumer that keeps them should take what it needs.
    """

    mechanism: str
    epsilon: float
    trial: int
    synopsis: Synopsis
    true_grid: np.ndarray  #: (g, g, T) true counts of all points on the hotspot grid
    released_grid: np.ndarray  #: (g, g, T) the synopsis's counts on the same grid
    forecast_boxes: np.ndarray  #: (q, 4) metres; the first is the whole region
    forecast_truth: np.ndarray  #: (q, T) true per-slot counts
    forecast_released: np.ndarray  #: (q, T) released per-slot counts (the model saw the first T − h)
    forecast: np.ndarray  #: (q, h) the forecast of the last h slots
    horizon: int


OnFit = Callable[[STFitDiagnostics], None]


@dataclass
class STEvalConfig:
    mechanisms: list[str]
    epsilons: list[float]
    window_start_s: int
    window_end_s: int
    slot_seconds: int
    privacy_unit: str = "user"
    max_points_per_user: int = DEFAULT_ST_MAX_POINTS_PER_USER
    query_sides_m: list[tuple[float, float]] = field(default_factory=lambda: list(DEFAULT_ST_QUERY_SIDES_M))
    n_queries: int = 1000
    max_query_slots: int | None = 7
    hotspot_thresholds: tuple[float, ...] = (10.0, 20.0, 40.0)
    hotspot_queries: int = 300
    hotspot_extent_m: float = 2000.0
    hotspot_grid: int = 256
    forecast_queries: int = 20
    forecast_horizon: int | None = None
    trials: int = 1
    seed: int = 0
    mechanism_params: dict[str, dict] = field(default_factory=dict)
    workload: str = DEFAULT_WORKLOAD

    def __post_init__(self) -> None:
        check_privacy_unit(self.privacy_unit)
        self.epsilons = [check_epsilon(e) for e in self.epsilons]
        if not self.mechanisms:
            raise STEvalError("at least one mechanism is needed")
        self.workload = str(parse_workload(self.workload))
        for m in self.mechanisms:
            if not get_mechanism_class(m).tags.input_type.needs_time_slots:
                raise STEvalError(f"mechanism {m!r} is not spatio-temporal; use e.g. identity3d or vdr")
        if self.window_end_s <= self.window_start_s:
            raise STEvalError("the window's end must be after its start")
        if self.slot_seconds < 1:
            raise STEvalError("slot length must be ≥ 1 s")

    @property
    def n_slots(self) -> int:
        return -(-(self.window_end_s - self.window_start_s) // self.slot_seconds)

    def horizon(self) -> int:
        if self.forecast_horizon is not None:
            return max(1, min(int(self.forecast_horizon), self.n_slots - 2))
        period = season_period(self.slot_seconds)
        if period and self.n_slots >= 3 * period:
            return period
        return max(1, self.n_slots // 4)


def _truth_series(x, y, slot, region, n_slots, boxes) -> np.ndarray:
    q = boxes.shape[0]
    starts = np.tile(np.arange(n_slots), q)
    ranges = np.stack([starts, starts + 1], axis=1)
    return true_st_counts(x, y, slot, region, n_slots, np.repeat(boxes, n_slots, axis=0), ranges).reshape(q, n_slots)


def evaluate_st(points: Points, region: Region, config: STEvalConfig, progress: Progress | None = None,
                train_progress: Progress | None = None, on_fit: OnFit | None = None) -> dict:
    """Run the protocol; returns the JSON-able report (schema in the module docstring and README).

    ``on_fit`` (optional) gets an STFitDiagnostics after every fit; it does not change the protocol."""
    idx, x, y = clip_to_region(points, region)
    t = config.n_slots
    slot_all = time_slots(points.ts[idx], config.window_start_s, config.slot_seconds, t)
    inside = slot_all >= 0
    x, y, slot, user = x[inside], y[inside], slot_all[inside], points.user[idx][inside]
    n_points = int(x.size)
    if n_points == 0:
        raise DataError(f"no points fall inside region {region.name} and the window")
    psi = psi_for(n_points)
    rng = np.random.default_rng([config.seed, 0x57])
    # --- workloads and truth (shared by all mechanisms) ------------------------------------------
    spec = parse_workload(config.workload)
    centres = workload_centres(spec, region, x, y)
    workloads = []
    for a, b in config.query_sides_m:
        boxes, ranges = st_range_workload(region, t, config.n_queries, a, b, rng, max_slots=config.max_query_slots,
                                          centres=centres)
        workloads.append(((a, b), boxes, ranges, true_st_counts(x, y, slot, region, t, boxes, ranges)))
    g = config.hotspot_grid
    true_grid = grid_counts_3d(x, y, slot, region.bounds_m, g, g, t).astype(np.float64)
    if spec.kind == "data":
        # where and when people are: a drawn point's location and its own slot
        pick = rng.integers(0, n_points, config.hotspot_queries)
        h_pts, h_t = np.column_stack([x[pick], y[pick]]), slot[pick].astype(np.int64)
    else:
        if centres is None:
            h_pts = rng.uniform(-region.half_m, region.half_m, (config.hotspot_queries, 2))
        else:
            h_pts = np.column_stack(centre_draw(region, config.hotspot_queries, rng, centres))
        h_t = rng.integers(0, t, config.hotspot_queries)
    h_ranges = np.stack([h_t, h_t + 1], axis=1)
    true_hot = {v: nearest_hotspot(true_grid, region, h_pts, v, config.hotspot_extent_m, h_ranges)
                for v in config.hotspot_thresholds}
    nothing = []
    for v in config.hotspot_thresholds:
        d, r = hotspot_errors(report_nothing(h_pts.shape[0]), true_hot[v], true_grid, region, v,
                              config.hotspot_extent_m, h_ranges)
        nothing.append({"threshold": v, "distance_error_m": float(d.mean()), "regret": float(r.mean())})
    horizon = config.horizon()
    f_boxes = forecast_workload(region, config.forecast_queries, 1000.0, 5000.0, rng, centres)
    f_truth = _truth_series(x, y, slot, region, t, f_boxes)
    period = season_period(config.slot_seconds)

    total = len(config.mechanisms) * len(config.epsilons) * config.trials
    done = 0
    results = []
    for mech in config.mechanisms:
        params = dict(config.mechanism_params.get(mech, {}))
        for eps in config.epsilons:
            acc: dict[str, list] = {"rel": [], "rel_w": [[] for _ in workloads], "fit": [], "ans": [],
                                    "smape": [], **{f"d{v}": [] for v in config.hotspot_thresholds},
                                    **{f"r{v}": [] for v in config.hotspot_thresholds}}
            extra_info: dict = {}
            for trial in range(config.trials):
                noise = NoiseSource.seeded(int(np.random.SeedSequence(
                    [config.seed, trial, int(eps * 1e6), sum(map(ord, mech))]).generate_state(1)[0]))
                if config.privacy_unit == "user":
                    keep = bound_contributions(user, config.max_points_per_user, noise.rng).keep
                    k = config.max_points_per_user
                else:
                    keep = np.arange(n_points)
                    k = None
                sample = PrivateSample(x[keep], y[keep], region, PrivacyUnit.of(config.privacy_unit, k),
                                       user=user[keep], slot=slot[keep], n_slots=t, slot_seconds=config.slot_seconds,
                                       window_start_s=config.window_start_s, public_total=float(n_points))
                mechanism = get_mechanism(mech, **params)
                data = input_for(mechanism.tags.input_type, sample)
                if hasattr(mechanism, "progress"):
                    mechanism.progress = train_progress
                t0 = time.perf_counter()
                syn = mechanism.fit(data, eps, noise)
                acc["fit"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for w, (_, boxes, ranges, truth) in enumerate(workloads):
                    e = relative_error(syn.answer_st(boxes, ranges), truth, psi)
                    acc["rel_w"][w].append(e)
                    acc["rel"].append(e)
                acc["ans"].append(time.perf_counter() - t0)
                rel_grid = syn.density_st(g)
                for v in config.hotspot_thresholds:
                    found = nearest_hotspot(rel_grid, region, h_pts, v, config.hotspot_extent_m, h_ranges)
                    d, r = hotspot_errors(found, true_hot[v], true_grid, region, v, config.hotspot_extent_m, h_ranges)
                    acc[f"d{v}"].append(d)
                    acc[f"r{v}"].append(r)
                released_series = syn.series(f_boxes)
                fc = forecast_theta(released_series[:, : t - horizon], horizon, period)
                acc["smape"].append(smape(fc, f_truth[:, t - horizon:]))
                if on_fit is not None:
                    on_fit(STFitDiagnostics(mech, eps, trial, syn, true_grid, rel_grid, f_boxes, f_truth,
                                            released_series, fc, horizon))
                extra_info = {k2: v2 for k2, v2 in syn.extra_meta().items()
                              if k2 in ("train_seconds", "train_steps", "inference_seconds", "device", "codes_used",
                                        "grid_size", "resolution")}
                done += 1
                if progress:
                    progress(done, total, f"{mech} ε={eps:g} trial {trial + 1}/{config.trials}")
            rel = np.concatenate(acc["rel"])
            hot = [{"threshold": v, "distance_error_m": float(np.concatenate(acc[f"d{v}"]).mean()),
                    "regret": float(np.concatenate(acc[f"r{v}"]).mean())} for v in config.hotspot_thresholds]
            results.append({
                "mechanism": mech, "epsilon": eps,
                "max_points_per_user": config.max_points_per_user if config.privacy_unit == "user" else None,
                "mean_relative_error": float(rel.mean()), "median_relative_error": float(np.median(rel)),
                "query_sides_m": [list(s) for s, *_ in workloads],
                "range_workloads": [{"query_sides_m": list(s), "mean_relative_error": float(np.concatenate(e).mean()),
                                     "median_relative_error": float(np.median(np.concatenate(e)))}
                                    for (s, *_), e in zip(workloads, acc["rel_w"], strict=True)],
                "hotspot_distance_error": float(np.mean([h["distance_error_m"] for h in hot])),
                "hotspot_regret": float(np.mean([h["regret"] for h in hot])),
                "hotspot": hot,
                "forecast_smape": float(np.concatenate(acc["smape"]).mean()),
                "trials": config.trials, "queries": config.n_queries * len(workloads),
                "fit_seconds": float(np.mean(acc["fit"])), "answer_seconds": float(np.mean(acc["ans"])),
                "params": params, **extra_info,
            })
    return {
        "n_points": n_points, "n_users": int(np.unique(user).size), "privacy_unit": config.privacy_unit,
        "region": region.to_dict(), "psi": psi, "seed": config.seed,
        "window": {"start_s": config.window_start_s, "end_s": config.window_end_s,
                   "slot_seconds": config.slot_seconds, "n_slots": t},
        "total_points_source": "public input of the evaluation protocol (N of the region and window)",
        "noise_source": "seeded (experiments only)",
        "workload": {"centres": str(spec), "description": spec.describe()},
        # Baselines that use no data: answering 0 to every range query, and reporting no hotspot.
        "reference_answer_zero": [
            {"query_sides_m": list(s), "mean_relative_error": float(
                relative_error(np.zeros_like(truth, dtype=np.float64), truth, psi).mean())}
            for s, _, _, truth in workloads],
        "reference_report_nothing": {
            "hotspot_distance_error": float(np.mean([h["distance_error_m"] for h in nothing])),
            "hotspot_regret": float(np.mean([h["regret"] for h in nothing])), "hotspot": nothing},
        "workloads": {
            "range": {"query_sides_m": [list(s) for s, *_ in workloads], "queries_per_workload": config.n_queries,
                      "slot_range_length": [1, min(t, config.max_query_slots or t)],
                      "metric": "|est - truth| / max(truth, psi), psi = 0.1% of n_points"},
            "hotspot": {"queries": config.hotspot_queries, "thresholds": list(config.hotspot_thresholds),
                        "extent_m": config.hotspot_extent_m, "grid": g, "slot_range_length": 1,
                        "metric": "distance error (m) to the true nearest hotspot (extent when only one exists); "
                                  "regret max(0, v - true count of the reported cell), v when none is reported"},
            "forecast": {"series": int(f_boxes.shape[0]), "horizon": horizon, "train_slots": t - horizon,
                         "period": period, "model": "statsmodels ThetaModel (seasonality test, method auto)",
                         "metric": "sMAPE in [0, 2]"},
        },
        "results": results,
    }


def format_st_table(report: dict) -> str:
    w = report["window"]
    work = report.get("workload", {}).get("centres", "uniform")
    rows = [f"{report['n_points']:,} points, {report['n_users']:,} users, {w['n_slots']} slots of "
            f"{w['slot_seconds']}s, privacy unit {report['privacy_unit']}, ψ = {report['psi']:g}, "
            f"query locations: {work}",
            f"{'mechanism':<11} {'ε':>5} {'mean rel.err':>12} {'median':>8} {'hot dist m':>10} {'regret':>7} "
            f"{'sMAPE':>6} {'fit s':>7}"]
    for r in report["results"]:
        rows.append(f"{r['mechanism']:<11} {r['epsilon']:>5g} {r['mean_relative_error']:>12.4f} "
                    f"{r['median_relative_error']:>8.4f} {r['hotspot_distance_error']:>10.1f} "
                    f"{r['hotspot_regret']:>7.2f} {r['forecast_smape']:>6.3f} {r['fit_seconds']:>7.1f}")
    zero = report.get("reference_answer_zero")
    nothing = report.get("reference_report_nothing")
    if zero and nothing:
        z = float(np.mean([r["mean_relative_error"] for r in zero]))
        rows.append(f"{'(no data)':<11} {'-':>5} {z:>12.4f} {'':>8} {nothing['hotspot_distance_error']:>10.1f} "
                    f"{nothing['hotspot_regret']:>7.2f} {'-':>6} {'-':>7}   reference: answer 0, report no hotspot")
    return "\n".join(rows)
