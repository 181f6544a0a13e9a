"""How often the 95% intervals of a time series cover the truth, through the analyst's path (issue 43 item 2):
one `geodp release run` a day (the CLI's code, in this process, into a local store), then
``geodp.open_store(STORE).query_range(..., period=A..B)`` as `geodp query range STORE/releases/D/C --period`
answers it: per-day rows and the sum rows of 3- and 7-day windows.

Gowalla NYC check-ins in the ``new-york`` box (or ``--dataset austin`` / ``san-francisco``, the 1,000-user
sample); windows of 7 consecutive busy days (``--skip-windows 3``: the windows bench/fit_spread.py --daily
did not see). Squares of each band are centred on uniformly drawn points of the window; the truth is the count
of all the day's points (rows) or the window's (sums): full counts, what the default user-level answers
estimate. Beside the mechanisms: "answer 0" (no square centred on a point holds 0) and the hindsight grid
(identity at the width with the smallest mean error per band and row, picked with the truth, released in
process as bench_coverage.release draws it, its sums combined by dpcore.queries.series.combine_sum).

    nice -n 10 .venv/bin/python bench/bench_series_coverage.py --skip-windows 3              # auto, both units
    nice -n 10 .venv/bin/python bench/bench_series_coverage.py --mechanisms ug,ag --units record
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_coverage import BANDS, HINDSIGHT_WIDTHS, intervals, release, squares  # noqa: E402

from dpcore.data.points import load_points  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.queries.range import true_counts  # noqa: E402
from dpcore.queries.series import combine_sum  # noqa: E402
from dpcore.synopsis.estimand import covers_words  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
ROWS = ("day", "3-day sum", "7-day sum")
CITY = {"nyc": "new-york"}


def load(dataset: str):
    """The points of the dataset as a standard table (user_id, timestamp, lat, lon) and the city's region."""
    name = "gowalla_nyc_checkins.tsv.gz" if dataset == "nyc" else "gowalla_sample_1000users.parquet"
    pts = load_points(SHARED / name).points
    region = city_region(CITY.get(dataset, dataset))
    frame = pd.DataFrame({"user_id": pts.user, "timestamp": pd.to_datetime(pts.ts, unit="s", utc=True),
                          "lat": pts.lat, "lon": pts.lon})
    x, y = region.project(pts.lat, pts.lon)
    return frame, x, y, pts.user, pts.ts // 86400, region


def windows(day: np.ndarray, inside: np.ndarray, n: int, skip: int) -> list[int]:
    """First days of ``n`` disjoint windows of 7 consecutive days with data, each starting on a day at least
    as busy as the median (inside the city), after the first ``skip`` such windows."""
    days, per = np.unique(day[inside], return_counts=True)
    busy = days[per >= np.quantile(per, 0.5)]
    starts: list[int] = []
    for d in busy:
        if (not starts or d >= starts[-1] + 7) and np.isin(d + np.arange(7), days).all():
            starts.append(int(d))
    return starts[skip:skip + n]


def iso(d: int) -> str:
    return str(np.datetime64(int(d), "D"))


