"""The `release` flow: one dataset, one period, several cities, in parallel on Dask.

Order (docs/architecture.md): plan release keys → skip what is committed → the data pass on Dask
(workers read and validate the period's files, bound contributions once over all the cities' data and
sum each city's fine count grid; only counts come back) → charge the ledger (refusal happens here,
before any noise) → one privatize task per city on Dask → previews of the released maps → persist
(files, then the manifest) → artifacts. The in-process form runs the same data pass on the local
threaded scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING

from dpcore import GeoDPError
from dpcore.data.inputs import DataError
from flows.release_summary import ReleaseRow, RunSummary, artifact_key
from flows.release_summary import artifacts as artifacts_of
from tasks.config import ReleaseParams
from tasks.ledger_tasks import (
    charge_ledger,
    committed_from,
    give_back_interrupted,
    given_back_on_failure,
    settle_strays,
    void_charge,
)
from tasks.persist_tasks import persist_release
from tasks.progress import Progress, on_terminal
from tasks.public_errors import PrivateDataFailure, public_data_error, without_private_detail
from tasks.release_city_plan import ReleaseError
from tasks.release_plan import ReleasePlan, plan_release
from tasks.release_tasks import (
    code_version,
    count_release_data,
    fit_city,
    paid_profile,
    privatize,
    read_bound_count,
    render_preview,
)
from tasks.runtime import dashboard_link, dask_for_run, where_it_runs
from tasks.storage.held_charge import HeldCharge
from tasks.storage.manifest import Manifest

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.futures import PrefectFuture
    from prefect.states import State

    from tasks.dask_path import DataPass

# Prefect is imported where a flow run uses it: the in-process form (`geodp release --out`, the CLI's
# `--no-prefect`) runs the same pipeline without importing it (0.7 s of CPU a command).


#: why a charge goes back after a persist failed (the attempt's files deleted, then the void)
STORAGE_FAILED = "storage failed before the commit"


def release_cities(params: ReleaseParams, config_path: str | None = None, loaded=None,
                   artifacts: bool = True, in_process: bool = False, strict: bool = False) -> dict:
    """The release pipeline, the one both forms run: plan, then :func:`run_plan`. Returns the run's
    summary as JSON (RunSummary.to_dict). ``loaded`` (a LoadResult of params.data) lets a backfill read
    its input once."""
    plan = plan_release(params, config_path, now=None if in_process else _scheduled_start())
    return run_plan(plan, loaded=loaded, artifacts=artifacts, in_process=in_process, strict=strict).to_dict()


def run_plan(plan: ReleasePlan, loaded=None, artifacts: bool = True, in_process: bool = False,
             strict: bool = False, raise_refusals: bool = True) -> RunSummary:
    """Release what the plan has to do (the data pass, the charge, one fit per city, persist).

    Inside a flow run (the default) every step is a Prefect task and the per-city fits run on the flow's
    Dask task runner; with ``in_process`` the same steps run here, one after the other, with no Prefect.
    A city the plan's verdict, or the verdict of the run's paid profile, refused alone is listed in
    ``summary.refused``; when the profile's verdict refuses every city left, that is the run's one-line
    error (unless ``raise_refusals`` is False: a backfill reports the day and goes on)."""
    log = _log(in_process)
    step = (lambda t: t.fn) if in_process else (lambda t: t)
    t0 = time.perf_counter()
    params, dataset, period, plans, resolved = plan.params, plan.dataset, plan.period, plan.plans, plan.resolved
    store = plan.store
    per_day, committed, todo, window = plan.per_day, plan.committed, plan.todo, plan.window
    log(f"{dataset} {period.label}: {len(plans)} cities, {len(plans) - len(todo)} already committed, "
        f"{len(todo)} to release; policy: {resolved.policy.describe()}")
    placed: list[dict] = []
    placed_refusals: list[dict] = list(plan.refused)  # cities the verdict refused alone
    results: dict[str, Manifest] = {p.city: committed[p.city] for p in plans if committed[p.city] is not None}
    status = {city: "already committed" for city in results}
    if todo:
        # the data pass comes before the charge: bad input is a one-line error with nothing charged
        data = loaded if loaded is not None else plan.input  # the files whose version is in the keys
        args = (data, todo, params.seed, per_day, params.columns, params.format, strict, window)
        try:
            counted = count_release_data(*args) if in_process else _read_on_cluster(args, data)
        except Exception as exc:
            raise _one_line(exc) from None
        if in_process:  # the operator's own terminal; the flow never logs counts of private rows
            log(f"read {params.data}: {counted.report.summary()} ({counted.n_files} file(s))")
        inputs = counted.cities
        manifests, held, placed, after = _charge_and_fit(plan, todo, inputs, counted.profile, step, in_process)
        placed_refusals += after
        if after and not manifests and raise_refusals:
            raise ReleaseError(" | ".join(r["reason"] for r in after))
        for p in todo:
            if p.city not in manifests:
                continue  # refused after its profile: nothing more charged
            m = manifests[p.city]
            if held[p.city].charged and not committed_from(m, held[p.city]):
                # another run's attempt was committed for this key: our noise is never published
                step(void_charge)(store, dataset, held[p.city], "another attempt was committed")
            results[p.city], status[p.city] = m, "committed"
    if params.seed is None and results:
        settle_strays(store, dataset, list(results.values()), plan.home)
    experiment = params.seed is not None
    loss = None if experiment else plan.home.ledger(dataset).loss()
    guarantee = ("seeded noise (an experiment): NOT FOR PUBLICATION and not charged; anyone with the seed "
                 "can remove the noise") if experiment else resolved.policy.describe()
    summary = RunSummary(dataset=dataset, period=period.label, store=store.url, ledger=plan.home.url,
                         policy=resolved.policy.to_dict(), guarantee=guarantee, loss=loss,
                         seconds=round(time.perf_counter() - t0, 2),
                         releases=[ReleaseRow.of(results[p.city], status[p.city]) for p in plans if p.city in results],
                         refused=placed_refusals)
    if not in_process:
        # where the tasks ran: process ids and worker addresses are public facts about the platform
        workers = sorted({(w["worker"] or "", w["pid"]) for w in placed})
        summary.dask = {"dashboard": dashboard_link(), "flow_pid": os.getpid(),
                        "workers": [{"worker": a or None, "pid": pid} for a, pid in workers]}
    if artifacts and not in_process:
        artifacts_of(summary, results, store)
    return summary


def _charge_and_fit(plan: ReleasePlan, todo: list, inputs: dict, counts, step,
                    in_process: bool) -> tuple[dict[str, Manifest], dict, list[dict], list[dict]]:
    """Pay the run's contribution profile (from the data pass's ``counts``) and refuse the cities it says are
    hopeless, then charge the rest, fit, preview and persist each city: (manifests, the charges held, where
    the tasks ran, the cities refused after the profile)."""
    params, dataset, placed = plan.params, plan.dataset, []
    if not todo:
        return {}, {}, placed, []
    todo, profile, refusals = _verdict(plan, todo, counts, in_process, step)
    if not todo:
        return {}, {}, placed, refusals
    if params.seed is None:
        # the profile was charged apart, before: each city's charge is the rest of its ε
        paid = {p.city: profile.epsilon for p in todo} if profile is not None else None
        held = step(charge_ledger)(plan.store, todo, plan.resolved, plan.input.locators(), plan.home, paid)
    else:
        held = {p.city: HeldCharge(p.release_key, p.city, p.period.label) for p in todo}
    try:
        return (*_fit_and_persist(plan, todo, inputs, profile, held, in_process), refusals)
    except (KeyboardInterrupt, SystemExit) as exc:
        # Ctrl-C or SIGTERM after the charge: in the Prefect form the charges go back once the flow has
        # stopped its cluster, when no worker can stage noise any more; here nothing else writes
        exc.geodp_held = [*getattr(exc, "geodp_held", []), *((plan.store, dataset, h) for h in held.values())]
        if profile is not None and params.seed is None:  # its noise was drawn: its charge is never given back
            exc.geodp_profiles = [*getattr(exc, "geodp_profiles", []), *((p.city, profile.epsilon) for p in todo)]
        if in_process:
            give_back_interrupted(exc, workers_stopped=True)
        raise


def _fit_and_persist(plan: ReleasePlan, todo: list, inputs: dict, profile, held: dict,
                     in_process: bool) -> tuple[dict[str, Manifest], dict, list[dict]]:
    dataset, placed = plan.dataset, []
    code = code_version()
    if in_process:
        manifests = {}
        with Progress("fits", total=len(todo), unit="cities") as fits:
            for p in todo:
                with given_back_on_failure(plan.store, dataset, held[p.city], "fit failed"):
                    syn = fit_city(p, inputs[p.city], profile)
                    png = render_preview.fn(p, syn)
                with given_back_on_failure(plan.store, dataset, held[p.city], STORAGE_FAILED, quiet=True,
                                           on=Exception):
                    manifests[p.city] = persist_release.fn(plan.store, p, syn, png, held[p.city], code)
                fits.advance(what=p.city)
    else:
        manifests, placed = _run_on_workers(plan.store_url, dataset, todo, inputs, held, code, profile)
    return manifests, held, placed


def _verdict(plan: ReleasePlan, todo: list, counts, in_process: bool, step) -> tuple[list, object, list[dict]]:
    """The run's contribution profile, paid first and alone (tasks/release_profile.py: drawn once for all
    its regions, or reused from an earlier run of the same release), and each city's verdict from it and
    the region's published release (if any), so a first release gets a verdict too. A city expected worse
    than a blank map at every band is refused having spent only the profile, unless ``publish_anyway``
    (recorded in ``quality.plan``): (the cities to charge and fit, the profile, the refused cities)."""
    from tasks.release_profile import pay_profile
    from tasks.release_tasks import profile_applies
    from tasks.release_usefulness import expectation, refusal

    if counts is None or not all(profile_applies(p) for p in todo):
        return todo, None, []

    def draw() -> object:
        # in the flow's own process: a failure here would be the flow run's state, so only its type is shown
        return paid_profile(todo, counts) if in_process else without_private_detail(
            lambda: paid_profile(todo, counts), plan.params.data, step="the contribution profile")

    profile, spent = pay_profile(plan, todo, draw, step)
    store = plan.store
    out, refusals = [], []
    for p in todo:
        exp = expectation(store, p, profile)
        if exp.get("useless") and not plan.params.publish_anyway:
            refusals.append({"city": p.city, "period": p.period.label, "reason": refusal(p.city, exp, spent)})
            continue
        prior = {k: v for k, v in (p.expected or {}).items() if k in ("k_choice",)}
        # published anyway: refused by this verdict, or by the plan's before the charge (from the published map)
        anyway = bool(exp.get("useless")) or bool((p.expected or {}).get("published_anyway"))
        out.append(dataclasses.replace(p, expected={**prior, **exp, "published_anyway": anyway}))
    return out, profile, refusals


def _read_on_cluster(args: tuple, data) -> DataPass:
    """read_bound_count on the flow's Dask cluster. The task logs its progress in the run's log; on the
    operator's terminal (the CLI's Prefect form) this process follows the same file reads through Dask
    events and shows them, rows included, in the command's spinner."""
    if not on_terminal():
        return read_bound_count.submit(*args).result()
    from tasks.dask_path import new_topic

    topic, client = new_topic(), _runner_client()
    files = getattr(data, "files", None)
    with Progress("data pass", total=len(files) if files is not None else None, unit="files", log=False) as shown:
        rows = 0

        def follow(event: tuple) -> None:
            nonlocal rows
            rows += int(event[1].get("rows", 0))
            shown.advance(private=f"{rows:,} rows")

        if client is not None:
            client.subscribe_topic(topic, follow)
        try:
            return read_bound_count.submit(*args, progress_topic=topic).result()
        finally:
            if client is not None:
                client.unsubscribe_topic(topic)


