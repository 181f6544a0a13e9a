"""Prefect tasks of the privacy ledger: resolve a dataset's policy, charge a run, void a charge.

The policy of a dataset lives in its ledger home (tasks/storage/ledger.py, tasks/storage/ledger_home.py:
the release store itself unless the platform settings name one home for every store). A run asks for one through a
:class:`PolicyRequest` built from its options; the first release into a dataset creates the policy from
it, later ones must agree with the stored policy (a different ``--budget-cap``, privacy unit or k is a
one-line error; changing a policy is ``geodp dataset policy``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from dpcore import GeoDPError
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
from tasks.lazy_task import NO_CACHE, task
from tasks.public_errors import retry_unless_refused
from tasks.storage.held_charge import HeldCharge, attempt_of
from tasks.storage.ledger import ENTRY_HASH, ChargeMoved
from tasks.storage.ledger_home import LEDGER_RECORD, LedgerHome, resolve_home
from tasks.storage.manifest import Manifest
from tasks.storage.store import CHARGE_REF, CLAIM, ReleaseRef, ReleaseStore, StagedElsewhere, as_store
from tasks.storage.take_over import take_over

DEFAULT_K = 20
#: ``--max-points-per-user auto``: the plan chooses each release's k (tasks/release_k.py)
AUTO = "auto"
#: The bound a dataset policy created with k = auto gets: the largest k the plan tries
#: (dpcore.synopsis.expected_error.K_CANDIDATES).
AUTO_K_MAX = 200
EXPERIMENTAL = "_EXPERIMENTAL"


@dataclass(frozen=True)
class PolicyRequest:
    """What a run's options say about the dataset's policy. ``budget`` is an explicit cap (a
    ``--budget-cap`` or a per-dataset cap in the config) that must match a stored policy;
    ``default_budget`` only seeds a new dataset."""

    privacy_unit: str
    max_points_per_user: int | str | None = None  # a number, AUTO or None (the policy's)
    budget: float | None = None
    default_budget: float = 10.0
    zcdp: bool = False
    #: a whole policy the platform configuration declares for the dataset ([nightly.policy]): a new
    #: dataset gets it, a stored policy must equal it
    declared: PrivacyPolicy | None = None

    def new_policy(self) -> PrivacyPolicy:
        if self.declared is not None:
            return self.declared
        user, auto = self.privacy_unit == "user", self.max_points_per_user == AUTO
        return PrivacyPolicy(privacy_unit=self.privacy_unit,
                             budget=float(self.budget if self.budget is not None else self.default_budget),
                             max_points_per_user=(AUTO_K_MAX if auto else self.max_points_per_user or DEFAULT_K)
                             if user else None, k_auto=user and auto)


@dataclass(frozen=True)
class ResolvedPolicy:
    """The policy a run releases under, whether it is stored yet, and the run's k and multiplier. With
    ``choose_k`` the plan chooses k (at most ``max_points_per_user``) from published releases."""

    policy: PrivacyPolicy
    stored: bool
    max_points_per_user: int
    multiplier: int
    choose_k: bool = False


def home_of(store: ReleaseStore, home: LedgerHome | None = None) -> LedgerHome:
    """``home``, else the ledger home ``store`` recorded, else the store itself."""
    return home if home is not None else resolve_home(store)


def held_home(store: ReleaseStore, held: HeldCharge) -> LedgerHome:
    """The ledger home of a charge a run holds for a release into ``store`` (its ``home``)."""
    return LedgerHome.of(store, held.home)


def resolve_policy(store_url: ReleaseStore | str, dataset: str, request: PolicyRequest, home: LedgerHome | None = None) -> ResolvedPolicy:
    """Read the dataset's policy (or propose one from the request) and check the run fits it.
    Reads only; nothing is written until :func:`charge_ledger`."""
    stored = home_of(as_store(store_url), home).ledger(dataset).policy()
    policy = stored or request.new_policy()
    if stored is not None and request.declared is not None and stored != request.declared:
        have, want = stored.to_dict(), request.declared.to_dict()
        diff = ", ".join(f"{k} {have[k]!r} stored, {want[k]!r} configured" for k in have if have[k] != want[k])
        raise PolicyError(f"dataset {dataset!r} has another policy than the configuration's [nightly.policy] "
                          f"({diff}); change one of them (`geodp dataset policy` changes the stored one)")
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
    multiplier, choose = 1, False
    k = request.max_points_per_user
    if request.privacy_unit == "user":
        user = policy.privacy_unit == "user"
        if user and k == AUTO and not policy.k_auto:
            raise PolicyError(
                f"dataset {dataset!r} bounds each person to k={policy.max_points_per_user} points per "
                f"{policy.bound_window}; k = auto needs a policy that lets each release choose k "
                "(`geodp dataset policy ... --max-points-per-user auto`)")
        if user and policy.k_auto and k not in (None, AUTO) and k > policy.max_points_per_user:
            raise PolicyError(
                f"dataset {dataset!r} lets each release choose k up to {policy.max_points_per_user}; this "
                f"release asks k={k}. Give a smaller k, auto, or change the policy with `geodp dataset policy`")
        if user and not policy.k_auto and k is not None and k != policy.max_points_per_user:
            raise PolicyError(
                f"dataset {dataset!r} bounds each person to k={policy.max_points_per_user} points per "
                f"{policy.bound_window}; this release asks k={k}. Drop --max-points-per-user or change the "
                "policy with `geodp dataset policy`")
        choose = k == AUTO or (k is None and policy.k_auto)
        k = policy.max_points_per_user if choose or k is None else k
        k = k or DEFAULT_K
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
    return ResolvedPolicy(policy, stored is not None, int(k), multiplier, choose)


def mark_experimental(store: ReleaseStore) -> None:
    """Make ``store`` a store of seeded experiments, whose noise anyone with the seed can regenerate:
    refused for a store that holds or charges a ledger, so such releases never sit beside publishable ones."""
    if store.listdir("datasets") or store.exists(LEDGER_RECORD):
        raise PolicyError(f"{store.url} holds a privacy ledger: seeded noise (--seed) cannot be committed "
                          "there; use a separate folder for experiments")
    if store.dry_run:
        return  # `release plan` checks the store, and marks nothing
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


def charge_for(plan, resolved: ResolvedPolicy, draw: str, profile_epsilon: float | None = None,
               profile: bool = False) -> LedgerCharge:
    """The ledger's view of one city-release: its days, ε, region and bounding draw. With
    ``profile_epsilon`` the run paid its contribution profile in a charge of its own
    (tasks/release_profile.py): ``profile`` True makes that charge (key ``<release key>/profile``, ε_p),
    else the release's charge is ε − ε_p and says so (``profile_epsilon``)."""
    span = charged_days(plan.period, resolved.policy)
    per_day = resolved.policy.bound_window == "day" and plan.privacy_unit == "user"
    if per_day and span == EVERY_DAY:
        raise PolicyError(f"dataset {plan.dataset!r} bounds each person per UTC day: a release needs a "
                          "--period (or a horizon in the policy)")
    key, epsilon, extra = plan.release_key, None if plan.epsilon is None else float(plan.epsilon), {}
    if profile_epsilon is not None:
        key, epsilon = (key + "/profile", profile_epsilon) if profile else (key, epsilon - profile_epsilon)
        extra = {"profile_epsilon": profile_epsilon} if not profile else {"profile_of": plan.release_key}
    return LedgerCharge(key=key, draw=draw, epsilon=epsilon, rho=plan.rho,
                        first_day=span[0], last_day=span[1], per_day=per_day,
                        bbox=plan.region.bbox_latlon(), multiplier=resolved.multiplier, city=plan.city,
                        period=plan.period.label,
                        extra={"mechanism": plan.mechanism, "privacy_unit": plan.privacy_unit,
                               "config_hash": plan.config_hash, **extra})


