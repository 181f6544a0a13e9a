"""The privacy ledger of a release store: one policy per dataset and an append-only log of charges.

Layout inside the store (create-only objects, see tasks/storage/store.py)::

    datasets/<dataset>/policy/<seq>.json   the dataset's policy; a higher seq is a logged change
    datasets/<dataset>/ledger/<seq>.json   a batch of charges (one run's cities) or a void of some of them
    sources/<hash of the locator>.json     which dataset a source (path or URL) belongs to

Each log is linearizable without a lock service: a writer lists it, checks what it must (no other
policy yet; the budget holds in every window the new charges touch) and creates entry ``len(log)``;
of two writers racing for one number only one succeeds, and the other re-reads and checks again.

Charges are never removed. A run whose fit fails before anything was staged, or whose city-release
was committed by another run's attempt, appends a *void* of its own charge; everything else keeps its
charge. Nothing here reads private data: policies, days, ε and regions are public configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dpcore import GeoDPError
from dpcore.privacy.accounting import (
    BudgetRefused,
    LedgerCharge,
    PolicyError,
    PrivacyPolicy,
    check_within_budget,
    worst_case_loss,
)
from tasks.storage.store import (
    _MAX_APPEND_TRIES,
    IntegrityError,
    ReleaseStore,
    StoreError,
    check_slug,
    sha256_bytes,
    utc_now,
)

ENTRY_HASH = "entry_sha256"


def _entry_hash(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k != ENTRY_HASH}
    return sha256_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


class SourceTaken(GeoDPError, ValueError):
    """A source already belongs to another dataset."""


@dataclass(frozen=True)
class Held:
    """A charge held by a run: the ledger entry it lives in and the charge itself."""

    seq: int
    charge: LedgerCharge


class DatasetLedger:
    """The policy and the charges of one dataset in one store."""

    def __init__(self, store: ReleaseStore, dataset: str):
        self.store = store
        self.dataset = check_slug(dataset, "dataset")
        self._policy_dir = f"datasets/{dataset}/policy"
        self._ledger_dir = f"datasets/{dataset}/ledger"

    # -- logs -----------------------------------------------------------------------------------
    def _log(self, prefix: str) -> list[dict]:
        out = []
        for name in self.store.listdir(prefix):
            if name.endswith(".json") and name[:-5].isdigit():
                entry = self.store.read_json(f"{prefix}/{name}")
                if not isinstance(entry, dict) or entry.get(ENTRY_HASH) != _entry_hash(entry) \
                        or entry.get("seq") != int(name[:-5]):
                    raise IntegrityError(f"{self.store.url_of(prefix)}/{name} was altered after it was written; "
                                         "the ledger cannot be trusted until it is restored")
                out.append(entry)
        return sorted(out, key=lambda e: e["seq"])

    def _append(self, prefix: str, make: callable) -> dict:
        """Append ``make(log)`` as entry ``len(log)``; ``make`` checks the log and may raise."""
        for _ in range(_MAX_APPEND_TRIES):
            log = self._log(prefix)
            entry = make(log)
            entry = {"seq": len(log), "dataset": self.dataset, "created_at": utc_now(), **entry}
            entry[ENTRY_HASH] = _entry_hash(entry)
            try:
                self.store.create(f"{prefix}/{len(log):08d}.json", json.dumps(entry, indent=2).encode())
            except FileExistsError:
                continue  # another writer took this number: re-read and check again
            return entry
        raise StoreError(f"{self.store.url_of(prefix)} is too contended: gave up after {_MAX_APPEND_TRIES} tries")

    # -- policy ---------------------------------------------------------------------------------
    def policy_log(self) -> list[dict]:
        return self._log(self._policy_dir)

    def policy(self) -> PrivacyPolicy | None:
        log = self.policy_log()
        return PrivacyPolicy.from_dict(log[-1]["policy"]) if log else None

    def create_policy(self, policy: PrivacyPolicy, reason: str) -> PrivacyPolicy:
        """Set the dataset's first policy; if one exists (another writer won), that one is returned."""
        def make(log: list[dict]) -> dict:
            if log:
                raise _Exists(log[-1])
            return {"policy": policy.to_dict(), "reason": reason}

        try:
            self._append(self._policy_dir, make)
        except _Exists as exc:
            return PrivacyPolicy.from_dict(exc.entry["policy"])
        return policy

    def change_policy(self, policy: PrivacyPolicy, reason: str) -> dict:
        """An explicit, logged change of the policy (``geodp dataset policy``). Refuses a change under
        which the charges already made could not be costed (pure ε after ρ-only releases)."""
        if not reason.strip():
            raise PolicyError("a policy change needs a reason (it is logged)")
        charges = [h.charge for h in self.held()]
        worst_case_loss(policy, charges)  # raises PolicyError when a charge has no cost under it

        def make(log: list[dict]) -> dict:
            if not log:
                raise PolicyError(f"dataset {self.dataset!r} has no policy yet; create it first")
            return {"policy": policy.to_dict(), "reason": reason, "previous": log[-1]["policy"]}

        return self._append(self._policy_dir, make)

    # -- sources --------------------------------------------------------------------------------
    def bind_source(self, locator: str) -> None:
        """Tie ``locator`` (the input's public path or URL) to this dataset; a second dataset name for
        the same source is refused, so one person's data cannot be spent under two budgets."""
        rel = f"sources/{sha256_bytes(locator.encode())[:32]}.json"
        body = {"source": locator, "dataset": self.dataset, "created_at": utc_now()}
        try:
            self.store.create(rel, json.dumps(body, indent=2).encode())
            return
        except FileExistsError:
            pass
        owner = self.store.read_json(rel)
        if owner["dataset"] != self.dataset:
            raise SourceTaken(f"{locator} is already the source of dataset {owner['dataset']!r} in "
                              f"{self.store.url}; release it under that name (one source, one budget)")

    # -- charges --------------------------------------------------------------------------------
    def entries(self) -> list[dict]:
        return self._log(self._ledger_dir)

    def held(self, entries: list[dict] | None = None) -> list[Held]:
        """Every charge not voided, in log order."""
        entries = self.entries() if entries is None else entries
        voided = {(v["seq"], v["key"]) for e in entries if e["kind"] == "void" for v in e["voids"]}
        return [Held(e["seq"], LedgerCharge.from_dict(c)) for e in entries if e["kind"] == "charge"
                for c in e["charges"] if (e["seq"], c["key"]) not in voided]

    def charge(self, charges: list[LedgerCharge], policy: PrivacyPolicy) -> tuple[dict, dict]:
        """Append one batch of charges after checking them against the policy in every window they
        touch. Returns (entry, worst-case loss after it). Raises :class:`BudgetRefused`."""
        result: dict = {}

        def make(log: list[dict]) -> dict:
            current = self.policy()
            if current != policy:
                raise PolicyError(f"the policy of dataset {self.dataset!r} changed while this release was "
                                  "planned; run it again")
            existing = [h.charge for h in self.held(log)]
            result["loss"] = check_within_budget(policy, existing, charges)
            return {"kind": "charge", "charges": [c.to_dict() for c in charges]}

        entry = self._append(self._ledger_dir, make)
        return entry, result["loss"]

    def void(self, seq: int, keys: list[str], reason: str) -> dict:
        """Give back charges of entry ``seq`` (their noise was never published)."""
        return self._append(self._ledger_dir, lambda log: {
            "kind": "void", "voids": [{"seq": int(seq), "key": k} for k in keys], "reason": reason})

    def loss(self, policy: PrivacyPolicy | None = None) -> dict:
        policy = policy or self.policy()
        if policy is None:
            raise PolicyError(f"dataset {self.dataset!r} has no policy in {self.store.url}")
        return worst_case_loss(policy, [h.charge for h in self.held()])


class _Exists(Exception):
    def __init__(self, entry: dict):
        self.entry = entry


def datasets(store: ReleaseStore) -> list[str]:
    return store.listdir("datasets")


__all__ = ["BudgetRefused", "DatasetLedger", "Held", "SourceTaken", "datasets"]
