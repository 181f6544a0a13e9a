"""The contribution profile as a release of its own, paid before the rest of the run (issue 43 item 4).

A user-level run scaled by its profile pays for it first: one ledger entry holding only the profile's
charges (key ``<release key>/profile``, ε_p = PROFILE_FRACTION of the run's smallest ε, each city's
region and days), committed before its noise is drawn. The noisy profile is then recorded create-only in
the release store (``profiles/<dataset>/<key hash>/<seq>.json``, one record per charge) before anything
is derived from it, and the run predicts each city's error from it (tasks/release_usefulness.py). A city
expected worse than a blank map at every band is refused having spent only ε_p; the others are charged
ε − ε_p under their release key, so a published release costs ε in all, as when the profile was part of
its one charge.

Once drawn, a profile stays charged whatever happens to the run (its noise decided the verdict; a
recorded profile is public). A run of the same release keys reuses a recorded profile instead of
drawing again (no second charge); a profile charge whose run died before recording it is taken over
(``adopt``), as the release's own charge is when its noise never reached the store.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

from dpcore.privacy.profile import PROFILE_FRACTION, ContributionProfile
from tasks.lazy_task import NO_CACHE, task
from tasks.ledger_tasks import ResolvedPolicy, charge_for, open_to_charge
from tasks.public_errors import retry_unless_refused
from tasks.storage.held_charge import HeldCharge
from tasks.storage.ledger import ChargeMoved
from tasks.storage.ledger_home import LedgerHome
from tasks.storage.profile_records import profile_key, record_dir, records_of
from tasks.storage.store import ReleaseStore, as_store


def profile_epsilon(plans: list) -> float:
    """The profile's ε: a fixed, public share of the run's smallest ε (the rest pays each city's fit)."""
    return PROFILE_FRACTION * min(float(p.epsilon) for p in plans)


def recorded_profile(store: ReleaseStore, plans: list) -> tuple[ContributionProfile, int] | None:
    """A profile already recorded for every one of ``plans`` (one run drew it over all their data), with
    its seq, or None: a run of the same release reuses it and pays nothing more for it."""
    common: dict[str, tuple[int, dict]] | None = None
    for p in plans:
        mine = {r.get("run"): (seq, r) for seq, r in records_of(store, p.dataset, p.release_key).items()}
        common = mine if common is None else {run: common[run] for run in common if run in mine}
        if not common:
            return None
    seq, record = min(common.values(), key=lambda v: v[0])
    return ContributionProfile.from_dict(record["profile"]), seq


@task(name="charge-profile", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE,
      retry_condition_fn=retry_unless_refused)
def charge_profile(store_url: ReleaseStore | str, plans: list, resolved: ResolvedPolicy, epsilon: float,
                   source: str | list[str], home: LedgerHome | None = None) -> dict[str, HeldCharge]:
    """Charge the run's profile in a ledger entry of its own, before its noise is drawn: per city the
    charge held (key ``<release key>/profile``). A profile charge of the same key whose profile was never recorded (its run
    died in between) is taken over instead; a recorded one is never drawn again."""
    store, home, ledger, locators, policy, entries = open_to_charge(store_url, plans, resolved, source, home)
    draw = uuid.uuid4().hex[:16]
    held = ledger.held(entries)
    out, to_charge = {}, []
    for p in plans:
        key = profile_key(p.release_key)
        used = set(records_of(store, p.dataset, p.release_key))
        stale = sorted(h.seq for h in held if h.charge.key == key and h.store == home.scope and h.seq not in used)
        if stale:
            try:
                ledger.adopt(stale[0], key, draw, policy, "a new run of the same release takes over a profile "
                                                          "charge whose profile was never recorded")
                out[p.city] = HeldCharge(key, p.city, p.period.label, stale[0], draw)
                continue
            except ChargeMoved:
                pass
        to_charge.append(p)
    if to_charge:
        charges = [charge_for(p, replace(resolved, policy=policy), draw, profile_epsilon=epsilon, profile=True)
                   for p in to_charge]
        entry, _ = ledger.charge(charges, policy, store=home.scope, sources=locators)
        out.update({p.city: HeldCharge(profile_key(p.release_key), p.city, p.period.label, entry["seq"], draw)
                    for p in to_charge})
    return out


def record_profile(store_url: ReleaseStore | str, plans: list, held: dict[str, HeldCharge],
                   profile: ContributionProfile) -> ContributionProfile:
    """Record the drawn profile under each city's profile charge (create-only), before anything is derived
    from it. Where another run holding the same charge recorded first, its profile is the one used (ours
    is never shown)."""
    store = as_store(store_url)
    run = held[plans[0].city].draw
    body = {"run": run, "profile": profile.to_dict(), "epsilon": profile.epsilon,
            "release_keys": sorted(p.release_key for p in plans)}
    for p in plans:
        rel = f"{record_dir(p.dataset, p.release_key)}/{int(held[p.city].seq):08d}.json"
        try:
            store.create(rel, json.dumps(body, sort_keys=True).encode())
        except FileExistsError:
            body = store.read_json(rel)
    return ContributionProfile.from_dict(body["profile"])


def pay_profile(plan, todo: list, draw_profile, step) -> tuple[ContributionProfile, str]:
    """The run's profile, paid before anything else: (profile, what the run has spent so far, in words).
    ``draw_profile()`` draws it from the data pass's counts (the caller's process decides how its failures
    are shown); ``step`` runs the charge as a Prefect task or in this process."""
    if plan.params.seed is not None:  # seeded experiments are never charged nor recorded
        return draw_profile(), "nothing was charged (seeded noise)"
    store = plan.store
    found = recorded_profile(store, todo)
    if found is not None:
        return found[0], (f"nothing more was charged (its contribution profile, ε = {found[0].epsilon:.3g}, was "
                          f"paid by ledger entry #{found[1]})")
    held = step(charge_profile)(store, todo, plan.resolved, profile_epsilon(todo), plan.input.locators(),
                                plan.home)
    profile = record_profile(store, todo, held, draw_profile())
    return profile, f"only its contribution profile was charged (ε = {profile.epsilon:.3g})"
