"""Do `geodp query forecast`'s 95% bands cover the true counts that follow the release? (issue 43 item 3)

Through the CLI a user runs: `geodp release run` of SF cabs' daily slots (a spatio-temporal release,
user level, scaled to full counts by the window's public total), then `geodp query forecast --json` for
squares of 1–5 km centred on trip records, H days past the release; each day's band is checked against
the true full count of that day (read from the data here, never by geodp).

    nice -n 10 .venv/bin/python bench/bench_forecast_coverage.py --mechanisms identity3d,vdr --epsilons 0.5,2

Prints one row per mechanism × ε: coverage per step ahead and overall, the band's median width, and the
forecast's sMAPE beside a naive forecast (the last released day repeated) so the band's honesty is read
beside its usefulness. CPU-seconds are of the whole process tree (every CLI call is a child).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcore.geo import city_region

ROOT = Path(__file__).resolve().parents[1]
SF = ROOT.parent / "shared" / "data" / "sf_cabs.parquet"
CITY = "san-francisco"


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def geodp(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("geodp")
    r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    if r.returncode != 0:
        raise SystemExit(f"geodp {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return r


def squares(frame: pd.DataFrame, n: int, rng: np.random.Generator) -> np.ndarray:
    """n squares (min_lat, min_lon, max_lat, max_lon) of 1–5 km side centred on drawn records."""
    pick = frame.iloc[rng.integers(0, len(frame), n)]
    side = rng.uniform(1000.0, 5000.0, n)
    dlat = side / 2 / 111_320.0
    dlon = side / 2 / (111_320.0 * np.cos(np.radians(pick["lat"].to_numpy())))
    lat, lon = pick["lat"].to_numpy(), pick["lon"].to_numpy()
    return np.column_stack([lat - dlat, lon - dlon, lat + dlat, lon + dlon])


def daily_truth(frame: pd.DataFrame, boxes: np.ndarray, days: pd.DatetimeIndex) -> np.ndarray:
    """True full counts: boxes × days."""
    day = frame["timestamp"].dt.floor("D").dt.tz_localize(None)
    lat, lon = frame["lat"].to_numpy(), frame["lon"].to_numpy()
    out = np.zeros((len(boxes), len(days)))
    for j, d in enumerate(days):
        on = (day == d).to_numpy()
        la, lo = lat[on], lon[on]
        inside = ((la[None, :] >= boxes[:, 0:1]) & (la[None, :] < boxes[:, 2:3])
                  & (lo[None, :] >= boxes[:, 1:2]) & (lo[None, :] < boxes[:, 3:4]))
        out[:, j] = inside.sum(axis=1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mechanisms", default="identity3d,vdr")
    ap.add_argument("--epsilons", default="0.5,2")
    ap.add_argument("--start", default="2008-05-18")
    ap.add_argument("--days", type=int, default=14, help="released days (the history)")
    ap.add_argument("--horizon", type=int, default=7)
    ap.add_argument("--boxes", type=int, default=40)
    ap.add_argument("--units", default="record,user", help="privacy units to release at (user: k = --k)")
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--grid-size", type=int, default=32, help="identity3d's grid (vdr picks its own)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    start = pd.Timestamp(args.start)
    released = pd.date_range(start, periods=args.days, freq="D")
    ahead = pd.date_range(released[-1] + pd.Timedelta(days=1), periods=args.horizon, freq="D")
    t0, t1 = pd.Timestamp(start, tz="UTC"), pd.Timestamp(ahead[-1] + pd.Timedelta(days=1), tz="UTC")
    frame = ds.dataset(SF).to_table(columns=["user_id", "timestamp", "lat", "lon"],
                                    filter=(ds.field("timestamp") >= t0) & (ds.field("timestamp") < t1)).to_pandas()
    # the release counts only what falls in the city's public region: so does the truth
    min_lat, min_lon, max_lat, max_lon = city_region(CITY).bbox_latlon()
    frame = frame[frame["lat"].between(min_lat, max_lat, inclusive="left")
                  & frame["lon"].between(min_lon, max_lon, inclusive="left")]
    history_rows = frame[frame["timestamp"] < pd.Timestamp(released[-1] + pd.Timedelta(days=1), tz="UTC")]
    rng = np.random.default_rng(args.seed)
    boxes = squares(history_rows, args.boxes, rng)
    boxes = np.column_stack([np.maximum(boxes[:, 0], min_lat), np.maximum(boxes[:, 1], min_lon),
                             np.minimum(boxes[:, 2], max_lat), np.minimum(boxes[:, 3], max_lon)])
    truth = daily_truth(frame, boxes, ahead)
    last_true = daily_truth(frame, boxes, released[-1:])[:, 0]
    period = f"{released[0].date()}..{released[-1].date()}"
    print(f"SF cabs {period} released in daily slots, forecast {ahead[0].date()}..{ahead[-1].date()}; "
          f"{args.boxes} squares of 1–5 km centred on records (cut to the city's region, which is all a release counts); user level k {args.k} with "
          f"public total {len(history_rows):,}; true daily counts per square median {np.median(truth):.0f}")
    print()
    print("| unit | mechanism | ε | coverage (all steps) | coverage h=1 / 3 / 7 | median band width / truth | sMAPE forecast | "
          "sMAPE last released day repeated | CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sf.parquet"
        history_rows.to_parquet(data)
        runs = [(u, m, e) for u in args.units.split(",") for m in args.mechanisms.split(",")
                for e in args.epsilons.split(",")]
        for unit, mech, eps in runs:
            unit_args = (["--privacy-unit", "record"] if unit == "record"
                         else ["--max-points-per-user", args.k, "--public-total", len(history_rows)])
            c0 = cpu()
            out = Path(tmp) / f"{unit}-{mech}-{eps}"
            extra = ["--param", f"grid_size={args.grid_size}"] if mech == "identity3d" else []
            geodp("release", "run", data, "--city", CITY, "--period", period, "--slot", "1d", "--epsilon", eps,
                  "--mechanism", mech, *extra, *unit_args, "--out", out, "--no-prefect")
            fc, lo, hi, last = [], [], [], []
            for b in boxes:
                r = json.loads(geodp("query", "forecast", out, "--box", ",".join(f"{v:.6f}" for v in b),
                                     "--horizon", args.horizon, "--json", "-").stdout)
                fc.append(r["forecast"])
                lo.append([np.nan if v is None else v for v in r["lower"]])
                hi.append([np.nan if v is None else v for v in r["upper"]])
                last.append(r["history"][-1])
            fc, lo, hi = (np.asarray(v, dtype=np.float64) for v in (fc, lo, hi))
            covered = (lo <= truth) & (truth <= hi)  # a missing band covers nothing
            no_band = int(np.isnan(lo).any(axis=1).sum())
            steps = [h for h in (1, 3, 7) if h <= args.horizon]
            width = np.nanmedian((hi - lo) / np.maximum(truth, 1.0))
            smape = np.mean(2 * np.abs(fc - truth) / np.maximum(np.abs(fc) + np.abs(truth), 1e-9))
            naive = np.repeat(np.asarray(last, dtype=np.float64)[:, None], args.horizon, axis=1)
            smape_naive = np.mean(2 * np.abs(naive - truth) / np.maximum(np.abs(naive) + np.abs(truth), 1e-9))
            print(f"| {unit if unit == 'record' else f'user, k {args.k}'} | {mech} | {eps} | {covered.mean():.3f} | "
                  + " / ".join(f"{covered[:, h - 1].mean():.2f}" for h in steps)
                  + f" | {width:.2f}{f' ({no_band} without a band)' if no_band else ''} | {smape:.3f} | {smape_naive:.3f} | {cpu() - c0:.0f} |", flush=True)
    print(f"\n(the true last released day repeated, no noise: sMAPE "
          f"{np.mean(2 * np.abs(last_true[:, None] - truth) / np.maximum(last_true[:, None] + truth, 1e-9)):.3f})")


if __name__ == "__main__":
    main()
