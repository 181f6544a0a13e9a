"""The `evaluate` flow: the core evaluation harness with one Dask task per (city, mechanism, ε).

Artifacts: a table of every result row and a markdown summary with an error-vs-ε plot.
"""

from __future__ import annotations

import base64

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.release import _artifact_key
from tasks.config import EvaluateParams
from tasks.evaluate_tasks import error_plot_png, evaluate_one
from tasks.release_tasks import load_and_validate
from tasks.runtime import dask_task_runner


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: EvaluateParams) -> dict:
    loaded = load_and_validate(params.data)
    futures = [evaluate_one.submit(loaded.points, city, mech, eps, params.privacy_unit, params.max_points_per_user,
                                   params.query_sides_m, params.queries, params.trials, params.seed)
               for city in params.cities for mech in params.mechanisms for eps in params.epsilons]
    outs = [f.result() for f in futures]
    rows = [{"city": o["city"], **r} for o in outs for r in o["results"]]
    create_table_artifact(
        [{"city": r["city"], "mechanism": r["mechanism"], "ε": r["epsilon"],
          "query sides (m)": f"{r['query_sides_m'][0]:g}-{r['query_sides_m'][1]:g}",
          "mean rel. error": round(r["mean_relative_error"], 4),
          "median rel. error": round(r["median_relative_error"], 4)} for r in rows],
        key=_artifact_key(f"evaluate-{loaded.data_version}"), description="range-count relative error")
    png = base64.b64encode(error_plot_png(rows)).decode()
    create_markdown_artifact(
        f"# Evaluation of {', '.join(params.mechanisms)} on {', '.join(params.cities)}\n\n"
        f"{len(rows)} result rows, privacy unit {params.privacy_unit}, k={params.max_points_per_user}.\n\n"
        f"![error vs epsilon](data:image/png;base64,{png})\n",
        key=_artifact_key(f"evaluate-summary-{loaded.data_version}"), description="evaluation summary")
    return {"privacy_unit": params.privacy_unit, "results": rows,
            "cities": {o["city"]: {"n_points": o["n_points"], "n_users": o["n_users"]} for o in outs}}


def run_evaluate(params: EvaluateParams) -> dict:
    return evaluate_flow.with_options(task_runner=dask_task_runner(params.dask_address, params.n_workers))(params)
