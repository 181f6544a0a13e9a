"""How often the 95% intervals of range answers cover the truth, per mechanism × band × privacy unit, and
for per-day rows and 3- and 7-day sums of daily releases (issue 43 items 1 and 2).

Gowalla NYC check-ins in the ``new-york`` box (where the spread's factors were fitted, bench/fit_spread.py),
or with ``--dataset austin`` / ``san-francisco`` the Gowalla 1,000-user sample's check-ins in that city's box
(held out from every tuning). Each release
is drawn as ``geodp release`` draws it: record level, or user level with a k-sample per person, the
contribution profile paid with PROFILE_FRACTION of ε and the answers scaled to full counts by it (the
default user-level release). Squares of each band are centred on uniformly drawn points of the released
data; the truth is the count of all its points (what the answers estimate). A cell is the share of
``--releases`` × ``--queries`` answers whose interval holds the truth; "absent" where the release states
no interval (with the reason). Also printed: the median relative half-width and the coverage of the
interval as it was before partly covered cells were bounded (noise and bounding bias only).

    nice -n 10 .venv/bin/python bench/bench_coverage.py                  # the 2-D table
    nice -n 10 .venv/bin/python bench/bench_coverage.py --dataset austin --seed 101   # held out
    nice -n 10 .venv/bin/python bench/bench_coverage.py --daily          # per-day rows and window sums
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.data.points import load_points  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.mechanisms import get_mechanism, input_for  # noqa: E402
from dpcore.mechanisms.contract import PrivacyUnit  # noqa: E402
from dpcore.mechanisms.inputs import PointsInput  # noqa: E402
from dpcore.privacy.bounding import bound_contributions  # noqa: E402
from dpcore.privacy.noise import NoiseSource  # noqa: E402
from dpcore.privacy.profile import PROFILE_FRACTION, noisy_profile, profile_counts  # noqa: E402
from dpcore.privacy.scaling import fit_profiled  # noqa: E402
from dpcore.queries.range import true_counts  # noqa: E402
from dpcore.queries.series import combine_sum  # noqa: E402
from dpcore.synopsis.estimand import covers_words, honest_intervals  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
BANDS = ((25.0, 100.0), (100.0, 1000.0), (1000.0, 5000.0))
MECHANISMS = {"identity": {"cell_width_m": 250.0}, "ug": {}, "ag": {}, "hb": {}, "privtree": {}, "auto": {}}


def load(dataset: str = "nyc"):
    """(x, y, user, ts, region): Gowalla NYC in the new-york box, or the 1,000-user sample in a city's box."""
    if dataset == "nyc":
        pts, region = load_points(SHARED / "gowalla_nyc_checkins.tsv.gz").points, city_region("new-york")
    else:
        pts, region = load_points(SHARED / "gowalla_sample_1000users.parquet").points, city_region(dataset)
    x, y = region.project(pts.lat, pts.lon)
    inside = region.contains_m(x, y)
    return x[inside], y[inside], pts.user[inside], pts.ts[inside], region


def release(name: str, params: dict, x, y, user, region, unit: str, k: int, epsilon: float, seed: int):
    """One release as `geodp release` draws it (record level, or user level scaled by the paid profile)."""
    rng = np.random.default_rng(seed)
    noise = NoiseSource.seeded(seed)
    mech = get_mechanism(name, **params)
    if unit == "record":
        data = PointsInput(x, y, region, PrivacyUnit.of("record"), user=user)
        return mech.fit(input_for(mech.tags.input_type, data), epsilon, noise.spawn(2))
    keep = bound_contributions(user, k, rng).keep
    data = PointsInput(x[keep], y[keep], region, PrivacyUnit.user(k), user=user[keep])
    per_user = np.bincount(np.unique(user, return_inverse=True)[1])
    profile = noisy_profile(profile_counts(per_user), PROFILE_FRACTION * epsilon, noise.spawn(1))
    return fit_profiled(mech, input_for(mech.tags.input_type, data), epsilon, noise.spawn(2), profile)


def squares(x, y, band, n, rng):
    c = rng.integers(0, x.size, n)
    side = rng.uniform(band[0], band[1], n)
    return np.stack([x[c] - side / 2, y[c] - side / 2, x[c] + side / 2, y[c] + side / 2], axis=1)


def intervals(syn, boxes):
    est, iv = syn.intervals(boxes)
    lo, hi, method = honest_intervals(syn, iv.lower, iv.upper, iv.method)
    return est, lo, hi, method, iv.noise or (est - iv.lower, iv.upper - est)


HINDSIGHT_WIDTHS = (50.0, 100.0, 250.0, 500.0, 1000.0, 2000.0)