def version_of(store: ReleaseStore, dataset: str, city: str, period: str, release_key: str) -> ReleaseRef | None:
    """The version a release key has claimed in the store, or None (reads only)."""
    prefix = f"releases/{dataset}/{city}/{period}"
    for n in store.versions(dataset, city, period):
        try:
            claim = store.read_json(f"{prefix}/v{n}/{CLAIM}")
        except FileNotFoundError:
            continue
        if isinstance(claim, dict) and claim.get("release_key") == release_key:
            return ReleaseRef(dataset, city, period, n)
    return None


def staged_elsewhere(store: ReleaseStore, plan) -> bool:
    """True when a complete attempt of this release key is already staged (a run died before its
    manifest): the next run commits that noise and is not charged again."""
    ref = version_of(store, plan.dataset, plan.city, plan.period.label, plan.release_key)
    return ref is not None and store.staged_attempt(ref) is not None


def check_budget(store_url: ReleaseStore | str, plans: list, resolved: ResolvedPolicy, home: LedgerHome | None = None) -> None:
    """Refuse, before any data is read or a cluster starts, charges the ledger would refuse now (the
    policy's budget in every window, a per-day bound without days), counting the charges of every
    store the ledger home pays for. Reads only: :func:`charge_ledger` checks again when it appends,
    since another run may charge in between."""
    if not plans:
        return
    store = as_store(store_url)
    home = home_of(store, home)
    held = home.ledger(plans[0].dataset).held()
    # a key that holds a charge for this store already takes it over (charge_ledger checks that
    # against the budget); the same key released into another store is another release
    taken = {h.charge.key for h in held if h.store == home.scope}
    # a contribution profile an earlier run of the key paid (tasks/release_profile.py) is reused or taken
    # over: the run adds only the rest of its ε
    paid = {h.charge.key: h.charge.epsilon for h in held if h.store == home.scope and h.charge.extra.get("profile_of")}
    charges = [charge_for(p, resolved, "planned", paid.get(p.release_key + "/profile")) for p in plans
               if p.release_key not in taken and not staged_elsewhere(store, p)]
    if charges:
        check_within_budget(resolved.policy, [h.charge for h in held], charges)