def _runner_client():
    """The distributed client of this flow run's Dask task runner, or None."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    try:
        return ctx.task_runner.client if ctx is not None else None
    except (AttributeError, RuntimeError):
        return None


def _scheduled_start():
    """When this flow run was scheduled to start (relative periods count from it), or None."""
    from prefect.runtime import flow_run

    start = flow_run.scheduled_start_time
    return start if isinstance(start, datetime) else None


def _log(in_process: bool):
    if in_process:
        return lambda msg: print(msg, file=sys.stderr, flush=True)
    from prefect import get_run_logger

    logger = get_run_logger()
    return logger.info


def _run_on_workers(store_url: str, dataset: str, todo: list, inputs: dict, held: dict[str, HeldCharge], code: str,
                    profile=None) -> tuple[dict[str, Manifest], list[dict]]:
    """One privatize → preview → persist chain per city on the Dask task runner. A city whose fit
    failed (nothing staged) gives its charge back before the error is raised."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    placed = [where_it_runs.submit() for _ in todo]
    fitted = {}
    for p in todo:
        syn = privatize.submit(p, inputs[p.city], profile)
        fitted[p.city] = (syn, render_preview.submit(p, syn))
    futures = {}
    for p in todo:
        # the noise is drawn once: persist gets the synopsis and preview this process holds, so a persist
        # that a lost worker's retry runs again uploads the same bytes (a future would fit afresh)
        syn, png = fitted[p.city]
        try:
            drawn = syn.result(), png.result()
        except Exception as exc:
            futures[p.city] = (None, exc)
            continue
        futures[p.city] = (persist_release.submit(store_url, p, *drawn, held[p.city], code), ())
    progress = create_progress_artifact(0.0, key=artifact_key(f"release-progress-{dataset}"),
                                        description=f"cities of {dataset} committed")
    manifests, first_error = {}, None
    with Progress("fits", total=len(futures), unit="cities") as fits:  # the cities' names and count are public
        for i, (city, (fut, upstream)) in enumerate(futures.items()):
            try:
                if fut is None:
                    raise _FitFailed(upstream)
                with given_back_on_failure(store_url, dataset, held[city], STORAGE_FAILED, quiet=True,
                                           on=Exception, unless=_FitFailed):
                    manifests[city] = _persisted(fut, upstream)
            except _FitFailed as exc:
                void_charge(store_url, dataset, held[city], f"fit failed: {type(exc.cause).__name__}")
                first_error = first_error or exc.cause
            except Exception as exc:  # storage failed, or the worker was lost: nothing was committed
                first_error = first_error or exc
            update_progress_artifact(progress, 100.0 * (i + 1) / len(futures))
            fits.advance(what=city)
    if first_error is not None:
        raise _one_line(first_error)
    return manifests, [f.result() for f in placed]


