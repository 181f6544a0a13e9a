"""Which release stores a ledger home pays for: ``<home>/stores/<hash of URL>.json`` names each one
(tasks/storage/ledger_home.py writes them; DatasetLedger.verify reads them to find every release that
names one of its entries). URLs are canonical: a local store by its real path, an S3 one as
``s3://bucket/prefix``."""

from __future__ import annotations

import json

from tasks.storage.store import ReleaseStore, StoreError

STORES = "stores"


def canonical_url(store: ReleaseStore) -> str:
    """The one spelling of a store's URL that ledger records and manifests use."""
    return store.url_of("").rstrip("/")


def release_stores(home: ReleaseStore) -> list[ReleaseStore]:
    """The home and every store recorded as charging it (a local store that no longer exists holds no
    release, and is left out)."""
    out = [home]
    for url in _recorded_urls(home):
        try:
            out.append(ReleaseStore(url, create=False))
        except StoreError:
            if "://" in url and not url.startswith("file://"):
                raise  # an unreachable remote store: its releases cannot be checked
    return out


def registered_stores(home: ReleaseStore) -> set[str]:
    """The canonical URLs of the stores recorded as charging ``home``."""
    return set(_recorded_urls(home))


def _recorded_urls(home: ReleaseStore) -> list[str]:
    """The store URLs recorded under the home's stores/ folder (one listing, one batched read)."""
    names = [n for n in home.listdir(STORES) if n.endswith(".json")]
    return [json.loads(d)["store"] for d in home.read_many([f"{STORES}/{n}" for n in names]).values()]
