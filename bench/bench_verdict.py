"""How often the verdict refuses real days, and how the published ones fare (issue 43 item 4).

Daily releases of Gowalla NYC (`new-york` box) through the CLI (`geodp release run … --out DIR`, seeded
noise so no budget cap interferes; the verdict is the same code path as with secure noise), each day
into a fresh store (a first release: its verdict comes from its own paid profile), with --publish-anyway:
its manifest records whether the verdict would have refused it, and its error says whether that was right:
mean |answer − true| / max(true, ψ) on squares centred on that day's points (truth = all points, ψ = 0.1%
of the points) over answering 0's, per band; truly worse = at least 1 at every band. The confusion table
counts (refused, published) × (truly worse, better at one band). Empty days (dates the file does not
cover) are run without --publish-anyway: refused means exit 2.

    python bench/bench_verdict.py --days 2010-05-01..2010-05-30 [--options "--epsilon 1 --mechanism auto --max-points-per-user 5"]
    python bench/bench_verdict.py --simulate 1,5,0    # the profile-only verdict on every day, no releases
    python bench/bench_verdict.py --data sample --city austin --periods 2010-05,2010-06 --empty "" \
        --options "--epsilon 0.5 --mechanism identity --max-points-per-user 10"   # the sample's thin months
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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
SAMPLE = ROOT.parent / "shared" / "data" / "gowalla_sample_1000users.parquet"
BANDS = [(25, 100), (100, 1000), (1000, 5000)]
DAY = "--epsilon 1 --mechanism auto --max-points-per-user 5"


def _ratios(release, points: pd.DataFrame, queries: int, seed: int) -> list[float]:
    """Per band: the release's mean relative error over answering 0's (bench_nightly's measure)."""
    import bench_nightly

    bench_nightly.BANDS = BANDS
    errors = bench_nightly._errors(release, points, queries, seed)
    return [errors[b][0] / errors[b][1] for b in BANDS]


def _release(data: Path, out: Path, day: str, options: list[str], seed: int, city: str = "new-york") -> tuple[int, str]:
    from flows.cli import main as geodp_main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = geodp_main(["release", "run", str(data), "--cities", city, "--period", day, *options,
                           "--seed", str(seed), "--out", str(out)])
    return code, next((ln for ln in err.getvalue().splitlines() if ln.startswith("error:")), "")


def simulate(raw: pd.DataFrame, eps: float, k: int, width: float | None, seed: int) -> None:
    """The profile-only verdict (a first release's) on every day of the file, without releasing: each day's
    true profile of the `new-york` box noised at ε_p = 10% of ε (seeded), then the rule the run applies
    (dpcore.synopsis.profile_verdict: the typical count of each band modelled from N̂ and the profile's
    points-weighted mean)."""
    from dpcore.geo import city_region
    from dpcore.privacy.noise import NoiseSource
    from dpcore.privacy.profile import PROFILE_FRACTION, noisy_profile, profile_counts
    from dpcore.synopsis.expected_error import useless
    from dpcore.synopsis.profile_verdict import inputs_from, profile_errors, without_untrusted

    region = city_region("new-york")
    x, y = region.project(raw.lat.to_numpy(), raw.lon.to_numpy())
    inside = raw[(np.abs(x) < region.half_m) & (np.abs(y) < region.half_m)]
    days = inside.timestamp.dt.strftime("%Y-%m-%d")
    noise = NoiseSource.seeded(seed)

    def verdict(counts: np.ndarray) -> tuple[bool, float, list[float]]:
        profile = without_untrusted(noisy_profile(counts, PROFILE_FRACTION * eps, noise))
        inputs = inputs_from(profile, eps, k, width)
        rows = profile_errors(inputs, profile)
        return useless(rows), inputs.total, [r["expected_relative_error"] for r in rows]

    groups = list(inside.groupby(days))
    out = [verdict(profile_counts(g.groupby("user_id").size().to_numpy())) for _, g in groups]
    sizes = np.array([len(g) for _, g in groups])
    refused = np.array([u for u, _, _ in out])
    for lo, hi in ((0, 25), (25, 50), (50, 100), (100, 200), (200, 400), (400, 10 ** 9)):
        on = (sizes >= lo) & (sizes < hi)
        print(f"  days of {lo}–{hi} points: {int(refused[on].sum())} of {int(on.sum())} refused")
    empty = [verdict(np.zeros(24, dtype=np.int64)) for _ in range(200)]
    errs = np.median([e for _, _, e in out], axis=0)
    for margin in (0.95, 1.0, 2.0):
        print(f"  margin {margin}: days refused {sum(min(e) >= margin for _, _, e in out)}, empty refused "
              f"{sum(min(e) >= margin for _, _, e in empty)}")
    print(f"profile only, ε {eps:g}, k {k}, cells {width or 'auto'}: {sum(u for u, _, _ in out)} of {len(out)} days "
          f"refused; median N̂ {np.median([m for _, m, _ in out]):.0f}; median predicted error / blank map per band "
          + ", ".join(f"{e:.3g}" for e in errs) + f"; empty period: {sum(u for u, _, _ in empty)} of 200 refused "
          f"(median N̂ {np.median([m for _, m, _ in empty]):.0f}; predicted per band "
          + ", ".join(f"{e:.3g}" for e in np.median([e for _, _, e in empty], axis=0)) + ")")


def main() -> None:
    import geodp

    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", default=None, metavar="EPS,K,WIDTH",
                    help="instead: the profile-only verdict on every day of the file (WIDTH 0: the mechanism's own)")
    ap.add_argument("--days", default="2010-05-01..2010-05-30")
    ap.add_argument("--options", default=DAY)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="noise seeds per day")
    ap.add_argument("--verbose", action="store_true", help="each release's measured and predicted error")
    ap.add_argument("--empty", default="2011-06-01", help="days the file does not cover (comma-separated)")
    ap.add_argument("--data", choices=("nyc", "sample"), default="nyc", help="Gowalla NYC or the Gowalla sample")
    ap.add_argument("--city", default="new-york")
    ap.add_argument("--periods", default=None, help="instead of --days: period labels (comma-separated, e.g. 2010-05)")
    args = ap.parse_args()
    first, _, last = args.days.partition("..")
    days = [d.date().isoformat() for d in pd.date_range(first, last or first, freq="D")]
    days = args.periods.split(",") if args.periods else days
    options = args.options.split()
    if args.data == "sample":
        raw = pd.read_parquet(SAMPLE, columns=["user_id", "timestamp", "lat", "lon"])
        raw["timestamp"] = pd.to_datetime(raw["timestamp"], utc=True)
    else:
        raw = pd.read_csv(DATA, sep="\t", header=None, names=["user_id", "timestamp", "lat", "lon", "venue"])
        raw["timestamp"] = pd.to_datetime(raw["timestamp"], utc=True)
        raw = raw.drop(columns="venue")
    if args.simulate:
        eps, k, width = args.simulate.split(",")
        simulate(raw, float(eps), int(k), float(width) or None, args.seed)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "points.parquet"
        raw.to_parquet(data)
        table = {(r, w): 0 for r in (True, False) for w in (True, False)}
        ratios, shown = [], []
        for seed in range(args.seed, args.seed + args.seeds):
            for i, day in enumerate(days):
                # every day is published anyway (fresh store: a first release): its manifest records whether the
                # verdict would have refused it, and its error says whether that was right
                out = Path(tmp) / f"s{seed}-{i}"
                code, line = _release(data, out, day, [*options, "--publish-anyway"], seed, args.city)
                if code != 0:
                    print(f"  {day} seed {seed}: failed: {line[:300]}")
                    continue
                manifest = json.loads(next(out.rglob("_MANIFEST.json")).read_text())
                refused = bool(manifest["quality"]["plan"].get("published_anyway"))
                span = pd.Period(day)
                rows = raw[(raw.timestamp >= span.start_time.tz_localize("UTC"))
                           & (raw.timestamp <= span.end_time.tz_localize("UTC"))]
                release = next(iter(geodp.open_store(str(out)).releases()))
                r = _ratios(release, rows, args.queries, seed)
                worse = all(v >= 1.0 for v in r)
                table[(refused, worse)] += 1
                ratios.append(r)
                predicted = [b["expected_relative_error"] for b in manifest["quality"]["plan"]["bands"]]
                shown.append((day, seed, refused, r, predicted))
        print(f"`{args.options}` {len(days)} days × {args.seeds} seeds, first releases:")
        print("  | verdict | truly worse than a blank map at every band | better at one band at least |")
        print(f"  | refused | {table[(True, True)]} | {table[(True, False)]} |")
        print(f"  | published | {table[(False, True)]} | {table[(False, False)]} |")
        r = np.array(ratios)
        pred = np.array([p for *_, p in shown])
        for b, (lo, hi) in enumerate(BANDS):
            print(f"  {lo:g}–{hi:g} m: measured median {np.median(r[:, b]):.3g} (90th pct {np.quantile(r[:, b], 0.9):.3g}),"
                  f" predicted median {np.median(pred[:, b]):.3g}")
        if args.verbose:
            for day, seed, refused, rr, p in shown:
                print(f"  {day} s{seed} {'refused' if refused else 'published'} measured "
                      + " / ".join(f"{v:.2f}" for v in rr) + " predicted " + " / ".join(f"{v:.2f}" for v in p))
        for j, empty in enumerate(args.empty.split(",") if args.empty else []):
            code, line = _release(data, Path(tmp) / f"empty-{j}", empty, options, args.seed, args.city)
            print(f"  empty day {empty}: {'exit ' + str(code) + ': ' + line[:400] if code else 'published'}")
        sys.stdout.flush()
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU-seconds: {use.ru_utime + use.ru_stime:.0f}")


if __name__ == "__main__":
    main()
