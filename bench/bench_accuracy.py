"""Accuracy of the range-count mechanisms on real public data, through dpcore.evaluate.

Every mechanism × ε ∈ {0.05, 0.1, 0.2, 0.4, 0.8, 1.6} × workloads 25–100 m, 100–1000 m, 1–5 km, on
- Gowalla NYC check-ins in the ``new-york`` box, and
- SF cabs trip start points (the first point of each occupied run of a cab) in the ``san-francisco``
  box,
at user level (k points per user, scaled to full counts as dpcore.evaluate does) and record level.
Prints mean relative error tables (ψ = 0.1% of the region's points) and the checks the issue asks
for: do ag and privtree beat ug on skewed data at small ε. ``--readme`` rewrites the accuracy
section of bench/README.md with the tables, the date and the command.

    .venv/bin/python bench/bench_accuracy.py                      # everything (several minutes)
    .venv/bin/python bench/bench_accuracy.py --datasets gowalla-nyc --units record --trials 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.data import Points, load_points  # noqa: E402
from dpcore.evaluate import EvalConfig, evaluate  # noqa: E402
from dpcore.geo import city_region  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
EPSILONS = "0.05,0.1,0.2,0.4,0.8,1.6"
DATASETS = {
    # name: (file, city, default k)
    "gowalla-nyc": ("gowalla_nyc_checkins.tsv.gz", "new-york", 20),
    "sf-cabs-starts": ("sf_cabs.parquet", "san-francisco", 50),
}
README_START = "<!-- accuracy:start -->"
README_END = "<!-- accuracy:end -->"


def sf_trip_starts(path: Path) -> Points:
    """First point of every occupied run of each cab (the points the SNH/VDR papers use)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["user_id", "timestamp", "lat", "lon", "occupied"])
    codes, uniq = table.column("user_id").to_pandas().factorize()
    ts = table.column("timestamp").cast("int64").to_numpy() // 1_000_000
    lat = table.column("lat").to_numpy()
    lon = table.column("lon").to_numpy()
    occ = table.column("occupied").to_numpy().astype(bool)
    order = np.lexsort((ts, codes))
    codes, ts, lat, lon, occ = codes[order], ts[order], lat[order], lon[order], occ[order]
    new_cab = np.r_[True, codes[1:] != codes[:-1]]
    start = occ & (new_cab | ~np.r_[False, occ[:-1]])
    ok = start & np.isfinite(lat) & np.isfinite(lon)
    return Points(codes[ok].astype(np.int64), ts[ok].astype(np.int64), lat[ok], lon[ok], np.asarray(uniq))


def load_dataset(name: str) -> Points:
    file, _, _ = DATASETS[name]
    path = SHARED / file
    if not path.exists():
        raise SystemExit(f"{path} is missing: this benchmark needs ../shared/data")
    if name == "sf-cabs-starts":
        return sf_trip_starts(path)
    return load_points(path).points


