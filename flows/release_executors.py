"""The two executors of a release run, behind one interface: :func:`flows.release.run_plan` composes
their steps (read and count, the profile's draw, charge + fit + persist, log, artifacts) without knowing
which one it has.

- :class:`InProcessExecutor` (`geodp release --out`, `--no-prefect`): each step is the task's plain
  function, run here one after the other; failures show their detail (the operator's own terminal).
- :class:`PrefectDaskExecutor` (inside a flow run): each step is a Prefect task, the data pass and the
  per-city fits run on the flow's Dask task runner; failures name public facts only. The charge and the
  steps its noise pays for (fit, preview, persist) form one Prefect transaction: the charge task's
  rollback hook (:func:`_give_back_on_rollback`) gives back every charge of the run whose noise is not
  committed when any of them fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from dpcore import GeoDPError
from flows.release_summary import RunSummary, artifact_key
from flows.release_summary import artifacts as artifacts_of
from tasks.ledger_tasks import charge_ledger, give_back, give_back_interrupted, given_back_on_failure
from tasks.persist_tasks import persist_release
from tasks.progress import Progress, on_terminal
from tasks.public_errors import PrivateDataFailure, without_private_detail
from tasks.release_city_plan import CityPlan
from tasks.release_plan import ReleasePlan
from tasks.release_tasks import (
    count_release_data,
    fit_city,
    paid_profile,
    privatize,
    read_bound_count,
    render_preview,
)
from tasks.runtime import dashboard_link, where_it_runs
from tasks.storage.held_charge import HeldCharge
from tasks.storage.manifest import Manifest
from tasks.storage.store import as_store

if TYPE_CHECKING:
    from prefect.futures import PrefectFuture
    from prefect.transactions import Transaction

    from dpcore.privacy.profile import ContributionProfile
    from tasks.dask_path import DataPass

#: why a charge goes back after a persist failed (the attempt's files deleted, then the void)
STORAGE_FAILED = "storage failed before the commit"


class Executor(Protocol):
    """What :func:`flows.release.run_plan` asks of the form it runs in."""

    def now(self) -> datetime | None:
        """When the run counts relative periods from: a flow run's scheduled start, else None (now)."""

    def log(self, msg: str) -> None:
        """A line of the run's log (the operator's terminal, or the flow run's log)."""

    def step(self, task) -> Callable:
        """``task`` as this form runs it: its plain function, or the Prefect task."""

    def read(self, plan: ReleasePlan, args: tuple, data) -> DataPass:
        """The data pass (tasks.release_tasks.count_release_data's arguments ``args``) over ``data``."""

    def draw_profile(self, plan: ReleasePlan, todo: list[CityPlan], counts) -> ContributionProfile | None:
        """The run's contribution profile, drawn from the data pass's ``counts``."""

    def held_charges(self, plan: ReleasePlan, todo: list[CityPlan],
                     paid: dict[str, float] | None) -> AbstractContextManager[dict[str, HeldCharge]]:
        """Charge the cities (``paid``: the ε their profile was charged apart) for the body's fits and persists."""

    def fit_and_persist(self, plan: ReleasePlan, todo: list[CityPlan], inputs: dict, profile,
                        held: dict[str, HeldCharge], code: str) -> tuple[dict[str, Manifest], list[dict]]:
        """Fit, preview and persist each city: (manifests, where the tasks ran)."""

    def interrupted(self, exc: BaseException) -> None:
        """After Ctrl-C or SIGTERM with charges held (noted on ``exc``)."""

    def finish(self, summary: RunSummary, results: dict[str, Manifest], placed: list[dict], artifacts: bool,
               plan: ReleasePlan) -> None:
        """What the form adds to the summary once the run is done."""


def _charged(step, plan: ReleasePlan, todo: list[CityPlan], paid: dict[str, float] | None) -> dict[str, HeldCharge]:
    """Every city's charge (one ledger entry), or, for seeded noise, none (an experiment is never charged)."""
    if plan.experiment:
        return {p.city: HeldCharge(p.release_key, p.city, p.period.label) for p in todo}
    return step(charge_ledger)(plan.store, todo, plan.resolved, plan.input.locators(), plan.home, paid)


