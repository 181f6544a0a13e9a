"""The shipped nightly (deploy/geodp.toml) against the nightly it replaced, on real check-ins.

For each 7-day window of Gowalla NYC it runs `geodp release run` with the shipped nightly's options
(read through the settings loader: period of 7 days, mechanism, ε, k) and with the former nightly's
(one day, identity at 100 m cells, ε 0.5, k 20), each with seeded noise into a temporary store, and
answers squares centred on the window's points in New York. Beside them, a uniform grid sized with
hindsight: `identity` with the shipped nightly's period, ε and k at each of several cell sizes, the
best size per band (chosen on the errors it is scored by). Error: mean |answer − true count| /
max(true count, ψ), ψ = 0.1% of the points, true counts of ALL points (what the answers estimate);
a blank map (answering 0) scores 1.0 where every square holds more than ψ points.

    python bench/bench_nightly.py [--weeks 2010-08-04,2010-09-01,2010-10-06] [--seeds 3] [--queries 1000]
                                  [--hindsight-sizes 250,500,1000,2000,4000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "gowalla_nyc_checkins.tsv.gz"
BANDS = [(100, 1000), (1000, 5000)]


def _errors(release, points: pd.DataFrame, queries: int, seed: int) -> dict:
    g = release.to_xarray()
    inside = points[(points.lat >= float(g.lat.min())) & (points.lat <= float(g.lat.max()))
                    & (points.lon >= float(g.lon.min())) & (points.lon <= float(g.lon.max()))]
    rng = np.random.default_rng(seed)
    floor = max(1.0, len(inside) / 1000)
    lat, lon = inside.lat.to_numpy()[:, None], inside.lon.to_numpy()[:, None]
    out = {}
    for lo, hi in BANDS:
        centres = inside.iloc[rng.integers(0, len(inside), queries)]
        half = rng.uniform(lo, hi, queries) / 2 / 111_320
        hlon = half / np.cos(np.radians(centres.lat.to_numpy()))
        boxes = pd.DataFrame({"min_lat": centres.lat.to_numpy() - half, "min_lon": centres.lon.to_numpy() - hlon,
                              "max_lat": centres.lat.to_numpy() + half, "max_lon": centres.lon.to_numpy() + hlon})
        truth = ((lat >= boxes.min_lat.to_numpy()) & (lat < boxes.max_lat.to_numpy())
                 & (lon >= boxes.min_lon.to_numpy()) & (lon < boxes.max_lon.to_numpy())).sum(axis=0)
        est = release.query(boxes).estimate.to_numpy()
        out[(lo, hi)] = (float(np.mean(np.abs(est - truth) / np.maximum(truth, floor))),
                         float(np.mean(truth / np.maximum(truth, floor))))
    return out


def main() -> None:
    import geodp
    from flows.cli import main as geodp_main
    from tasks.settings import load_settings

    ap = argparse.ArgumentParser()
    ap.add_argument("--weeks", default="2010-08-04,2010-09-01,2010-10-06", help="first days of 7-day windows")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--hindsight-sizes", default="250,500,1000,2000,4000",
                    help="cell sides (m) of the uniform grids the hindsight row picks from")
    args = ap.parse_args()
    nightly = load_settings(ROOT / "deploy" / "geodp.toml").nightly
    k = nightly.release.max_points_per_user or nightly.policy.policy().max_points_per_user
    shipped = ["--mechanism", nightly.release.mechanism, "--epsilon", str(nightly.release.epsilon),
               "--max-points-per-user", str(k)]
    former = ["--mechanism", "identity", "--epsilon", "0.5", "--max-points-per-user", "20"]
    raw = pd.read_csv(DATA, sep="\t", header=None, names=["user_id", "timestamp", "lat", "lon", "venue"])
    raw["timestamp"] = pd.to_datetime(raw["timestamp"], utc=True)
    print(f"shipped nightly: {' '.join(shipped)} (period {nightly.release.period}); former: one day, "
          f"{' '.join(former)}")
    print(f"{'window':<24} {'release':<8} {'rows':>6}  " + "  ".join(f"{lo}-{hi} m (blank)".rjust(22)
                                                                    for lo, hi in BANDS))
    sizes = [int(v) for v in args.hindsight_sizes.split(",")]
    grid = ["--mechanism", "identity", *shipped[2:]]  # the shipped ε and k

    def errors(part: pd.DataFrame, a: date, b: date, options: list[str]) -> dict:
        """Mean error per band over the seeds, and the blank map's."""
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "window.parquet"
            part.to_parquet(data)
            for seed in range(args.seeds):
                out = Path(tmp) / f"rel{seed}"
                with contextlib.redirect_stdout(io.StringIO()):  # the CLI's own report of each release
                    code = geodp_main(["release", "run", str(data), "--cities", "new-york", "--period",
                                       f"{a}..{b}", *options, "--seed", str(seed), "--out", str(out)])
                assert code == 0, f"release of {a}..{b} failed"
                rows.append(_errors(geodp.open_store(str(out)).releases()[0], part, args.queries, seed))
        return {band: (float(np.mean([r[band][0] for r in rows])), rows[0][band][1]) for band in BANDS}

    def line(a: date, b: date, name: str, rows: int, found: dict) -> None:
        cells = "  ".join(f"{found[band][0]:>13.3f} ({found[band][1]:.3f})" for band in BANDS)
        print(f"{a}..{b}   {name:<8} {rows:>6}  {cells}", flush=True)

    for first in args.weeks.split(","):
        a = date.fromisoformat(first)
        for name, days, options in (("shipped", 7, shipped), ("former", 1, former)):
            b = a + timedelta(days=days - 1)
            part = raw[(raw.timestamp >= str(a)) & (raw.timestamp < str(b + timedelta(days=1)))].drop(columns="venue")
            line(a, b, name, len(part), errors(part, a, b, options))
            if name == "shipped":
                by_size = {m: errors(part, a, b, [*grid, "--param", f"cell_width_m={m}"])
                           for m in sizes}
                best = {band: min((by_size[m][band][0], m) for m in sizes) for band in BANDS}
                line(a, b, "hindsight", len(part), {band: by_size[best[band][1]][band] for band in BANDS})
                print("    hindsight sizes (m): " + ", ".join(f"{lo}-{hi} m: {best[(lo, hi)][1]}"
                                                          for lo, hi in BANDS), flush=True)


if __name__ == "__main__":
    main()