def check_sources(store_url: ReleaseStore | str, dataset: str, locators: list[str], home: LedgerHome | None = None) -> None:
    """Refuse, before any data is read, an input whose files (or locator) belong to another dataset."""
    home_of(as_store(store_url), home).ledger(dataset).check_sources(locators)


def open_to_charge(store_url: ReleaseStore | str, plans: list, resolved: ResolvedPolicy, source: str | list[str],
                   home: LedgerHome | None = None):
    """What a charge needs first: (store, ledger home, dataset ledger, source locators, policy, the charge
    log as verified). The ledger is verified, the store bound to its home and the source to the dataset,
    and the policy stored on the first release. The log is the one the charge starts from (take-overs);
    the charge itself appends only after reading it again (DatasetLedger.charge)."""
    store = as_store(store_url)
    home = home_of(store, home)
    ledger = home.ledger(plans[0].dataset)
    locators = [source] if isinstance(source, str) else list(source)
    # before anything is written: a ledger that does not verify (an entry deleted, a published charge
    # given back, its policy or a source binding gone) is an IntegrityError, and no policy is made anew
    entries = ledger.verify()
    home.bind(store)
    ledger.bind_sources(locators)
    policy = resolved.policy
    if not resolved.stored:
        policy = ledger.create_policy(policy, reason=f"first release into {plans[0].dataset}")
        if policy != resolved.policy:
            raise PolicyError(f"dataset {plans[0].dataset!r} got a different policy from a concurrent "
                              "release; run this one again")
    return store, home, ledger, locators, policy, entries


@task(name="charge-ledger", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE,
      retry_condition_fn=retry_unless_refused)