def cell(hits: list[np.ndarray]) -> str:
    """Coverage over all answers, ± its standard error over releases: a release's squares of one band share
    its noise and spread (a 1–5 km square centred in Manhattan overlaps most others), so a release, not a
    square, is the independent draw."""
    per = np.array([np.mean(h) for h in hits])
    se = per.std(ddof=1) / np.sqrt(per.size) if per.size > 1 else float("nan")
    return f"{np.mean(np.concatenate(hits)):.3f} ± {se:.3f}"


def table_2d(a) -> None:
    x, y, user, _, region = load(a.dataset)
    print(f"{a.dataset}, {x.size} points; ε {a.epsilon:g}, k {a.k}; {a.releases} releases × {a.queries} squares "
          "per band; truth = all points; coverage ± its standard error over releases; mean |error| / truth\n")
    print("| mechanism | unit | " + " | ".join(f"{lo:g}–{hi:g} m" for lo, hi in BANDS)
          + " | median rel. half-width | mean rel. error |")
    print("|---|---|" + "---|" * len(BANDS) + "---|---|")
    boxes_of, truth_of = {}, {}
    for r in range(a.releases):
        rng = np.random.default_rng(1000 + r)
        for b in BANDS:
            boxes_of[r, b] = squares(x, y, b, a.queries, rng)
            truth_of[r, b] = true_counts(x, y, boxes_of[r, b])
    for unit in a.units.split(","):
        # answer 0: an interval [0, 0] holds no square centred on a point; its relative error is 1
        print(f"| answer 0 | {unit} | " + " | ".join("0.000" for _ in BANDS) + " | – | 1 / 1 / 1 |")
        # the hindsight grid: the identity width with the smallest error per band, picked with the truth
        best = {}
        for w in HINDSIGHT_WIDTHS:
            for r in range(a.releases):
                syn = release("identity", {"cell_width_m": w}, x, y, user, region, unit, a.k, a.epsilon, a.seed + r)
                for b in BANDS:
                    est, lo, hi, _, _ = intervals(syn, boxes_of[r, b])
                    t = truth_of[r, b]
                    best.setdefault((w, b), []).append((np.abs(est - t) / np.maximum(t, 1), (lo <= t) & (t <= hi)))
        pick = {b: min(HINDSIGHT_WIDTHS, key=lambda w, b=b: np.mean([e.mean() for e, _ in best[w, b]])) for b in BANDS}
        print(f"| hindsight grid ({' / '.join(f'{pick[b]:g}' for b in BANDS)} m) | {unit} | "
              + " | ".join(cell([c for _, c in best[pick[b], b]]) for b in BANDS) + " | – | "
              + " / ".join(f"{np.mean([e.mean() for e, _ in best[pick[b], b]]):.2f}" for b in BANDS) + " |", flush=True)
        for name in a.mechanisms.split(","):
            cover = {b: [] for b in BANDS}
            width = {b: [] for b in BANDS}
            error = {b: [] for b in BANDS}
            reason = ""
            for r in range(a.releases):
                syn = release(name, MECHANISMS[name], x, y, user, region, unit, a.k, a.epsilon, a.seed + r)
                for b in BANDS:
                    boxes, truth = boxes_of[r, b], truth_of[r, b]
                    est, lo, hi, method, _ = intervals(syn, boxes)
                    error[b].append(np.abs(est - truth) / np.maximum(truth, 1))
                    if not np.isfinite(lo).any():
                        reason = method
                        continue
                    cover[b].append((lo <= truth) & (truth <= hi))
                    width[b].append((hi - lo) / 2 / np.maximum(truth, 1))
            cells = [cell(cover[b]) if cover[b] else "absent" for b in BANDS]
            widths = [f"{np.median(np.concatenate(width[b])):.2f}" if width[b] else "–" for b in BANDS]
            errors = [f"{np.mean(np.concatenate(error[b])):.2f}" for b in BANDS]
            print(f"| {name} | {unit} | " + " | ".join(cells) + f" | {' / '.join(widths)} | {' / '.join(errors)} |"
                  + (f" <!-- {reason} -->" if reason else ""), flush=True)


