"""How often the verdict refuses real days, and how the published ones fare (issue 43 item 4).

Daily releases of Gowalla NYC (`new-york` box) through the CLI (`geodp release run … --out DIR`, seeded
noise so no budget cap interferes; the verdict is the same code path as with secure noise), each day in
turn, in two forms:
- nightly: every day into one store, so each day's plan has the day before as its basis and its paid
  profile adds to it;
- first: every day into a fresh store, so each day's verdict comes from its own paid profile alone.
Per day: refused or published, and for a published day its error on squares centred on that day's
points (mean |answer − true| / max(true, ψ), truth = all points, ψ = 0.1% of the points) over answering 0's,
per band: below 1 beats a blank map. An empty day (a date the file does not cover) is run too.

    python bench/bench_verdict.py --days 2010-05-01..2010-05-30 [--options "--epsilon 1 --mechanism auto --max-points-per-user 5"]
    python bench/bench_verdict.py --simulate 1,5,0    # the profile-only verdict on every day, no releases
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

DATA = ROOT.parent / "shared" / "data" / "gowalla_nyc_checkins.tsv.gz"
BANDS = [(25, 100), (100, 1000), (1000, 5000)]
DAY = "--epsilon 1 --mechanism auto --max-points-per-user 5"


def _ratios(release, points: pd.DataFrame, queries: int, seed: int) -> list[float]:
    """Per band: the release's mean relative error over answering 0's (bench_nightly's measure)."""
    import bench_nightly

    bench_nightly.BANDS = BANDS
    errors = bench_nightly._errors(release, points, queries, seed)
    return [errors[b][0] / errors[b][1] for b in BANDS]


def _release(data: Path, out: Path, day: str, options: list[str], seed: int) -> tuple[int, str]:
    from flows.cli import main as geodp_main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = geodp_main(["release", "run", str(data), "--cities", "new-york", "--period", day, *options,
                           "--seed", str(seed), "--out", str(out)])
    return code, next((ln for ln in err.getvalue().splitlines() if ln.startswith("error:")), "")


def simulate(raw: pd.DataFrame, eps: float, k: int, width: float | None, seed: int) -> None:
    """The profile-only verdict (a first release's) on every day of the file, without releasing: each day's
    true profile of the `new-york` box noised at ε_p = 10% of ε (seeded), then the rule the run applies
    (tasks/release_usefulness.expectation with no basis: N̂'s 99th percentile bounds every band)."""
    from dpcore.geo import city_region
    from dpcore.privacy.noise import NoiseSource
    from dpcore.privacy.profile import PROFILE_FRACTION, noisy_profile, profile_counts
    from dpcore.synopsis.expected_error import PlanInputs, expected_errors, useless

    region = city_region("new-york")
    x, y = region.project(raw.lat.to_numpy(), raw.lon.to_numpy())
    inside = raw[(np.abs(x) < region.half_m) & (np.abs(y) < region.half_m)]
    days = inside.timestamp.dt.strftime("%Y-%m-%d")
    noise = NoiseSource.seeded(seed)
    inputs = PlanInputs(epsilon=eps, rho=None, k=k, cell_width_m=width, profiled=True)

    def verdict(counts: np.ndarray) -> tuple[bool, float, list[float]]:
        profile = noisy_profile(counts, PROFILE_FRACTION * eps, noise)
        most = float(np.quantile(profile.draws(1, 2001, np.random.default_rng(0))[0], 0.99))
        rows = expected_errors(inputs, np.full(len(BANDS), np.nan), profile, at_most=np.full(len(BANDS), most))
        return useless(rows), most, [r["expected_abs_error"] for r in rows]

    out = [verdict(profile_counts(g.groupby("user_id").size().to_numpy())) for _, g in inside.groupby(days)]
    empty = [verdict(np.zeros(24, dtype=np.int64)) for _ in range(200)]
    errs = np.median([e for _, _, e in out], axis=0)
    print(f"profile only, ε {eps:g}, k {k}, cells {width or 'auto'}: {sum(u for u, _, _ in out)} of {len(out)} days "
          f"refused; median N̂ 99th pct {np.median([m for _, m, _ in out]):.0f}; median predicted |error| per band "
          + ", ".join(f"{e:.3g}" for e in errs) + f"; empty period: {sum(u for u, _, _ in empty)} of 200 refused "
          f"(median N̂ 99th pct {np.median([m for _, m, _ in empty]):.0f})")


def main() -> None:
    import geodp

    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", default=None, metavar="EPS,K,WIDTH",
                    help="instead: the profile-only verdict on every day of the file (WIDTH 0: the mechanism's own)")
    ap.add_argument("--days", default="2010-05-01..2010-05-30")
    ap.add_argument("--options", default=DAY)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--empty", default="2011-06-01", help="a day the file does not cover")
    args = ap.parse_args()
    first, _, last = args.days.partition("..")
    days = [d.date().isoformat() for d in pd.date_range(first, last or first, freq="D")]
    options = args.options.split()
    raw = pd.read_csv(DATA, sep="\t", header=None, names=["user_id", "timestamp", "lat", "lon", "venue"])
    raw["timestamp"] = pd.to_datetime(raw["timestamp"], utc=True)
    raw = raw.drop(columns="venue")
    if args.simulate:
        eps, k, width = args.simulate.split(",")
        simulate(raw, float(eps), int(k), float(width) or None, args.seed)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "gowalla_nyc.parquet"
        raw.to_parquet(data)
        for form in ("nightly", "first"):
            refused, ratios = [], []
            for i, day in enumerate([*days, args.empty]):
                out = Path(tmp) / (f"{form}" if form == "nightly" else f"{form}-{i}")
                code, line = _release(data, out, day, options, args.seed)
                if day == args.empty:
                    print(f"{form}: empty day {day}: {'refused: ' + line[:200] if code else 'published'}")
                    continue
                if code != 0:
                    refused.append((day, line))
                    continue
                rows = raw[(raw.timestamp >= pd.Timestamp(day, tz="UTC"))
                           & (raw.timestamp < pd.Timestamp(day, tz="UTC") + pd.Timedelta(days=1))]
                latest = max(geodp.open_store(str(out)).releases(), key=lambda r: r.window_s()[0] or 0)
                ratios.append(_ratios(latest, rows, args.queries, args.seed))
            r = np.array(ratios)
            print(f"{form}: `{args.options}` {len(days)} days: {len(refused)} refused, {len(ratios)} published")
            for day, line in refused[:5]:
                print(f"  refused {day}: {line[:300]}")
            if len(r):
                print("  | band | median error / blank | 90th pct | published days worse than blank |")
                for b, (lo, hi) in enumerate(BANDS):
                    col = r[:, b][np.isfinite(r[:, b])]
                    print(f"  | {lo:g}–{hi:g} m | {np.median(col):.2f} | {np.quantile(col, 0.9):.2f} | "
                          f"{int((col >= 1).sum())} of {len(col)} |")
            sys.stdout.flush()
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU-seconds: {use.ru_utime + use.ru_stime:.0f}")


if __name__ == "__main__":
    main()
