"""The `release` flow: one dataset, one period, several cities, in parallel on Dask.

Order (see ../shared/DESIGN.md): load + validate → plan release keys → skip what is committed →
charge the ledger (refusal happens here, before any noise) → bound contributions once over all the
cities' data → one privatize task per city on Dask → previews of the released maps → persist (files,
then the manifest) → artifacts.
"""

from __future__ import annotations

import base64
import time

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.exceptions import UnfinishedRun
from prefect.futures import PrefectFuture

from flows.store import ReleaseStore
from tasks.config import ReleaseParams, budget_cap_for, load_platform_config, parse_period
from tasks.release_tasks import (
    bound_and_split,
    charge_ledger,
    check_committed,
    code_version,
    dataset_name,
    load_and_validate,
    make_plans,
    persist_release,
    privatize,
    render_preview,
)
from tasks.runtime import dask_task_runner


def _artifact_key(text: str) -> str:
    """Prefect artifact keys are lowercase letters, digits and dashes."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:100] or "geodp"


def release_cities(params: ReleaseParams, config_path: str | None = None, loaded=None,
                   artifacts: bool = True) -> dict:
    """Body of the release flow (call inside a flow run). Returns a JSON-able summary.

    ``loaded`` (a LoadResult of params.data) lets a backfill read its input once for all periods."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    period = parse_period(params.period)
    cap = budget_cap_for(dataset_name(params.data, params.dataset), load_platform_config(config_path),
                         params.budget_cap)
    store = ReleaseStore(params.store)  # fails fast on a bad URL
    if loaded is None:
        loaded = load_and_validate(params.data, params.columns, params.format)
    dataset = dataset_name(params.data, params.dataset)
    cities = params.cities
    if not cities and not params.center:
        from dpcore.geo import city_names

        # Every catalog city, whether or not it holds points: choosing cities by "has data" would let
        # the mere existence of a release reveal that someone was there, unpaid. A city without data
        # gets a noise-only release, which is still correct and costs the same.
        cities = city_names()
    plans = make_plans(dataset=dataset, cities=cities, center=params.center, side_km=params.side_km,
                       period=period, mechanism=params.mechanism, params=params.mechanism_params,
                       epsilon=params.epsilon, privacy_unit=params.privacy_unit,
                       max_points_per_user=params.max_points_per_user, seed=params.seed,
                       data_version=loaded.data_version, slot=params.slot, public_total=params.public_total,
                       source=loaded.source)
    committed = check_committed(params.store, plans)
    todo = [p for p in plans if committed[p.city] is None]
    logger.info("%s %s: %d cities, %d already committed, %d to release (cap ε=%g)", dataset, period.label,
                len(plans), len(plans) - len(todo), len(todo), cap)
    results: dict[str, dict] = {p.city: {**committed[p.city], "status": "already committed"}
                                for p in plans if committed[p.city] is not None}
    stats: dict = {}
    if todo:
        entries = charge_ledger(params.store, todo, cap)
        inputs = bound_and_split(loaded.points, todo, params.seed)
        progress = create_progress_artifact(0.0, key=_artifact_key(f"release-progress-{dataset}"),
                                            description=f"cities of {dataset} {period.label} committed")
        code = code_version()
        futures = {}
        for p in todo:
            syn = privatize.submit(p, inputs[p.city])
            png = render_preview.submit(p, syn)
            futures[p.city] = (persist_release.submit(params.store, p, syn, png, entries[p.city], code), (syn, png))
        stats = {c: {"points": i.n_points_raw, "users": i.n_users_raw, "kept": int(i.x.size)}
                 for c, i in inputs.items()}
        done = 0
        for city, (fut, upstream) in futures.items():
            manifest = _persisted(fut, upstream)
            results[city] = {**manifest, "status": "committed"}
            done += 1
            update_progress_artifact(progress, 100.0 * done / len(futures))
    summary = {"dataset": dataset, "period": period.label, "store": store.url, "cap": cap,
               "spent": store.spent(dataset, period.label), "seconds": round(time.perf_counter() - t0, 2),
               "releases": [_row(results[p.city], stats.get(p.city)) for p in plans]}
    if artifacts:
        _artifacts(summary, results, store)
    return summary


def _persisted(persist: PrefectFuture, upstream: tuple[PrefectFuture, ...]) -> dict:
    """The persist task's manifest. When a task before it failed (a fit the mechanism refused), persist
    never ran and its result is only "not ready"; the first failed task's own error is raised instead,
    so the caller sees why (a GeoDPError reaches the CLI as a clean error)."""
    try:
        return persist.result()
    except UnfinishedRun as exc:
        not_ready = exc
    for task_future in upstream:  # outside the except block, so the cause is not chained to "not ready"
        task_future.result()  # raises that task's exception if it failed
    raise not_ready


def chosen_mechanism(manifest: dict) -> str | None:
    """What a self-choosing mechanism (auto) ran, from its release's manifest; None for the others."""
    chosen = (manifest.get("params") or {}).get("chosen")
    return chosen.get("mechanism") if isinstance(chosen, dict) else None


def _row(manifest: dict, stats: dict | None) -> dict:
    return {"city": manifest["city"], "version": manifest["version"], "epsilon": manifest["epsilon"],
            "mechanism": manifest["mechanism"], "chosen_mechanism": chosen_mechanism(manifest),
            "status": manifest["status"], "url": manifest.get("url"),
            "points_raw_internal": None if stats is None else stats["points"],
            "users_raw_internal": None if stats is None else stats["users"]}


def _artifacts(summary: dict, results: dict, store: ReleaseStore) -> None:
    """Table of cities, markdown summary with heatmaps of the released maps (never the true one)."""
    key = _artifact_key(f"release-{summary['dataset']}-{summary['period']}")
    create_table_artifact(
        [{"city": r["city"], "points (raw, internal)": r["points_raw_internal"],
          "users (raw, internal)": r["users_raw_internal"], "ε spent": r["epsilon"], "version": r["version"],
          "status": r["status"], "url": r["url"]} for r in summary["releases"]],
        key=key + "-cities", description="City-releases of this run. Raw point/user counts are private: shown "
        "to operators only, never published.")
    lines = [f"# Release {summary['dataset']} / {summary['period']}", "",
             f"- store: `{summary['store']}`",
             f"- ledger for this period: ε spent {summary['spent']:g} of cap {summary['cap']:g}",
             f"- {len(summary['releases'])} cities, {summary['seconds']} s", ""]
    for r in summary["releases"]:
        lines.append(f"## {r['city']} v{r['version']} ({r['status']})")
        lines.append(f"`{r['url']}`")
        m = results[r["city"]]
        png = next((f for f in m.get("files", []) if f["name"] == "preview.png"), None)
        if png is not None and r["url"]:
            try:
                rel = r["url"].split(store.root + "/", 1)[1]
                data = store.read(f"{rel}/{png['path']}")
                lines.append(f"![released heatmap](data:image/png;base64,{base64.b64encode(data).decode()})")
            except (IndexError, OSError):
                pass
        lines.append("")
    create_markdown_artifact("\n".join(lines), key=key + "-summary", description="release summary")


@flow(name="release", log_prints=True)
def release_flow(params: ReleaseParams, config_path: str | None = None) -> dict:
    """Release one dataset × period × cities; one Dask task per city."""
    return release_cities(params, config_path)


def run_release(params: ReleaseParams, config_path: str | None = None) -> dict:
    """Run the flow with the Dask runner its parameters ask for (LocalCluster or an address)."""
    runner = dask_task_runner(params.dask_address, params.n_workers)
    return release_flow.with_options(task_runner=runner)(params, config_path)
