"""The ledger home: the one store whose ledgers charge the releases of a release store.

A dataset's policy, charges and source bindings (tasks/storage/ledger.py) live in one store, its
*ledger home*. The platform setting ``ledger`` (``GEODP_LEDGER``) names it once for every release
store (tasks/settings.py); without it a store is its own home. So that a second store cannot open a
second ledger unnoticed, both sides record the binding, create-only, before the first charge:

    <store>/_LEDGER.json              {"ledger": URL}, or {"ledger": "."}: the store is its own home
    <home>/stores/<hash of URL>.json  {"store": URL}: a store whose releases this home pays for

A store records one home for its life: a release whose configured home differs from the store's
recorded one is refused (:class:`LedgerHomeConflict`). A store made before the record existed and
holding ``datasets/`` is its own home. The home's list of stores lets DatasetLedger.verify find every
release that names one of its entries, wherever it was committed. URLs are canonical: a local store
by its real path (symlinks resolved, ``file://`` dropped), an S3 one as ``s3://bucket/prefix``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from dpcore import GeoDPError
from tasks.storage.home_stores import STORES, canonical_url, registered_stores, release_stores
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore, StoreError, sha256_bytes, utc_now

LEDGER_RECORD = "_LEDGER.json"
#: What a store's record names when the store is its own ledger home.
ITSELF = "."


class LedgerHomeConflict(GeoDPError, ValueError):
    """A store is bound to another ledger home than the one this release is configured with."""


def recorded_home(store: ReleaseStore) -> str | None:
    """The canonical URL of the ledger home ``store`` has recorded (itself for a store that predates
    the record and holds a ledger), or None while it has charged no ledger."""
    try:
        named = store.read_json(LEDGER_RECORD).get("ledger")
    except FileNotFoundError:
        return canonical_url(store) if store.listdir("datasets") else None
    if not isinstance(named, str) or not named:
        raise StoreError(f"{store.url_of(LEDGER_RECORD)} names no ledger home")
    return canonical_url(store) if named == ITSELF else named


@dataclass(frozen=True)
class LedgerHome:
    """Where the releases of one store are charged: the home's and the store's canonical URLs."""

    url: str
    store_url: str

    @classmethod
    def of(cls, store: ReleaseStore, home_url: str | None = None) -> LedgerHome:
        """The home ``home_url`` (canonical) for ``store``; None: the store itself."""
        here = canonical_url(store)
        home = cls(url=home_url or here, store_url=here)
        if home.url == here:
            home.__dict__["store"] = store  # the ledger lives in the store the run opened: not opened again
        return home

    @property
    def elsewhere(self) -> bool:
        """Whether the ledger lives outside the release store."""
        return self.url != self.store_url

    @property
    def ref(self) -> str | None:
        """The home as a charge reference and a manifest name it: None when it is the store itself."""
        return self.url if self.elsewhere else None

    @property
    def scope(self) -> str | None:
        """The release store as the home's charge entries name it: None when it is the home itself."""
        return self.store_url if self.elsewhere else None

    @cached_property
    def store(self) -> ReleaseStore:
        """The home, opened (the release store itself when the ledger lives there)."""
        return ReleaseStore(self.url)

    def __getstate__(self) -> dict:
        return {"url": self.url, "store_url": self.store_url}  # an opened store is not sent along

    def ledger(self, dataset: str) -> DatasetLedger:
        """The dataset's ledger, one object per home (it holds no state: every read goes to the store)."""
        ledgers = self.__dict__.setdefault("_ledgers", {})
        if dataset not in ledgers:
            ledgers[dataset] = DatasetLedger(self.store, dataset)
        return ledgers[dataset]

    def bind(self, release_store: ReleaseStore) -> None:
        """Record the binding on both sides (module docstring), create-only, before the first charge.
        Raises :class:`LedgerHomeConflict` when the store already records another home (a release
        configured with another home raced this one)."""
        if self.elsewhere:
            body = {"store": self.store_url, "created_at": utc_now()}
            try:
                self.store.create(f"{STORES}/{sha256_bytes(self.store_url.encode())[:32]}.json",
                                  json.dumps(body, indent=2).encode())
            except FileExistsError:
                pass
        named = self.url if self.elsewhere else ITSELF
        if release_store.listdir("datasets") and self.elsewhere:
            raise self._conflict(canonical_url(release_store))
        try:
            release_store.create(LEDGER_RECORD, json.dumps({"ledger": named, "created_at": utc_now()},
                                                           indent=2).encode())
            return
        except FileExistsError:
            pass
        recorded = recorded_home(release_store)
        if recorded != self.url:
            raise self._conflict(recorded)

    def _conflict(self, recorded: str | None) -> LedgerHomeConflict:
        return LedgerHomeConflict(
            f"store {self.store_url} charges the ledger in {recorded}, not the configured ledger home {self.url}: "
            f"a store keeps one ledger for its life; set `ledger` (GEODP_LEDGER) to {recorded} or release "
            "into another store")


def resolve_home(store: ReleaseStore, configured: str | None = None) -> LedgerHome:
    """The ledger home of releases into ``store``: the configured one (``ledger`` in the platform
    settings), else the one the store recorded, else the store itself. A configured home that differs
    from the recorded one is refused (:class:`LedgerHomeConflict`). Reads only."""
    here = LedgerHome.of(store)
    recorded = recorded_home(store)
    if configured:
        home = LedgerHome.of(store, canonical_url(ReleaseStore(configured)))
        if recorded is not None and recorded != home.url:
            raise home._conflict(recorded)
        return home
    return LedgerHome.of(store, recorded) if recorded else here


__all__ = ["LEDGER_RECORD", "STORES", "LedgerHome", "LedgerHomeConflict", "canonical_url", "recorded_home",
           "registered_stores", "release_stores", "resolve_home"]
