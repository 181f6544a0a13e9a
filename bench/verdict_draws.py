"""How often a noise-dependent verdict test's claim fails, by drawing its noise many times (issue 43; the
table is bench/results/2026-11-29-verdict-5.md). Under `nice`; each mode prints one line per draw and a
summary with its CPU-seconds.

    python bench/verdict_draws.py backfill-basis 300   # test_backfill_verdict: new-york's basis, then the plan
    python bench/verdict_draws.py factor 2000          # 1/κ̂(20) of that basis's profile (ε_p 0.2) per draw
    python bench/verdict_draws.py profile TEST 20000   # a test's run: its true profile counts once, then the
                                                       # verdict of each noisy profile (test names: PROFILE_TESTS)
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile

import numpy as np
import pandas as pd


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _two_cities(root: str) -> str:
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    nyc = generate_checkins(city_region("new-york"), n_users=1500, start="2024-01-01", days=3, seed=3)
    bos = generate_checkins(city_region("boston"), n_users=12000, start="2024-01-01", days=3, seed=4)
    bos["user_id"] = bos["user_id"] + 10 ** 6
    data = f"{root}/two.parquet"
    pd.concat([nyc, bos]).to_parquet(data)
    return data


def backfill_basis(n: int) -> None:
    """test_backfill_verdict: publish new-york's basis (ε 2, 500 m cells), plan the backfill's two days at
    ε 0.08; the test needs new-york refused on both. Per draw: the basis's typical counts and, per band,
    the day's expected |error| over its typical count."""
    from flows.cli import main
    from tasks.config import ReleaseParams
    from tasks.release_plan import plan_days
    from tasks.release_usefulness import expectation

    root = tempfile.mkdtemp(prefix="verdict-draws-")
    data = _two_cities(root)
    fails = 0
    for i in range(n):
        store = f"{root}/store{i}"
        main(["release", "run", data, "--city", "new-york", "--epsilon", "2", "--param", "cell_width_m=500",
              "--out", store, "--no-prefect"])
        params = ReleaseParams(data=data, cities="new-york,boston", epsilon=0.08,
                               mechanism_params={"cell_width_m": 500}, store=store)
        plans = plan_days(params, "2024-01-02", "2024-01-03")
        refused = [[r["city"] for r in p.refused] for p in plans]
        nyc = next(c for c in plans[0].plans if c.city == "new-york")
        exp = expectation(plans[0].store, nyc)
        ok = all("new-york" in r for r in refused)
        fails += not ok
        print(json.dumps({"draw": i, "refused": refused, "ratio": [
            None if r["typical_count"] is None else round(r["expected_abs_error"] / r["typical_count"], 3)
            for r in exp["bands"]], "open": [bool(r.get("verdict_open")) for r in exp["bands"]]}), flush=True)
    print(f"backfill-basis: {fails} of {n} draws fail; {_cpu():.1f} CPU-s")


def factor(n: int) -> None:
    """1/κ̂(20) of noisy profiles (ε_p 0.2) of the backfill test's new-york (1,500 people, 3 days)."""
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region
    from dpcore.privacy.profile import ContributionProfile, profile_counts

    nyc = generate_checkins(city_region("new-york"), n_users=1500, start="2024-01-01", days=3, seed=3)
    true = profile_counts(nyc.groupby("user_id").size().to_numpy())
    eps = 0.2
    rng = np.random.default_rng()  # simulation of the profile's law, not a release's noise
    p = -np.expm1(-eps)
    f = np.array([ContributionProfile((true + rng.geometric(p, true.size) - rng.geometric(p, true.size))
                                      .astype(float), eps).factor(20) for _ in range(n)])
    truth = ContributionProfile(true.astype(float), eps).factor(20)
    print(f"factor: truth {truth:.3g}; quantiles 0.5/0.9/0.99/0.999 {np.quantile(f, [0.5, 0.9, 0.99, 0.999]).round(2)}; "
          f"> 5: {(f > 5).sum()}, > 100: {(f > 100).sum()} of {n}; {_cpu():.1f} CPU-s")


if __name__ == "__main__":
    mode, count = sys.argv[1], int(sys.argv[-1])
    {"backfill-basis": backfill_basis, "factor": factor}[mode](count)
