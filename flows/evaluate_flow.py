"""The `evaluate` flow: the core evaluation harness with one Dask task per (city, mechanism, ε), and,
when ``params.spatio_temporal`` is given, the spatio-temporal harness with one Dask task per
(city, mechanism, ε) on the same cluster, so cities and mechanisms run in parallel.

Artifacts: a table of every 2-D result row and a markdown summary with an error-vs-ε plot; SNH
training curves; per city a table of spatio-temporal rows and a markdown artifact with released vs
true heatmaps of a few slots and forecast plots for each mechanism at one ε. The images of true
counts are operator diagnostics: labelled so, and written (besides the Prefect artifacts) only to
``params.output_dir``, which may not be a release store.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from dpcore.data.points import Points, clip_to_region
from dpcore.geo import city_region
from flows.release_summary import artifact_key as _artifact_key
from tasks.config import ConfigError, EvaluateParams
from tasks.evaluate_tasks import (
    OPERATOR_ONLY,
    error_plot_png,
    evaluate_one,
    evaluate_st_one,
    forecast_png,
    st_slots_png,
    training_curve_png,
)
from tasks.release_tasks import load_and_validate
from tasks.runtime import dask_for_run


def check_output_dir(output_dir: str | None) -> Path | None:
    """The local folder for artifact images; refuses URLs and release stores (true counts inside)."""
    if not output_dir:
        return None
    from tasks.storage.store import STORE_ID

    if "://" in output_dir:
        raise ConfigError(f"output_dir must be a local folder, got {output_dir!r}")
    path = Path(output_dir).resolve()
    for p in (path, *path.parents):
        if (p / STORE_ID).exists() or ((p / "ledger").is_dir() and (p / "releases").is_dir()):
            raise ConfigError(f"output_dir {output_dir!r} is inside the release store {p}; evaluation "
                              "images show true counts and never go into a release store")
    return path


def within(points: Points, city: str, window: tuple[int, int] | None = None) -> Points:
    """The points inside a catalog city's region (and a time window): public selections only."""
    if window is not None:
        points = points.between(*window)
    idx, _, _ = clip_to_region(points, city_region(city))
    return points.take(idx)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in text)


@flow(name="evaluate", log_prints=True, persist_result=False,
      description="OPERATOR ONLY: reads the private data for its ground truth; its artifacts show errors "
                  "against true counts and images of true counts, never n, user counts or ψ "
                  "(docs/decisions/0014-what-the-prefect-ui-shows.md)")
def evaluate_flow(params: EvaluateParams) -> dict:
    with dask_for_run(params.dask_address, params.n_workers):
        return _evaluate(params)


def _evaluate(params: EvaluateParams) -> dict:
    out_dir = check_output_dir(params.output_dir)
    loaded = load_and_validate(params.data, params.columns, params.format)
    st = params.spatio_temporal
    # Each task gets only its city's points (the harnesses clip to the region themselves, so results
    # are unchanged): every submit ships its arguments to the cluster.
    futures = []
    if params.mechanisms:
        city_points = {city: within(loaded.points, city) for city in params.cities}
        futures = [evaluate_one.submit(city_points[city], city, mech, eps, params.privacy_unit,
                                       params.max_points_per_user, params.query_sides_m, params.queries, params.trials,
                                       params.seed, params.mechanism_params.get(mech, {}), params.workload,
                                       params.bounding)
                   for city in params.cities for mech in params.mechanisms for eps in params.epsilons]
    st_futures = []
    if st is not None:
        window = st.window_seconds()
        st_points = {city: within(loaded.points, city, window) for city in params.cities}
        drawn_eps = st.drawn_epsilon()
        st_futures = [evaluate_st_one.submit(st_points[city], city, mech, eps, st, params.privacy_unit, params.seed,
                                             params.mechanism_params.get(mech, {}),
                                             draw=math.isclose(eps, drawn_eps, rel_tol=1e-9), workload=params.workload)
                      for city in params.cities for mech in st.mechanisms for eps in st.epsilons]
    outs = [f.result() for f in futures]
    st_outs = [f.result() for f in st_futures]
    files: dict[str, bytes] = {}
    summary: dict = {"privacy_unit": params.privacy_unit, "data_version": loaded.data_version, "results": [],
                     "training": [], "cities": {}}
    if outs:
        rows = [{"city": o["city"], **r} for o in outs for r in o["results"]]
        training = [{"city": o["city"], **c} for o in outs for c in o["training"]]
        references = [{"city": o["city"], **ref} for o in outs for ref in o["reference_answer_zero"]]
        # Every task of a city draws the same workloads, so its references are one per band (answer 0)
        # and one per (ε, band) (the hindsight grid, which draws noise from seeds of its own).
        references = list({(r["city"], tuple(r["query_sides_m"])): r for r in references}.values())
        hindsight = {}
        for o in outs:
            for r in o["reference_hindsight_grid"]:
                hindsight[(o["city"], r["epsilon"], tuple(r["query_sides_m"]))] = r
        _publish_2d(params, loaded.data_version, rows, training, files, references,
                    [{"city": c, **r} for (c, _, _), r in hindsight.items()])
        summary.update({"results": rows, "training": training, "workload": outs[0]["workload"],
                        "bounding": outs[0]["bounding"],
                        "cities": {o["city"]: {"n_points": o["n_points"], "n_users": o["n_users"], "psi": o["psi"],
                                               "workload": o["workload"], "bounding": o["bounding"],
                                               "reference_answer_zero": o["reference_answer_zero"],
                                               "reference_hindsight_grid": sorted(
                                                   (r for (c, _, _), r in hindsight.items() if c == o["city"]),
                                                   key=lambda r: (r["epsilon"], r["query_sides_m"]))}
                                   for o in outs}})
    if st_outs:
        summary["spatio_temporal"] = _publish_st(params, loaded.data_version, st_outs, files)
    from prefect.runtime import flow_run

    summary["flow_run_id"] = str(flow_run.id) if flow_run.id else None
    if out_dir is not None:
        summary["output_files"] = _write_files(out_dir, files, summary)
    return summary


