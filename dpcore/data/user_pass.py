"""User level in one process: every file's compact rows (chunks.compact_rows) bounded and counted
together, with no shuffle.

When the release's rows fit in one process's memory (12 bytes a row for one grid), a person's rows
need not be brought into one partition: the units (people, or people and UTC days) are coded once,
one count per unit gives both the contribution profile and who is over k, and
dpcore.privacy.bounding.sample_per_unit draws every heavy unit's k rows at once. The rows stay in
their files' blocks: one array per column of the whole release would be new memory, which costs more
to touch than the passes over it. A cluster runs the same steps per partition after its shuffle
(chunks.bound_chunk, chunks.unit_profile).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.data.chunks import GridSpec, frame_counts, merge_counts
from dpcore.privacy.bounding import sample_per_unit, unit_codes
from dpcore.privacy.profile import profile_counts


def unit_blocks(frames: list[pd.DataFrame], per_day: bool) -> tuple[list[np.ndarray], int]:
    """Each frame's int64 code per row of its bounding unit (its person, or its person and UTC day),
    equal across frames, and the number of codes. Small non-negative integer ids are their own codes;
    other ids, and people and days, are coded through one hash table over all rows."""
    users = [f["user"].to_numpy() for f in frames]
    n = sum(u.size for u in users)
    if not n:
        return [np.empty(0, dtype=np.int64) for _ in frames], 0
    low = min(int(u.min()) for u in users if u.size)
    high = max(int(u.max()) for u in users if u.size)
    if not per_day and low >= 0 and high < 2 * n + 1_000_000:
        return [u.astype(np.int64, copy=False) for u in users], high + 1
    codes = unit_codes(np.concatenate(users))
    if per_day:
        day = np.concatenate([f["day"].to_numpy() for f in frames]).astype(np.int64)
        day -= day.min()
        codes = unit_codes(codes * (int(day.max()) + 1) + day)
    ends = np.cumsum([u.size for u in users])
    return np.split(codes, ends[:-1]), int(codes.max()) + 1


def unit_counts(blocks: list[np.ndarray], n_codes: int) -> np.ndarray:
    """Rows per code over all blocks, added into one table. A block whose codes span a small range
    (files split by person, or by time with few people each) is counted by a bincount over that span;
    any other block adds into the table in place: a bincount over a span as wide as the table is a new
    array of that size per block, whose pages cost more to fault in than the counting."""
    counts = np.zeros(n_codes, dtype=np.int64)
    for b in blocks:
        if not b.size:
            continue
        low = int(b.min())
        high = int(b.max()) + 1
        if high - low <= b.size // 4:
            counts[low:high] += np.bincount(b - low, minlength=high - low)
        else:
            np.add.at(counts, b.astype(np.intp, copy=False), 1)
    return counts


def user_level_counts(frames: list[pd.DataFrame], meta: pd.DataFrame, specs: list[GridSpec], max_points_per_user: int,
                      rng: np.random.Generator, per_day: bool = False,
                      count_people: bool = False) -> tuple[dict[str, tuple], np.ndarray]:
    """Per region, what chunks.frame_counts gives of a uniform sample of at most k rows per unit, and
    the units per bucket of their point count (the private profile, dpcore.privacy.profile), from
    ``frames`` (``meta``'s columns: chunks.compact_meta), which must hold every row of the release. With
    ``count_people`` a person counts once per cell (and slot) before the k cells are drawn, as
    chunks.bound_chunk's caller does; the profile counts their points before that."""
    frames = [f for f in frames if len(f)] or [meta]
    blocks, n_codes = unit_blocks(frames, per_day)
    counts = unit_counts(blocks, n_codes)
    profile = profile_counts(counts, skip_empty=True)
    if count_people and n_codes:
        # a person's duplicates may lie in different files: one frame, deduplicated as a whole
        joined = pd.concat(frames, ignore_index=True)
        first = np.flatnonzero(~joined.drop(columns=[c for c in ("lat", "lon") if c in joined]).duplicated())
        frames = [joined.iloc[first]]
        blocks = [np.concatenate(blocks)[first]]
        counts = unit_counts(blocks, n_codes)
    keep = sample_per_unit(blocks, counts, int(max_points_per_user), rng)
    # the person's key only where a fit reads points or a mass grid spreads a person's mass
    needs_user = any(s.cells is None or s.mass is not None for s in specs)
    columns = [c for c in frames[0].columns if c != "day" and (c != "user" or needs_user)]
    starts = np.cumsum([0] + [len(f) for f in frames])
    kept = [pd.DataFrame({c: f[c].to_numpy()[keep[s:e]] for c in columns}, copy=False)
            for f, s, e in zip(frames, starts[:-1], starts[1:], strict=True)]
    if needs_user:  # a mass grid needs each person's kept rows together
        return frame_counts(pd.concat(kept, ignore_index=True), specs), profile
    total = frame_counts(kept[0], specs)
    for part in kept[1:]:
        total = merge_counts(total, frame_counts(part, specs))
    return total, profile
