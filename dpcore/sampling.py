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
    if u.dtype.kind not in "iu":
        _, u = np.unique(u, return_inverse=True)
    uniq, inverse, counts = np.unique(u, return_inverse=True, return_counts=True)
    heavy_user = counts > k
    heavy_rec = heavy_user[inverse]
    light_idx = np.flatnonzero(~heavy_rec)
    heavy_idx = np.flatnonzero(heavy_rec)
    if heavy_idx.size:
        # Sort heavy records by (user, random key) with one argsort of a combined int64 key.
        h_user = inverse[heavy_idx].astype(np.int64)
        rand = rng.integers(0, 1 << 31, size=heavy_idx.size, dtype=np.int64)
        order = np.argsort((h_user << 31) | rand, kind="stable")
        sorted_user = h_user[order]
        starts = np.flatnonzero(np.r_[True, sorted_user[1:] != sorted_user[:-1]])
        group_start = np.repeat(starts, np.diff(np.r_[starts, sorted_user.size]))
        rank = np.arange(sorted_user.size) - group_start
        kept_heavy = heavy_idx[order[rank < k]]
        keep = np.sort(np.concatenate([light_idx, kept_heavy]))
    else:
        keep = light_idx
    return BoundingResult(keep.astype(np.int64), n, int(uniq.size), int(heavy_user.sum()), k)
