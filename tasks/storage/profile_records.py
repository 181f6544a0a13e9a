"""Where the contribution profiles a release paid for are recorded in its store (create-only, one file per
ledger entry), and the ledger key of a profile's charge: read by the release (tasks.release_profile) and by
the ledger's void (tasks.ledger_tasks), so it depends on neither."""

from __future__ import annotations

from tasks.config import canonical_hash
from tasks.storage.store import ReleaseStore

#: a profile charge's ledger key: the release key it paid the verdict of, with this suffix
PROFILE_KEY_SUFFIX = "/profile"


def profile_key(release_key: str) -> str:
    return release_key + PROFILE_KEY_SUFFIX


def record_dir(dataset: str, release_key: str) -> str:
    return f"profiles/{dataset}/{canonical_hash([profile_key(release_key)])[:32]}"


def is_record_name(name: str) -> bool:
    """A profile record's file name: the ledger seq of the charge that paid it, ``NNNNNNNN.json``."""
    return name.endswith(".json") and name[:-5].isdigit()


def records_of(store: ReleaseStore, dataset: str, release_key: str) -> dict[int, dict]:
    """The recorded profiles a release key's profile charges paid for, by ledger seq."""
    where = record_dir(dataset, release_key)
    out = {}
    for name in store.listdir(where):
        name = name.rsplit("/", 1)[-1]
        if is_record_name(name):
            try:
                out[int(name[:-5])] = store.read_json(f"{where}/{name}")
            except FileNotFoundError:
                continue
    return out