def charge_ledger(store_url: ReleaseStore | str, plans: list, resolved: ResolvedPolicy, source: str | list[str],
                  home: LedgerHome | None = None,
                  profile_paid: dict[str, float] | None = None) -> dict[str, HeldCharge]:
    """Charge every city of the run in one ledger entry, before any noise is drawn.

    Ties the source (its locators: InputSet.locators) to the dataset and stores the policy on the first
    release, after recording the store's ledger home on both sides (LedgerHome.bind: a store bound to
    another home is refused here). A city with a complete staged attempt is not charged (its noise was paid for by the run
    that drew it; it is committed as is). A city whose key already holds a charge with nothing staged
    (a run that died or failed before its noise reached the store) takes that charge over instead of
    paying twice. Returns, per city, the charge the run holds (:class:`HeldCharge`; seq None for a resumed
    city); the manifest names the entry by seq and hash, so it cannot
    be deleted unnoticed (DatasetLedger.verify). ``profile_paid``: per city, the ε its contribution
    profile was charged apart (tasks/release_profile.py); the city's charge is the rest of its ε."""
    if not plans:
        return {}
    store, home, ledger, locators, policy, entries = open_to_charge(store_url, plans, resolved, source, home)
    draw = uuid.uuid4().hex[:16]
    held = ledger.held(entries)

    def mine(p, seq=None, holders=(), entry_hash=None) -> HeldCharge:
        return HeldCharge(p.release_key, p.city, p.period.label, seq, draw if seq is not None else None,
                          entry_hash, tuple(holders), home.ref)

    out, to_charge = {}, []
    for p in plans:
        if staged_elsewhere(store, p):
            out[p.city] = mine(p)
            continue
        stale = sorted(h.seq for h in held if h.charge.key == p.release_key and h.store == home.scope)
        if stale:
            try:
                holders = take_over(store, ledger, p, stale[0], draw, policy)
            except StagedElsewhere:  # an earlier holder's attempt completed first: it is committed as is
                out[p.city] = mine(p)
                continue
            if holders is not None:
                charged = next(e for e in entries if e["seq"] == stale[0])
                out[p.city] = mine(p, stale[0], holders, charged[ENTRY_HASH])
                continue
        to_charge.append(p)
    if to_charge:
        entry, _ = ledger.charge([charge_for(p, replace(resolved, policy=policy), draw,
                                             (profile_paid or {}).get(p.city)) for p in to_charge], policy,
                                 store=home.scope, sources=locators)
        for p in to_charge:
            out[p.city] = mine(p, entry["seq"], (), entry[ENTRY_HASH])
    return out


def give_back(store: ReleaseStore, dataset: str, held: HeldCharge, reason: str) -> bool:
    """Give back a charge this run holds whose noise is not published: seal its attempt (so nothing
    can complete it later), delete the attempt's files, then void the charge, in that order, so the
    charge covers every noisy file for as long as one exists. A charge another run took over, or whose
    attempt completed, stays. Returns whether the charge was voided."""
    if not held.charged:
        return False
    ref = version_of(store, dataset, held.city, held.period, held.key)
    if ref is not None:
        committed = store.manifest(ref)
        if committed is not None and committed.ledger is not None and committed.ledger.seq == held.seq:
            return False  # the charge paid for the published release (another holder's attempt): it stays
        attempt = held.attempt_name()
        if store.exists(f"{ref.rel}/{attempt}/{CHARGE_REF}") or store.attempt_data(ref, attempt):
            try:
                store.seal_attempt(ref, attempt)
            except StagedElsewhere:
                committed = store.manifest(ref)
                if committed is None or committed.attempt == attempt:
                    return False  # complete: the next run commits it with this charge
                # complete, but the version committed another attempt: this noise is never published
            store.delete_attempt_data(ref, attempt)
    try:
        held_home(store, held).ledger(dataset).void(held.seq, [held.key], reason, holder=held.draw)
    except ChargeMoved:
        return False
    return True