def _publish_2d(params: EvaluateParams, data_version: str, rows: list[dict], training: list[dict],
                files: dict[str, bytes], references: list[dict], hindsight: list[dict]) -> None:
    def sides(r: dict) -> str:
        return f"{r['query_sides_m'][0]:g}-{r['query_sides_m'][1]:g}"

    create_table_artifact(
        [{"city": r["city"], "mechanism": r["mechanism"], "ε": r["epsilon"], "query sides (m)": sides(r),
          "mean rel. error": round(r["mean_relative_error"], 4),
          "median rel. error": round(r["median_relative_error"], 4),
          "× answer 0": _round(r.get("ratio_to_answer_zero")),
          "× hindsight grid": _round(r.get("ratio_to_hindsight_grid"))} for r in rows]
        + [{"city": r["city"], "mechanism": "answer 0 (reference)", "ε": "-", "query sides (m)": sides(r),
            "mean rel. error": round(r["mean_relative_error"], 4), "median rel. error": "-",
            "× answer 0": "-", "× hindsight grid": "-"} for r in references]
        + [{"city": r["city"], "mechanism": f"hindsight grid {r['grid_size']}² (reference, NOT DP)", "ε": r["epsilon"],
            "query sides (m)": sides(r), "mean rel. error": round(r["mean_relative_error"], 4),
            "median rel. error": round(r["median_relative_error"], 4), "× answer 0": "-", "× hindsight grid": "-"}
           for r in hindsight],
        key=_artifact_key(f"evaluate-{data_version}"),
        description="OPERATOR ONLY: range-count relative error against the true counts")
    png = error_plot_png(rows, references)
    files["error-vs-epsilon.png"] = png
    create_markdown_artifact(
        f"# Evaluation of {', '.join(params.mechanisms)} on {', '.join(params.cities)} (OPERATOR ONLY)\n\n"
        "Errors are measured against the true counts of the private data: operator diagnostics, not a "
        "publication.\n\n"
        f"{len(rows)} result rows, privacy unit {params.privacy_unit}, k={params.max_points_per_user}, "
        f"bounding {params.bounding}, query centres: {params.workload}.\n\n"
        "Dashed lines: answering 0 to every query (no data, no noise). A mechanism above its line "
        "tells less than a blank map under this metric. The table also gives each row's ratio to the "
        "hindsight grid: the identity grid whose size was picked with the true answers (a yardstick, "
        "not a DP mechanism).\n\n"
        f"![error vs epsilon]({_data_uri(png)})\n",
        key=_artifact_key(f"evaluate-summary-{data_version}"), description="OPERATOR ONLY: evaluation summary")
    if not training:
        return
    lines = ["# Training curves (2-D evaluation)", "",
             "Training loss per epoch of every fit that trains a model (SNH, or auto choosing SNH); one line "
             "per ε and trial. The loss is on the noisy grid's augmented labels (post-processing).", ""]
    for city in params.cities:
        for mech in params.mechanisms:
            curves = [c for c in training if c["city"] == city and c["mechanism"] == mech]
            if not curves:
                continue
            png = training_curve_png(curves, f"{city}: {mech} training loss")
            files[f"{_slug(city)}/{_slug(mech)}-training.png"] = png
            lines += [f"## {city} · {mech}", "", f"![{mech} training loss, {city}]({_data_uri(png)})", ""]
    create_markdown_artifact("\n".join(lines), key=_artifact_key(f"evaluate-training-{data_version}"),
                             description="training curves of the evaluated mechanisms")


