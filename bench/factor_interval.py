"""How often a user-level release's scale-factor interval holds the true factor 1/κ (issue 43 item 1).

Per city, the true 1/κ(k) = Σ n / Σ min(n, k) over its people, and ``--profiles`` noisy contribution
profiles at ε_p (seeds 500–): the share whose 95% interval of the factor's draws holds the truth, for the
draws up to the estimate's top bucket (ContributionProfile.top_bucket, the interval before) and up to
dpcore.privacy.scaling.reach_bucket for the upper end (the interval now), with the median interval
[2.5%, median, 97.5%].

    nice -n 10 .venv/bin/python bench/factor_interval.py
    nice -n 10 .venv/bin/python bench/factor_interval.py --days 60    # one profile per UTC day (daily releases)
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_coverage as bc

from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.profile import noisy_profile, profile_counts
from dpcore.privacy.scaling import reach_bucket


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="nyc,austin,san-francisco")
    ap.add_argument("--profiles", type=int, default=40)
    ap.add_argument("--epsilon", type=float, default=0.1, help="ε_p, the profile's share (10% of ε 1)")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--days", type=int, default=0, help="instead: one profile of each of this many UTC days "
                                                        "(evenly spread over the days with data)")
    a = ap.parse_args()
    if a.days:
        return daily(a)
    print("| data | people | true 1/κ | interval | holds the truth | median [2.5%, median, 97.5%] |")
    print("|---|---:|---:|---|---:|---|")
    for d in a.datasets.split(","):
        _, _, user, _, _ = bc.load(d)
        n = np.bincount(np.unique(user, return_inverse=True)[1])
        true = n.sum() / np.minimum(n, a.k).sum()
        rows = {"top bucket (before)": [], "to the reach bucket (now)": []}
        for s in range(a.profiles):
            p = noisy_profile(profile_counts(n), a.epsilon, NoiseSource.seeded(500 + s))
            q = np.quantile(p.factor_draws(a.k, 4000, np.random.default_rng(0)), [0.025, 0.5, 0.975])
            rows["top bucket (before)"].append((q[0] <= true <= q[2], *q))
            # now: hidden heavy people only add points, so the reach widens the upper end alone
            hi = np.quantile(p.factor_draws(a.k, 4000, np.random.default_rng(0), top=reach_bucket(p)), 0.975)
            q[2] = max(q[2], hi)
            rows["to the reach bucket (now)"].append((q[0] <= true <= q[2], *q))
        for name, r in rows.items():
            r = np.array(r, dtype=float)
            print(f"| {d} | {n.size} | {true:.2f} | {name} | {r[:, 0].mean():.2f} | "
                  f"[{np.median(r[:, 1]):.2f}, {np.median(r[:, 2]):.2f}, {np.median(r[:, 3]):.2f}] |", flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\n<!-- {ru.ru_utime + ru.ru_stime:.0f} CPU-seconds -->")


def daily(a) -> None:
    """One noisy profile per day (what a daily release pays): the share of days whose factor interval holds
    the day's true 1/κ, and the median and largest upper end, per the reach's start."""
    import math

    from dpcore.privacy.profile import PROFILE_BUCKETS, TAIL_BUCKETS

    def reach_from_largest(p) -> int:  # coverage-4's start: the largest noisy count where none is visible
        j = max(p.visible_top(), int(np.argmax(p.noisy)))
        t = math.log(1.0 / (2.0 * 0.25)) / float(p.epsilon)
        while j + 1 < PROFILE_BUCKETS and p.noisy[j + 1] >= t:
            j += 1
        return int(min(PROFILE_BUCKETS - 1, max(j + TAIL_BUCKETS, p.top_bucket())))

    print("| data | days | people a day (median) | reach from | holds the truth | upper end: median | 95% | max |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for d in a.datasets.split(","):
        _, _, user, ts, _ = bc.load(d)
        day = ts // 86400
        days = np.unique(day)
        days = days[np.linspace(0, days.size - 1, min(a.days, days.size)).astype(int)]
        rows = {"the largest count (coverage-4)": [], "bucket 0 (now)": []}
        people = []
        for i, dd in enumerate(days):
            n = np.bincount(np.unique(user[day == dd], return_inverse=True)[1])
            people.append(n.size)
            true = n.sum() / np.minimum(n, a.k).sum()
            p = noisy_profile(profile_counts(n), a.epsilon, NoiseSource.seeded(500 + i))
            q = np.quantile(p.factor_draws(a.k, 4000, np.random.default_rng(0)), [0.025, 0.975])
            for name, top in (("the largest count (coverage-4)", reach_from_largest(p)), ("bucket 0 (now)", reach_bucket(p))):
                hi = max(q[1], np.quantile(p.factor_draws(a.k, 4000, np.random.default_rng(0), top=top), 0.975))
                rows[name].append((q[0] <= true <= hi, hi))
        for name, r in rows.items():
            r = np.array(r, dtype=float)
            print(f"| {d} | {days.size} | {np.median(people):.0f} | {name} | {r[:, 0].mean():.2f} | "
                  f"{np.median(r[:, 1]):.3g} | {np.quantile(r[:, 1], 0.95):.3g} | {r[:, 1].max():.3g} |", flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\n<!-- {ru.ru_utime + ru.ru_stime:.0f} CPU-seconds -->")


if __name__ == "__main__":
    main()
