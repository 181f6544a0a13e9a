"""The `release` flow: one dataset, one period, several cities, in parallel on Dask.

Order (docs/architecture.md): plan release keys → skip what is committed → the data pass on Dask
(workers read and validate the period's files, bound contributions once over all the cities' data and
sum each city's fine count grid; only counts come back) → charge the ledger (refusal happens here,
before any noise) → one privatize task per city on Dask → previews of the released maps → persist
(files, then the manifest) → artifacts. :func:`run_plan` composes these steps; an executor
(flows/release_executors.py) runs them: as Prefect tasks on the flow's Dask runner, or in this process
(the in-process form, whose data pass runs on the local threaded scheduler).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dpcore import GeoDPError
from dpcore.data.inputs import DataError
from flows.release_executors import Executor, InProcessExecutor, PrefectDaskExecutor, one_line
from flows.release_summary import ReleaseRow, RunSummary
from tasks.config import ReleaseParams
from tasks.ledger_tasks import committed_from, give_back_interrupted, settle_strays, void_charge
from tasks.public_errors import public_data_error
from tasks.release_city_plan import ReleaseError
from tasks.release_plan import ReleasePlan, plan_release
from tasks.release_tasks import code_version
from tasks.runtime import dask_for_run, workers_stop_with_run
from tasks.storage.manifest import Manifest

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.states import State
    from pydantic import BaseModel

# Prefect is imported where a flow run uses it: the in-process form (`geodp release --out`, the CLI's
# `--no-prefect`) runs the same pipeline without importing it (0.7 s of CPU a command).


def release_cities(params: ReleaseParams, config_path: str | None = None, loaded=None,
                   artifacts: bool = True, in_process: bool = False, strict: bool = False) -> dict:
    """The release pipeline, the one both forms run: plan, then :func:`run_plan` with the executor of the
    form (``in_process``: this process, else the current flow run's Prefect tasks on Dask). Returns the
    run's summary as JSON (RunSummary.to_dict). ``loaded`` (a LoadResult of params.data) lets a backfill
    read its input once."""
    executor = InProcessExecutor() if in_process else PrefectDaskExecutor()
    plan = plan_release(params, config_path, now=executor.now())
    return run_plan(plan, executor, loaded=loaded, artifacts=artifacts, strict=strict).to_dict()


def run_plan(plan: ReleasePlan, executor: Executor, loaded=None, artifacts: bool = True, strict: bool = False,
             raise_refusals: bool = True) -> RunSummary:
    """Release what the plan has to do (the data pass, the charge, one fit per city, persist), each step run
    by ``executor`` (flows/release_executors.py: in this process, or as Prefect tasks on Dask).

    A city the plan's verdict, or the verdict of the run's paid profile, refused alone is listed in
    ``summary.refused``; when the profile's verdict refuses every city left, that is the run's one-line
    error (unless ``raise_refusals`` is False: a backfill reports the day and goes on)."""
    log = executor.log
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
            counted = executor.read(plan, args, data)
        except Exception as exc:
            raise one_line(exc) from None
        manifests, held, placed, after = _charge_and_fit(plan, todo, counted.cities, counted.profile, executor)
        placed_refusals += after
        if after and not manifests and raise_refusals:
            raise ReleaseError(" | ".join(r["reason"] for r in after))
        for p in todo:
            if p.city not in manifests:
                continue  # refused after its profile: nothing more charged
            m = manifests[p.city]
            if held[p.city].charged and not committed_from(m, held[p.city]):
                # another run's attempt was committed for this key: our noise is never published
                executor.step(void_charge)(store, dataset, held[p.city], "another attempt was committed")
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
    executor.finish(summary, results, placed, artifacts, plan)
    return summary


def _charge_and_fit(plan: ReleasePlan, todo: list, inputs: dict, counts,
                    executor: Executor) -> tuple[dict[str, Manifest], dict, list[dict], list[dict]]:
    """Pay the run's contribution profile (from the data pass's ``counts``) and refuse the cities it says are
    hopeless, then charge the rest, fit, preview and persist each city: (manifests, the charges held, where
    the tasks ran, the cities refused after the profile)."""
    params, dataset = plan.params, plan.dataset
    todo, profile, refusals = _verdict(plan, todo, counts, executor)
    if not todo:
        return {}, {}, [], refusals
    # the profile was charged apart, before: each city's charge is the rest of its ε
    paid = {p.city: profile.epsilon for p in todo} if profile is not None and params.seed is None else None
    with executor.held_charges(plan, todo, paid) as held:
        try:
            manifests, placed = executor.fit_and_persist(plan, todo, inputs, profile, held, code_version())
        except (KeyboardInterrupt, SystemExit) as exc:
            # Ctrl-C or SIGTERM after the charge: the charges go back once nothing of the run can stage
            # noise any more (the executor says when: here at once, or once the flow has stopped its cluster)
            exc.geodp_held = [*getattr(exc, "geodp_held", []), *((plan.store, dataset, h) for h in held.values())]
            if profile is not None and params.seed is None:  # its noise was drawn: its charge is never given back
                exc.geodp_profiles = [*getattr(exc, "geodp_profiles", []),
                                      *((p.city, profile.epsilon) for p in todo)]
            executor.interrupted(exc)
            raise
    return manifests, held, placed, refusals


def _verdict(plan: ReleasePlan, todo: list, counts, executor: Executor) -> tuple[list, object, list[dict]]:
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
    profile, spent = pay_profile(plan, todo, lambda: executor.draw_profile(plan, todo, counts), executor.step)
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


def release_flow(params: ReleaseParams, config_path: str | None = None) -> dict | State:
    """Release one dataset × period × cities; one Dask task per city, on the cluster the parameters name.

    The plan (every check that public inputs allow) runs in the flow's process first; the cluster
    starts only when a city is left to release. A refusal ends the run at once (:func:`refused`)."""
    try:
        executor = PrefectDaskExecutor()
        plan = take_planned(params, config_path) or plan_release(params, config_path, now=executor.now())
        if not plan.todo:  # every key committed: nothing to read or fit, no cluster
            return run_plan(plan, executor, strict=params.strict).to_dict()
        try:
            with dask_for_run(params.dask_address, params.n_workers):
                return run_plan(plan, executor, strict=params.strict).to_dict()
        except (KeyboardInterrupt, SystemExit) as exc:
            give_back_interrupted(exc, workers_stopped=workers_stop_with_run(params.dask_address))
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
    with planned_here(params, config_path, plan):
        return __getattr__("release_flow")(params, config_path)


#: plans this process made before running a flow here (:func:`planned_here`), by the flow's parameters
_PLANNED: dict[str, object] = {}


@contextmanager
def planned_here(params: BaseModel, config_path: str | None, plan: object | None) -> Iterator[None]:
    """While a flow of ``params`` runs in this process, its plan (a release's ReleasePlan, a backfill's
    list of them) as this process made it before Prefect started: the flow run takes it
    (:func:`take_planned`) instead of planning again."""
    key = f"{config_path}\n{params.model_dump_json()}"
    if plan is not None:
        _PLANNED[key] = plan
    try:
        yield
    finally:
        _PLANNED.pop(key, None)


def take_planned(params: BaseModel, config_path: str | None):
    """The plan :func:`planned_here` handed over for a flow of ``params``, or None (a served run plans itself)."""
    return _PLANNED.pop(f"{config_path}\n{params.model_dump_json()}", None)


_release_fn = release_flow
del release_flow


def __getattr__(name: str) -> Flow:
    """``release_flow``, the Prefect flow, made on first use (with its parameter schema for the UI's form
    built on first use too: :func:`tasks.lazy_task.flow`), which a release in this process (``--out``)
    never needs. Served deployments load it by entrypoint (flows/release.py:release_flow), which reads it
    from here."""
    if name != "release_flow":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from prefect.states import State

    from tasks.lazy_task import flow

    # Prefect evaluates the function's annotations (``-> dict | State``) for the parameter schema; with
    # Prefect imported only here, State joins the module's names here, before the flow is made
    globals()["State"] = State
    made = globals().get("_release_flow") or flow(_release_fn, name="release", log_prints=True, retries=0)
    globals()["_release_flow"] = made
    return made