def _round(v: float | None) -> float | str:
    return "-" if v is None else round(v, 3)


def _st_reference_rows(report: dict) -> list[dict]:
    """The no-data baselines of an evaluate-st report: answer 0 (range) and no hotspot reported."""
    zero, nothing = report.get("reference_answer_zero"), report.get("reference_report_nothing")
    if not zero or not nothing:
        return []
    z = sum(r["mean_relative_error"] for r in zero) / len(zero)
    return [{"mechanism": "no data (reference: answer 0, report no hotspot)", "ε": "-",
             "mean rel. error": round(z, 4), "hotspot distance error (m)": round(nothing["hotspot_distance_error"], 1),
             "hotspot regret": round(nothing["hotspot_regret"], 3), "forecast sMAPE": "-", "fit s": "-"}]


def _publish_st(params: EvaluateParams, data_version: str, st_outs: list[dict], files: dict[str, bytes]) -> dict:
    """Per city: the evaluate-st report (rows in dpcore.evaluation.spatiotemporal's key names), a table artifact and a
    markdown artifact with the slot images and forecast plots of each mechanism at the drawn ε."""
    st = params.spatio_temporal
    assert st is not None
    drawn_eps = st.drawn_epsilon()
    cities: dict[str, dict] = {}
    for city in params.cities:
        mine = [o for o in st_outs if o["city"] == city]
        report = {**mine[0]["report"], "results": [r for o in mine for r in o["results"]]}
        report["training"] = [c for o in mine for c in o["training"]]
        cities[city] = report
        key = _artifact_key(f"evaluate-st-{city}-{data_version}")
        create_table_artifact(
            [{"mechanism": r["mechanism"], "ε": r["epsilon"], "mean rel. error": round(r["mean_relative_error"], 4),
              "hotspot distance error (m)": round(r["hotspot_distance_error"], 1),
              "hotspot regret": round(r["hotspot_regret"], 3), "forecast sMAPE": round(r["forecast_smape"], 4),
              "fit s": round(r["fit_seconds"], 1)} for r in report["results"]]
            + _st_reference_rows(report),
            key=key, description=f"OPERATOR ONLY: spatio-temporal evaluation of {city} against the true counts")
        w = report["window"]
        # n and ψ (a fraction of n) stay out of the UI: they are in the flow's return value and
        # output_dir's evaluate.json, on the operator's side (docs/decisions/0014)
        lines = [f"# Spatio-temporal evaluation: {city} (OPERATOR ONLY)", "", f"> {OPERATOR_ONLY}", "",
                 f"{w['n_slots']} slots of {w['slot_seconds']} s, privacy unit {report['privacy_unit']}, "
                 f"k={st.max_points_per_user}. Images at ε={drawn_eps:g} (first trial).", ""]
        for o in mine:
            img = o["images"]
            if img is None:
                continue
            mech = o["mechanism"]
            title = f"{city} · {mech} · ε={o['epsilon']:g}"
            slots = st_slots_png(img, f"{title}: true vs released (operator only)")
            fc = forecast_png(img, f"{title}: forecast (horizon {img['horizon']})")
            stem = f"{_slug(city)}/{_slug(mech)}-eps{o['epsilon']:g}"
            files[f"{stem}-slots.png"] = slots
            files[f"{stem}-forecast.png"] = fc
            lines += [f"## {mech}", "", f"### true vs released, slots {img['slots']}", "",
                      f"![{mech} true vs released slots]({_data_uri(slots)})", "",
                      "### forecasts (released history, forecast, true series)", "",
                      f"![{mech} forecasts]({_data_uri(fc)})", ""]
        curves = report["training"]
        if curves:
            png = training_curve_png([{**c, "city": city} for c in curves], f"{city}: training loss")
            files[f"{_slug(city)}/st-training.png"] = png
            lines += ["## training curves", "", f"![training loss]({_data_uri(png)})", ""]
        create_markdown_artifact("\n".join(lines), key=key + "-images",
                                 description=f"operator diagnostics (true counts) of {city}")
    return {"window": st.window, "slot": st.slot, "drawn_epsilon": drawn_eps, "cities": cities}


def _write_files(out_dir: Path, files: dict[str, bytes], summary: dict) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(str(path))
    (out_dir / "evaluate.json").write_text(json.dumps(summary, indent=2, default=float))
    return [*written, str(out_dir / "evaluate.json")]


def run_evaluate(params: EvaluateParams) -> dict:
    return evaluate_flow(params)
