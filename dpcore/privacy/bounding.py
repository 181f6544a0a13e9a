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
        kept = ~heavy_rec  # a mask gives the kept indices in order without sorting them
        kept[heavy_idx[perm[order[rank < k]]]] = True
        keep = np.flatnonzero(kept)
    else:
        keep = np.arange(n)
    n_users = int(np.count_nonzero(counts))
    return BoundingResult(keep.astype(np.int64), n, n_users, int(heavy_user.sum()), k)


# -- weighted bounding ------------------------------------------------------------------------------
#: Weights live on the lattice of multiples of 2⁻²⁰, so any sum of them (below 2³³ points) is exact in
#: float64 and a weighted count can take integer-valued discrete Laplace noise in units of the lattice
#: step (NoiseSource.add_lattice_laplace): no float Laplace, and no rounding that could add to the
#: sensitivity. A person with up to k·2²⁰ points keeps a positive weight on every one of them.
WEIGHT_QUANTUM = 2.0 ** -20


def _codes(user: np.ndarray) -> np.ndarray:
    u = np.asarray(user)
    if u.dtype.kind in "iu" and u.size and u.min() >= 0 and u.max() < 2 * u.size + 1_000_000:
        return u.astype(np.int64, copy=False)
    return np.unique(u, return_inverse=True)[1].astype(np.int64)


def contribution_weights(user: np.ndarray, max_points_per_user: int) -> np.ndarray:
    """Per-point weights min(1, k/n_u), rounded DOWN to the WEIGHT_QUANTUM lattice.

    n_u is the number of points person u has in ``user`` (the whole release: every city and slot, as
    for :func:`bound_contributions`). Every point is kept; a person's weights add up to at most k
    (n_u · ⌊k/n_u⌋_lattice ≤ k, the rounding only goes down), so a weighted count histogram has L1
    sensitivity k like the k-sample, and its expectation over the k-sample's draws is the same
    (each point is in a uniform k-subset with probability min(1, k/n_u)) without the sampling noise.
    """
    k = int(max_points_per_user)
    if k < 1:
        raise SamplingError(f"max_points_per_user must be ≥ 1, got {max_points_per_user}")
    if np.asarray(user).size == 0:
        return np.empty(0, dtype=np.float64)
    codes = _codes(user)
    n_u = np.bincount(codes).astype(np.float64)
    steps = np.floor(np.minimum(1.0, k / np.maximum(n_u, 1.0)) / WEIGHT_QUANTUM)
    return (steps * WEIGHT_QUANTUM)[codes]


def check_weights(user: np.ndarray | None, weights: np.ndarray, max_points_per_user: int) -> None:
    """Refuse weights that would break the sensitivity k of a weighted count: off the lattice, outside
    (0, 1], or summing above k for some person. Exact: sums of lattice values are exact in float64."""
    w = np.asarray(weights, dtype=np.float64)
    if user is None or np.asarray(user).shape != w.shape:
        raise SamplingError("weighted bounding needs one user id per weighted point")
    if w.size == 0:
        return
    if not (np.all(w > 0) and np.all(w <= 1.0)):
        raise SamplingError("contribution weights must lie in (0, 1]")
    if not np.array_equal(np.floor(w / WEIGHT_QUANTUM) * WEIGHT_QUANTUM, w):
        raise SamplingError("contribution weights must be multiples of WEIGHT_QUANTUM (2^-20)")
    per_user = np.bincount(_codes(user), weights=w)
    if per_user.max() > int(max_points_per_user):
        raise SamplingError(f"a person's weights add up to {per_user.max():g} > k = {max_points_per_user}")
