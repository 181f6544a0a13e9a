"""A new run of a release takes over the charge an earlier run of it holds with nothing staged (it died,
or is only slow): the attempts of every earlier holder are sealed before the ledger names the new run,
so a published manifest always names the ledger's holder of its charge
(docs/decisions/0022-a-published-charge-stays-with-its-run.md)."""

from __future__ import annotations

from dpcore.privacy.accounting import PrivacyPolicy
from tasks.storage.held_charge import attempt_of
from tasks.storage.ledger import ChargeMoved, DatasetLedger
from tasks.storage.store import _MAX_APPEND_TRIES, ReleaseRef, ReleaseStore, StagedElsewhere, StoreError


def take_over(store: ReleaseStore, ledger: DatasetLedger, plan, seq: int, draw: str,
              policy: PrivacyPolicy) -> list[str] | None:
    """Take charge (seq, key) of ``plan``'s release over for this run (``draw``). The attempt of every run
    that has held it is sealed first (the version is claimed if no run has yet), and the charge adopted
    only while the last of them still holds it, so no earlier holder's attempt can complete once the
    ledger names this run. Returns the earlier holders; None when the charge was voided meanwhile (the
    caller charges afresh). Raises :class:`StagedElsewhere` when an earlier holder's attempt completed
    (or was committed) first: that noise is committed as is, under its own holder."""
    key = plan.release_key
    version, _ = store.claim_version(plan.dataset, plan.city, plan.period.label, key)
    ref = ReleaseRef(plan.dataset, plan.city, plan.period.label, version)
    for _ in range(_MAX_APPEND_TRIES):
        holders = ledger.holders(seq, key)
        for d in holders:
            store.seal_attempt(ref, attempt_of(seq, d))
        try:
            ledger.adopt(seq, key, draw, policy,
                         "a new run of the same release takes over a charge whose noise never reached the store",
                         holder=holders[-1])
            return holders
        except ChargeMoved:
            if not any(h.seq == seq and h.charge.key == key for h in ledger.held()):
                return None
            if ledger.holders(seq, key)[-1] == holders[-1]:  # held by the same run: its release is published
                raise StagedElsewhere(f"charge #{seq} paid for a published release") from None
    raise StoreError(f"charge #{seq} of {key} is too contended: gave up taking it over")