def table_daily(a) -> None:
    """Per-day rows and sums over 3 and 7 consecutive days of daily releases."""
    x, y, user, t, region = load(a.dataset)
    day = t // 86400
    days, n_per_day = np.unique(day, return_counts=True)
    rng = np.random.default_rng(a.seed)
    busy = days[n_per_day >= np.quantile(n_per_day, 0.5)]
    starts = [d for d in busy if all(np.isin(d + np.arange(7), days))][a.skip_windows:a.skip_windows + a.windows]
    print(f"Gowalla NYC daily releases; ε {a.epsilon:g} a day, k {a.k}; {len(starts)} 7-day windows × "
          f"{a.queries} squares per band, centred on the window's points; truth = all points of the day(s)\n")
    print("| mechanism | unit | rows | " + " | ".join(f"{lo:g}–{hi:g} m" for lo, hi in BANDS) + " |")
    print("|---|---|---|" + "---|" * len(BANDS))
    windows = []  # per window: the days' masks and, per band, its squares (the same for every mechanism)
    for s in starts:
        sel = [day == s + i for i in range(7)]
        win = np.any(sel, axis=0)
        windows.append((s, sel, {b: squares(x[win], y[win], b, a.queries, rng) for b in BANDS}))
    rows = ("day", "3-day sum", "7-day sum")
    for unit in a.units.split(","):
        print(f"| answer 0 | {unit} | all | " + " | ".join("0.000" for _ in BANDS) + " |")
        # the hindsight grid: the identity width with the smallest mean error per row and band, picked with the truth
        runs = {w: daily_hits("identity", {"cell_width_m": w}, a, x, y, user, region, unit, windows)
                for w in HINDSIGHT_WIDTHS}
        for r in rows:
            pick = {b: min(HINDSIGHT_WIDTHS, key=lambda w, b=b: np.mean(np.concatenate(runs[w][1][r, b])))
                    for b in BANDS}
            print(f"| hindsight grid ({' / '.join(f'{pick[b]:g}' for b in BANDS)} m) | {unit} | {r} | "
                  + " | ".join(f"{np.mean(np.concatenate(runs[pick[b]][0][r, b])):.3f}" for b in BANDS) + " |",
                  flush=True)
        for name in a.mechanisms.split(","):
            cover, _ = daily_hits(name, MECHANISMS[name], a, x, y, user, region, unit, windows)
            for w in rows:
                cells = [f"{np.mean(np.concatenate(cover[w, b])):.3f}" for b in BANDS]
                print(f"| {name} | {unit} | {w} | " + " | ".join(cells) + " |", flush=True)


def daily_hits(name, params, a, x, y, user, region, unit, windows):
    """({(rows, band): hits}, {(rows, band): relative errors}) of one mechanism's daily releases."""
    cover = {(w, b): [] for w in ("day", "3-day sum", "7-day sum") for b in BANDS}
    error = {k: [] for k in cover}
    for s, sel, boxes_of in windows:
        rels = [release(name, params, x[m], y[m], user[m], region, unit, a.k, a.epsilon, a.seed + int(s) + i)
                for i, m in enumerate(sel)]
        for b in BANDS:
            boxes = boxes_of[b]
            per = [intervals(syn, boxes) for syn in rels]
            truth = [true_counts(x[m], y[m], boxes) for m in sel]
            for i in range(7):
                est, lo, hi = per[i][:3]
                cover["day", b].append((lo <= truth[i]) & (truth[i] <= hi))
                error["day", b].append(np.abs(est - truth[i]) / np.maximum(truth[i], 1))
            for w, n in (("3-day sum", 3), ("7-day sum", 7)):
                est, lo, hi = combine_sum([p[0] for p in per[:n]], [p[1] for p in per[:n]],
                                          [p[2] for p in per[:n]], covers_words(rels[0]),
                                          [p[4][0] for p in per[:n]], [p[4][1] for p in per[:n]])
                tr = np.sum(truth[:n], axis=0)
                cover[w, b].append((lo <= tr) & (tr <= hi))
                error[w, b].append(np.abs(est - tr) / np.maximum(tr, 1))
    return cover, error


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mechanisms", default=",".join(MECHANISMS))
    ap.add_argument("--units", default="record,user")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--releases", type=int, default=10)
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--dataset", default="nyc", help="nyc, or a city of the Gowalla 1,000-user sample (austin, "
                                                     "san-francisco)")
    ap.add_argument("--daily", action="store_true", help="per-day rows and 3-/7-day sums of daily releases")
    ap.add_argument("--windows", type=int, default=3, help="7-day windows (--daily)")
    ap.add_argument("--skip-windows", type=int, default=0, help="start after this many windows (--daily; "
                                                                 "held-out windows: 3)")
    ap.add_argument("--factors", default="", help="try other spread factors, e.g. 'grid=0.45,0,0.45,8;hb=1,0,1,8' "
                                                   "(dpcore.synopsis.spread.FACTORS; bench/fit_spread.py fits them)")
    a = ap.parse_args()
    if a.factors:
        import dpcore.synopsis.spread as spread

        for part in a.factors.split(";"):
            kind, values = part.split("=")
            spread.FACTORS[kind.strip()] = tuple(float(v) for v in values.split(","))
        print(f"spread factors: {spread.FACTORS}\n")
    (table_daily if a.daily else table_2d)(a)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\n<!-- {ru.ru_utime + ru.ru_stime + ch.ru_utime + ch.ru_stime:.0f} CPU-seconds -->")


if __name__ == "__main__":
    main()
