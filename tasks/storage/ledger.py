"""The privacy ledger of a release store: one policy per dataset and an append-only log of charges.

Layout inside the store (create-only objects, see tasks/storage/store.py)::

    datasets/<dataset>/policy/<seq>.json   the dataset's policy; a higher seq is a logged change
    datasets/<dataset>/ledger/<seq>.json   a batch of charges (one run's cities) or a void of some of them
    sources/<hash of the locator>.json     which dataset a source (path or URL) belongs to
    stores/<hash of the URL>.json          another release store whose releases this ledger pays for

The store holding these is the datasets' *ledger home* (tasks/storage/ledger_home.py): the release
store itself by default, or one home that several release stores charge. A charge entry written for
another store names it (``store``), and so does every charge held for it (:class:`Held`).

Each log is linearizable without a lock service: a writer lists it, checks what it must (no other
policy yet; the budget holds in every window the new charges touch) and creates entry ``len(log)``;
of two writers racing for one number only one succeeds, and the other re-reads and checks again.

Each log is a hash chain: an entry carries its own sha256 and the sha256 of the entry before it
(``prev_sha256``; entry 0 names :data:`GENESIS`), and its number is inside what is hashed. Reading a
log checks every hash, that the numbers run 0..n-1 without a gap, and that every entry follows the
one before it, so an altered, deleted or reordered entry is an :class:`IntegrityError`. The newest
entry has no successor to betray its deletion: every committed manifest and every staged attempt
names the charge entry that paid for it (seq and sha256), and :meth:`DatasetLedger.verify` checks
that each such entry is there, unchanged (docs/decisions/0019-ledger-hash-chain.md), in the home and
in every store recorded as charging it (docs/decisions/0020-ledger-home.md). Entries written
before the chain existed carry no ``prev_sha256``; their own hashes and numbers are still checked, and
the first chained entry after them names the last of them.

Charges are never removed. A run whose fit fails before anything was staged, or whose city-release
was committed by another run's attempt, appends a *void* of its own charge; everything else keeps its
charge. Nothing here reads private data: policies, days, ε and regions are public configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from dpcore import GeoDPError
from dpcore.privacy.accounting import (
    BudgetRefused,
    LedgerCharge,
    PolicyError,
    PrivacyPolicy,
    check_within_budget,
    worst_case_loss,
)
from tasks.storage.home_stores import canonical_url, registered_stores, release_stores
from tasks.storage.manifest import ManifestError, parse_manifest
from tasks.storage.profile_records import is_record_name, profile_key, record_dir
from tasks.storage.store import (
    _MAX_APPEND_TRIES,
    MANIFEST,
    MANIFEST_HASH,
    IntegrityError,
    ReleaseStore,
    StoreError,
    check_slug,
    manifest_hash,
    sha256_bytes,
    utc_now,
)

ENTRY_HASH = "entry_sha256"
PREV_HASH = "prev_sha256"
#: What entry 0 of a log names as the entry before it.
GENESIS = "0" * 64
#: Files of a release's folder that name the ledger entry which paid for its noise.
_PAID_BY_FILES = (MANIFEST, "charge.json")


def _entry_hash(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k != ENTRY_HASH}
    return sha256_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


class SourceTaken(GeoDPError, ValueError):
    """A source already belongs to another dataset."""


class ChargeMoved(GeoDPError, ValueError):
    """A charge is no longer this run's to adopt or void (voided, or taken over by another run)."""


@dataclass(frozen=True)
class Held:
    """A charge held by a run: the ledger entry it lives in, the charge itself, and the release store
    its noise goes to (None: the ledger's own store)."""

    seq: int
    charge: LedgerCharge
    store: str | None = None


