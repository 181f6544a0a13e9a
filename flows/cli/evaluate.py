"""`geodp eval range|st`: accuracy of mechanisms on a dataset, in this process or (`--flow`) as the
Prefect `evaluate` flow with one Dask task per (city, mechanism, ε) and its artifacts. An evaluation
reads the private data for the true answers; its output is for the operator, never published."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.common import (
    CLIError,
    StepProgress,
    at_least,
    check_mechanism,
    comma,
    emit_json,
    field_default,
    human_out,
    mechanism_capability,
    model_option,
    names,
    noun,
    params_by_mechanism,
    parse_epsilons,
    parse_window,
    validated,
    window_text,
    working,
)
from flows.cli.inputs import (
    Center,
    City,
    Columns,
    Data,
    Format,
    Json,
    Params,
    PrivacyUnit,
    SideKm,
    Strict,
    Workload,
    check_input_options,
    check_public_workload,
    load,
    region,
)
from tasks.config import EvaluateParams, STEvaluateOptions

app = noun("eval", "Accuracy of mechanisms on a dataset: range counts, spatio-temporal, heatmaps, sparse 1-D.")

E, S = EvaluateParams, STEvaluateOptions
Flow = Annotated[bool, typer.Option(
    "--flow", rich_help_panel="flow form",
    help="run as the Prefect `evaluate` flow on Dask, with artifacts; --city may then list several catalog "
         "cities (A,B,...) that run in parallel")]
ArtifactsDir = Annotated[str | None, typer.Option(
    "--artifacts-dir", metavar="DIR", help=E.model_fields["output_dir"].description)]
Workers = Annotated[int, typer.Option("--workers", help="Dask LocalCluster workers of the flow form")]
DaskAddress = Annotated[str | None, typer.Option("--dask-address",
                                                 help="Dask scheduler address (default: a LocalCluster)")]


def _flow_cities(data: str, city: str | None, center: str | None, side_km: float | None, workers: int,
                 strict: bool, fmt: str) -> list[str]:
    """The catalog cities of the flow form, checked before any data is read."""
    from dpcore.data.inputs import resolve_input
    from dpcore.geo import resolve_region

    if center or not city:
        raise CLIError("--flow needs catalog cities (--city A[,B,...]); --center is not supported there")
    cities = names(city)
    for c in cities:
        resolve_region(city=c, side_km=side_km)
    if side_km is not None:
        raise CLIError("--flow evaluates the catalog's city regions; --side-km is not supported there")
    at_least(workers, 1, "--workers")
    if strict:
        raise CLIError("--strict is not supported with --flow (the flow drops invalid rows and reports them)")
    resolve_input(str(data), fmt)  # a missing, empty or mixed-format input fails here
    return cities


def _run_flow(params: EvaluateParams) -> dict:
    from flows.evaluate_flow import check_output_dir, run_evaluate
    from tasks.runtime import local_prefect

    check_output_dir(params.output_dir)  # fail before starting Prefect
    with local_prefect(), working("evaluate flow on Dask"):
        return run_evaluate(params)


@app.command("range")
def range_counts(
    data: Data,
    city: City = None,
    center: Center = None,
    side_km: SideKm = None,
    privacy_unit: PrivacyUnit = field_default(E, "privacy_unit"),
    max_points_per_user: int = model_option(E, "max_points_per_user", "--max-points-per-user", metavar="K",
                                            help="contribution bound k per person (user level)"),
    mechanisms: str = model_option(E, "mechanisms", "--mechanisms", fmt=comma,
                                   help="mechanisms to compare, comma-separated"),
    epsilon: str = model_option(E, "epsilons", "--epsilon", fmt=comma, help="ε values, comma-separated"),
    query_sides_m: str = model_option(E, "query_sides_m", "--query-sides-m", fmt=comma,
                                      help="query side bands in metres, A:B,C:D"),
    queries: int = model_option(E, "queries", "--queries", help="range queries per band"),
    trials: int = model_option(E, "trials", "--trials", help="noise draws averaged per cell of the table"),
    seed: int = model_option(E, "seed", "--seed", help="seed of the queries and noise (an experiment)"),
    workload: Workload = field_default(E, "workload"),
    bounding: str = model_option(E, "bounding", "--bounding"),
    param: Params = None,
    columns: Columns = None,
    format: Format = "auto",
    strict: Strict = False,
    json_out: Json = None,
    flow: Flow = False,
    artifacts_dir: ArtifactsDir = None,
    workers: Workers = field_default(E, "n_workers"),
    dask_address: DaskAddress = None,
) -> int:
    """Range-count relative error of mechanisms at several ε (JSON: n_points, n_users, privacy_unit,
    results)."""
    from dpcore.evaluation.range import EvalConfig, evaluate, format_table
    from dpcore.mechanisms import MechanismError
    from dpcore.queries.range import parse_query_sides

    check_input_options(format, privacy_unit)
    for what, value in (("--queries", queries), ("--trials", trials), ("--max-points-per-user", max_points_per_user)):
        at_least(value, 1, what)
    mechs = names(mechanisms)
    mech_params = params_by_mechanism(param, mechs)
    config = EvalConfig(mechanisms=mechs, epsilons=parse_epsilons(epsilon), privacy_unit=privacy_unit,
                        max_points_per_user=max_points_per_user, query_sides_m=parse_query_sides(query_sides_m),
                        n_queries=queries, trials=trials, seed=seed, mechanism_params=mech_params,
                        workload=workload, bounding=bounding)
    for m in mechs:  # unknown names and bad values fail before the data is read
        check_mechanism(m, mech_params.get(m, {}))
        if bounding == "weight" and not mechanism_capability(m, "supports_weights"):
            raise MechanismError(f"{m} does not support --bounding weight")
    _check_bounds(max_points_per_user, mechs, mech_params, city, center, side_km)
    check_public_workload(config.workload)
    out = human_out(json_out)
    if flow:
        cities = _flow_cities(data, city, center, side_km, workers, strict, format)
        params = validated(lambda: EvaluateParams(
            data=str(data), cities=cities, mechanisms=mechs, epsilons=config.epsilons, privacy_unit=privacy_unit,
            max_points_per_user=max_points_per_user, query_sides_m=config.query_sides_m, queries=queries,
            trials=trials, seed=seed, mechanism_params=mech_params, output_dir=artifacts_dir, columns=columns,
            format=format, dask_address=dask_address, n_workers=workers, workload=config.workload,
            bounding=bounding), "evaluation parameters")
        report = _run_flow(params)
        for c in cities:
            info = report["cities"][c]
            print(f"== {c}", file=out)
            print(format_table({**info, "privacy_unit": report["privacy_unit"],
                                "results": [r for r in report["results"] if r["city"] == c]}), file=out)
    else:
        reg = region(city, center, side_km)
        loaded = load(data, columns, format, strict)
        with StepProgress("evaluate") as progress:
            report = evaluate(loaded.points, reg, config, progress=progress)
        report["input"] = {"source": loaded.source, "validation": loaded.report.to_dict()}
        print(format_table(report), file=out)
    if json_out is not None:
        emit_json(report, json_out)
    return 0


@app.command("st")
def spatio_temporal(
    data: Data,
    city: City = None,
    center: Center = None,
    side_km: SideKm = None,
    period: str | None = typer.Option(None, "--period", metavar="A..B",
                                      help="public time window: days A..B inclusive, or ISO times A..B (UTC)"),
    window: str | None = typer.Option(None, "--window", hidden=True),
    slot: str = model_option(S, "slot", "--slot"),
    epsilon: str = model_option(S, "epsilons", "--epsilon", fmt=comma, help="ε values, comma-separated"),
    mechanisms: str = model_option(S, "mechanisms", "--mechanisms", fmt=comma,
                                   help="spatio-temporal mechanisms, comma-separated"),
    privacy_unit: PrivacyUnit = field_default(E, "privacy_unit"),
    max_points_per_user: int = model_option(S, "max_points_per_user", "--max-points-per-user", metavar="K"),
    query_sides_m: str = model_option(S, "query_sides_m", "--query-sides-m", fmt=comma,
                                      help="query side bands in metres, A:B,C:D"),
    queries: int = model_option(S, "queries", "--queries"),
    max_query_slots: int = model_option(S, "max_query_slots", "--max-query-slots",
                                        help="longest slot range of a range query"),
    hotspot_queries: int = model_option(S, "hotspot_queries", "--hotspot-queries", help="hotspot queries"),
    hotspot_extent_km: float = model_option(S, "hotspot_extent_km", "--hotspot-extent-km",
                                            help="hotspot search radius in km"),
    forecast_queries: int = model_option(S, "forecast_queries", "--forecast-queries", help="forecast queries"),
    horizon: int | None = model_option(S, "horizon", "--horizon"),
    trials: int = model_option(S, "trials", "--trials", help="noise draws averaged"),
    seed: int = model_option(E, "seed", "--seed", help="seed of the queries and noise (an experiment)"),
    workload: Workload = field_default(E, "workload"),
    param: Params = None,
    columns: Columns = None,
    format: Format = "auto",
    strict: Strict = False,
    json_out: Json = None,
    flow: Flow = False,
    artifacts_dir: ArtifactsDir = None,
    workers: Workers = field_default(E, "n_workers"),
    dask_address: DaskAddress = None,
    image_epsilon: float | None = model_option(S, "image_epsilon", "--image-epsilon", metavar="EPS"),
) -> int:
    """Spatio-temporal mechanisms: range-count error, hotspot distance and regret, forecast sMAPE."""
    from dpcore.evaluation.spatiotemporal import STEvalConfig, evaluate_st, format_st_table
    from dpcore.geo import parse_slot
    from dpcore.queries.range import parse_query_sides

    check_input_options(format, privacy_unit)
    if (period is None) == (window is None):
        raise CLIError("give the evaluated time window as --period A..B")
    start, end = parse_window(period if period is not None else window)
    mechs = names(mechanisms)
    mech_params = params_by_mechanism(param, mechs)
    for what, value in (("--queries", queries), ("--trials", trials), ("--hotspot-queries", hotspot_queries),
                        ("--forecast-queries", forecast_queries), ("--max-points-per-user", max_points_per_user)):
        at_least(value, 1, what)
    if not hotspot_extent_km > 0:
        raise CLIError(f"--hotspot-extent-km must be > 0, got {hotspot_extent_km:g}")
    config = STEvalConfig(
        mechanisms=mechs, epsilons=parse_epsilons(epsilon), window_start_s=start, window_end_s=end,
        slot_seconds=parse_slot(slot), privacy_unit=privacy_unit, max_points_per_user=max_points_per_user,
        query_sides_m=parse_query_sides(query_sides_m), n_queries=queries, max_query_slots=max_query_slots,
        hotspot_queries=hotspot_queries, hotspot_extent_m=hotspot_extent_km * 1000.0,
        forecast_queries=forecast_queries, forecast_horizon=horizon, trials=trials, seed=seed,
        mechanism_params=mech_params, workload=workload)
    for m in mechs:  # unknown names and bad values fail before the data is read
        check_mechanism(m, mech_params.get(m, {}))
    check_public_workload(config.workload)
    out = human_out(json_out)
    if flow:
        cities = _flow_cities(data, city, center, side_km, workers, strict, format)
        st = validated(lambda: STEvaluateOptions(
            window=window_text(start, end), slot=slot, mechanisms=mechs, epsilons=config.epsilons,
            max_points_per_user=max_points_per_user, query_sides_m=config.query_sides_m, queries=queries,
            max_query_slots=max_query_slots, hotspot_queries=hotspot_queries, hotspot_extent_km=hotspot_extent_km,
            forecast_queries=forecast_queries, horizon=horizon, trials=trials, image_epsilon=image_epsilon),
            "evaluation parameters")
        params = validated(lambda: EvaluateParams(
            data=str(data), cities=cities, mechanisms=[], privacy_unit=privacy_unit, seed=seed,
            mechanism_params=mech_params, spatio_temporal=st, columns=columns, format=format,
            output_dir=artifacts_dir, dask_address=dask_address, n_workers=workers, workload=config.workload),
            "evaluation parameters")
        result = _run_flow(params)
        st_out = result["spatio_temporal"]
        report = {"results": [{"city": c, **r} for c, rep in st_out["cities"].items() for r in rep["results"]],
                  "cities": st_out["cities"], "window": st_out["cities"][cities[0]]["window"],
                  "drawn_epsilon": st_out["drawn_epsilon"], "flow_run_id": result["flow_run_id"],
                  "data": {"source": str(data), "data_version": result["data_version"]}}
        for c, rep in st_out["cities"].items():
            print(f"== {c}", file=out)
            print(format_st_table(rep), file=out)
        if artifacts_dir:
            print(f"artifact images in {artifacts_dir}", file=out)
    else:
        reg = region(city, center, side_km)
        loaded = load(data, columns, format, strict)
        points = loaded.points.between(start, end)
        with StepProgress("evaluate-st") as progress, StepProgress("training") as training:
            report = evaluate_st(points, reg, config, progress=progress, train_progress=training)
        report["data"] = {"source": str(data), "data_version": loaded.data_version}
        print(format_st_table(report), file=out)
    if json_out is not None:
        emit_json(report, json_out)
    return 0


def _check_bounds(k: int, mechs: list[str], mech_params: dict, city: str | None, center: str | None,
                  side_km: float | None) -> None:
    """k and each mechanism's grid within what a release accepts (tasks/release_city_plan.py), before the
    data is read: k = 1e20 overflowed the noise scale, cell_width_m=0.001 asked for petabytes."""
    from dpcore.geo import resolve_region
    from tasks.release_city_plan import check_grid_fits

    if not 1 <= k <= 1_000_000:
        raise CLIError(f"--max-points-per-user must be a whole number in [1, 1000000], got {k}")
    if city is None and center is None:
        return  # the flow form checks each city it is given in the release plan's terms
    regions = [resolve_region(city=c, side_km=side_km) for c in names(city)] if city else \
        [resolve_region(center=center, side_km=side_km)]
    for m in mechs:
        for reg in regions:
            check_grid_fits(m, mech_params.get(m, {}), reg, None, None)
