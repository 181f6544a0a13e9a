"""Prefect tasks of the privacy ledger: resolve a dataset's policy, charge a run, void a charge.

The policy of a dataset lives in the store (tasks/storage/ledger.py). A run asks for one through a
:class:`PolicyRequest` built from its options; the first release into a dataset creates the policy from
it, later ones must agree with the stored policy (a different ``--budget-cap``, privacy unit or k is a
one-line error; changing a policy is ``geodp dataset policy``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from prefect import task
from prefect.cache_policies import NO_CACHE

from dpcore.privacy.accounting import (
    DAY_S,
    EVERY_DAY,
    LedgerCharge,
    PolicyError,
    PrivacyPolicy,
    check_within_budget,
    day_number,
    days_of_window,
)
from tasks.public_errors import retry_unless_refused
from tasks.storage.ledger import ENTRY_HASH, DatasetLedger
from tasks.storage.manifest import Manifest
from tasks.storage.store import ReleaseRef, ReleaseStore

DEFAULT_K = 20
EXPERIMENTAL = "_EXPERIMENTAL"


@dataclass(frozen=True)
class PolicyRequest:
    """What a run's options say about the dataset's policy. ``budget`` is an explicit cap (a
    ``--budget-cap`` or a per-dataset cap in the config) that must match a stored policy;
    ``default_budget`` only seeds a new dataset."""

    privacy_unit: str
    max_points_per_user: int | None = None
    budget: float | None = None
    default_budget: float = 10.0
    zcdp: bool = False

    def new_policy(self) -> PrivacyPolicy:
        return PrivacyPolicy(privacy_unit=self.privacy_unit,
                             budget=float(self.budget if self.budget is not None else self.default_budget),
                             max_points_per_user=(self.max_points_per_user or DEFAULT_K)
                             if self.privacy_unit == "user" else None)


@dataclass(frozen=True)
class ResolvedPolicy:
    """The policy a run releases under, whether it is stored yet, and the run's k and multiplier."""

    policy: PrivacyPolicy
    stored: bool
    max_points_per_user: int
    multiplier: int


def resolve_policy(store_url: str, dataset: str, request: PolicyRequest) -> ResolvedPolicy:
    """Read the dataset's policy (or propose one from the request) and check the run fits it.
    Reads only; nothing is written until :func:`charge_ledger`."""
    stored = DatasetLedger(ReleaseStore(store_url), dataset).policy()
    policy = stored or request.new_policy()
    if stored is not None and request.budget is not None and abs(request.budget - stored.budget) > 1e-12:
        raise PolicyError(
            f"dataset {dataset!r} already has a budget of {stored.unit}={stored.budget:g} per person over "
            f"{stored.window_label}; the budget given here ({request.budget:g}) differs. A later release "
            f"never changes a policy: drop --budget-cap, or change it with `geodp dataset policy`")
    if stored is not None and stored.accounting == "zcdp" and request.budget is not None:
        raise PolicyError(f"dataset {dataset!r} is accounted in ρ (zCDP); --budget-cap does not apply")
    if request.zcdp and policy.accounting != "zcdp":
        raise PolicyError(f"a ρ release needs a dataset accounted in ρ; create {dataset!r} with "
                          "`geodp dataset create ... --accounting zcdp` first")
    multiplier = 1
    k = request.max_points_per_user
    if request.privacy_unit == "user":
        if policy.privacy_unit == "user" and k is not None and k != policy.max_points_per_user:
            raise PolicyError(
                f"dataset {dataset!r} bounds each person to k={policy.max_points_per_user} points per "
                f"{policy.bound_window}; this release asks k={k}. Drop --max-points-per-user or change the "
                "policy with `geodp dataset policy`")
        k = k or policy.max_points_per_user or DEFAULT_K
    elif policy.privacy_unit == "user":
        if policy.max_records_per_person is None:
            raise PolicyError(
                f"dataset {dataset!r} protects users; a record-level release would let a person with m "
                "records lose m·ε. Declare a public bound on records per person in the policy "
                "(`geodp dataset policy ... --max-records-per-person M`) to release at record level")
        multiplier = policy.max_records_per_person
        k = DEFAULT_K
    else:
        k = DEFAULT_K
    return ResolvedPolicy(policy, stored is not None, int(k), multiplier)


def mark_experimental(store: ReleaseStore) -> None:
    """Make ``store`` a store of seeded experiments, whose noise anyone with the seed can regenerate:
    refused for a store that holds a ledger, so such releases never sit beside publishable ones."""
    if store.listdir("datasets"):
        raise PolicyError(f"{store.url} holds a privacy ledger: seeded noise (--seed) cannot be committed "
                          "there; use a separate folder for experiments")
    try:
        store.create(EXPERIMENTAL, b"seeded experiments: NOT FOR PUBLICATION\n")
    except FileExistsError:
        pass


def refuse_if_experimental(store: ReleaseStore) -> None:
    if store.exists(EXPERIMENTAL):
        raise PolicyError(f"{store.url} holds seeded experiments (NOT FOR PUBLICATION); releases with secure "
                          "noise go to another store")


def charged_days(period, policy: PrivacyPolicy) -> tuple[int, int]:
    """The UTC days (first, last) a release of ``period`` is charged for: the days its period touches,
    or, without a period, the policy's horizon (EVERY_DAY when it has none)."""
    span = days_of_window(period.start_s, period.end_s)
    if span is None:
        horizon = policy.horizon
        span = (day_number(horizon[0]), day_number(horizon[1])) if horizon else EVERY_DAY
    return span


