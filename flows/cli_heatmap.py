"""`geodp evaluate-heatmap` (DP heatmaps vs baselines: EMD, KL, Pearson) and `geodp sparse1d`
(sparse 1-D histograms of check-ins per venue: Laplace vs noise-then-threshold vs top-t%)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from flows.cli_common import (
    CLIError,
    ProgressPrinter,
    add_data_args,
    add_region_args,
    eprint,
    load_from_args,
    parse_epsilons,
    region_from_args,
)


def _int_list(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise CLIError(f"{what} must be a comma-separated list of integers, got {text!r}") from exc
    if not vals or any(v < 1 for v in vals):
        raise CLIError(f"{what} must list integers ≥ 1, got {text!r}")
    return vals


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate-heatmap", help="DP heatmaps vs Laplace baselines: EMD, KL, Pearson (Ghazi et al.)")
    add_data_args(p)
    add_region_args(p)
    p.add_argument("--resolution", default="64,128,256", help="grid sides Δ (powers of two for dpheatmap)")
    p.add_argument("--epsilon", default="0.2,1,5", help="comma-separated ε values")
    p.add_argument("--users", default="50,200,500", help="users sampled per trial, comma-separated")
    p.add_argument("--mechanisms", default="dpheatmap,laplace,laplace-top",
                   help="comma-separated; parameters as NAME:KEY=VALUE, e.g. laplace-top:top_percent=0.05")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--emd-max-side", type=int, default=64,
                   help="EMD is exact up to this grid side; finer grids are block-summed (error ≤ √2/side)")
    p.add_argument("--render", metavar="PNG", help="also render true vs released heatmaps (first ε, Δ, n)")
    p.add_argument("--json", required=True, metavar="OUT", help="write the results JSON here")
    p.set_defaults(func=run_evaluate_heatmap)

    s = sub.add_parser("sparse1d", help="sparse 1-D histogram of records per bin column (e.g. venue): "
                                        "Laplace vs noise-then-threshold vs top-t%%, total absolute error")
    s.add_argument("data", metavar="DATA", help="table with a user column and an integer bin column "
                                                 "(SNAP Gowalla .txt/.tsv(.gz) or Parquet/CSV)")
    s.add_argument("--bin-column", default="location_id", help="integer bin column (default location_id)")
    s.add_argument("--domain-size", type=int, required=True,
                   help="public number of bins: bins are 0..N-1 (e.g. the venue id space); ids ≥ N are dropped")
    s.add_argument("--epsilon", default="0.2,1,5")
    s.add_argument("--max-points-per-user", type=int, default=10, help="k: records kept per user (sensitivity)")
    s.add_argument("--eta", type=float, default=1.0, help="threshold θ = η·k·ln(N)/ε")
    s.add_argument("--top-percent", type=float, default=None, help="also evaluate the top-t%% variant")
    s.add_argument("--trials", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", metavar="OUT")
    s.set_defaults(func=run_sparse1d)


def run_evaluate_heatmap(args: argparse.Namespace) -> int:
    from dpcore.evaluation.heatmap import HeatmapEvalConfig, evaluate_heatmap, format_table

    if args.trials < 1:
        raise CLIError("--trials must be ≥ 1")
    config = HeatmapEvalConfig(
        mechanisms=[m.strip() for m in args.mechanisms.split(",") if m.strip()],
        epsilons=parse_epsilons(args.epsilon), resolutions=_int_list(args.resolution, "--resolution"),
        users=_int_list(args.users, "--users"), trials=args.trials, seed=args.seed,
        emd_max_side=args.emd_max_side)
    region = region_from_args(args)
    loaded = load_from_args(args)
    report = evaluate_heatmap(loaded.points, region, config, progress=ProgressPrinter("evaluate-heatmap"),
                              keep_example=bool(args.render))
    example = report.pop("example", None)
    report["data"] = {"source": loaded.source, "data_version": loaded.data_version}
    print(format_table(report))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    eprint(f"wrote {out}")
    if args.render and example:
        from dpcore.heatmap.quadtree import render_heatmaps

        (eps, res, n_users), grids = next(iter(example.items()))
        panels = [("true", grids.pop("truth"))] + list(grids.items())
        path = render_heatmaps(panels, args.render, suptitle=f"{region.name}: ε={eps:g}, Δ={res}, {n_users} users")
        eprint(f"wrote {path}")
    return 0


def venue_counts(path: str, bin_column: str, domain_size: int, k: int, rng: np.random.Generator):
    """(bin keys, counts) of ≤ k uniformly sampled records per user, for bins in the public domain
    [0, domain_size); ids outside it are dropped (the domain is configuration, not read from data)."""
    import pandas as pd

    from dpcore.data.points import SNAP_COLUMNS, DataError
    from dpcore.privacy.bounding import bound_contributions

    p = Path(path)
    if not p.exists():
        raise CLIError(f"input file not found: {p}")
    try:
        if p.name.endswith((".parquet", ".pq")):
            df = pd.read_parquet(p)
        elif p.name.endswith((".txt", ".txt.gz", ".tsv", ".tsv.gz")):
            df = pd.read_csv(p, sep="\t", header=None, names=list(SNAP_COLUMNS))
        else:
            df = pd.read_csv(p)
    except Exception as exc:  # parser errors vary; all mean unreadable
        raise DataError(f"cannot read {p}: {type(exc).__name__}: {exc}") from exc
    if bin_column not in df.columns or "user_id" not in df.columns:
        raise CLIError(f"{p} needs columns user_id and {bin_column}; it has {list(df.columns)}")
    b = pd.to_numeric(df[bin_column], errors="coerce").to_numpy()
    ok = np.isfinite(b) & (b >= 0) & (b < domain_size)
    bins = b[ok].astype(np.int64)
    _, user = np.unique(df["user_id"].to_numpy()[ok].astype(str), return_inverse=True)
    if bins.size == 0:
        raise CLIError(f"no {bin_column} values in [0, {domain_size})")
    keep = bound_contributions(user, k, rng).keep
    keys, counts = np.unique(bins[keep], return_counts=True)
    return keys, counts


def sparse_errors(keys, counts, domain_size: int, eps: float, k: int, eta: float,
                  top_percent: float | None, noise) -> dict:
    """Total absolute error against the bounded counts, over the whole public domain, per method."""
    from dpcore.sparse1d.histograms import noise_then_threshold_sparse

    # Plain Laplace on all N bins: its error is the total |noise|, drawn for every bin (in chunks).
    scale = k / eps
    occ_err = float(np.abs(noise.discrete_laplace(scale, counts.shape)).sum())
    n_empty = domain_size - keys.size
    empty_err = 0.0
    for start in range(0, n_empty, 1 << 22):
        m = min(1 << 22, n_empty - start)
        empty_err += float(np.abs(noise.discrete_laplace(scale, m)).sum())
    out = {"laplace": occ_err + empty_err}
    rel = noise_then_threshold_sparse(keys, counts, domain_size, eps, k, eta, noise)
    truth = dict(zip(keys.tolist(), counts.tolist(), strict=True))
    released = dict(zip(rel.keys.tolist(), rel.values.tolist(), strict=True))
    err = sum(abs(released.get(key, 0) - c) for key, c in truth.items())
    err += sum(abs(v) for key, v in released.items() if key not in truth)
    out["threshold"] = float(err)
    out["threshold_released_bins"] = int(rel.keys.size)
    out["threshold_theta"] = rel.threshold
    if top_percent is not None:
        if domain_size > 20_000_000:
            raise CLIError("--top-percent needs --domain-size ≤ 20,000,000 (dense noise)")
        from dpcore.sparse1d.histograms import top_percent as top_fn

        dense = np.zeros(domain_size, dtype=np.int64)
        dense[keys] = counts
        rel_dense = top_fn(dense, eps, k, top_percent, noise)
        out["top_percent"] = float(np.abs(rel_dense - dense).sum())
    return out


def run_sparse1d(args: argparse.Namespace) -> int:
    from dpcore.privacy.noise import NoiseSource

    if args.domain_size < 1 or args.max_points_per_user < 1 or args.trials < 1:
        raise CLIError("--domain-size, --max-points-per-user and --trials must be ≥ 1")
    rng = np.random.default_rng(args.seed)
    keys, counts = venue_counts(args.data, args.bin_column, args.domain_size, args.max_points_per_user, rng)
    eprint(f"{int(counts.sum()):,} records after bounding to k={args.max_points_per_user}, "
           f"{keys.size:,} occupied of {args.domain_size:,} bins")
    rows = []
    for eps in parse_epsilons(args.epsilon):
        acc: dict[str, list[float]] = {}
        for trial in range(args.trials):
            noise = NoiseSource.seeded(args.seed * 1000 + trial)
            for key, v in sparse_errors(keys, counts, args.domain_size, eps, args.max_points_per_user,
                                        args.eta, args.top_percent, noise).items():
                acc.setdefault(key, []).append(v)
        row = {"epsilon": eps, "trials": args.trials, **{k: float(np.mean(v)) for k, v in acc.items()}}
        rows.append(row)
        line = f"ε={eps:g}: total |error| laplace {row['laplace']:,.0f}  threshold(η={args.eta:g}) {row['threshold']:,.0f}"
        if "top_percent" in row:
            line += f"  top-{args.top_percent:g}% {row['top_percent']:,.0f}"
        print(line + f"  (released {row['threshold_released_bins']:,.0f} bins, θ={row['threshold_theta']:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"domain_size": args.domain_size, "bin_column": args.bin_column,
                                               "max_points_per_user": args.max_points_per_user, "eta": args.eta,
                                               "occupied_bins": int(keys.size), "results": rows}, indent=2))
    return 0