def give_back_interrupted(exc: BaseException, workers_stopped: bool) -> None:
    """After Ctrl-C (or SIGTERM), once nothing of the run can stage noise any more (the Prefect form has
    closed its cluster): give back each charge the run holds for noise that is not published
    (tasks.ledger_tasks.give_back seals the attempt, deletes its files, then voids; a complete staged
    attempt keeps its charge for the next run to commit), and note on ``exc`` what became of them, for the
    command's one line. On a cluster the run did not start (``workers_stopped`` False) a task may still be
    staging: the charges stay held, and the next run of the release takes them over."""
    states: dict[str, list[str]] = {}
    for store_url, dataset, held in getattr(exc, "geodp_held", []):
        if not held.charged:
            continue
        store = as_store(store_url)
        try:
            if workers_stopped:
                give_back(store, dataset, held, "interrupted before the commit")
            ref = version_of(store, dataset, held.city, held.period, held.key)
            manifest = store.manifest(ref) if ref is not None else None
            if manifest is not None and committed_from(manifest, held):
                continue  # published: its charge is spent
            still = any(h.seq == held.seq and h.charge.key == held.key
                        for h in held_home(store, held).ledger(dataset).held())
        except (OSError, GeoDPError):
            still = True  # the store did not answer: the charge is held as far as this run knows
        states.setdefault("stays held until the release runs again" if still else "was given back",
                          []).append(held.city)
    notes = [f"the charge of {', '.join(sorted(set(c)))} {what}" for what, c in states.items()]
    profiles: dict[float, set[str]] = {}
    for city, epsilon in getattr(exc, "geodp_profiles", []):
        profiles.setdefault(epsilon, set()).add(city)
    notes += [f"the contribution profile of {', '.join(sorted(c))} (ε {e:g}) stays charged: its noise was drawn"
              for e, c in profiles.items()]
    if notes:
        exc.geodp_note = "; ".join(notes)