class DatasetLedger:
    """The policy and the charges of one dataset in one store."""

    def __init__(self, store: ReleaseStore, dataset: str):
        self.store = store
        self.dataset = check_slug(dataset, "dataset")
        self._policy_dir = f"datasets/{dataset}/policy"
        self._ledger_dir = f"datasets/{dataset}/ledger"

    # -- logs -----------------------------------------------------------------------------------
    def _log(self, prefix: str) -> list[dict]:
        """The log under ``prefix``, its hash chain verified (module docstring)."""
        entries = []
        for name in self.store.listdir(prefix):
            if name.endswith(".json") and name[:-5].isdigit():
                entry = self.store.read_json(f"{prefix}/{name}")
                if not isinstance(entry, dict) or entry.get(ENTRY_HASH) != _entry_hash(entry) \
                        or entry.get("seq") != int(name[:-5]):
                    raise self._broken(prefix, f"entry {name} was altered or moved after it was written")
                entries.append(entry)
        entries.sort(key=lambda e: e["seq"])
        chained = False
        for i, entry in enumerate(entries):
            if entry["seq"] != i:
                raise self._broken(prefix, f"entry #{i} is missing (deleted)")
            if PREV_HASH in entry:
                chained = True
                expected = GENESIS if i == 0 else entries[i - 1][ENTRY_HASH]
                if entry[PREV_HASH] != expected:
                    raise self._broken(prefix, f"entry #{i} does not follow entry #{i - 1} "
                                               "(an entry was deleted, replaced or reordered)")
            elif chained:
                raise self._broken(prefix, f"entry #{i} is outside the hash chain the entries before it started")
        return entries

    def _broken(self, prefix: str, what: str) -> IntegrityError:
        return IntegrityError(f"the ledger chain of dataset {self.dataset!r} does not verify: "
                              f"{self.store.url_of(prefix)}: {what}; it cannot be trusted until it is restored")

    def _append(self, prefix: str, make: callable) -> dict:
        """Append ``make(log)`` as entry ``len(log)``; ``make`` checks the log and may raise."""
        for _ in range(_MAX_APPEND_TRIES):
            log = self._log(prefix)
            entry = make(log)
            entry = {"seq": len(log), "dataset": self.dataset, "created_at": utc_now(), **entry,
                     PREV_HASH: log[-1][ENTRY_HASH] if log else GENESIS}
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
        """The policy in force; None for a dataset without one. A dataset whose policy log is gone while
        its charge log is not is an IntegrityError: a new policy is never written in its place."""
        log = self.policy_log()
        if not log and self.store.listdir(self._ledger_dir):
            raise self._missing_policy()
        return PrivacyPolicy.from_dict(log[-1]["policy"]) if log else None

    def _missing_policy(self) -> IntegrityError:
        return self._broken(self._policy_dir, "the policy is missing (deleted) while the dataset holds charges "
                                              "or releases; restore it (a new one is never written in its place)")

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
    @staticmethod
    def _source_rel(locator: str) -> str:
        return f"sources/{sha256_bytes(locator.encode())[:32]}.json"

    def check_sources(self, locators: list[str]) -> None:
        """Refuse (:class:`SourceTaken`) when any of ``locators`` belongs to another dataset. Reads only."""
        bound = set(self.store.listdir("sources"))
        self._check_owners([loc for loc in locators if self._source_rel(loc).rsplit("/", 1)[-1] in bound])

    def _check_owners(self, locators: list[str]) -> None:
        """Every locator's binding names this dataset (one batched read of the bindings)."""
        if not locators:
            return
        rels = {self._source_rel(loc): loc for loc in locators}
        for rel, data in self.store.read_many(list(rels)).items():
            owner = json.loads(data)["dataset"]
            if owner != self.dataset:
                raise SourceTaken(f"{rels[rel]} is already the source of dataset {owner!r} in "
                                  f"{self.store.url}; release it under that name (one source, one budget)")

    def bind_sources(self, locators: list[str]) -> None:
        """Tie every locator (an input's normalised path or URL and each file it reads:
        dpcore.data.inputs.InputSet.locators) to this dataset, create-only; one that belongs to another
        dataset is refused, so the same rows reached another way cannot be spent under two budgets."""
        bound = set(self.store.listdir("sources"))
        if any(self._source_rel(loc).rsplit("/", 1)[-1] not in bound for loc in locators):
            # a binding is about to be made: every dataset's own bindings must all be there, so that
            # deleting sources/ cannot free a released source for a fresh budget under another name
            for other in known_datasets(self.store):
                DatasetLedger(self.store, other).verify()
        taken = []
        for locator in locators:
            rel = self._source_rel(locator)
            if rel.rsplit("/", 1)[-1] not in bound:
                body = {"source": locator, "dataset": self.dataset, "created_at": utc_now()}
                try:
                    self.store.create(rel, json.dumps(body, indent=2).encode())
                    continue
                except FileExistsError:
                    pass
            taken.append(locator)
        self._check_owners(taken)

    def bind_source(self, locator: str) -> None:
        """:meth:`bind_sources` of one locator."""
        self.bind_sources([locator])

    # -- charges --------------------------------------------------------------------------------
    def entries(self) -> list[dict]:
        return self._log(self._ledger_dir)

    def verify(self) -> list[dict]:
        """The charge log, its chain verified, after checking what the rest of the store says about it:
        every committed manifest and every staged attempt of this dataset names an entry of it as it is
        now (deleting the newest charge entry cannot hide while anything it paid for is in the store);
        no entry gives back (voids) a charge a committed manifest names (its noise is public), nor hands
        it (adopts) to another run than the one whose noise the manifest publishes; the policy
        each charge was checked against and every source binding a charge or a release made are there,
        naming this dataset. Returns the entries."""
        references = self._paid_references()  # first: an entry always exists before anything names it
        entries = self.entries()
        policies = self.policy_log()
        if not policies and (entries or any(ref.get("seq") is not None for _, ref, _ in references if ref)):
            raise self._missing_policy()
        unknown = {e["store"] for e in entries if e.get("store")} - registered_stores(self.store)
        if unknown:
            raise self._broken(self._ledger_dir, f"entries charge store {sorted(unknown)[0]}, which the ledger's "
                                                 "list of stores does not hold (stores/ was edited)")
        held = {(h.seq, h.charge.key): h.charge.draw for h in self.held(entries)}
        bindings: dict[str, str] = {}
        for where, ref, published in references:
            seq = ref.get("seq") if isinstance(ref, dict) else None
            if seq is None:
                continue  # seeded experiments hold no charge (and live in stores without a ledger)
            entry = entries[seq] if isinstance(seq, int) and 0 <= seq < len(entries) else None
            named = ref.get(ENTRY_HASH) or entry and entry[ENTRY_HASH]  # manifests before the chain name seq only
            if entry is None or entry["kind"] != "charge" or named != entry[ENTRY_HASH]:
                raise self._broken(self._ledger_dir, f"{where} was paid for by entry #{seq}, which is "
                                                     f"{'missing' if entry is None else 'not that entry'}")
            if published is None:
                continue  # a staged attempt: its charge may be given back once its files are deleted
            holder = held.get((seq, ref.get("key") or published["key"]))
            if holder is None:
                raise self._broken(self._ledger_dir, f"{where} publishes noise paid for by entry #{seq}, and a "
                                                     "later entry gives that charge back; published noise stays charged")
            if ref.get("draw") and holder != ref["draw"]:
                raise self._broken(self._ledger_dir, f"{where} publishes the noise of run {ref['draw']} (entry #{seq}), "
                                                     f"and a later entry hands that charge to run {holder}; a published "
                                                     "charge stays with the run whose noise it publishes")
            if published.get("source"):
                bindings[self._source_rel(published["source"])] = where
        for e in entries:
            for name in e.get("sources", []) if e["kind"] == "charge" else []:
                bindings.setdefault(f"sources/{name}.json", f"ledger entry #{e['seq']}")
            paid_under = e.get("policy")
            if paid_under is not None:
                n = paid_under.get("seq")
                if not (isinstance(n, int) and 0 <= n < len(policies)) or policies[n][ENTRY_HASH] != paid_under.get(ENTRY_HASH):
                    raise self._broken(self._policy_dir, f"policy entry #{n}, which charge entry #{e['seq']} was "
                                                         "checked against, is missing or was replaced")
        self._check_bindings(bindings)
        return entries

    def _check_bindings(self, bindings: dict[str, str]) -> None:
        """Every source binding in ``bindings`` (its path → what made it) exists and names this dataset."""
        if not bindings:
            return
        present = set(self.store.listdir("sources"))
        for rel, made_by in sorted(bindings.items()):
            if rel.rsplit("/", 1)[-1] not in present:
                raise IntegrityError(f"the source binding {self.store.url_of(rel)} of dataset {self.dataset!r} "
                                     f"(made for {made_by}) is missing: sources/ was edited; restore it, or the "
                                     "same input could be released under another name with a fresh budget")
        for rel, data in self.store.read_many(list(bindings)).items():
            try:
                owner = json.loads(data).get("dataset")
            except (json.JSONDecodeError, AttributeError):
                owner = None
            if owner != self.dataset:
                raise IntegrityError(f"the source binding {self.store.url_of(rel)} names dataset {owner!r}, "
                                     f"not {self.dataset!r}, which released from it: sources/ was edited")

    def _paid_references(self) -> list[tuple[str, dict | None, dict | None]]:
        """(where, the ledger reference it holds, the release's key and source when it is a committed
        manifest) for every manifest and staged charge of this dataset paid by this ledger, in its own
        store and in every store recorded as charging it."""
        home = canonical_url(self.store)
        out = []
        for store in release_stores(self.store):
            here = canonical_url(store)
            out += [(where, ref, published) for where, ref, published in self._references_in(store)
                    if ref is None or (ref.get("home") or here) == home]
        return out

    def _references_in(self, store: ReleaseStore) -> list[tuple[str, dict | None, dict | None]]:
        """(where, ledger reference, {"key", "source"} of a committed manifest else None) of every manifest
        and staged charge of this dataset in ``store``: one listing and one batched read."""
        found = store.find(f"releases/{self.dataset}", lambda name: name in _PAID_BY_FILES)
        out = []
        for rel, body in _read_json_objects(store, found):
            where = store.url_of(rel)
            if rel.endswith(MANIFEST):
                if not isinstance(body, dict) or (MANIFEST_HASH in body and manifest_hash(body) != body[MANIFEST_HASH]):
                    raise IntegrityError(f"{where} was altered after it was committed")
                try:
                    manifest = parse_manifest(body, where)
                except ManifestError as exc:
                    raise IntegrityError(str(exc)) from None
                ref = manifest.ledger
                out.append((where, None if ref is None else ref.model_dump(),
                            {"key": manifest.release_key, "source": manifest.input.source if manifest.input else None}))
            else:
                out.append((where, body if isinstance(body, dict) else None, None))
        return out + self._profile_references(store)

    def _profile_references(self, store: ReleaseStore) -> list[tuple[str, dict | None, dict | None]]:
        """The contribution profiles recorded in ``store`` for this dataset (tasks.release_profile): each
        decided a published verdict, so its charge is referenced as a committed manifest's is (it must exist
        and never be given back). Their run is not compared with the charge's holder: a run that took over a
        profile charge whose first holder recorded late uses the recorded profile, not its own."""
        found = store.find(f"profiles/{self.dataset}", is_record_name)
        out = []
        for rel, body in _read_json_objects(store, found):
            where = store.url_of(rel)
            folder = rel.rsplit("/", 2)[-2]
            keys = [profile_key(k) for k in (body.get("release_keys", []) if isinstance(body, dict) else [])
                    if record_dir(self.dataset, k).endswith(folder)]
            if not keys:
                raise IntegrityError(f"{where} records a contribution profile for no release key of its folder")
            seq = int(rel.rsplit("/", 1)[-1][:-5])
            out.append((where, {"seq": seq, "key": keys[0]}, {"key": keys[0], "source": None}))
        return out

    def held(self, entries: list[dict] | None = None) -> list[Held]:
        """Every charge not voided, in log order; a charge another run took over (``adopt``) is
        accounted under that run's bounding draw."""
        entries = self.entries() if entries is None else entries
        voided = {(v["seq"], v["key"]) for e in entries if e["kind"] == "void" for v in e["voids"]}
        adopted = {(a["seq"], a["key"]): a["draw"] for e in entries if e["kind"] == "adopt" for a in e["adopts"]}
        out = []
        for e in entries:
            if e["kind"] != "charge":
                continue
            for c in e["charges"]:
                if (e["seq"], c["key"]) in voided:
                    continue
                charge = LedgerCharge.from_dict(c)
                draw = adopted.get((e["seq"], c["key"]))
                out.append(Held(e["seq"], charge if draw is None else replace(charge, draw=draw), e.get("store")))
        return out

    def charge(self, charges: list[LedgerCharge], policy: PrivacyPolicy, store: str | None = None,
               sources: list[str] | None = None) -> tuple[dict, dict]:
        """Append one batch of charges after checking them against the policy in every window they
        touch; ``store``: the release store their noise goes to, when it is not the ledger's own (its
        binding is recorded first: LedgerHome.bind); ``sources``: the locators the run bound (their
        bindings are named in the entry, so :meth:`verify` finds one that is deleted). The entry also
        names the policy entry it was checked against. Returns (entry, worst-case loss after it).
        Raises :class:`BudgetRefused`."""
        result: dict = {}
        bound = sorted({self._source_rel(loc).rsplit("/", 1)[-1][:-5] for loc in sources or []})

        def make(log: list[dict]) -> dict:
            policies = self.policy_log()
            current = PrivacyPolicy.from_dict(policies[-1]["policy"]) if policies else None
            if current != policy:
                raise PolicyError(f"the policy of dataset {self.dataset!r} changed while this release was "
                                  "planned; run it again")
            existing = [h.charge for h in self.held(log)]
            result["loss"] = check_within_budget(policy, existing, charges)
            return {"kind": "charge", "charges": [c.to_dict() for c in charges], **({"store": store} if store else {}),
                    **({"sources": bound} if bound else {}),
                    "policy": {"seq": policies[-1]["seq"], ENTRY_HASH: policies[-1][ENTRY_HASH]}}

        self.verify()  # a lost entry is an error here, before its budget could be spent again
        entry = self._append(self._ledger_dir, make)
        return entry, result["loss"]

    def holders(self, seq: int, key: str, entries: list[dict] | None = None) -> list[str]:
        """The runs (bounding draws) that have held charge (seq, key), oldest first: the run that made
        it, then each run that took it over (``adopt`` entries)."""
        entries = self.entries() if entries is None else entries
        out = [c["draw"] for e in entries if e["seq"] == seq and e["kind"] == "charge"
               for c in e["charges"] if c["key"] == key]
        return out + [a["draw"] for e in entries if e["kind"] == "adopt" for a in e["adopts"]
                      if a["seq"] == seq and a["key"] == key]

    def adopt(self, seq: int, key: str, draw: str, policy: PrivacyPolicy, reason: str,
              holder: str | None = None) -> dict:
        """Take over charge (seq, key) for a new run of the same release whose earlier holder died
        before its noise was staged: the charge pays for the new run's noise instead of a second
        charge. The charge is then accounted under the new run's bounding draw (its users were bounded
        afresh, with the new run's other cities), checked against the budget like a charge. With
        ``holder`` (the draw the caller saw holding it, whose attempt it sealed) only while that run
        still holds it. Raises :class:`ChargeMoved` when the charge was voided or taken over by another
        run meanwhile, or when a committed manifest names it (a published charge stays with the run whose
        noise it publishes), :class:`BudgetRefused` past the cap."""
        published = {(ref.get("seq"), ref.get("key") or pub["key"])
                     for _, ref, pub in self._paid_references() if ref and pub is not None}

        def make(log: list[dict]) -> dict:
            held = self.held(log)
            mine = [h for h in held if h.seq == seq and h.charge.key == key]
            if not mine:
                raise ChargeMoved(f"charge #{seq} is no longer held")
            if (seq, key) in published:
                raise ChargeMoved(f"charge #{seq} paid for a published release; it stays with the run whose "
                                  "noise it publishes")
            if holder is not None and mine[0].charge.draw != holder:
                raise ChargeMoved(f"charge #{seq} was taken over by another run")
            if self.policy() != policy:
                raise PolicyError(f"the policy of dataset {self.dataset!r} changed while this release was "
                                  "planned; run it again")
            rest = [h.charge for h in held if h not in mine]
            check_within_budget(policy, rest, [replace(mine[0].charge, draw=draw)])
            return {"kind": "adopt", "adopts": [{"seq": int(seq), "key": key, "draw": draw}], "reason": reason}

        return self._append(self._ledger_dir, make)

    def void(self, seq: int, keys: list[str], reason: str, holder: str | None = None) -> dict:
        """Give back charges of entry ``seq`` (their noise was never published). With ``holder`` (a run's
        draw id) only while that run still holds them: a charge another run took over is its to settle
        (raises :class:`ChargeMoved`)."""
        def make(log: list[dict]) -> dict:
            held = {h.charge.key for h in self.held(log) if h.seq == seq}
            if not set(keys) <= held:
                raise ChargeMoved(f"charge #{seq} is already void")
            if holder is not None:
                for k in keys:
                    held_by = self.holders(seq, k, log)
                    if held_by and held_by[-1] != holder:
                        raise ChargeMoved(f"charge #{seq} was taken over by another run")
            return {"kind": "void", "voids": [{"seq": int(seq), "key": k} for k in keys], "reason": reason}

        return self._append(self._ledger_dir, make)

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


def known_datasets(home: ReleaseStore) -> list[str]:
    """Every dataset the ledger home ``home`` may pay for: those with a folder under ``datasets/`` and
    those with releases in the home or in a store recorded as charging it (whose ledger folder may
    have been deleted: DatasetLedger.verify reports that)."""
    names = set(datasets(home))
    for store in release_stores(home):
        names |= set(store.listdir("releases"))
    return sorted(names)


__all__ = ["ENTRY_HASH", "GENESIS", "PREV_HASH", "BudgetRefused", "DatasetLedger", "Held", "SourceTaken", "datasets", "known_datasets"]


def _read_json_objects(store: ReleaseStore, rels: list[str]) -> list[tuple[str, object]]:
    """(rel, parsed JSON) of each object in one batched read, in path order; a file that is not JSON is an
    integrity error naming it."""
    out = []
    for rel, data in sorted(store.read_many(rels).items()):
        try:
            out.append((rel, json.loads(data)))
        except json.JSONDecodeError:
            raise IntegrityError(f"{store.url_of(rel)} is not valid JSON") from None
    return out