class InProcessExecutor:
    """Every step in this process, one after the other, with no Prefect (its import is never paid)."""

    def now(self) -> datetime | None:
        return None

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def step(self, task) -> Callable:
        return task.fn

    def read(self, plan: ReleasePlan, args: tuple, data) -> DataPass:
        counted = count_release_data(*args)
        # the operator's own terminal; the flow never logs counts of private rows
        self.log(f"read {plan.params.data}: {counted.report.summary()} ({counted.n_files} file(s))")
        return counted

    def draw_profile(self, plan: ReleasePlan, todo: list[CityPlan], counts) -> ContributionProfile | None:
        return paid_profile(todo, counts)

    @contextmanager
    def held_charges(self, plan: ReleasePlan, todo: list[CityPlan],
                     paid: dict[str, float] | None) -> Iterator[dict[str, HeldCharge]]:
        # each fit and persist gives its own charge back beside it (fit_and_persist)
        yield _charged(self.step, plan, todo, paid)

    def fit_and_persist(self, plan: ReleasePlan, todo: list[CityPlan], inputs: dict, profile,
                        held: dict[str, HeldCharge], code: str) -> tuple[dict[str, Manifest], list[dict]]:
        manifests, store, dataset = {}, plan.store, plan.dataset
        with Progress("fits", total=len(todo), unit="cities") as fits:
            for p in todo:
                with given_back_on_failure(store, dataset, held[p.city], "fit failed"):
                    syn = fit_city(p, inputs[p.city], profile)
                    png = render_preview.fn(p, syn)
                with given_back_on_failure(store, dataset, held[p.city], STORAGE_FAILED, quiet=True, on=Exception):
                    manifests[p.city] = persist_release.fn(store, p, syn, png, held[p.city], code)
                fits.advance(what=p.city)
        return manifests, []

    def interrupted(self, exc: BaseException) -> None:
        give_back_interrupted(exc, workers_stopped=True)  # nothing else of the run writes: give back now

    def finish(self, summary: RunSummary, results: dict[str, Manifest], placed: list[dict], artifacts: bool,
               plan: ReleasePlan) -> None:
        return None


#: the transaction value the charge's rollback hook reads (:class:`_RunCharges`)
CHARGES = "geodp-charges"


@dataclass
class _RunCharges:
    """What a run holds inside its transaction: its charges, and why each city failed (the void's reason)."""

    store_url: str
    dataset: str
    held: dict[str, HeldCharge]
    why: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def _give_back_on_rollback(txn: Transaction) -> None:
    """Prefect rollback hook of the charge task: the run's transaction failed (a fit, preview or persist, or
    anything between the charge and the commit), so every charge it holds whose noise is not committed is
    given back (tasks.ledger_tasks.give_back: seal the attempt, delete its files, then void; a committed
    city's charge stays). After Ctrl-C or SIGTERM the charges stay until the flow has stopped its cluster
    (flows.release.release_flow). A store that does not answer keeps a charge held: the next run of the
    release takes it over."""
    run = txn.get(CHARGES, None)
    if run is None or run.interrupted:
        return
    store = as_store(run.store_url)
    for city, held in run.held.items():
        try:
            give_back(store, run.dataset, held, run.why.get(city, "the run failed before the commit"))
        except (OSError, GeoDPError):
            continue


