"""A release run's plan: everything that can be checked from public inputs, checked once, before any
Dask cluster starts or any private row is read.

:func:`plan_release` resolves the period, the platform settings, the dataset, its store and its
ledger home, the dataset's policy, the input's files (a missing file fails here), the city plans and their release
keys, which keys are already committed, and whether the ledger would accept the charges of the rest.
The flow (flows/release.py) starts a cluster only when the plan has something to release, so a run
with nothing to do (every key committed) finishes without one, and a refusal (budget, missing file,
bad configuration) is a one-line failure that no retry can change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime

from dpcore.data.inputs import InputSet, resolve_files
from tasks.config import Period, ReleaseParams, days_between
from tasks.ledger_tasks import (
    AUTO,
    DEFAULT_K,
    PolicyRequest,
    ResolvedPolicy,
    check_budget,
    check_sources,
    mark_experimental,
    read_window,
    refuse_if_experimental,
    resolve_policy,
)
from tasks.release_city_plan import CityPlan, make_plans, public_locator
from tasks.release_request import ReleaseRequest, release_request
from tasks.release_tasks import check_committed
from tasks.settings import load_settings
from tasks.storage.ledger_home import LedgerHome
from tasks.storage.manifest import Manifest
from tasks.storage.store import ReleaseStore


@dataclass(frozen=True)
class ReleasePlan:
    """One run's release of one dataset and period: its city plans and what is already committed."""

    params: ReleaseParams
    dataset: str
    period: Period
    store_url: str
    home: LedgerHome  # the ledger the run charges (the platform settings' `ledger`, else the store's own)
    resolved: ResolvedPolicy
    source: str
    input: InputSet
    plans: list[CityPlan]
    window: tuple[int | None, int | None]  # the time the run is charged for and reads (read_window)
    committed: dict[str, Manifest | None] = field(default_factory=dict)
    #: how the run's k was chosen under ``--max-points-per-user auto`` (tasks/release_k.py), else None
    k_choice: dict | None = None
    #: cities refused alone by the plan's verdict ({"city", "period", "reason"}); the others go ahead
    refused: list[dict] = field(default_factory=list)
    #: the store as this process opened it for the plan; the run's in-process steps use it (a task on a
    #: Dask worker gets ``store_url`` and opens its own)
    opened: ReleaseStore | None = field(default=None, compare=False, repr=False)

    @property
    def store(self) -> ReleaseStore:
        return self.opened if self.opened is not None else ReleaseStore(self.store_url)

    @property
    def experiment(self) -> bool:
        """Seeded noise: never charged, never for publication."""
        return self.params.seed is not None

    @property
    def per_day(self) -> bool:
        return self.resolved.policy.bound_window == "day"

    @property
    def todo(self) -> list[CityPlan]:
        """The city plans whose release key is not committed yet (and that the verdict did not refuse)."""
        gone = {r["city"] for r in self.refused}
        return [p for p in self.plans if self.committed.get(p.city) is None and p.city not in gone]


@dataclass(frozen=True)
class _Opened:
    """What a run (or a backfill, for all its days) opens once: its store, ledger home and policy."""

    store: ReleaseStore
    home: LedgerHome
    resolved: ResolvedPolicy


def plan_release(params: ReleaseParams, config_path: str | None = None, now: datetime | None = None,
                 check_charges: bool = True, check_useful: bool = True, raise_refusals: bool = True) -> ReleasePlan:
    """Plan one release and check it against the store; raises the refusal as a GeoDPError (one line).

    ``now`` is a scheduled run's start (relative periods count from it). ``check_charges`` False
    leaves the budget check to the caller; ``check_useful`` False skips the expected-usefulness check
    (tasks/release_usefulness.py); ``raise_refusals`` False returns a plan whose every city it refused
    (``refused``, nothing to do) instead of raising."""
    asked = release_request(params, now)  # every check of the parameters alone; nothing written yet
    opened = _open(asked, config_path)
    return _plan(asked, opened, check_useful, raise_refusals, sources=True, charges=check_charges)


def plan_days(params: ReleaseParams, first: str, last: str, config_path: str | None = None) -> list[ReleasePlan]:
    """A backfill's plans, one per UTC day from ``first`` to ``last``: the request checked and the input
    listed once for all the days (each day's request narrowed from it), one store, ledger home and policy
    for all of them, and the charges of every day checked against the budget together. A city the verdict
    refuses is refused alone on its day (``refused``); the other cities and days go ahead."""
    whole = release_request(params.model_copy(update={"period": f"{first}..{last}"}))
    opened = _open(whole, config_path)
    if params.seed is None:
        check_sources(opened.store, whole.dataset, whole.input.locators(), opened.home)
    plans = [_plan(whole.for_day(day), opened, True, raise_refusals=False, sources=False, charges=False)
             for day in days_between(first, last)]
    if params.seed is None:
        check_budget(opened.store, [p for plan in plans for p in plan.todo], opened.resolved, opened.home)
    return plans