def export_points(name: str, out: str) -> None:
    """A dataset as geodp's standard point table (user_id, timestamp, lat, lon)."""
    import pandas as pd

    if name not in DATASETS:
        raise SystemExit(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    pts = load_dataset(name)
    pd.DataFrame({"user_id": pts.user_ids[pts.user], "timestamp": pd.to_datetime(pts.ts, unit="s", utc=True),
                  "lat": pts.lat, "lon": pts.lon}).to_parquet(out, index=False)
    print(f"wrote {pts.lat.size:,} points of {name} to {out}")


def table_for(report: dict, sides: list[tuple[float, float]], epsilons: list[float], mechanisms: list[str]) -> str:
    by = {(r["mechanism"], r["epsilon"], tuple(r["query_sides_m"])): r["mean_relative_error"]
          for r in report["results"]}
    head = "| mechanism | query sides (m) | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |"
    rows = [head, "|" + "---|" * (2 + len(epsilons))]
    for a, b in sides:
        for m in mechanisms:
            vals = [by.get((m, e, (a, b))) for e in epsilons]
            rows.append(f"| {m} | {a:g}–{b:g} | " + " | ".join("" if v is None else f"{v:.3f}" for v in vals) + " |")
    return "\n".join(rows)


def checks(report: dict, sides: list[tuple[float, float]], small_eps: list[float]) -> list[str]:
    """ag and privtree vs ug at the small ε values, per workload."""
    by = {(r["mechanism"], r["epsilon"], tuple(r["query_sides_m"])): r["mean_relative_error"]
          for r in report["results"]}
    out = []
    for challenger in ("ag", "privtree"):
        for a, b in sides:
            for e in small_eps:
                u, c = by.get(("ug", e, (a, b))), by.get((challenger, e, (a, b)))
                if u is None or c is None:
                    continue
                verdict = "beats" if c < u else "does NOT beat"
                out.append(f"{challenger} {verdict} ug at ε={e:g}, {a:g}–{b:g} m: {c:.3f} vs {u:.3f}")
    return out


def write_readme(section: str) -> None:
    path = ROOT / "bench" / "README.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{README_START}\n{section}\n{README_END}"
    if README_START in text and README_END in text:
        pre, _, rest = text.partition(README_START)
        _, _, post = rest.partition(README_END)
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n## Accuracy of the range-count mechanisms\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="accuracy benchmark of range-count mechanisms on real data")
    ap.add_argument("mechanisms", nargs="*", default=["identity", "ug", "ag", "hb", "privtree"])
    ap.add_argument("--epsilons", default=EPSILONS)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--units", default="user,record")
    ap.add_argument("--k", type=int, default=None, help="max points per user (default: per dataset)")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write all reports to this JSON file")
    ap.add_argument("--readme", action="store_true", help="rewrite the accuracy section of bench/README.md")
    ap.add_argument("--markdown", default=None, help="write the accuracy section (markdown) to this file")
    ap.add_argument("--export", nargs=2, metavar=("DATASET", "OUT.parquet"), default=None,
                    help="write one dataset's points (e.g. sf-cabs-starts) as a point table for `geodp evaluate`, "
                         "and stop")
    args = ap.parse_args(argv)
    if args.export:
        export_points(*args.export)
        return 0

    epsilons = [float(e) for e in args.epsilons.split(",")]
    sides = [(25.0, 100.0), (100.0, 1000.0), (1000.0, 5000.0)]
    small = [e for e in epsilons if e <= 0.2]
    sections, reports = [], {}
    for ds in args.datasets.split(","):
        t0 = time.perf_counter()
        points = load_dataset(ds)
        _, city, k_default = DATASETS[ds]
        region = city_region(city)
        k = args.k or k_default
        print(f"# {ds}: {points.user.size:,} points loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        for unit in args.units.split(","):
            config = EvalConfig(mechanisms=list(args.mechanisms), epsilons=epsilons, privacy_unit=unit,
                                max_points_per_user=k, query_sides_m=sides, n_queries=args.queries,
                                trials=args.trials, seed=args.seed)
            t0 = time.perf_counter()
            report = evaluate(points, region, config)
            took = time.perf_counter() - t0
            reports[f"{ds}/{unit}"] = report
            title = (f"### {ds} ({city} box, 20 × 20 km), {unit}-level"
                     + (f", k = {k}" if unit == "user" else "")
                     + f": {report['n_points']:,} points, {report['n_users']:,} users, ψ = {report['psi']:g}")
            table = table_for(report, sides, epsilons, list(args.mechanisms))
            verdicts = checks(report, sides, small)
            print(title)
            print(table)
            print("\n".join(verdicts))
            print(f"({took:.0f} s)\n", flush=True)
            wins = {c: sum(1 for v in verdicts if v.startswith(f"{c} beats")) for c in ("ag", "privtree")}
            total = {c: sum(1 for v in verdicts if v.startswith(c + " ")) for c in ("ag", "privtree")}
            losses = [v for v in verdicts if "does NOT" in v]
            summary = (f"At ε ≤ 0.2: ag beats ug in {wins['ag']}/{total['ag']} (ε, workload) cells, privtree in "
                       f"{wins['privtree']}/{total['privtree']}."
                       + ("" if not losses else " Where not:\n" + "\n".join(f"- {v}" for v in losses)))
            sections.append(title + "\n\nMean relative error.\n\n" + table + "\n\n" + summary)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    cmd = ".venv/bin/python bench/bench_accuracy.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    header = (f"`{cmd.strip()}` ({dt.date.today().isoformat()}; {args.trials} trials × {args.queries} queries "
              "per workload; seeded noise; ψ = 0.1% of the region's points; user level scales to full "
              "counts as dpcore.evaluate documents).")
    section = header + "\n\n" + "\n\n".join(sections)
    if args.markdown:
        Path(args.markdown).write_text(section + "\n")
    if args.readme:
        write_readme(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
