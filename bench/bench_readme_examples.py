"""Every `geodp release` example of README.md and docs/*.md, run as a user would on real check-ins.

Each example's options go through the CLI (`geodp release run … --out DIR`, seeded noise) on Gowalla NYC
in the `new-york` box, with the example's own period where it names one (days the file holds) and the
whole file where it names none. Error on squares centred on the released period's points: mean
|answer − true count| / max(true count, ψ), truth = all points (what the answers estimate), ψ = 0.1% of
the points; "blank" is answering 0 (1.0 where every square holds more than ψ points). A backfill runs
the same release once per day into one store (so each day's plan has the day before as its basis):
its rows release the days before into the store first and measure the last. The `--cities new-york,boston` examples run
New York only (the file holds no Boston check-ins; Boston's release does not change New York's).
Spatio-temporal examples (vdr on SF cabs) are measured by bench_vdr.py, not here.

    python bench/bench_readme_examples.py [--seeds 3] [--queries 300] [--only NAME;…]
    python bench/bench_readme_examples.py --backfill 2010-05-01..2010-05-14   # the backfill example, day by day
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_nightly import BANDS, DATA, _errors  # noqa: E402

DAY_BEFORE = ["--epsilon", "0.5", "--mechanism", "identity", "--max-points-per-user", "20"]
DAY = ["--epsilon", "1", "--mechanism", "auto", "--max-points-per-user", "5"]
#: (name, where it is, periods: None for the whole file, else days or ranges released in turn into one
#: store, the last one measured; the example's release options, with the k the dataset's policy gives a
#: backfill). "(before)": as the example read before issue 35 (kept to show why it changed).
EXAMPLES: tuple[tuple[str, str, list[str] | None, list[str]], ...] = (
    ("worked example", "README.md, Worked example", None,
     ["--epsilon", "1", "--mechanism", "identity", "--param", "cell_width_m=250", "--max-points-per-user", "20"]),
    ("nightly", "docs/guarantee.md, A nightly release, worked through", ["2010-09-01..2010-09-07"],
     ["--epsilon", "0.5", "--mechanism", "auto", "--max-points-per-user", "20"]),
    ("platform (before)", "docs/operations.md, Releases, backfills, ledger", ["2010-05-01"], DAY_BEFORE),
    ("platform", "docs/operations.md, Releases, backfills, ledger", ["2010-05-01"], DAY),
    ("backfill day 2 (before)", "docs/operations.md, Releases, backfills, ledger (backfill)", ["2010-05-01", "2010-05-02"], DAY_BEFORE),
    ("backfill day 2", "docs/operations.md, Releases, backfills, ledger (backfill)", ["2010-05-01", "2010-05-02"], DAY),
    ("scale, whole input", "docs/operations.md, Running at scale", None, ["--epsilon", "1", "--max-points-per-user", "5"]),
    ("scale, one day (before)", "docs/operations.md, Running at scale", ["2010-05-03"], ["--epsilon", "1"]),
    ("scale, one day", "docs/operations.md, Running at scale", ["2010-05-03"], DAY),
    ("privtree", "docs/mechanisms.md", None,
     ["--epsilon", "0.5", "--mechanism", "privtree", "--max-points-per-user", "20"]),
    ("ag", "docs/mechanisms.md", None, ["--epsilon", "0.5", "--mechanism", "ag", "--param", "alpha=0.4"]),
    ("snh", "docs/mechanisms.md", None, ["--epsilon", "0.1", "--mechanism", "snh"]),
    ("auto", "docs/mechanisms.md", None, ["--epsilon", "0.1", "--mechanism", "auto"]),
)


def _in_box(points: pd.DataFrame) -> int:
    """Rows in the new-york box (what the releases count)."""
    from dpcore.geo import city_region

    region = city_region("new-york")
    x, y = region.project(points.lat.to_numpy(), points.lon.to_numpy())
    return int(((np.abs(x) < region.half_m) & (np.abs(y) < region.half_m)).sum())


def _period_rows(raw: pd.DataFrame, period: str | None) -> pd.DataFrame:
    if period is None:
        return raw
    first, _, last = period.partition("..")
    last = pd.Timestamp(last or first, tz="UTC") + pd.Timedelta(days=1)
    return raw[(raw.timestamp >= pd.Timestamp(first, tz="UTC")) & (raw.timestamp < last)]


def backfill_sweep(raw: pd.DataFrame, data: Path, tmp: Path, first: str, last: str, options: list[str],
                   seeds: int, queries: int) -> None:
    """The backfill example day by day: each seed releases every day of FIRST..LAST into one store (each
    day's plan reads the day before), and every day is measured."""
    import geodp
    from flows.cli import main as geodp_main

    days = [d.date().isoformat() for d in pd.date_range(first, last, freq="D")]
    errors: dict[str, list] = {d: [] for d in days}
    for seed in range(seeds):
        out = tmp / f"backfill-{seed}"
        for day in days:
            with contextlib.redirect_stdout(io.StringIO()):
                code = geodp_main(["release", "run", str(data), "--cities", "new-york", "--period", day, *options,
                                   "--seed", str(seed), "--out", str(out)])
            if code != 0:
                errors[day].append(None)
                continue
            latest = max(geodp.open_store(str(out)).releases(), key=lambda r: r.window_s()[0] or 0)
            errors[day].append(_errors(latest, _period_rows(raw, day), queries, seed))
    print(f"backfill `{' '.join(options)}`, {seeds} seeds: per day, 1–5 km error of each seed (blank: 1.0)")
    print("| day | rows | refused | " + " | ".join(f"{lo:g}–{hi:g} m" for lo, hi in BANDS) + " | 1–5 km per seed |")
    print("|---|---:|---:|" + "---:|" * len(BANDS) + "---|")
    for day in days:
        ok = [e for e in errors[day] if e is not None]
        cells = " | ".join(f"{np.mean([e[b][0] for e in ok]):.3f}" if ok else "-" for b in BANDS)
        print(f"| {day} | {_in_box(_period_rows(raw, day)):,} | {len(errors[day]) - len(ok)} | {cells} | "
              + ", ".join(f"{e[BANDS[-1]][0]:.2f}" for e in ok) + " |", flush=True)


def main() -> None:
    import geodp
    from flows.cli import main as geodp_main

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--only", default=None, help="example names separated by ';'")
    ap.add_argument("--backfill", default=None, metavar="FIRST..LAST",
                    help="instead: the backfill example on every day of FIRST..LAST")
    args = ap.parse_args()
    raw = pd.read_csv(DATA, sep="\t", header=None, names=["user_id", "timestamp", "lat", "lon", "venue"])
    raw["timestamp"] = pd.to_datetime(raw["timestamp"], utc=True)
    raw = raw.drop(columns="venue")
    only = set(args.only.split(";")) if args.only else None
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "gowalla_nyc.parquet"
        raw.to_parquet(data)
        if args.backfill:
            first, _, last = args.backfill.partition("..")
            backfill_sweep(raw, data, Path(tmp), first, last or first, DAY, args.seeds, args.queries)
            return
        print("| example | where | period | options | rows | " + " | ".join(f"{lo:g}–{hi:g} m | blank"
                                                                          for lo, hi in BANDS) + " |")
        print("|---|---|---|---|---:|" + "---:|---:|" * len(BANDS))
        for name, where, periods, options in EXAMPLES:
            if only is not None and name not in only:
                continue
            part = _period_rows(raw, periods[-1] if periods else None)
            rows = []
            for seed in range(args.seeds):
                out = Path(tmp) / f"{name.replace(' ', '_')}-{seed}"
                for period in periods or [None]:  # a backfill: the earlier days are in the store first
                    cmd = ["release", "run", str(data), "--cities", "new-york",
                           *(["--period", period] if period else []), *options, "--seed", str(seed), "--out", str(out)]
                    with contextlib.redirect_stdout(io.StringIO()):  # the CLI's own report of each release
                        code = geodp_main(cmd)
                    if code != 0:
                        break
                if code != 0:
                    rows = None
                    break
                latest = max(geodp.open_store(str(out)).releases(), key=lambda r: r.window_s()[0] or 0)
                rows.append(_errors(latest, part, args.queries, seed))
            cells = (" | ".join(f"{np.mean([r[b][0] for r in rows]):.3f} | {rows[0][b][1]:.3f}" for b in BANDS)
                     if rows else " | ".join("refused | " for _ in BANDS))
            period = periods[-1] if periods else "whole file"
            print(f"| {name} | {where} | {period} | `{' '.join(options)}` | {_in_box(part):,} | {cells} |", flush=True)

if __name__ == "__main__":
    main()