def _open(asked: ReleaseRequest, config_path: str | None) -> _Opened:
    """The platform settings, the run's store (fails fast on a bad URL), its ledger home and the dataset's
    policy, each opened or read once."""
    params, dataset = asked.params, asked.dataset
    settings = load_settings(config_path)
    store = ReleaseStore(settings.release_store(params.store))
    request = PolicyRequest(params.privacy_unit, params.max_points_per_user, zcdp=params.rho is not None,
                            budget=settings.explicit_budget_cap(dataset, params.budget_cap),
                            default_budget=settings.budget_cap_for(dataset),
                            declared=settings.declared_policy(dataset))
    if params.seed is not None:
        mark_experimental(store)  # seeded noise can be regenerated: never in a ledgered store
        home = LedgerHome.of(store)
        auto = params.max_points_per_user == AUTO
        new = request.new_policy()
        resolved = ResolvedPolicy(new, False, (new.max_points_per_user if auto else params.max_points_per_user)
                                  or DEFAULT_K, 1, auto and params.privacy_unit == "user")
    else:
        refuse_if_experimental(store)
        home = settings.ledger_home(store)  # a store bound to another home than the configured one: refused
        resolved = resolve_policy(store, dataset, request, home)
    return _Opened(store, home, resolved)


def _plan(asked: ReleaseRequest, opened: _Opened, check_useful: bool, raise_refusals: bool,
          sources: bool, charges: bool) -> ReleasePlan:
    """One period's plan from its checked request and what the run opened: the city plans and their keys,
    what is committed, then, in this order, whether its files are another dataset's (``sources``), whether
    the ledger accepts its charges (``charges``) and the plan's verdict (``check_useful``)."""
    params, period, dataset = asked.params, asked.period, asked.dataset
    store, home, resolved = opened.store, opened.home, opened.resolved
    cities = params.cities  # never chosen by the data: the existence of a release must not say who was there
    window = read_window(period, resolved.policy)  # never a row outside the days the run is charged for
    # the input as the request listed it: its data version goes into the release keys, its files are what
    # the data pass reads; listed again only when the policy's horizon narrows a period without bounds
    found = asked.input if window == asked.listed_window else resolve_files(params.data, params.format, window)

    def plans_with(k: int) -> list[CityPlan]:
        return make_plans(dataset=dataset, cities=cities, center=params.center, side_km=params.side_km,
                          period=period, mechanism=params.mechanism, params=params.mechanism_params,
                          epsilon=params.epsilon, rho=params.rho, privacy_unit=params.privacy_unit,
                          max_points_per_user=k, seed=params.seed,
                          data_version=params.data_version or found.version, slot=params.slot,
                          public_total=params.public_total, source=public_locator(found.source),
                          bound_per_day=resolved.policy.bound_window == "day",
                          records_per_person=resolved.policy.max_records_per_person
                          if params.privacy_unit == "record" and resolved.policy.privacy_unit == "user" else None,
                          count=params.count, mech=asked.mechanism, regions=asked.regions)

    k_choice = None
    if resolved.choose_k:  # from published releases only, before any private row is read or charged
        from tasks.release_k import choose_run_k

        k_choice = choose_run_k(store, plans_with(min(DEFAULT_K, resolved.max_points_per_user)),
                                resolved.max_points_per_user)
        plans = [dataclasses.replace(p, expected={"k_choice": k_choice}) for p in plans_with(k_choice["k"])]
    else:
        plans = plans_with(resolved.max_points_per_user)
    committed = check_committed.fn(store, plans)
    plan = ReleasePlan(params, dataset, period, store.url, home, resolved, public_locator(found.source), found,
                       plans, window, committed, k_choice, opened=store)
    if sources and not plan.experiment:
        check_sources(store, dataset, found.locators(), home)  # the same files under another dataset name
    if charges and not plan.experiment:
        check_budget(store, plan.todo, resolved, home)
    if check_useful and plan.todo:  # worse than a blank map at every band: refused before any charge
        from tasks.release_usefulness import check_usefulness, raise_if_all_refused

        checked, refused = check_usefulness(store, plan.todo, params.publish_anyway)
        if raise_refusals:
            raise_if_all_refused(checked, refused)
        by_city = {p.city: p for p in checked}
        plan = dataclasses.replace(plan, plans=[by_city.get(p.city, p) for p in plans], refused=refused)
    return plan
