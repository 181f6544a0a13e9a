"""The ledger charge a run holds for one city-release while it draws and stages that release's noise.

A run gets one per city from the ledger (tasks.ledger_tasks.charge_ledger, or the profile's charge in
tasks/release_profile.py); its attempt in the store is named after it (:func:`attempt_of`), its
reference (``charge.json``) is the attempt's first file, and the manifest names it (:meth:`HeldCharge.paid_by`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


def attempt_of(seq: int | None, draw: str | None) -> str:
    """Where a run stages its noise: named after the charge and the run (so a later run of the same
    charge knows which attempts to seal); a run without a charge (seeded) gets a random name."""
    if seq is None:
        return "a-x" + uuid.uuid4().hex[:12]
    return f"a-{int(seq)}-{draw}"


@dataclass(frozen=True)
class HeldCharge:
    """One city's charge as this run holds it. ``seq`` None: nothing charged (a seeded experiment, or a
    complete staged attempt another run paid for, committed as is). ``holders``: the earlier runs (their
    bounding draws) of a charge taken over, whose attempts staging seals. ``home``: the ledger home's URL,
    None when the ledger lives in the release store."""

    key: str
    city: str
    period: str
    seq: int | None = None
    draw: str | None = None
    entry_sha256: str | None = None
    holders: tuple[str, ...] = ()
    home: str | None = None

    @property
    def charged(self) -> bool:
        return self.seq is not None

    def attempt_name(self) -> str:
        """This charge's attempt (a fresh random name on each call when nothing is charged)."""
        return attempt_of(self.seq, self.draw)

    def earlier_attempts(self) -> tuple[str, ...]:
        """The attempts of the charge's earlier holders, which staging seals and empties first."""
        if not self.charged:
            return ()
        return tuple(attempt_of(self.seq, d) for d in self.holders if d != self.draw)

    def paid_by(self, dataset: str) -> dict:
        """The charge reference an attempt stages first and its manifest names (manifest field ``ledger``)."""
        ref = {"dataset": dataset, "seq": self.seq, "draw": self.draw, "key": self.key,
               "entry_sha256": self.entry_sha256}
        return {**ref, "home": self.home} if self.home else ref  # the ledger home, when not this store
