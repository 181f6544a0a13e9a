"""How far a user-level release's scale factor 1/κ̂(k) lands from the truth (issue 43): the estimate
(ContributionProfile.factor, the median of the profile's draws) against the true Σ n / Σ min(n, k).

- ``days``: one noisy profile per UTC day of Gowalla NYC and the Gowalla sample's Austin and San Francisco
  (seeds 500 + day's index), counting the days whose factor is over 3× / 100× the truth or under ⅓;
- ``files``: 40 profiles of each whole file (the factor's median and largest ratio to the truth);
- ``cabs``: the SF cab traces at user level (536 cabs, ~21,000 points each), the whole file and one profile
  per UTC day, k 20 and 1,000 (skipped when ../shared/data lacks them);
- ``heavy``: synthetic heavy units, N units of ~10⁴ points (log-normal, σ 0.5) alone or beside 300 light
  people (1–8 points): the share of 200 profiles whose factor is within 2× of the truth.

    nice -n 10 .venv/bin/python bench/factor_tail.py                  # all four: ~40 CPU-s
    nice -n 10 .venv/bin/python bench/factor_tail.py --parts days --epsilon 0.025
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_coverage as bc  # puts the repository first on the path

from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.profile import noisy_profile, profile_counts

CABS = Path(__file__).resolve().parents[2] / "shared/data/sf_cabs.parquet"


def ratios(per_unit_sets, k: int, epsilon: float, seed0: int = 500) -> np.ndarray:
    """factor / truth for each set of per-unit counts, one profile each (seed0 + i)."""
    out = []
    for i, n in enumerate(per_unit_sets):
        true = n.sum() / np.minimum(n, k).sum()
        p = noisy_profile(profile_counts(n), epsilon, NoiseSource.seeded(seed0 + i))
        out.append(p.factor(k) / true)
    return np.array(out)


def per_day(user: np.ndarray, ts: np.ndarray) -> list[np.ndarray]:
    day = ts // 86400
    order = np.argsort(day, kind="stable")
    day, user = day[order], user[order]
    cut = np.flatnonzero(np.diff(day)) + 1
    return [np.bincount(np.unique(u, return_inverse=True)[1]) for u in np.split(user, cut)]


def days(a) -> None:
    print(f"\nOne profile per UTC day, ε_p {a.epsilon}, k {a.k}:\n")
    print("| data | days | people a day (median) | factor > 3× truth | > 100× | < ⅓ truth | largest ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for d in ("nyc", "austin", "san-francisco"):
        _, _, user, ts, _ = bc.load(d)
        sets = per_day(user, ts)
        r = ratios(sets, a.k, a.epsilon)
        print(f"| {d} | {r.size} | {np.median([s.size for s in sets]):.0f} | {(r > 3).sum()} | {(r > 100).sum()} | "
              f"{(r < 1 / 3).sum()} | {r.max():.3g} |", flush=True)


def files(a) -> None:
    print(f"\nWhole files, 40 profiles, ε_p {a.epsilon}, k {a.k}:\n")
    print("| data | people | true 1/κ | factor / truth: median | min | max |")
    print("|---|---:|---:|---:|---:|---:|")
    for d in ("nyc", "austin", "san-francisco"):
        _, _, user, _, _ = bc.load(d)
        n = np.bincount(np.unique(user, return_inverse=True)[1])
        r = ratios([n] * 40, a.k, a.epsilon)
        true = n.sum() / np.minimum(n, a.k).sum()
        print(f"| {d} | {n.size} | {true:.2f} | {np.median(r):.3f} | {r.min():.3f} | {r.max():.3f} |", flush=True)


def cabs(a) -> None:
    if not CABS.exists():
        print(f"\n(skipping cabs: {CABS} is missing)")
        return
    import pyarrow.parquet as pq

    t = pq.read_table(CABS, columns=["user_id", "timestamp"])
    user = np.unique(t.column("user_id").to_numpy(zero_copy_only=False), return_inverse=True)[1]
    ts = t.column("timestamp").cast("int64").to_numpy() // 1_000_000
    whole = np.bincount(user)
    daily = per_day(user, ts)
    print(f"\nSF cabs at user level ({whole.size} cabs, {whole.sum():,} points), ε_p {a.epsilon}:\n")
    print("| profile | k | true 1/κ (median) | profiles | factor / truth: median | min | max | within 1.5× |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in (20, 1000):
        for name, sets in (("whole file", [whole] * 40), ("one per UTC day", daily)):
            r = ratios(sets, k, a.epsilon)
            true = np.median([s.sum() / np.minimum(s, k).sum() for s in sets])
            print(f"| {name} | {k} | {true:.4g} | {r.size} | {np.median(r):.3f} | {r.min():.3g} | {r.max():.3g} | "
                  f"{np.mean((r > 1 / 1.5) & (r < 1.5)):.2f} |", flush=True)


def heavy(a) -> None:
    print(f"\nSynthetic heavy units (~10⁴ points each), 200 profiles, ε_p {a.epsilon}, k {a.k}: share within 2× "
          "of the truth\n")
    print("| heavy units | alone | beside 300 light people |")
    print("|---:|---:|---:|")
    rng = np.random.default_rng(7)
    light = rng.integers(1, 9, 300)
    for units in (20, 40, 60, 80, 100, 150, 300):
        h = np.maximum(np.round(1e4 * rng.lognormal(0, 0.5, units)), 1).astype(np.int64)
        row = []
        for n in (h, np.concatenate([h, light])):
            r = ratios([n] * 200, a.k, a.epsilon, seed0=10_000)
            row.append(f"{np.mean((r > 0.5) & (r < 2)):.2f}")
        print(f"| {units} | {row[0]} | {row[1]} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="days,files,cabs,heavy")
    ap.add_argument("--epsilon", type=float, default=0.1, help="ε_p, the profile's share (10% of ε 1)")
    ap.add_argument("--k", type=int, default=20)
    a = ap.parse_args()
    for part in a.parts.split(","):
        {"days": days, "files": files, "cabs": cabs, "heavy": heavy}[part](a)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\n<!-- {ru.ru_utime + ru.ru_stime:.0f} CPU-seconds -->")


if __name__ == "__main__":
    main()
