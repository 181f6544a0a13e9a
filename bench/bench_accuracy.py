"""Accuracy of the range-count mechanisms on real public data, through dpcore.evaluation.range.

Every mechanism × ε × bands 25–100 m, 100–1000 m, 1–5 km, on
- Gowalla NYC check-ins in the ``new-york`` box, and
- SF cabs trip start points (the first point of each occupied run of a cab) in the ``san-francisco``
  box,
at user level (k points per user, a k-sample or weights min(1, k/n_u), scaled to full counts as
dpcore.evaluation.range does) and record level. Query centres are drawn from the data by default
(``--workload data``: queries where people are). Prints mean relative error tables (ψ = 0.1% of the
region's points) with every cell's ratio to the two references of dpcore.evaluation.range (the hindsight grid,
answering 0), the best mechanism per cell, and, with ``--boundings sample,weight``, the weighted
bounding against the k-sample. ``--readme`` rewrites the data-centred section at the top of
bench/README.md with the tables, the date and the command.

    .venv/bin/python bench/bench_accuracy.py                      # everything (long)
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

from dpcore.data.points import Points, load_points  # noqa: E402
from dpcore.evaluation.range import EvalConfig, evaluate  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.mechanisms import get_mechanism_class  # noqa: E402
from dpcore.queries.range import parse_query_sides  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
EPSILONS = "0.05,0.1,0.2,0.4,0.8,1.6"
DATASETS = {
    # name: (file, city, default k)
    "gowalla-nyc": ("gowalla_nyc_checkins.tsv.gz", "new-york", 20),
    "sf-cabs-starts": ("sf_cabs.parquet", "san-francisco", 50),
}
README_START = "<!-- accuracy-data:start -->"
README_END = "<!-- accuracy-data:end -->"
README_TITLE = "## Accuracy on the data-centred workload"


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


Band = tuple[float, float]


def _by(report: dict) -> dict[tuple[str, float, Band], dict]:
    return {(r["mechanism"], r["epsilon"], tuple(r["query_sides_m"])): r for r in report["results"]}


def _grid(report: dict) -> dict[tuple[float, Band], dict]:
    return {(r["epsilon"], tuple(r["query_sides_m"])): r for r in report.get("reference_hindsight_grid", [])}


def table_for(report: dict, sides: list[Band], epsilons: list[float], mechanisms: list[str]) -> str:
    """Markdown: per band and mechanism, each ε's mean relative error with its ratios to the hindsight
    grid (g) and to answering 0 (z); then the two reference rows."""
    by, grid = _by(report), _grid(report)
    zero = {tuple(r["query_sides_m"]): r["mean_relative_error"] for r in report["reference_answer_zero"]}
    head = "| query sides (m) | mechanism | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |"
    rows = [head, "|" + "---|" * (2 + len(epsilons))]
    for a, b in sides:
        for m in mechanisms:
            cells = []
            for e in epsilons:
                r = by.get((m, e, (a, b)))
                cells.append("" if r is None else f"{r['mean_relative_error']:.3f} (g {r['ratio_to_hindsight_grid']:.2f}, "
                             f"z {r['ratio_to_answer_zero']:.2f})")
            rows.append(f"| {a:g}–{b:g} | {m} | " + " | ".join(cells) + " |")
        rows.append(f"| {a:g}–{b:g} | *hindsight grid (not DP)* | " + " | ".join(
            f"*{grid[(e, (a, b))]['mean_relative_error']:.3f} (m={grid[(e, (a, b))]['grid_size']})*"
            if (e, (a, b)) in grid else "" for e in epsilons) + " |")
        rows.append(f"| {a:g}–{b:g} | *answer 0* | " + " | ".join(f"*{zero[(a, b)]:.3f}*" for _ in epsilons) + " |")
    return "\n".join(rows)


def best_lines(report: dict, sides: list[Band], epsilons: list[float]) -> list[str]:
    """Per (ε, band): the best DP mechanism, auto against it and against the hindsight grid, and at record
    level snh against privtree (the SNH paper's comparison)."""
    by, grid = _by(report), _grid(report)
    out = []
    for e in epsilons:
        for a, b in sides:
            rows = {m: r["mean_relative_error"] for (m, ee, band), r in by.items() if ee == e and band == (a, b)}
            if not rows:
                continue
            others = {m: v for m, v in rows.items() if m != "auto"}
            best = min(others, key=others.get) if others else None
            g = grid.get((e, (a, b)))
            line = f"ε={e:g}, {a:g}–{b:g} m: best {best} {others[best]:.3f}" if best else f"ε={e:g}, {a:g}–{b:g} m:"
            if g:
                line += f" (×{others[best] / g['mean_relative_error']:.2f} the hindsight grid)" if best else ""
            if "auto" in rows:
                line += f"; auto {rows['auto']:.3f}"
                if best:
                    line += f" = ×{rows['auto'] / others[best]:.2f} the best"
                if g:
                    line += f", ×{rows['auto'] / g['mean_relative_error']:.2f} the hindsight grid"
            if report["privacy_unit"] == "record" and "snh" in rows and "privtree" in rows:
                line += f"; snh / privtree ×{rows['snh'] / rows['privtree']:.2f}"
            out.append(line)
    return out


def bounding_table(sample: dict, weight: dict, sides: list[Band], epsilons: list[float],
                   mechanisms: list[str]) -> str:
    """Markdown: k-sample → weighted error per cell, with the ratio weighted / sample."""
    bs, bw = _by(sample), _by(weight)
    gs, gw = _grid(sample), _grid(weight)
    head = "| query sides (m) | mechanism | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |"
    rows = [head, "|" + "---|" * (2 + len(epsilons))]
    for a, b in sides:
        for m in [*mechanisms, "hindsight grid"]:
            cells = []
            for e in epsilons:
                if m == "hindsight grid":
                    rs, rw = gs.get((e, (a, b))), gw.get((e, (a, b)))
                else:
                    rs, rw = bs.get((m, e, (a, b))), bw.get((m, e, (a, b)))
                if rs is None or rw is None:
                    cells.append("")
                    continue
                s_, w_ = rs["mean_relative_error"], rw["mean_relative_error"]
                cells.append(f"{s_:.3f} → {w_:.3f} (×{w_ / s_:.2f})")
            label = "*hindsight grid (not DP)*" if m == "hindsight grid" else m
            rows.append(f"| {a:g}–{b:g} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def bounding_bias(ds: str, ks: list[int], sides: list[Band], queries: int, seed: int,
                  workload: str) -> str:
    """No noise at all: the error of the bounded points' exact grid scaled to full counts (N / kept mass), for
    the k-sample (one draw) and the weights, beside the full data's exact grid (the uniformity floor). What
    is left when ε → ∞ is the bias of bounding; it is the same for both boundings, whose expectations
    agree. A diagnostic on the true data, not a release."""
    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.evaluation.range import protocol_workloads, region_data
    from dpcore.grid.histogram import answer_boxes, grid_counts, prefix_sums
    from dpcore.privacy.bounding import bound_contributions, contribution_weights

    _, city, _ = DATASETS[ds]
    region = city_region(city)
    data = region_data(load_dataset(ds), region)
    psi, n = psi_for(data.n_points), data.n_points
    work = protocol_workloads(data, sides, queries, seed, workload=workload)
    rows = ["| k | kept mass (of N) | grid | " + " | ".join(f"{a:g}–{b:g} m: exact / weights / k-sample"
                                                            for a, b in sides) + " |",
            "|" + "---|" * (3 + len(sides))]
    for k in ks:
        w = contribution_weights(data.user, k)
        keep = bound_contributions(data.user, k, np.random.default_rng(seed)).keep
        for g in (256, 1024):
            grids = (grid_counts(data.x, data.y, region.bounds_m, g),
                     grid_counts(data.x, data.y, region.bounds_m, g, weights=w) * n / w.sum(),
                     grid_counts(data.x[keep], data.y[keep], region.bounds_m, g) * n / keep.size)
            cells = []
            for _, boxes, truth in work:
                e = [relative_error(answer_boxes(prefix_sums(v), region.bounds_m, boxes), truth, psi).mean()
                     for v in grids]
                cells.append(" / ".join(f"{v:.3f}" for v in e))
            rows.append(f"| {k} | {w.sum():,.0f} ({w.sum() / n:.1%}) | {g}² | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_readme(section: str) -> None:
    """Put the section between its markers, or, the first time, right after the file's introduction (before
    its first ## heading), so the newest protocol's tables come first."""
    path = ROOT / "bench" / "README.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{README_START}\n{section}\n{README_END}"
    if README_START in text and README_END in text:
        pre, _, rest = text.partition(README_START)
        _, _, post = rest.partition(README_END)
        text = pre + block + post
    else:
        pre, sep, post = text.partition("\n## ")
        text = pre.rstrip("\n") + f"\n\n{README_TITLE}\n\n{block}\n" + (sep + post if sep else "")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="accuracy benchmark of range-count mechanisms on real data")
    ap.add_argument("mechanisms", nargs="*", default=["identity", "ug", "ag", "hb", "privtree"])
    ap.add_argument("--epsilons", default=EPSILONS)
    ap.add_argument("--user-epsilons", default=None, help="ε list at user level (default: --epsilons)")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--units", default="user,record")
    ap.add_argument("--k", type=int, default=None, help="max points per user (default: per dataset)")
    ap.add_argument("--boundings", default="sample",
                    help="user-level boundings to run: sample, weight or sample,weight (then also a comparison)")
    ap.add_argument("--workload", default="data", help="query centres: data (default), uniform or public:PATH")
    ap.add_argument("--query-sides-m", default="25:100,100:1000,1000:5000")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--auto-band", default=None, metavar="LO:HI",
                    help="fix auto's query band (one fit answers every band, as a release does) instead of one "
                         "fit per band")
    ap.add_argument("--json", default=None, help="write all reports to this JSON file")
    ap.add_argument("--readme", action="store_true",
                    help="rewrite the data-centred accuracy section at the top of bench/README.md")
    ap.add_argument("--markdown", default=None, help="write the accuracy section (markdown) to this file")
    ap.add_argument("--export", nargs=2, metavar=("DATASET", "OUT.parquet"), default=None,
                    help="write one dataset's points (e.g. sf-cabs-starts) as a point table for `geodp evaluate`, "
                         "and stop")
    ap.add_argument("--bounding-bias", default=None, metavar="K[,K...]",
                    help="print the no-noise bias of bounding at these k (exact grids, no DP) and stop")
    args = ap.parse_args(argv)
    if args.export:
        export_points(*args.export)
        return 0
    if args.bounding_bias:
        for ds in args.datasets.split(","):
            print(f"### {ds}: error of exact grids scaled to full counts, no noise ({args.queries} queries per band, "
                  f"centres: {args.workload})\n")
            print(bounding_bias(ds, [int(k) for k in args.bounding_bias.split(",")],
                                parse_query_sides(args.query_sides_m), args.queries, args.seed, args.workload))
        return 0

    epsilons = {"record": [float(e) for e in args.epsilons.split(",")]}
    epsilons["user"] = [float(e) for e in (args.user_epsilons or args.epsilons).split(",")]
    sides = parse_query_sides(args.query_sides_m)
    boundings = [b for b in args.boundings.split(",") if b]
    sections, reports = [], {}
    for ds in args.datasets.split(","):
        t0 = time.perf_counter()
        points = load_dataset(ds)
        _, city, k_default = DATASETS[ds]
        region = city_region(city)
        k = args.k or k_default
        print(f"# {ds}: {points.user.size:,} points loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        for unit in args.units.split(","):
            eps = epsilons[unit]
            by_bounding = {}
            for bounding in (boundings if unit == "user" else ["sample"]):
                mechs = list(args.mechanisms)
                if bounding == "weight":
                    mechs = [m for m in mechs if get_mechanism_class(m).tags.supports_weights]
                config = EvalConfig(mechanisms=mechs, epsilons=eps, privacy_unit=unit, max_points_per_user=k,
                                    query_sides_m=sides, n_queries=args.queries, trials=args.trials, seed=args.seed,
                                    workload=args.workload, bounding=bounding,
                                    mechanism_params={"auto": {"query_sides_m": tuple(
                                        float(v) for v in args.auto_band.split(":"))}} if args.auto_band else {})
                t0 = time.perf_counter()
                report = evaluate(points, region, config)
                took = time.perf_counter() - t0
                by_bounding[bounding] = (report, mechs)
                reports[f"{ds}/{unit}" + (f"/{bounding}" if unit == "user" else "")] = report
                title = (f"### {ds} ({city} box, 20 × 20 km), {unit}-level"
                         + (f", k = {k}, bounding {bounding}" if unit == "user" else "")
                         + f": {report['n_points']:,} points, {report['n_users']:,} users, ψ = {report['psi']:g}")
                table = table_for(report, sides, eps, mechs)
                best = best_lines(report, sides, eps)
                skipped = sorted(set(args.mechanisms) - set(mechs))
                print(title)
                print(table)
                print("\n".join(best))
                print(f"({took:.0f} s)\n", flush=True)
                sections.append(title + f" ({took:.0f} s)\n\nMean relative error (g: ÷ the hindsight grid, z: ÷ answer 0)."
                                + (f" Not run with weights (no weighted support): {', '.join(skipped)}." if skipped else "")
                                + "\n\n" + table + "\n\n" + "\n".join(f"- {v}" for v in best))
            if "sample" in by_bounding and "weight" in by_bounding:
                (rs, ms), (rw, mw) = by_bounding["sample"], by_bounding["weight"]
                common = [m for m in ms if m in mw]
                comp = bounding_table(rs, rw, sides, eps, common)
                title = f"### {ds}, user-level, k = {k}: k-sample → weighted bounding"
                print(title)
                print(comp + "\n", flush=True)
                sections.append(title + "\n\nMean relative error with the k-sample → with weights min(1, k/n_u) "
                                "(× weighted / sample).\n\n" + comp)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    cmd = ".venv/bin/python bench/bench_accuracy.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    header = (f"`{cmd.strip()}` ({dt.date.today().isoformat()}; {args.trials} trials × {args.queries} queries "
              f"per band; query centres: {args.workload}; seeded noise; ψ = 0.1% of the region's points; user "
              "level scales to full counts as dpcore.evaluation.range documents).")
    section = header + "\n\n" + "\n\n".join(sections)
    if args.markdown:
        Path(args.markdown).write_text(section + "\n")
    if args.readme:
        write_readme(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
