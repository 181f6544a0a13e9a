"""Evaluation as tasks: the core harness (dpcore.evaluation.range) for one (city, mechanism, ε), the
spatio-temporal harness (dpcore.evaluation.spatiotemporal) for one (city, mechanism, ε), and the plots of their
artifacts (error vs ε, released vs true slots, forecasts, training curves).

Evaluation reads the raw data for its ground truth; its outputs (error tables, plots, and the images
of *true* counts) are for operators and research, not publications, and are never written to the
release store.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np

from dpcore.data.points import Points
from dpcore.evaluation.range import EvalConfig, evaluate
from dpcore.geo import city_region, parse_slot
from dpcore.grid.histogram import block_sum
from tasks.config import STEvaluateOptions
from tasks.lazy_task import NO_CACHE, task
from tasks.public_errors import without_private_detail
from tasks.runtime import run_logger

#: Where the operator sees a failed evaluation's own message (tasks/public_errors.py): the in-process form.
IN_PROCESS = "run the same `geodp eval` command without --flow"

OPERATOR_ONLY = ("Operator diagnostics: these images show TRUE counts of the private data next to the "
                 "released ones. Not a publication; never copy them into a release.")


@task(name="evaluate-one", cache_policy=NO_CACHE, persist_result=False)  # n, ψ and errors vs the truth
def evaluate_one(points: Points, city: str, mechanism: str, epsilon: float, privacy_unit: str,
                 max_points_per_user: int, query_sides_m: list[tuple[float, float]], queries: int, trials: int,
                 seed: int, mechanism_params: dict | None = None, workload: str = "data",
                 bounding: str = "sample") -> dict:
    """One (city, mechanism, ε) of the 2-D harness. ``training`` lists the loss curve of every trial
    whose synopsis has one (SNH, or auto choosing SNH). The references (answer 0, the hindsight grid at
    this ε) are the same in every task of a city and ε: they draw from seeds of their own."""
    config = EvalConfig(mechanisms=[mechanism], epsilons=[epsilon], privacy_unit=privacy_unit,
                        max_points_per_user=max_points_per_user, query_sides_m=[tuple(q) for q in query_sides_m],
                        n_queries=queries, trials=trials, seed=seed,
                        mechanism_params={mechanism: dict(mechanism_params or {})}, workload=workload,
                        bounding=bounding)
    training: list[dict] = []

    def keep_losses(mech: str, eps: float, trial: int, synopsis) -> None:
        # a ScaledSynopsis forwards unknown attributes to the synopsis it scales
        losses = getattr(synopsis, "training_losses", None)
        if losses:
            run_logger().info("%s %s ε=%g trial %d: trained %d epochs, loss %.4g → %.4g", city, mech, eps,
                              trial + 1, len(losses), losses[0], losses[-1])
            training.append({"mechanism": mech, "epsilon": eps, "trial": trial,
                             "losses": [float(v) for v in losses]})

    with forward_logs("dpcore.mechanisms.snh", run_logger()):  # SNH's per-epoch progress into the task log
        report = without_private_detail(lambda: evaluate(points, city_region(city), config, on_fit=keep_losses),
                                        city, step=f"evaluating {mechanism} at ε={epsilon:g}", hint=IN_PROCESS)
    return {"city": city, "n_points": report["n_points"], "n_users": report["n_users"], "psi": report["psi"],
            "results": report["results"], "training": training,
            "reference_answer_zero": report["reference_answer_zero"],
            "reference_hindsight_grid": report["reference_hindsight_grid"], "workload": report["workload"],
            "bounding": report["bounding"]}


def block_sum_xy(grid: np.ndarray, max_cells: int) -> np.ndarray:
    """Sum (nx, ny, k) cells into blocks so that each side has at most ``max_cells`` (zero-padded)."""
    f = max(1, math.ceil(max(grid.shape[:2]) / max_cells))
    return block_sum(np.array(grid, dtype=np.float64), f, pad=True)


@contextlib.contextmanager
def forward_logs(name: str, target: logging.Logger | logging.LoggerAdapter) -> Iterator[None]:
    """Send a library logger's INFO records to ``target`` (the task run's logger) while inside."""
    source = logging.getLogger(name)

    class _Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            target.log(record.levelno, record.getMessage())

    handler, level, propagate = _Forward(logging.INFO), source.level, source.propagate
    source.addHandler(handler)
    source.propagate = False  # the task logger prints it already
    if not source.isEnabledFor(logging.INFO):
        source.setLevel(logging.INFO)
    try:
        yield
    finally:
        source.removeHandler(handler)
        source.setLevel(level)
        source.propagate = propagate


_LOSS = re.compile(r"loss\s+([-+0-9.eE]+|nan)")


@task(name="evaluate-st-one", cache_policy=NO_CACHE, persist_result=False)  # true counts of slots
def evaluate_st_one(points: Points, city: str, mechanism: str, epsilon: float, options: STEvaluateOptions,
                    privacy_unit: str, seed: int, mechanism_params: dict | None = None,
                    draw: bool = False, workload: str = "data") -> dict:
    """One (city, mechanism, ε) of the spatio-temporal harness on the points of the public window.

    With ``draw``, the first trial's released and true counts of a few slots and a few forecast
    series come back too (small arrays, for the operator artifacts)."""
    from dpcore.evaluation.spatiotemporal import STEvalConfig, STFitDiagnostics, evaluate_st

    start, end = options.window_seconds()
    slot_s = parse_slot(options.slot)
    config = STEvalConfig(
        mechanisms=[mechanism], epsilons=[epsilon], window_start_s=start, window_end_s=end, slot_seconds=slot_s,
        privacy_unit=privacy_unit, max_points_per_user=options.max_points_per_user,
        query_sides_m=[tuple(q) for q in options.query_sides_m], n_queries=options.queries,
        max_query_slots=options.max_query_slots, hotspot_queries=options.hotspot_queries,
        hotspot_extent_m=options.hotspot_extent_km * 1000.0, hotspot_grid=options.hotspot_grid,
        forecast_queries=options.forecast_queries, forecast_horizon=options.horizon, trials=options.trials,
        seed=seed, mechanism_params={mechanism: dict(mechanism_params or {})}, workload=workload)
    logger = run_logger()
    curve: list[tuple[int, float]] = []

    def train_progress(step: int, total: int, message: str) -> None:
        logger.info("%s %s ε=%g training %d/%d %s", city, mechanism, epsilon, step, total, message)
        m = _LOSS.search(message)
        if m and len(curve) < 10_000:
            curve.append((int(step), float(m.group(1))))

    drawn: dict = {}

    def keep_images(d: STFitDiagnostics) -> None:
        if not draw or d.trial != 0:
            return
        t = d.true_grid.shape[2]
        slots = np.unique(np.linspace(0, t - 1, min(options.image_slots, t)).round().astype(int))
        q = min(options.forecast_plots, d.forecast_truth.shape[0])
        drawn.update({
            "slots": slots.tolist(),
            "slot_starts_s": [start + int(s) * slot_s for s in slots],
            "true": block_sum_xy(d.true_grid[:, :, slots], options.image_cells),
            "released": block_sum_xy(d.released_grid[:, :, slots], options.image_cells),
            "forecast_truth": np.array(d.forecast_truth[:q]), "forecast_released": np.array(d.forecast_released[:q]),
            "forecast": np.array(d.forecast[:q]), "horizon": int(d.horizon),
            "forecast_boxes_m": np.array(d.forecast_boxes[:q]),
        })

    def progress(done: int, total: int, what: str) -> None:
        logger.info("%s evaluate-st %d/%d %s", city, done, total, what)

    report = without_private_detail(
        lambda: evaluate_st(points, city_region(city), config, progress=progress, train_progress=train_progress,
                            on_fit=keep_images),
        city, step=f"evaluating {mechanism} at ε={epsilon:g} in space and time", hint=IN_PROCESS)
    meta = {k: v for k, v in report.items() if k != "results"}
    training = [{"mechanism": mechanism, "epsilon": epsilon, "trial": None, "steps": [s for s, _ in curve],
                 "losses": [v for _, v in curve]}] if curve else []
    return {"city": city, "mechanism": mechanism, "epsilon": epsilon, "report": meta,
            "results": report["results"], "images": drawn or None, "training": training}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def error_plot_png(rows: list[dict], references: list[dict] | None = None) -> bytes:
    """Mean relative error against ε, one line per (city, mechanism, query sides); each answer-0
    reference (city, query sides, mean relative error) as a dashed horizontal line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=90)
    series: dict[tuple, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault((r["city"], r["mechanism"], tuple(r["query_sides_m"])), []).append(
            (r["epsilon"], r["mean_relative_error"]))
    for (city, mech, sides), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{city} {mech} {sides[0]:g}-{sides[1]:g} m")
    for ref in references or []:
        a, b = ref["query_sides_m"]
        ax.axhline(ref["mean_relative_error"], linestyle="--", linewidth=0.8, color="grey")
        ax.annotate(f"answer 0, {ref['city']} {a:g}-{b:g} m", (0.01, ref["mean_relative_error"]),
                    xycoords=("axes fraction", "data"), fontsize=5, color="grey", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("mean relative error")
    ax.legend(fontsize=5)
    return _png(fig)


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%d %H:%M")


def st_slots_png(images: dict, title: str) -> bytes:
    """True | released counts for each drawn slot, side by side on one log colour scale
    (log10(1 + count); negative released cells drawn as 0)."""
    plt = _plt()
    true, rel = np.asarray(images["true"], float), np.asarray(images["released"], float)
    n = true.shape[2]
    vmax = float(np.log10(1.0 + max(true.max(initial=0.0), rel.max(initial=0.0), 1.0)))
    fig, axes = plt.subplots(n, 2, figsize=(6.4, 3.0 * n + 0.4), dpi=80, squeeze=False, layout="constrained")
    im = None
    for i in range(n):
        for j, (grid, what) in enumerate(((true, "true (all points)"), (rel, "released"))):
            ax = axes[i, j]
            # grids are (x, y): transpose so north is up
            im = ax.imshow(np.log10(1.0 + np.maximum(grid[:, :, i], 0.0)).T, origin="lower", cmap="magma",
                           vmin=0.0, vmax=vmax, interpolation="nearest")
            ax.set_title(f"{what}, slot {images['slots'][i]} ({_when(images['slot_starts_s'][i])})\n"
                         f"total {grid[:, :, i].sum():,.0f}", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="log10(1 + count)")
    return _png(fig)


def forecast_png(images: dict, title: str) -> bytes:
    """Per forecast series: the released history the model saw, its forecast, and the true series
    (its last h slots are the future the forecast is scored on)."""
    plt = _plt()
    truth = np.asarray(images["forecast_truth"], float)
    released = np.asarray(images["forecast_released"], float)
    fc = np.asarray(images["forecast"], float)
    h = int(images["horizon"])
    q, t = truth.shape
    fig, axes = plt.subplots(q, 1, figsize=(6.4, 2.0 * q + 0.4), dpi=80, squeeze=False, layout="constrained")
    x = np.arange(t)
    for i in range(q):
        ax = axes[i, 0]
        ax.plot(x[: t - h], released[i, : t - h], color="tab:blue", marker=".", label="released history")
        ax.plot(x[t - h:], fc[i], color="tab:orange", marker="o", label="forecast")
        ax.plot(x, truth[i], color="black", linestyle="--", linewidth=0.9, label="true (future: last h)")
        ax.axvline(t - h - 0.5, color="grey", linewidth=0.6)
        ax.set_ylabel("count", fontsize=7)
        ax.set_title("whole region" if i == 0 else f"square {i}", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[-1, 0].set_xlabel("slot")
    axes[0, 0].legend(fontsize=6)
    fig.suptitle(title, fontsize=8)
    return _png(fig)


def training_curve_png(curves: list[dict], title: str) -> bytes:
    """Training loss against epoch (or step), one line per (city, mechanism, ε, trial)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=90)
    for c in curves:
        ys = np.asarray(c["losses"], float)
        xs = np.asarray(c.get("steps") or np.arange(1, ys.size + 1))
        trial = "" if c.get("trial") is None else f" trial {c['trial'] + 1}"
        ax.plot(xs, ys, marker=".", label=f"{c.get('city', '')} {c['mechanism']} ε={c['epsilon']:g}{trial}".strip())
    if all(v > 0 for c in curves for v in c["losses"] if math.isfinite(v)):
        ax.set_yscale("log")
    ax.set_xlabel("step" if any(c.get("steps") for c in curves) else "epoch")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=5)
    return _png(fig)