def read_window(period, policy: PrivacyPolicy) -> tuple[int | None, int | None]:
    """The time window [start_s, end_s) a release may read rows from: never wider than the days it is
    charged for, so a release without a period under a horizon reads the horizon's rows only."""
    if period.start_s is not None or period.end_s is not None:
        return period.start_s, period.end_s
    first, last = charged_days(period, policy)
    if (first, last) == EVERY_DAY:
        return None, None
    return first * DAY_S, (last + 1) * DAY_S


def charge_for(plan, resolved: ResolvedPolicy, draw: str) -> LedgerCharge:
    """The ledger's view of one city-release: its days, ε, region and bounding draw."""
    span = charged_days(plan.period, resolved.policy)
    per_day = resolved.policy.bound_window == "day" and plan.privacy_unit == "user"
    if per_day and span == EVERY_DAY:
        raise PolicyError(f"dataset {plan.dataset!r} bounds each person per UTC day: a release needs a "
                          "--period (or a horizon in the policy)")
    return LedgerCharge(key=plan.release_key, draw=draw,
                        epsilon=None if plan.epsilon is None else float(plan.epsilon), rho=plan.rho,
                        first_day=span[0], last_day=span[1], per_day=per_day,
                        bbox=plan.region.bbox_latlon(), multiplier=resolved.multiplier, city=plan.city,
                        period=plan.period.label,
                        extra={"mechanism": plan.mechanism, "privacy_unit": plan.privacy_unit,
                               "config_hash": plan.config_hash})


def staged_elsewhere(store: ReleaseStore, plan) -> bool:
    """True when a complete attempt of this release key is already staged (a run died before its
    manifest): the next run commits that noise and must not be charged again."""
    prefix = f"releases/{plan.dataset}/{plan.city}/{plan.period.label}"
    for n in store.versions(plan.dataset, plan.city, plan.period.label):
        try:
            claim = store.read_json(f"{prefix}/v{n}/_CLAIM.json")
        except FileNotFoundError:
            continue
        if claim.get("release_key") == plan.release_key:
            return store.staged_attempt(ReleaseRef(plan.dataset, plan.city, plan.period.label, n)) is not None
    return False


def check_budget(store_url: str, plans: list, resolved: ResolvedPolicy) -> None:
    """Refuse, before any data is read or a cluster starts, charges the ledger would refuse now (the
    policy's budget in every window, a per-day bound without days). Reads only: :func:`charge_ledger`
    checks again when it appends, since another run may charge in between."""
    if not plans:
        return
    store = ReleaseStore(store_url)
    charges = [charge_for(p, resolved, "planned") for p in plans if not staged_elsewhere(store, p)]
    if charges:
        held = [h.charge for h in DatasetLedger(store, plans[0].dataset).held()]
        check_within_budget(resolved.policy, held, charges)


def check_sources(store_url: str, dataset: str, locators: list[str]) -> None:
    """Refuse, before any data is read, an input whose files (or locator) belong to another dataset."""
    DatasetLedger(ReleaseStore(store_url), dataset).check_sources(locators)


@task(name="charge-ledger", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE,
      retry_condition_fn=retry_unless_refused)
def charge_ledger(store_url: str, plans: list, resolved: ResolvedPolicy, source: str | list[str]) -> dict[str, dict]:
    """Charge every city of the run in one ledger entry, before any noise is drawn.

    Ties the source (its locators: InputSet.locators) to the dataset and stores the policy on the first
    release. Cities with a complete
    staged attempt are not charged (their noise was paid for by the run that drew it). Returns, per
    city, the charge the run holds: {"seq", "draw", "key", "entry_sha256"} (seq None for a resumed city);
    the manifest names it, so the ledger entry cannot be deleted unnoticed (DatasetLedger.verify)."""
    if not plans:
        return {}
    store = ReleaseStore(store_url)
    ledger = DatasetLedger(store, plans[0].dataset)
    ledger.bind_sources([source] if isinstance(source, str) else list(source))
    policy = resolved.policy
    if not resolved.stored:
        policy = ledger.create_policy(policy, reason=f"first release into {plans[0].dataset}")
        if policy != resolved.policy:
            raise PolicyError(f"dataset {plans[0].dataset!r} got a different policy from a concurrent "
                              "release; run this one again")
    draw = uuid.uuid4().hex[:16]
    to_charge = [p for p in plans if not staged_elsewhere(store, p)]
    out = {p.city: {"seq": None, "draw": None, "key": p.release_key} for p in plans}
    if to_charge:
        entry, _ = ledger.charge([charge_for(p, replace(resolved, policy=policy), draw) for p in to_charge], policy)
        for p in to_charge:
            out[p.city] = {"seq": entry["seq"], "draw": draw, "key": p.release_key, ENTRY_HASH: entry[ENTRY_HASH]}
    return out


@task(name="void-charge", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE)
def void_charge(store_url: str, dataset: str, held: dict, reason: str) -> None:
    """Give back a city's charge: its noise was never published (the fit failed before staging, or
    another run's attempt was committed for the same release key)."""
    if held.get("seq") is None:
        return
    DatasetLedger(ReleaseStore(store_url), dataset).void(held["seq"], [held["key"]], reason)


def committed_from(manifest: Manifest, held: dict) -> bool:
    """Whether a committed manifest's noise came from the charge this run holds."""
    paid = manifest.ledger
    return held.get("seq") is not None and paid is not None and paid.seq == held["seq"] and paid.draw == held["draw"]
