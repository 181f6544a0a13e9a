"""How often a noise-dependent verdict test's claim fails, by drawing its noise many times (issue 43; the
table is bench/results/2026-11-29-verdict-5.md). Under `nice`; each mode prints one line per draw and a
summary with its CPU-seconds.

    python bench/verdict_draws.py backfill-basis 300   # test_backfill_verdict: new-york's basis, then the plan
    python bench/verdict_draws.py factor 2000          # 1/κ̂(20) of that basis's profile (ε_p 0.2) per draw
    python bench/verdict_draws.py profile TEST 20000   # a test's run: its true profile counts once, then the
                                                       # verdict of each noisy profile (test names: PROFILE_TESTS)
    python bench/verdict_draws.py basis-day 0.02 40    # test_a_refused_release_published_anyway…: basis, plan, note
    python bench/verdict_draws.py backfill-basis 1000 100  # the same with new-york's people given
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


#: new-york's people in test_backfill_verdict's data
NYC_USERS = 1000


def _two_cities(root: str) -> str:
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    nyc = generate_checkins(city_region("new-york"), n_users=NYC_USERS, start="2024-01-01", days=3, seed=3)
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


def _fortnight(root: str) -> str:
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    data = f"{root}/c.parquet"
    generate_checkins(city_region("new-york"), n_users=400, start="2024-01-01", days=14, seed=3).to_parquet(data)
    return data


_RUN = ["release", "run", "--city", "new-york", "--no-prefect", "--param", "cell_width_m=250"]
_WOULD_HELP = ("ε ≥", "cells of", "-day period")


def _helps(exp: dict) -> bool:
    return any(w in h for h in exp.get("would_help") or [] for w in _WOULD_HELP)


#: test: (data, the run's options, what the test needs of the run's verdict from its paid profile, tries)
#: (the tests' "would help: ε ≥ | cells of | -day period" is counted apart, on a tenth of the draws)
PROFILE_TESTS = {
    "test_an_empty_period_is_refused_having_spent_only_its_profile": (
        _fortnight, [*_RUN, "--period", "2024-02-01", "--epsilon", "0.5"],
        lambda e: e["useless"] and e["empty_like"], 2),
    "test_a_first_day_worse_than_a_blank_map_is_refused_and_a_good_release_published (the day)": (
        _fortnight, [*_RUN, "--period", "2024-01-02", "--epsilon", "0.25"], lambda e: e["useless"], 1),
    "test_a_first_day_worse_than_a_blank_map_is_refused_and_a_good_release_published (the fortnight, plan)": (
        _fortnight, ["release", "run", "--city", "new-york", "--no-prefect", "--param", "cell_width_m=1000",
                     "--period", "2024-01-01..2024-01-14", "--epsilon", "1"],
        lambda e: not e["useless"] and any(b["worse_than_blank_map"] is False for b in e["bands"]), 1),
    "test_a_first_release_its_paid_profile_finds_hopeless_is_refused_having_spent_only_the_profile": (
        _fortnight, ["release", "run", "--city", "new-york", "--no-prefect", "--side-km", "2", "--param",
                     "cell_width_m=5", "--max-points-per-user", "100", "--period", "2024-02-01", "--epsilon", "1"],
        lambda e: e["useless"], 3),
    "test_a_first_day_at_eps_1_with_250_m_cells_is_refused_having_spent_only_its_profile": (
        _fortnight, [*_RUN, "--period", "2024-01-02", "--epsilon", "1"],
        lambda e: e["useless"] and "25–100 m (inside the cells: noise alone" in e["statement"], 3),
    "test_a_refusal_from_a_profile_that_sees_no_one_says_the_period_may_hold_more": (
        _fortnight, [*_RUN, "--epsilon", "0.1"], lambda e: e["useless"] and e["empty_like"], 2),
    "test_an_empty_period_published_at_the_daily_settings_says_the_profile_cannot_tell_it_from_empty": (
        _fortnight, ["release", "run", "--city", "new-york", "--no-prefect", "--mechanism", "auto",
                     "--max-points-per-user", "5", "--period", "2024-02-01", "--epsilon", "1"],
        lambda e: not e["useless"] and e["empty_like"], 1),
    "test_a_refused_city_is_refused_alone_and_published_anyway_on_request (boston, one day)": (
        _two_cities, ["release", "run", "--city", "boston", "--no-prefect", "--param", "cell_width_m=500",
                      "--period", "2024-01-02", "--epsilon", "0.08"], lambda e: not e["useless"], 1),
}


class _Captured(Exception):
    pass


def _capture(args: list[str], data: str, store: str) -> dict:
    """One run of ``args`` into ``store``, stopped at its verdict from its paid profile: its true profile
    counts (what the product's data pass noises), ε_p, and the store and plan the verdict reads."""
    import tasks.release_tasks as rt
    import tasks.release_usefulness as ru
    from flows.cli import main

    seen: dict = {}
    real_noisy, real_expectation = rt.noisy_profile, ru.expectation

    def noisy(counts, epsilon, noise, per_day=False):
        seen.update(counts=np.asarray(counts), epsilon=float(epsilon), per_day=per_day)
        return real_noisy(counts, epsilon, noise, per_day)

    def capture(st, plan, prof=None):
        if prof is None:
            return real_expectation(st, plan)
        seen.update(store=st, plan=plan)
        raise _Captured

    rt.noisy_profile, ru.expectation = noisy, capture
    try:
        main([*args[:2], data, *args[2:], "--out", store])
    except _Captured:
        pass
    finally:
        rt.noisy_profile, ru.expectation = real_noisy, real_expectation
    assert "plan" in seen, "the run drew no profile"
    return seen


def _verdicts(seen: dict, n: int, helps: bool = True):
    """The product's verdict (tasks.release_usefulness.expectation) of ``n`` noisy profiles of the captured
    run's law (discrete Laplace of scale 1/ε_p on its true counts; a simulation, not a release's noise).
    Without ``helps`` a refusal's what-would-help (~40 more verdicts each) is left out: ``would_help`` None."""
    import dpcore.synopsis.profile_verdict as pv
    from dpcore.privacy.profile import ContributionProfile
    from tasks.release_usefulness import expectation

    rng = np.random.default_rng()
    p = -np.expm1(-seen["epsilon"])
    true = seen["counts"]
    real = pv.what_would_help
    if not helps:
        pv.what_would_help = lambda *a, **k: None
    try:
        for _ in range(n):
            noise = rng.geometric(p, true.size) - rng.geometric(p, true.size)
            yield expectation(seen["store"], seen["plan"],
                              ContributionProfile((true + noise).astype(float), seen["epsilon"], seen["per_day"]))
    finally:
        pv.what_would_help = real


def profile(test: str, n: int) -> None:
    """One run of the test's release captures its true profile counts and its plan (the product's own
    data pass); then ``n`` noisy profiles of the same law each get the product's verdict. A try fails where
    the test's need does not hold."""
    make, args, need, tries = PROFILE_TESTS[test]
    root = tempfile.mkdtemp(prefix="verdict-draws-")
    seen = _capture(args, make(root), f"{root}/store")
    bad = sum(not need(exp) for exp in _verdicts(seen, n, helps=False))
    # what would help, on a tenth of the draws (each costs ~40 verdicts): where the test names it
    helped = [exp for exp in _verdicts(seen, max(n // 10, 1)) if exp.get("useless")]
    print(json.dumps({"test": test, "draws": n, "failed_tries": bad, "tries": tries, "test_fails": (bad / n) ** tries,
                      "refusals_without_eps_cells_or_period_help": f"{sum(not _helps(e) for e in helped)} of {len(helped)}",
                      "cpu_s": round(_cpu(), 1)}, ensure_ascii=False))


#: test_a_refused_release_published_anyway_shows_its_verdict_everywhere's day ε
DAY_EPS = "0.02"


def basis_day(n: int, m: int = 20) -> None:
    """test_a_refused_release_published_anyway_shows_its_verdict_everywhere: ``n`` draws of the fortnight's
    basis (ε 4, 250 m cells); on each, the plan of the day at ε DAY_EPS must refuse it naming ε and a longer
    period, and ``m`` draws of the day's own profile must keep its 25–100 m band worse than a blank map once
    it is published anyway (the note on the test's 55 m box)."""
    from flows.cli import main
    from tasks.release_verdict import band_verdicts

    root = tempfile.mkdtemp(prefix="verdict-draws-")
    data = _fortnight(root)
    plan_bad = note_bad = 0
    day = [*_RUN, "--period", "2024-01-02", "--epsilon", DAY_EPS]
    for i in range(n):
        store = f"{root}/store{i}"
        main([*_RUN[:2], data, *_RUN[2:], "--epsilon", "4", "--out", store])
        seen = _capture([*day, "--publish-anyway"], data, store)
        import tasks.release_usefulness as ru

        planned = ru.expectation(seen["store"], seen["plan"])
        helps = planned.get("would_help") or []
        plan_ok = bool(planned.get("useless")) and any("ε ≥" in h for h in helps) and any("-day period" in h for h in helps)
        plan_bad += not plan_ok
        for exp in _verdicts(seen, m):
            small = next(b for b in band_verdicts({"plan": exp}) if b["query_sides_m"] == [25, 100])
            note_bad += not small["worse"]
        print(json.dumps({"draw": i, "plan_ok": plan_ok, "would_help": helps}, ensure_ascii=False), flush=True)
    print(json.dumps({"test": "test_a_refused_release_published_anyway_shows_its_verdict_everywhere",
                      "basis_draws": n, "plan_failed": plan_bad, "profile_draws": n * m, "note_failed": note_bad,
                      "cpu_s": round(_cpu(), 1)}, ensure_ascii=False))

if __name__ == "__main__":
    mode, count = sys.argv[1], int(sys.argv[-1])
    if mode == "backfill-basis" and len(sys.argv) > 3:  # backfill-basis NYC_USERS N
        NYC_USERS = int(sys.argv[2])
    if mode == "basis-day" and len(sys.argv) > 3:  # basis-day DAY_EPS N
        DAY_EPS = sys.argv[2]
    if mode == "profile":
        for name in [t for t in PROFILE_TESTS if sys.argv[2] in t]:
            profile(name, count)
    else:
        {"backfill-basis": backfill_basis, "factor": factor, "basis-day": basis_day}[mode](count)
