"""Evaluation as a task: the core harness (dpcore.evaluate) for one (city, mechanism, ε).

Evaluation reads the raw data for its ground truth; its outputs (error tables, plots) are for
operators and research, not publications, and are never written to the release store.
"""

from __future__ import annotations

import io

from prefect import task
from prefect.cache_policies import NO_CACHE

from dpcore.data import Points
from dpcore.evaluate import EvalConfig, evaluate
from dpcore.geo import city_region


@task(name="evaluate-one", cache_policy=NO_CACHE)
def evaluate_one(points: Points, city: str, mechanism: str, epsilon: float, privacy_unit: str,
                 max_points_per_user: int, query_sides_m: list[tuple[float, float]], queries: int, trials: int,
                 seed: int) -> dict:
    config = EvalConfig(mechanisms=[mechanism], epsilons=[epsilon], privacy_unit=privacy_unit,
                        max_points_per_user=max_points_per_user, query_sides_m=[tuple(q) for q in query_sides_m],
                        n_queries=queries, trials=trials, seed=seed)
    report = evaluate(points, city_region(city), config)
    return {"city": city, "n_points": report["n_points"], "n_users": report["n_users"],
            "results": report["results"]}


def error_plot_png(rows: list[dict]) -> bytes:
    """Mean relative error against ε, one line per (city, mechanism, query sides)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=90)
    series: dict[tuple, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault((r["city"], r["mechanism"], tuple(r["query_sides_m"])), []).append(
            (r["epsilon"], r["mean_relative_error"]))
    for (city, mech, sides), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{city} {mech} {sides[0]:g}-{sides[1]:g} m")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("mean relative error")
    ax.legend(fontsize=5)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