class RunFailed(GeoDPError, RuntimeError):
    """A step failed for a reason outside geodp (a lost Dask worker, a backend error)."""


def _one_line(exc: BaseException) -> BaseException:
    """geodp's own errors as they are; anything else (KilledWorker, a backend's exception) as one
    line that says nothing was committed, so no traceback reaches the terminal or the flow's state."""
    if isinstance(exc, GeoDPError):
        return exc
    # a PrivateDataFailure is public and one line already; whole, it keeps where to see the detail
    first = str(exc) if isinstance(exc, PrivateDataFailure) else (str(exc).strip().splitlines() or [""])[0][:300]
    return RunFailed(f"{type(exc).__name__}: {first} (nothing was committed for that city; its charge is "
                     "given back, or taken over by the next run of the release)")


class _FitFailed(Exception):
    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _persisted(persist: PrefectFuture, upstream: tuple[PrefectFuture, ...]) -> Manifest:
    """The persist task's manifest. When a task before it failed (a fit the mechanism refused), persist
    never ran and its result is only "not ready"; that task's own error is raised instead (wrapped in
    _FitFailed, since nothing was staged), so the caller sees why and can give the charge back."""
    from prefect.exceptions import UnfinishedRun

    try:
        return persist.result()
    except UnfinishedRun as exc:
        not_ready = exc
    for task_future in upstream:  # outside the except block, so the cause is not chained to "not ready"
        try:
            task_future.result()
        except Exception as exc:
            raise _FitFailed(exc) from None
    raise not_ready