class PrefectDaskExecutor:
    """Every step a Prefect task of the current flow run; the data pass and the fits on its Dask runner."""

    def __init__(self) -> None:
        from prefect import get_run_logger

        self._logger = get_run_logger()

    def now(self) -> datetime | None:
        from prefect.runtime import flow_run

        start = flow_run.scheduled_start_time
        return start if isinstance(start, datetime) else None

    def log(self, msg: str) -> None:
        self._logger.info(msg)

    def step(self, task) -> Callable:
        return task

    def read(self, plan: ReleasePlan, args: tuple, data) -> DataPass:
        """read_bound_count on the flow's Dask cluster. The task logs its progress in the run's log; on the
        operator's terminal (the CLI's Prefect form) this process follows the same file reads through Dask
        events and shows them, rows included, in the command's spinner."""
        if not on_terminal():
            return read_bound_count.submit(*args).result()
        from tasks.dask_path import new_topic

        topic, client = new_topic(), _runner_client()
        files = getattr(data, "files", None)
        with Progress("data pass", total=len(files) if files is not None else None, unit="files",
                      log=False) as shown:
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

    def draw_profile(self, plan: ReleasePlan, todo: list[CityPlan], counts) -> ContributionProfile | None:
        # in the flow's own process: a failure here would be the flow run's state, so only its type is shown
        return without_private_detail(lambda: paid_profile(todo, counts), plan.params.data,
                                      step="the contribution profile")

    @contextmanager
    def held_charges(self, plan: ReleasePlan, todo: list[CityPlan],
                     paid: dict[str, float] | None) -> Iterator[dict[str, HeldCharge]]:
        """The charge and the body (fit, preview, persist) in one Prefect transaction: the charge task's
        rollback hook gives the run's charges back when the body fails. A failure outside geodp is one
        line (:func:`one_line`)."""
        from prefect.transactions import transaction

        with transaction() as txn:
            held = _charged(_charge_task, plan, todo, paid)
            txn.set(CHARGES, _RunCharges(plan.store_url, plan.dataset, held))
            try:
                yield held
            except (KeyboardInterrupt, SystemExit):
                run = txn.get(CHARGES)
                run.interrupted = True  # no rollback now: a worker may still be staging
                txn.set(CHARGES, run)
                raise
            except Exception as exc:
                raise one_line(exc) from None

    def fit_and_persist(self, plan: ReleasePlan, todo: list[CityPlan], inputs: dict, profile,
                        held: dict[str, HeldCharge], code: str) -> tuple[dict[str, Manifest], list[dict]]:
        """One privatize → preview → persist chain per city on the Dask task runner. The first failure is
        raised once every city is done; why each failed city failed goes to the run's transaction, whose
        rollback gives its charge back with that reason."""
        from prefect.artifacts import create_progress_artifact, update_progress_artifact
        from prefect.transactions import get_transaction

        placed = [where_it_runs.submit() for _ in todo]
        fitted = {}
        for p in todo:
            syn = privatize.submit(p, inputs[p.city], profile)
            fitted[p.city] = (syn, render_preview.submit(p, syn))
        persists: dict[str, PrefectFuture | Exception] = {}  # a city's persist, or why its fit failed
        for p in todo:
            # the noise is drawn once: persist gets the synopsis and preview this process holds, so a persist
            # that a lost worker's retry runs again uploads the same bytes (a future would fit afresh)
            syn, png = fitted[p.city]
            try:
                drawn = syn.result(), png.result()
            except Exception as exc:  # nothing was staged for that city
                persists[p.city] = exc
                continue
            persists[p.city] = persist_release.submit(plan.store_url, p, *drawn, held[p.city], code)
        progress = create_progress_artifact(0.0, key=artifact_key(f"release-progress-{plan.dataset}"),
                                            description=f"cities of {plan.dataset} committed")
        manifests, why, first_error = {}, {}, None
        with Progress("fits", total=len(persists), unit="cities") as fits:  # the cities' names and count are public
            for i, (city, persist) in enumerate(persists.items()):
                if isinstance(persist, Exception):
                    why[city] = f"fit failed: {type(persist).__name__}"
                    first_error = first_error or persist
                else:
                    try:
                        manifests[city] = persist.result()
                    except Exception as exc:  # storage failed, or the worker was lost: nothing was committed
                        why[city] = f"{STORAGE_FAILED}: {type(exc).__name__}"
                        first_error = first_error or exc
                update_progress_artifact(progress, 100.0 * (i + 1) / len(persists))
                fits.advance(what=city)
        if first_error is not None:
            txn = get_transaction()
            if txn is not None:
                run = txn.get(CHARGES, None)
                if run is not None:
                    run.why.update(why)
                    txn.set(CHARGES, run)
            raise one_line(first_error)
        return manifests, [f.result() for f in placed]

    def interrupted(self, exc: BaseException) -> None:
        return None  # the flow gives the charges back once it has stopped its cluster (release_flow)

    def finish(self, summary: RunSummary, results: dict[str, Manifest], placed: list[dict], artifacts: bool,
               plan: ReleasePlan) -> None:
        # where the tasks ran: process ids and worker addresses are public facts about the platform
        workers = sorted({(w["worker"] or "", w["pid"]) for w in placed})
        summary.dask = {"dashboard": dashboard_link(), "flow_pid": os.getpid(),
                        "workers": [{"worker": a or None, "pid": pid} for a, pid in workers]}
        if artifacts:
            artifacts_of(summary, results, plan.store)


def _charge_task(task) -> Callable:
    """The charge as a Prefect task whose rollback hook (:func:`_give_back_on_rollback`) gives it back;
    the hook joins the task when a flow run first charges (Prefect is imported only then)."""
    made = task.prefect_task()
    if _give_back_on_rollback not in made.on_rollback_hooks:
        made.on_rollback(_give_back_on_rollback)
    return made


def _runner_client():
    """The distributed client of this flow run's Dask task runner, or None."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    try:
        return ctx.task_runner.client if ctx is not None else None
    except (AttributeError, RuntimeError):
        return None


class RunFailed(GeoDPError, RuntimeError):
    """A step failed for a reason outside geodp (a lost Dask worker, a backend error)."""


def one_line(exc: BaseException) -> BaseException:
    """geodp's own errors as they are; anything else (KilledWorker, a backend's exception) as one
    line that says nothing was committed, so no traceback reaches the terminal or the flow's state."""
    if isinstance(exc, GeoDPError):
        return exc
    # a PrivateDataFailure is public and one line already; whole, it keeps where to see the detail
    first = str(exc) if isinstance(exc, PrivateDataFailure) else (str(exc).strip().splitlines() or [""])[0][:300]
    return RunFailed(f"{type(exc).__name__}: {first} (nothing was committed for that city; its charge is "
                     "given back, or taken over by the next run of the release)")
