"""The release store's names, errors and small helpers, shared by the store (tasks/storage/store.py)
and its attempt protocol (tasks/storage/attempts.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from dpcore import GeoDPError

MANIFEST = "_MANIFEST.json"
CLAIM = "_CLAIM.json"
STAGED = "_STAGED.json"
CHARGE_REF = "charge.json"
SEALED = "sealed"
STORE_ID = "_STORE_ID"


@dataclass(frozen=True)
class ReleaseRef:
    """Where one committed version lives inside a store."""

    dataset: str
    city: str
    period: str
    version: int

    @property
    def rel(self) -> str:
        return f"releases/{self.dataset}/{self.city}/{self.period}/v{self.version}"


class StoreError(GeoDPError, OSError):
    """The release store is unreachable, malformed, or refused an operation."""


class IntegrityError(StoreError):
    """A released file does not match the sha256 or size its manifest records."""


class AttemptSealed(StoreError):
    """A newer run of the same release took this attempt's charge over and sealed the attempt."""


class StagedElsewhere(StoreError):
    """An attempt this run meant to supersede completed first: commit that one instead."""

    def __init__(self, attempt: str):
        super().__init__(f"attempt {attempt} is already staged")
        self.attempt = attempt


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