def release_flow(params: ReleaseParams, config_path: str | None = None) -> dict | State:
    """Release one dataset × period × cities; one Dask task per city, on the cluster the parameters name.

    The plan (every check that public inputs allow) runs in the flow's process first; the cluster
    starts only when a city is left to release. A refusal ends the run at once (:func:`refused`)."""
    try:
        plan = _PLANNED.pop(_plan_key(params, config_path), None) or plan_release(params, config_path,
                                                                                 now=_scheduled_start())
        if not plan.todo:  # every key committed: nothing to read or fit, no cluster
            return run_plan(plan, strict=params.strict).to_dict()
        try:
            with dask_for_run(params.dask_address, params.n_workers):
                return run_plan(plan, strict=params.strict).to_dict()
        except (KeyboardInterrupt, SystemExit) as exc:
            give_back_interrupted(exc, workers_stopped=not params.dask_address)
            raise
    except GeoDPError as exc:
        return refused(exc, params)


class _RefusalWithoutTraceback(logging.Filter):
    """Prefect's engine logs the exception of every failed run with its traceback ("Engine execution
    exited with unexpected exception"), a served run's too. For a refusal, which :func:`refused` made
    the run's state, that traceback says nothing the one-line state message does not: the line stays,
    naming the refusal, without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, GeoDPError):
            record.msg, record.args = f"refused: {' '.join(str(exc).split())}", ()
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("prefect.flow_runs").addFilter(_RefusalWithoutTraceback())


def refused(exc: GeoDPError, params: ReleaseParams) -> State:
    """A refusal (budget, policy, missing input, bad configuration or parameters, bad data) as the run's
    final state: its one public line is the state message the UI shows, with no traceback. A flow run
    has no retries: the same public inputs would be refused again. Calling the flow raises ``exc``."""
    from prefect.states import Failed

    if isinstance(exc, DataError) and exc.public != str(exc):
        exc = public_data_error(exc, params.data, params.columns, params.format, params.strict)
    return Failed(message=" ".join(str(exc).split()), data=exc)


def run_release(params: ReleaseParams, config_path: str | None = None, plan: ReleasePlan | None = None) -> dict:
    """Run the flow here (it starts the Dask runner its parameters ask for: LocalCluster or an address).
    ``plan``: this process's plan of the same parameters (the CLI plans before Prefect starts), which the
    flow run then uses instead of planning again."""
    if plan is not None:
        _PLANNED[_plan_key(params, config_path)] = plan
    try:
        return __getattr__("release_flow")(params, config_path)
    finally:
        _PLANNED.pop(_plan_key(params, config_path), None)


#: plans this process made before running the flow here (:func:`run_release`), by the flow's parameters
_PLANNED: dict[str, ReleasePlan] = {}


def _plan_key(params: ReleaseParams, config_path: str | None) -> str:
    return f"{config_path}\n{params.model_dump_json()}"


_release_fn = release_flow
del release_flow


def __getattr__(name: str) -> Flow:
    """``release_flow``, the Prefect flow, made on first use: Prefect builds a flow's parameter schema
    when it is made (0.5 s for ReleaseParams), which a release in this process (``--out``) never needs.
    Served deployments load it by entrypoint (flows/release.py:release_flow), which reads it from here."""
    if name != "release_flow":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from prefect import flow
    from prefect.states import State

    # Prefect evaluates the function's annotations (``-> dict | State``) for the parameter schema; with
    # Prefect imported only here, State joins the module's names here, before the flow is made
    globals()["State"] = State
    made = globals().get("_release_flow") or flow(name="release", log_prints=True, retries=0)(_release_fn)
    globals()["_release_flow"] = made
    return made