@contextmanager
def given_back_on_failure(store_url: ReleaseStore | str, dataset: str, held: HeldCharge, what: str, quiet: bool = False,
                          on: type[BaseException] = BaseException,
                          unless: type[BaseException] | tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Around a step whose noise the charge ``held`` pays for (a fit, a persist): when the step fails
    with ``on`` (and not ``unless``), nothing of it was committed, so the charge is given back
    (:func:`give_back`, reason "``what``: <error type>") before the error goes on. ``quiet``: a store that does not answer keeps the
    charge held (the next run of the release takes it over) and the step's own error is the one raised."""
    try:
        yield
    except on as exc:
        if isinstance(exc, unless):
            raise
        reason = f"{what}: {type(exc).__name__}"
        try:
            give_back(as_store(store_url), dataset, held, reason)
        except (OSError, GeoDPError):
            if not quiet:
                raise
        raise


@task(name="void-charge", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE)
def void_charge(store_url: ReleaseStore | str, dataset: str, held: HeldCharge, reason: str) -> bool:
    """Give back a city's charge: its noise was never published (the fit failed, storage failed before
    the commit, or another run's attempt was committed for the same release key)."""
    return give_back(as_store(store_url), dataset, held, reason)


class VoidRefused(GeoDPError, ValueError):
    """An operator's void that would give back the charge of noise that is (or may become) public."""


def void_entry(store: ReleaseStore, dataset: str, seq: int, reason: str,
               home: LedgerHome | None = None) -> tuple[list[str], list[str]]:
    """``geodp dataset void``: give back the held charges of ledger entry ``seq`` whose noise was never
    published. For each, the attempts of the charge are sealed (nothing can complete them later) and
    their files deleted, and only then is the charge voided; the void is refused while any file of
    such an attempt is left, when the charge's release is committed, or when an attempt of it is
    complete (a re-run of the release commits that noise). ``store`` is any store charging the ledger
    home (``home``, else the one it recorded); the attempts are looked for in the release store the
    entry names. Returns (voided keys, deleted files)."""
    home = home_of(store, home)
    ledger = home.ledger(dataset)
    entries = ledger.entries()
    entry = next((e for e in entries if e["seq"] == seq and e["kind"] == "charge"), None)
    if entry is None:
        raise VoidRefused(f"dataset {dataset!r} has no charge entry #{seq}")
    store = ReleaseStore(entry["store"], create=False) if entry.get("store") else home.store
    held = {h.charge.key for h in ledger.held(entries) if h.seq == seq}
    if not held:
        raise VoidRefused(f"every charge of entry #{seq} is already void")
    todo = []
    for c in entry["charges"]:
        if c["key"] not in held:
            continue
        if c.get("profile_of"):  # a contribution profile's own charge (tasks/release_profile.py)
            _refuse_recorded_profile(store, dataset, seq, c)
            continue
        ref = version_of(store, dataset, c["city"], c["period"], c["key"])
        if ref is None:
            continue
        m = store.manifest(ref)
        if m is not None and m.ledger is not None and m.ledger.seq == seq:
            raise VoidRefused(f"entry #{seq} paid for the published release {c['city']} {c['period']} "
                              f"({store.url_of(ref.rel)}); it cannot be given back")
        names = set(store.attempts_of_charge(ref, seq))
        names |= {attempt_of(seq, d) for d in ledger.holders(seq, c["key"], entries)}
        if m is None:  # an attempt of unknown charge (staged by older code, charge reference last) may be ours
            names |= {a for a in store.attempts(ref)
                      if not store.exists(f"{ref.rel}/{a}/{CHARGE_REF}") and store.attempt_data(ref, a)}
        todo.append((ref, sorted(names - {m.attempt if m is not None else None})))
    deleted = []
    for ref, names in todo:
        for attempt in names:
            try:
                store.seal_attempt(ref, attempt)
            except StagedElsewhere:
                raise VoidRefused(f"entry #{seq} paid for {store.url_of(ref.rel)}/{attempt}, which is completely "
                                  f"staged: a re-run of the release commits it (no new charge)") from None
            data = store.attempt_data(ref, attempt)
            store.delete_attempt_data(ref, attempt)
            deleted += [f"{store.url_of(ref.rel)}/{attempt}/{n}" for n in data]
    try:
        ledger.void(seq, sorted(held), reason)
    except ChargeMoved as exc:
        raise VoidRefused(f"entry #{seq}: {exc}") from None
    return sorted(held), deleted


def _refuse_recorded_profile(store: ReleaseStore, dataset: str, seq: int, charge: dict) -> None:
    """A profile charge whose profile is recorded paid for noise that decided a verdict (and is public):
    it stays. One whose run died before recording it may be given back."""
    from tasks.storage.profile_records import records_of

    if seq in records_of(store, dataset, charge["profile_of"]):
        raise VoidRefused(f"entry #{seq} paid for the contribution profile of {charge['city']} {charge['period']}, "
                          "which is recorded in the store and decided its verdict; it cannot be given back")


def settle_strays(store: ReleaseStore, dataset: str, manifests: list[Manifest], home: LedgerHome | None = None) -> int:
    """Once a release key is committed, no other charge of the key for this store can ever publish:
    seal the other attempts of the key, delete their files and void their charges (a race loser, or a
    run that died after another's commit, leaves them). Returns how many charges were voided."""
    home = home_of(store, home)
    store.sweep_committed(dataset)  # first: the files of sealed or abandoned attempts of committed versions
    ledger = home.ledger(dataset)
    entries = ledger.entries()
    by_key = {m.release_key: m for m in manifests}
    paid = {k: (m.ledger.seq if m.ledger is not None else None) for k, m in by_key.items()}
    strays = sorted({(h.seq, h.charge.key) for h in ledger.held(entries) if h.charge.key in by_key
                     and h.store == home.scope and h.seq != paid[h.charge.key]})
    voided = 0
    for seq, key in strays:
        m = by_key[key]
        ref = ReleaseRef(dataset, m.city, m.period, int(m.version))
        # every attempt of the charge: those begun, and those its holders have yet to begin
        holders = ledger.holders(seq, key, entries)
        names = set(store.attempts_of_charge(ref, seq)) | {attempt_of(seq, d) for d in holders}
        left = False
        for attempt in sorted(names - {m.attempt}):
            try:
                store.seal_attempt(ref, attempt)
            except StagedElsewhere:
                pass  # complete but never to be committed: its files go all the same
            # a stray's run may still be uploading (a race loser): the seal stops it, and it deletes
            # what it adds and gives its charge back itself
            left = bool(store.delete_attempt_data(ref, attempt, live_writer_may_remain=True)) or left
        if left:
            continue  # the charge keeps covering noise that is still in the store
        try:
            # only while the holder seen above still holds it: a run that took the charge over since
            # stages an attempt not sealed here, which it settles itself once it sees the commit
            ledger.void(seq, [key], "the release was committed by another run's attempt",
                        holder=holders[-1] if holders else None)
            voided += 1
        except ChargeMoved:
            continue
    return voided


def committed_from(manifest: Manifest, held: HeldCharge) -> bool:
    """Whether a committed manifest's noise is paid for by the charge this run holds (made or taken over)."""
    paid = manifest.ledger
    return held.charged and paid is not None and paid.seq == held.seq
