"""The `backfill` flow: one release per day over a date range, skipping days already committed with
the same config (the release key; nothing is noised or charged for them).

Locally, and submitted to a served `backfill` deployment, every day runs inside one flow run on one Dask
cluster; a day-partitioned input is read day by day on the workers, any other input once, for the
backfill's days only. Submitted to a served `release` deployment, ``submit_to_deployment`` starts one
flow run per day instead (each with its own cluster). Either way with an idempotency key, so a repeated
submission returns the earlier run instead of starting a second one, and says so. A city the verdict
refuses is refused alone: its days are reported, the other cities released.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.states import State

from dpcore import GeoDPError
from dpcore.data.inputs import partition_day
from dpcore.privacy.accounting import budget_label
from flows.release import planned_here, refused, run_plan, take_planned
from flows.release_executors import PrefectDaskExecutor
from flows.release_summary import artifact_key
from tasks.config import BackfillParams, ConfigError, canonical_hash, days_between
from tasks.ledger_tasks import give_back_interrupted
from tasks.release_plan import ReleasePlan, plan_days
from tasks.release_tasks import load_and_validate
from tasks.runtime import dask_for_run, workers_stop_with_run


@flow(name="backfill", log_prints=True, retries=0)
def backfill_flow(params: BackfillParams, config_path: str | None = None) -> dict | State:
    """Every day is planned and checked (files, policy, committed keys, the budget of all the days'
    charges together) before a cluster starts; a backfill with every day committed starts none."""
    rp = params.release
    try:
        # a city refused by the verdict is refused alone, its days reported; the other cities go ahead
        plans = take_planned(params, config_path) or plan_days(rp, params.start, params.end, config_path)
        if not any(plan.todo for plan in plans):
            return _backfill(params, plans, loaded=None)
        try:
            with dask_for_run(rp.dask_address, rp.n_workers):
                return _backfill(params, plans, loaded=_load_unless_partitioned(rp, plans))
        except (KeyboardInterrupt, SystemExit) as exc:
            give_back_interrupted(exc, workers_stopped=workers_stop_with_run(rp.dask_address))
            raise
    except GeoDPError as exc:
        return refused(exc, rp)


def _backfill(params: BackfillParams, plans: list[ReleasePlan], loaded) -> dict:
    logger = get_run_logger()
    rp = params.release
    dataset = plans[0].dataset
    progress = create_progress_artifact(0.0, key=artifact_key(f"backfill-progress-{dataset}"),
                                        description=f"days of {dataset} {params.start}..{params.end} done")
    periods, executor = [], PrefectDaskExecutor()
    for i, plan in enumerate(plans):
        summary = run_plan(plan, executor, loaded=loaded, artifacts=False, strict=rp.strict, raise_refusals=False)
        periods.append(summary.to_dict())
        update_progress_artifact(progress, 100.0 * (i + 1) / len(plans))
        logger.info("%s: %s", plan.period.label, ", ".join(
            [f"{r.city} v{r.version} {r.status}" for r in summary.releases]
            + [f"{r['city']} refused" for r in summary.refused]))
        for r in summary.refused:
            logger.warning("%s: refused: %s", plan.period.label, r["reason"])
    rows = [r for s in periods for r in s["releases"]]
    committed = sum(r["status"] == "committed" for r in rows)
    refused = [{**r, "period": s["period"]} for s in periods for r in s["refused"]]
    result = {"dataset": dataset, "start": params.start, "end": params.end, "periods": periods,
              "committed": committed, "skipped": len(rows) - committed, "refused": refused}
    lines = [f"# Backfill {dataset} {params.start} .. {params.end}", "",
             f"{committed} new version(s) committed, {len(rows) - committed} already committed.", "",
             "| period | city | version | ε | status |", "|---|---|---|---|---|"]
    lines += [f"| {s['period']} | {r['city']} | v{r['version']} | {budget_label(r['epsilon'], r.get('rho'))} | "
              f"{r['status']}; {r.get('verdict') or ''} |" for s in periods for r in s["releases"]]
    lines += [f"| {r['period']} | {r['city']} | — | {budget_label(rp.epsilon, rp.rho)} | **refused**: {r['reason']} |"
              for r in refused]
    create_markdown_artifact("\n".join(lines), key=artifact_key(f"backfill-{dataset}"),
                             description="backfill summary")
    return result


def _load_unless_partitioned(rp, plans: list[ReleasePlan]):
    """The backfill's input, read once here for all its days, or None when every file is a day
    partition: each day's release then runs its own data pass on the workers, over that day's files
    only, and nothing of the input passes through this process. Either way only the files whose
    partition lies in the backfill's days are opened (the plans' listing: nothing is listed again)."""
    todo = [plan for plan in plans if plan.todo]
    files = [f for plan in todo for f in plan.input.files]
    if files and all(partition_day(f.partition) is not None for f in files):
        return None
    window = (todo[0].period.start_s, todo[-1].period.end_s)
    return load_and_validate(rp.data, rp.columns, rp.format, rp.strict, window=window)


def run_backfill(params: BackfillParams, config_path: str | None = None,
                 plans: list[ReleasePlan] | None = None) -> dict:
    """Run the flow here. ``plans``: this process's plans of the same backfill (tasks.release_plan.plan_days;
    the CLI plans before Prefect starts), which the flow run then uses instead of planning again."""
    with planned_here(params, config_path, plans):
        return backfill_flow(params, config_path)


def submit_to_deployment(params: BackfillParams, deployment: str) -> list[dict]:
    """Submit the backfill to a served deployment, with idempotency keys: to a `backfill` deployment one run
    for all the days (one Dask cluster serves them all), to a `release` deployment one run per day. Each
    row says whether the run is new or was submitted before with the same parameters (a re-submission
    returns that run), and its state and message."""
    from datetime import UTC, datetime

    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    rp = params.release
    if deployment.split("/", 1)[0] == "backfill":
        key = f"backfill-all-{canonical_hash(params.model_dump(mode='json'))[:32]}"
        jobs = [(f"{params.start}..{params.end}", {"params": params.model_dump(mode="json")}, key)]
    else:
        jobs = []
        for day in days_between(params.start, params.end):
            p = rp.model_copy(update={"period": day})
            jobs.append((day, {"params": p.model_dump(mode="json")},
                         f"backfill-{canonical_hash(p.model_dump(mode='json'))[:32]}"))
    out = []
    for period, parameters, key in jobs:
        asked = datetime.now(UTC)
        try:
            run = run_deployment(deployment, parameters=parameters, timeout=0, idempotency_key=key)
        except ObjectNotFound:
            raise ConfigError(f"the Prefect server at {PREFECT_API_URL.value()} has no deployment {deployment!r}: "
                              "start `geodp serve` against it (it serves backfill/backfill and release/release), "
                              "or name one it serves") from None
        created = getattr(run, "created", None)
        out.append({"period": period, "flow_run_id": str(run.id), "state": run.state_name if run.state else "?",
                    "message": (run.state.message or "") if run.state else "",
                    "resubmitted": created is not None and created < asked,
                    "failed": bool(run.state and run.state.is_final() and not run.state.is_completed())})
    return out