def cli_release(data: Path, store: Path, city: str, day: int, mechanism: str, unit: str, epsilon: float,
                seed: int) -> None:
    """One day's release as `geodp release run DATA --out STORE` makes it (seeded: an experiment)."""
    from flows.cli import main

    argv = ["release", "run", str(data), "--city", city, "--period", iso(day), "--epsilon", f"{epsilon:g}",
            "--mechanism", mechanism, "--privacy-unit", unit, "--seed", str(seed), "--out", str(store),
            "--dataset", f"{mechanism}-{unit}", "--publish-anyway"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main(argv)
    if rc:
        raise SystemExit(f"geodp {' '.join(argv)} exited {rc}: {err.getvalue()[-2000:]}")


def hits(lo, hi, truth) -> np.ndarray:
    return (lo <= truth) & (truth <= hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mechanisms", default="auto")
    ap.add_argument("--units", default="record,user")
    ap.add_argument("--dataset", default="nyc")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--skip-windows", type=int, default=0)
    ap.add_argument("--seed", type=int, default=101)
    ap.add_argument("--no-hindsight", action="store_true")
    a = ap.parse_args()
    import geodp

    frame, x, y, user, day, region = load(a.dataset)
    city = CITY.get(a.dataset, a.dataset)
    inside = region.contains_m(x, y)
    starts = windows(day, inside, a.windows, a.skip_windows)
    rng = np.random.default_rng(a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="series-coverage-"))
    print(f"{a.dataset} ({city}), daily releases at ε {a.epsilon:g} a day (k: the policy's default, 20); "
          f"windows from {', '.join(iso(s) for s in starts)}; {a.queries} squares per band and window, centred "
          "on the window's points; truth = all points of the day (rows) or days (sums); coverage, and in "
          "brackets the median relative half-width\n")
    print("| mechanism | unit | rows | " + " | ".join(f"{lo:g}–{hi:g} m" for lo, hi in BANDS) + " |")
    print("|---|---|---|" + "---|" * len(BANDS))
    plan = []  # per window: boxes (m), boxes (lat/lon), per-day truths
    for w, s in enumerate(starts):
        sel = [(day == s + i) & inside for i in range(7)]
        win = np.any(sel, axis=0)
        data = tmp / f"window{w}.parquet"
        frame[(day >= s) & (day < s + 7)].to_parquet(data)
        per_band = {}
        for b in BANDS:
            boxes = squares(x[win], y[win], b, a.queries, rng)
            lat0, lon0 = region.unproject(boxes[:, 0], boxes[:, 1])
            lat1, lon1 = region.unproject(boxes[:, 2], boxes[:, 3])
            per_band[b] = (boxes, np.stack([lat0, lon0, lat1, lon1], axis=1),
                           [true_counts(x[m], y[m], boxes) for m in sel])
        plan.append((s, data, sel, per_band))
    for unit in a.units.split(","):
        print(f"| answer 0 | {unit} | all | " + " | ".join("0.000" for _ in BANDS) + " |")
        if not a.no_hindsight:
            hindsight(a, plan, x, y, user, region, unit)
        for name in a.mechanisms.split(","):
            cover = {(r, b): [] for r in ROWS for b in BANDS}
            width = {(r, b): [] for r in ROWS for b in BANDS}
            for w, (s, data, _, per_band) in enumerate(plan):
                store = tmp / f"store-{w}"
                for i in range(7):
                    cli_release(data, store, city, s + i, name, unit, a.epsilon, a.seed + 1000 * w + i)
                st = geodp.open_store(str(store))
                for b in BANDS:
                    _, ll, truth = per_band[b]
                    week = st.query_range(f"{name}-{unit}", city, ll, period=f"{iso(s)}..{iso(s + 6)}")
                    three = st.query_range(f"{name}-{unit}", city, ll, period=f"{iso(s)}..{iso(s + 2)}")
                    n = len(ll)
                    rows = week.iloc[:7 * n]
                    if rows["period"].nunique() != 7:
                        raise SystemExit(f"window {iso(s)}: {rows['period'].nunique()} periods answered, not 7")
                    lo, hi, est = (rows[c].to_numpy(np.float64).reshape(7, n) for c in ("lower", "upper", "estimate"))
                    t = np.stack(truth)
                    cover["day", b].append(hits(lo, hi, t).ravel())
                    width["day", b].append(((hi - lo) / 2 / np.maximum(t, 1)).ravel())
                    for r, table, tr in (("3-day sum", three, t[:3].sum(0)), ("7-day sum", week, t.sum(0))):
                        sm = table.iloc[-n:]
                        slo, shi = sm["lower"].to_numpy(np.float64), sm["upper"].to_numpy(np.float64)
                        cover[r, b].append(hits(slo, shi, tr))
                        width[r, b].append((shi - slo) / 2 / np.maximum(tr, 1))
            for r in ROWS:
                cells = [f"{np.mean(np.concatenate(cover[r, b])):.3f} ({np.median(np.concatenate(width[r, b])):.2f})"
                         for b in BANDS]
                print(f"| {name} | {unit} | {r} | " + " | ".join(cells) + " |", flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\n<!-- {ru.ru_utime + ru.ru_stime + ch.ru_utime + ch.ru_stime:.0f} CPU-seconds; stores in {tmp} -->")


def hindsight(a, plan, x, y, user, region, unit: str) -> None:
    """The identity grid whose width errs least per band and row, picked with the truth."""
    err, cov = {}, {}
    for w_m in HINDSIGHT_WIDTHS:
        for w, (_, _, sel, per_band) in enumerate(plan):
            rels = [release("identity", {"cell_width_m": w_m}, x[m], y[m], user[m], region, unit, 20, a.epsilon,
                            a.seed + 1000 * w + i) for i, m in enumerate(sel)]
            for b in BANDS:
                boxes, _, truth = per_band[b]
                per = [intervals(syn, boxes) for syn in rels]
                t = np.stack(truth)
                est = np.stack([p[0] for p in per])
                err.setdefault((w_m, "day", b), []).append((np.abs(est - t) / np.maximum(t, 1)).ravel())
                cov.setdefault((w_m, "day", b), []).append(
                    hits(np.stack([p[1] for p in per]), np.stack([p[2] for p in per]), t).ravel())
                for r, n in (("3-day sum", 3), ("7-day sum", 7)):
                    tot, lo, hi = combine_sum([p[0] for p in per[:n]], [p[1] for p in per[:n]],
                                              [p[2] for p in per[:n]], covers_words(rels[0]),
                                              [p[4][0] for p in per[:n]], [p[4][1] for p in per[:n]])
                    tr = t[:n].sum(0)
                    err.setdefault((w_m, r, b), []).append(np.abs(tot - tr) / np.maximum(tr, 1))
                    cov.setdefault((w_m, r, b), []).append(hits(lo, hi, tr))
    for r in ROWS:
        pick = {b: min(HINDSIGHT_WIDTHS, key=lambda w_m, b=b: np.mean(np.concatenate(err[w_m, r, b]))) for b in BANDS}
        print(f"| hindsight grid ({' / '.join(f'{pick[b]:g}' for b in BANDS)} m) | {unit} | {r} | "
              + " | ".join(f"{np.mean(np.concatenate(cov[pick[b], r, b])):.3f}" for b in BANDS) + " |", flush=True)


if __name__ == "__main__":
    main()
