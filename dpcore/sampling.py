"""User-level contribution bounding.

Neighbouring datasets differ by all the records of one user. Keeping at most k records per user,
chosen uniformly at random, bounds the change a user can make to any histogram's L1 norm by k. The
bound is applied once per *release*, over all cities and time slots together: bounding per city
would let a user who appears in c cities contribute c·k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpcore import GeoDPError

PrivacyUnit = Literal["user", "record"]
PRIVACY_UNITS = ("user", "record")


class SamplingError(GeoDPError, ValueError):
    pass


def check_privacy_unit(privacy_unit: str) -> str:
    if privacy_unit not in PRIVACY_UNITS:
        raise SamplingError(f"privacy unit must be one of {PRIVACY_UNITS}, got {privacy_unit!r}")
    return privacy_unit


def count_sensitivity(privacy_unit: str, max_points_per_user: int | None) -> int:
    """L1 sensitivity of a count histogram: k under user-level privacy, 1 under record-level."""
    check_privacy_unit(privacy_unit)
    if privacy_unit == "record":
        return 1
    if max_points_per_user is None or int(max_points_per_user) < 1:
        raise SamplingError("user-level privacy needs max_points_per_user (k) ≥ 1")
    return int(max_points_per_user)


@dataclass(frozen=True)
class BoundingResult:
    keep: np.ndarray  # indices into the input, sorted ascending
    n_input: int
    n_users: int
    n_users_truncated: int
    max_points_per_user: int


def bound_contributions(user: np.ndarray, max_points_per_user: int, rng: np.random.Generator) -> BoundingResult:
    """Indices of a uniform sample of at most k records per user (vectorised, no per-user loop).

    Each record gets an independent random key; within a user, the records with the k smallest keys
    are kept, which is a uniform k-subset. Users with ≤ k records keep everything and are not sorted.
    """
    k = int(max_points_per_user)
    if k < 1:
        raise SamplingError(f"max_points_per_user must be ≥ 1, got {max_points_per_user}")
    u = np.asarray(user)
    n = u.size
    if n == 0:
        return BoundingResult(np.empty(0, dtype=np.int64), 0, 0, 0, k)
    if u.dtype.kind in "iu" and u.min() >= 0 and u.max() < 2 * n + 1_000_000:
        codes = u.astype(np.int64, copy=False)  # already small ints (Points.user is dense): no sort
    else:
        _, codes = np.unique(u, return_inverse=True)
    counts = np.bincount(codes)
    heavy_user = counts > k
    heavy_rec = heavy_user[codes]
    heavy_idx = np.flatnonzero(heavy_rec)
    if heavy_idx.size:
        # A uniform k-subset per user = the first k of a uniformly random order. Shuffle the heavy
        # records, then stable-sort them by user (a radix sort when user codes fit in 16 bits):
        # each user's records stay in shuffled order, and rank < k keeps k of them uniformly.
        n_heavy = int(heavy_user.sum())
        dense = (np.cumsum(heavy_user) - 1)[codes[heavy_idx]]
        perm = rng.permutation(heavy_idx.size)
        shuffled_user = dense[perm].astype(np.uint16 if n_heavy <= 65536 else np.uint32)
        order = np.argsort(shuffled_user, kind="stable")
        per_user = counts[heavy_user]
        starts = np.cumsum(per_user) - per_user
        rank = np.arange(order.size) - np.repeat(starts, per_user)
        kept_heavy = heavy_idx[perm[order[rank < k]]]
        keep = np.flatnonzero(~heavy_rec)
        keep = np.sort(np.concatenate([keep, kept_heavy]))
    else:
        keep = np.arange(n)
    n_users = int(np.count_nonzero(counts))
    return BoundingResult(keep.astype(np.int64), n, n_users, int(heavy_user.sum()), k)
