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
#: Rows per step of the per-row passes: a step's temporaries (a byte a row, and a few bytes per
#: candidate) stay in the core's cache and are reused, not new memory each time.
SAMPLE_BLOCK = 1 << 18
#: Candidates a unit expects per bucket of its key range (see sample_per_unit).
PER_BUCKET = 4


def _random_u32(rng: np.random.Generator, n: int) -> np.ndarray:
    """n independent uniform 32-bit integers: both halves of the generator's 64-bit outputs."""
    return rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]


def _random_u8(rng: np.random.Generator, n: int) -> np.ndarray:
    """n independent uniform bytes: the eight bytes of each of the generator's 64-bit outputs."""
    return rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n]


def _ranges(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The concatenation of arange(start[i], start[i] + length[i]) over i."""
    ends = np.cumsum(length)
    return np.repeat(start - (ends - length), length) + np.arange(int(ends[-1]) if ends.size else 0)


def sample_per_unit(codes: np.ndarray | list[np.ndarray], counts: np.ndarray, k: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Row mask of a uniform sample of min(n_u, k) rows per unit, for rows coded ``codes`` (one array,
    or a list whose concatenation is the rows; integers below ``counts.size``) with ``counts`` the
    rows per code.

    Each row of a heavy unit (n_u > k) gets an independent uniform 64-bit key, and the unit keeps the
    rows with its k smallest keys, or, when it has fewer than 2k rows, drops the rows with its n_u − k
    smallest keys: either way a uniform k-subset, since the keys are exchangeable. Call m_u the rows a
    unit so chooses. A key's top 7 bits are drawn for every row, its next 25 only for candidates and its
    last 32 only where two keys must be told apart. Candidates are the rows whose top bits lie under a
    per-unit threshold T_u/128 that about m_u + 5.5·sqrt(m_u) of its rows clear, so the m_u smallest
    keys are among them; one byte per code holds T_u and the unit's side, so the pass over every row
    reads a table of a byte per person. A unit with fewer than m_u candidates draws again with every
    row a candidate. No sort finds the m_u-th smallest key: the unit's range of candidate keys is cut
    into buckets of about PER_BUCKET candidates, one count per bucket tells which bucket holds it, the
    candidates in lower buckets are chosen, and only that bucket's candidates are sorted (by their key's
    top 32 bits, then its last 32). A unit whose m_u-th and next keys tie in all 64 bits also draws
    again, so the sample is exactly uniform. Light units keep every row. The per-row passes
    go SAMPLE_BLOCK rows at a time."""
    blocks = [codes] if isinstance(codes, np.ndarray) else list(codes)
    blocks = [b[i:i + SAMPLE_BLOCK] for b in blocks for i in range(0, b.size, SAMPLE_BLOCK)]
    starts = np.cumsum([0] + [b.size for b in blocks])
    heavy = counts > k
    n_u = counts[heavy]
    h = n_u.size
    if not h:
        return np.ones(int(starts[-1]), dtype=bool)
    keep = np.empty(int(starts[-1]), dtype=bool)  # the first pass writes every row
    drop = n_u < 2 * k
    m = np.where(drop, n_u - k, k)
    # heavy units numbered 0 … h − 1 in code order
    dense = np.zeros(counts.size, dtype=np.int32 if h < 2 ** 31 else np.int64)
    dense[heavy] = np.arange(h)
    q = np.minimum(1.0, (m + CANDIDATE_SDS * np.sqrt(m) + 4.0) / n_u)
    # Per code, a byte: 0 for a light unit, else 2·T + 1 where the unit keeps its choice and 2·T where it
    # drops it (so a row's starting keep flag is its lowest bit being 0). Any T in 1 … 127 serves (it
    # only sets how many candidates a unit expects). With r a row's random byte, its key's top 7 bits
    # are r >> 1, and (r | 1) < 2·T + side holds exactly when r >> 1 < T, whatever the side.
    top = np.clip(np.ceil(q * 128.0), 1, 127).astype(np.uint8)
    table = np.zeros(counts.size, dtype=np.uint8)
    table[heavy] = (top << np.uint8(1)) | (~drop).astype(np.uint8)
    limit = top.astype(np.float64) * 2.0 ** 25  # a candidate's top 32 key bits are below its unit's limit
    chosen_state = np.where(drop, 3, 0).astype(np.int8)
    row_type = np.int32 if keep.size < 2 ** 31 else np.int64
    scratch = np.empty(SAMPLE_BLOCK, dtype=np.uint8)
    redo = None  # per code: its unit draws again, with every row a candidate
    while True:
        # unit i's candidates fall in buckets offset[i] … offset[i + 1] − 1, in the order of their keys
        # (a monotone map of the key); the factor under 1 keeps every key below the unit's last bucket's end
        expected = n_u * (limit / 2.0 ** 32) if redo is None else np.where(redo[heavy], n_u, 0.0)
        n_buckets = np.ceil(expected / PER_BUCKET).astype(np.int64) + (expected > 0)
        offset = np.concatenate([[0], np.cumsum(n_buckets)])
        scale = n_buckets / limit * (1.0 - 2.0 ** -30)
        bucket_type = np.int32 if offset[-1] < 2 ** 31 else np.int64
        rows, buckets, keys = [], [], []
        for start, block in zip(starts, blocks, strict=False):
            if redo is None:
                t = table[block]
                mark = scratch[:block.size]
                # light units' rows, and those of units that drop their choice, are kept unless chosen
                np.bitwise_and(t, np.uint8(1), out=mark)
                np.equal(mark, 0, out=keep[start:start + block.size])
                r8 = _random_u8(rng, block.size)
                np.bitwise_or(r8, np.uint8(1), out=mark)
                r = np.flatnonzero(mark < t)
                high = r8[r] >> np.uint8(1)
            else:
                r = np.flatnonzero(redo[block])
                high = _random_u8(rng, r.size) >> np.uint8(1)
            key = _random_u32(rng, r.size) >> np.uint32(7)
            key |= high.astype(np.uint32) << np.uint32(25)
            u = dense[block[r]]
            b = (key * scale[u]).astype(bucket_type)
            b += offset[u].astype(bucket_type, copy=False)
            buckets.append(b)
            rows.append((r + start).astype(row_type, copy=False))
            keys.append(key)
        bucket, row, key = np.concatenate(buckets), np.concatenate(rows), np.concatenate(keys)
        del buckets, rows, keys
        # per unit: the bucket that holds its m-th smallest key, and how many of that bucket's
        # candidates it takes; a unit with fewer than m candidates draws again
        below = np.zeros(int(offset[-1]) + 1, dtype=np.int64)  # candidates in the buckets before each
        np.cumsum(np.bincount(bucket, minlength=int(offset[-1])), out=below[1:])
        target = below[offset[:-1]] + m
        enough = below[offset[1:]] >= target
        edge_bucket = np.searchsorted(below, target, side="left") - 1
        take = target - below[np.minimum(edge_bucket, int(offset[-1]))]
        # per bucket: chosen (0 kept, 3 dropped), 1 a unit's edge bucket, 2 neither
        state = np.full(int(offset[-1]), 2, dtype=np.int8)
        first, last = offset[:-1][enough], edge_bucket[enough]
        state[_ranges(first, last - first)] = np.repeat(chosen_state[enough], last - first)
        state[last] = 1
        s = state[bucket]
        # the edge buckets' candidates, by bucket, then all 64 bits of their keys
        edge = np.flatnonzero(s == 1)
        eb = bucket[edge]
        ek = key[edge].astype(np.uint64) << np.uint64(32)
        ek |= _random_u32(rng, edge.size)
        order = np.lexsort((ek, eb))
        edge, eb, ek = edge[order], eb[order], ek[order]
        unit = np.searchsorted(offset, eb, side="right") - 1
        rank = np.arange(edge.size) - np.searchsorted(eb, eb, side="left")
        nxt = np.flatnonzero(rank == take[unit])  # each unit's first candidate not taken
        tied = unit[nxt[ek[nxt] == ek[nxt - 1]]]
        picked = rank < take[unit]
        if tied.size:  # all 64 bits equal at the cut: the unit draws again
            enough[tied] = False
            state[_ranges(offset[tied], n_buckets[tied])] = 2
            s = state[bucket]
            picked &= enough[unit]
        keep[row[s == 0]] = True
        keep[row[s == 3]] = False
        keep[row[edge[picked]]] = ~drop[unit[picked]]
        again = ~enough if redo is None else redo[heavy] & ~enough
        if not again.any():
            return keep
        redo = np.zeros(counts.size, dtype=bool)
        redo[heavy] = again
        limit = np.full(h, 2.0 ** 32)


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
