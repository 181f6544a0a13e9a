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


def unit_codes(user: np.ndarray) -> np.ndarray:
    """int64 codes of the units in ``user``, equal for equal ids: small non-negative integer ids as
    themselves (dense user codes need no hashing), any other ids through one hash table."""
    u = np.asarray(user)
    if u.dtype.kind in "iu" and u.size and u.min() >= 0 and u.max() < 2 * u.size + 1_000_000:
        return u.astype(np.int64, copy=False)
    if u.dtype.kind in "iu":
        import pandas as pd  # here: a caller with small ids never needs it

        return pd.factorize(u)[0].astype(np.int64, copy=False)
    return np.unique(u, return_inverse=True)[1].astype(np.int64).reshape(-1)


#: Candidates a heavy unit expects beyond the m it chooses, in standard deviations of its candidate
#: count (plus a few): a unit with fewer than m candidates, which draws again after a pass over every
#: row, is then rare (a Poisson tail: 3·10⁻⁵ a unit at m = 1, 4·10⁻⁷ at m = 50).
CANDIDATE_SDS = 5.5
#: Rows per step of the per-row passes: a step's temporaries are reused, not new memory each time.
SAMPLE_BLOCK = 1 << 20


def sample_per_unit(codes: np.ndarray | list[np.ndarray], counts: np.ndarray, k: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Row mask of a uniform sample of min(n_u, k) rows per unit, for rows coded ``codes`` (one array,
    or a list whose concatenation is the rows; integers below ``counts.size``) with ``counts`` the
    rows per code.

    Each row of a heavy unit (n_u > k) gets an independent 64-bit random key, and the unit keeps the
    rows with its k smallest keys, or, when it has fewer than 2k rows, drops the rows with its n_u − k
    smallest keys: either way a uniform k-subset, since the keys are exchangeable. Call m_u the rows
    a unit so chooses. Only candidates are sorted: rows whose key lies under a per-unit threshold that
    about m_u + 5.5·sqrt(m_u) of its rows clear, so the m_u smallest keys are among them; a unit with
    fewer than m_u candidates draws again with every row a candidate. Candidates are ordered by unit,
    then by their key's top bits; a unit whose m_u-th and next candidates tie there also draws again
    (probability about n_u²·2^(b − 65) for 2^b heavy units), so the sample is exactly uniform. Light
    units keep every row. The per-row passes go SAMPLE_BLOCK rows at a time."""
    blocks = [codes] if isinstance(codes, np.ndarray) else list(codes)
    blocks = [b[i:i + SAMPLE_BLOCK] for b in blocks for i in range(0, b.size, SAMPLE_BLOCK)]
    starts = np.cumsum([0] + [b.size for b in blocks])
    keep = np.ones(int(starts[-1]), dtype=bool)
    heavy = counts > k
    n_u = counts[heavy]
    h = n_u.size
    if not h:
        return keep
    drop = n_u < 2 * k
    m = np.where(drop, n_u - k, k)
    # heavy units numbered 0 … h − 1 in code order
    dense = np.zeros(counts.size, dtype=np.int32 if h < 2 ** 31 else np.int64)
    dense[heavy] = np.arange(h)
    q = np.minimum(1.0, (m + CANDIDATE_SDS * np.sqrt(m) + 4.0) / n_u)
    # Per code, 32 bits: 0 for a light unit, else a threshold on the top half of its rows' keys, whose
    # lowest bit says the unit drops its choice. Any threshold serves (it only sets how many candidates
    # a unit expects), so it is at least 2, and a key's top half is above 2³² − 2 twice in 2³² draws.
    threshold = np.clip(np.floor(q * 2.0 ** 32), 2.0, 2.0 ** 32 - 1).astype(np.uint32)
    table = np.zeros(counts.size, dtype=np.uint32)
    table[heavy] = (threshold & ~np.uint32(1)) | drop.astype(np.uint32)
    bits = max(1, h.bit_length())
    low, high = np.uint64(bits), np.uint64(64 - bits)
    row_type = np.int32 if keep.size < 2 ** 31 else np.int64
    redo = None  # per code: its unit draws again, with every row a candidate
    while True:
        composites, rows = [], []
        for start, block in zip(starts, blocks, strict=False):
            key = None
            if redo is None:
                t = table[block]
                # light units' rows, and those of units that drop their choice, are kept unless chosen
                np.bitwise_and(t, np.uint32(1), out=keep[start:start + block.size], casting="unsafe")
                keep[start:start + block.size] |= t == 0
                key = rng.bit_generator.random_raw(block.size).astype(np.uint64, copy=False)
                r = np.flatnonzero((key >> np.uint64(32)).astype(np.uint32) < t)
                key = key[r]
            else:
                r = np.flatnonzero(redo[block])
                key = rng.bit_generator.random_raw(r.size).astype(np.uint64, copy=False)
            # a candidate's unit in the top bits, its key's top bits below: sorted, by unit then key
            composite = dense[block[r]].astype(np.uint64) << high
            composite |= key >> low
            composites.append(composite)
            rows.append((r + start).astype(row_type, copy=False))
        composite, row = np.concatenate(composites), np.concatenate(rows)
        del composites, rows
        u = (composite >> high).astype(np.intp)
        n_cand = np.bincount(u, minlength=h)
        ordered = np.sort(composite)
        present = np.flatnonzero(n_cand)  # units with candidates, ascending: ordered's order
        per, want = n_cand[present], m[present]
        enough = per >= want
        present, per, want = present[enough], per[enough], want[enough]
        at = np.cumsum(n_cand)[present] - per + want - 1  # each unit's m_u-th smallest candidate
        kth = np.zeros(h, dtype=np.uint64)
        kth[present] = ordered[at]
        done = np.zeros(h, dtype=bool)
        done[present] = (per == want) | (ordered[np.minimum(at + 1, ordered.size - 1)] != ordered[at])
        del ordered
        chosen = np.flatnonzero(done[u] & (composite <= kth[u]))
        keep[row[chosen]] = ~drop[u[chosen]]
        again = ~done if redo is None else redo[heavy] & ~done
        if not again.any():
            return keep
        redo = np.zeros(counts.size, dtype=bool)
        redo[heavy] = again


def bound_contributions(user: np.ndarray, max_points_per_user: int, rng: np.random.Generator) -> BoundingResult:
    """Indices of a uniform sample of at most k records per user (vectorised, no per-user loop;
    :func:`sample_per_unit`)."""
    k = int(max_points_per_user)
    if k < 1:
        raise SamplingError(f"max_points_per_user must be ≥ 1, got {max_points_per_user}")
    u = np.asarray(user)
    n = u.size
    if n == 0:
        return BoundingResult(np.empty(0, dtype=np.int64), 0, 0, 0, k)
    codes = unit_codes(u)
    counts = np.bincount(codes)
    keep = np.flatnonzero(sample_per_unit(codes, counts, k, rng))
    n_users = int(np.count_nonzero(counts))
    return BoundingResult(keep.astype(np.int64), n, n_users, int(np.count_nonzero(counts > k)), k)


# -- weighted bounding ------------------------------------------------------------------------------
#: Weights live on the lattice of multiples of 2⁻²⁰, so any sum of them (below 2³³ points) is exact in
#: float64 and a weighted count can take integer-valued discrete Laplace noise in units of the lattice
#: step (NoiseSource.add_lattice_laplace): no float Laplace, and no rounding that could add to the
#: sensitivity. A person with up to k·2²⁰ points keeps a positive weight on every one of them.
WEIGHT_QUANTUM = 2.0 ** -20


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
    codes = unit_codes(user)
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
    per_user = np.bincount(unit_codes(user), weights=w)
    if per_user.max() > int(max_points_per_user):
        raise SamplingError(f"a person's weights add up to {per_user.max():g} > k = {max_points_per_user}")
