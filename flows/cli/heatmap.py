"""`geodp eval heatmap` (DP heatmaps against Laplace baselines: EMD, KL, Pearson) and `geodp eval sparse1d`
(sparse 1-D histograms of records per bin, e.g. venue: Laplace vs noise-then-threshold vs top-t%)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from dpcore.evaluation.heatmap import HeatmapEvalConfig
from flows.cli.common import (
    CLIError,
    StepProgress,
    at_least,
    check_mechanism,
    comma,
    emit_json,
    eprint,
    human_out,
    model_option,
    names,
    numbers,
    params_by_mechanism,
    parse_epsilons,
)
from flows.cli.evaluate import app
from flows.cli.inputs import Center, City, Columns, Data, Format, Json, Params, SideKm, Strict, load, region

H = HeatmapEvalConfig


@app.command("heatmap")
def heatmap(
    data: Data,
    city: City = None,
    center: Center = None,
    side_km: SideKm = None,
    resolution: str = model_option(H, "resolutions", "--resolution", fmt=comma,
                                   help="grid sides Δ, comma-separated (powers of two for dpheatmap)"),
    epsilon: str = model_option(H, "epsilons", "--epsilon", fmt=comma, help="ε values, comma-separated"),
    users: str = model_option(H, "users", "--users", fmt=comma, help="users sampled per trial, comma-separated"),
    mechanisms: str = model_option(H, "mechanisms", "--mechanisms", fmt=comma,
                                   help="heatmap mechanisms, comma-separated; NAME:K=V names a variant "
                                        "with its own parameters, e.g. laplace-top:top_percent=0.02"),
    param: Params = None,
    trials: int = model_option(H, "trials", "--trials", help="trials averaged"),
    seed: int = model_option(H, "seed", "--seed", help="seed of the sampling and noise (an experiment)"),
    emd_max_side: int = model_option(H, "emd_max_side", "--emd-max-side",
                                     help="EMD is exact up to this grid side; finer grids are block-summed "
                                          "(error ≤ √2/side)"),
    render: str | None = typer.Option(None, "--render", metavar="PNG",
                                      help="also draw true vs released heatmaps (first ε, Δ, n) into PNG"),
    columns: Columns = None,
    format: Format = "auto",
    strict: Strict = False,
    json_out: Json = None,
) -> int:
    """DP heatmaps against Laplace baselines: EMD, KL divergence and Pearson correlation to the truth."""
    from dpcore.evaluation.heatmap import evaluate_heatmap, format_table

    at_least(trials, 1, "--trials")
    specs = names(mechanisms)
    bases = [s.split(":", 1)[0].strip() for s in specs]
    by_base = params_by_mechanism(param, bases)
    config = HeatmapEvalConfig(
        mechanisms=specs, epsilons=parse_epsilons(epsilon), resolutions=numbers(resolution, "--resolution", int, 1),
        users=numbers(users, "--users", int, 1), trials=trials, seed=seed, emd_max_side=emd_max_side,
        params={s: by_base[b] for s, b in zip(specs, bases, strict=True) if b in by_base})
    _check_before_the_work(config, specs, render)
    reg = region(city, center, side_km)
    loaded = load(data, columns, format, strict)
    with StepProgress("evaluate-heatmap") as progress:
        report = evaluate_heatmap(loaded.points, reg, config, progress=progress, keep_example=bool(render))
    example = report.pop("example", None)
    report["data"] = {"source": loaded.source, "data_version": loaded.data_version}
    print(format_table(report), file=human_out(json_out))
    if json_out is not None:
        emit_json(report, json_out)
    if render and example:
        from dpcore.heatmap.quadtree import render_heatmaps

        (eps, res, n_users), grids = next(iter(example.items()))
        panels = [("true", grids.pop("truth"))] + list(grids.items())
        path = render_heatmaps(panels, render, suptitle=f"{reg.name}: ε={eps:g}, Δ={res}, {n_users} users")
        eprint(f"wrote {path}")
    return 0


#: What --render can write (matplotlib picks the format from the name's suffix).
RENDER_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _check_before_the_work(config: HeatmapEvalConfig, specs: list[str], render: str | None) -> None:
    """Every resolution, mechanism and the --render path, checked before the data is read: a grid too fine
    or a file matplotlib cannot write would otherwise fail after the whole evaluation."""
    from dpcore.evaluation.heatmap import parse_mechanism_spec
    from dpcore.heatmap.quadtree import HeatmapError, check_resolution

    if render is not None and not render.lower().endswith(RENDER_SUFFIXES):
        raise CLIError(f"--render writes an image ({', '.join(RENDER_SUFFIXES)}), got {render!r}")
    try:
        config.validate()
        for res in config.resolutions:
            check_resolution(res, power_of_two=False)
    except HeatmapError as exc:
        raise CLIError(f"--resolution: {exc}") from exc
    for spec in specs:
        label, name, spec_params = parse_mechanism_spec(spec)
        for res in config.resolutions:
            check_mechanism(name, {"resolution": res, **spec_params, **config.params.get(label, {})})


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


@app.command("sparse1d")
def sparse1d(
    data: str = typer.Argument(..., metavar="DATA", show_default=False,
                               help="table with a user column and an integer bin column (SNAP Gowalla "
                                    ".txt/.tsv(.gz), Parquet or CSV)"),
    bin_column: str = typer.Option("location_id", "--bin-column", help="integer bin column"),
    domain_size: int = typer.Option(..., "--domain-size", metavar="N",
                                    help="public number of bins: bins are 0..N-1 (e.g. the venue id space); "
                                         "ids ≥ N are dropped"),
    epsilon: str = typer.Option("0.2,1,5", "--epsilon", help="ε values, comma-separated"),
    max_points_per_user: int = typer.Option(10, "--max-points-per-user", metavar="K",
                                            help="records kept per user (the sensitivity)"),
    eta: float = typer.Option(1.0, "--eta", help="threshold θ = η·k·ln(N)/ε"),
    top_percent: float | None = typer.Option(None, "--top-percent", help="also evaluate the top-t% variant"),
    trials: int = typer.Option(3, "--trials", help="noise draws averaged"),
    seed: int = typer.Option(0, "--seed", help="seed of the sampling and noise (an experiment)"),
    json_out: Json = None,
) -> int:
    """Sparse 1-D histogram of records per bin: total absolute error of Laplace, noise-then-threshold and
    top-t%."""
    from dpcore.privacy.noise import NoiseSource

    for what, value in (("--domain-size", domain_size), ("--max-points-per-user", max_points_per_user),
                        ("--trials", trials)):
        at_least(value, 1, what)
    rng = np.random.default_rng(seed)
    keys, counts = venue_counts(data, bin_column, domain_size, max_points_per_user, rng)
    eprint(f"{int(counts.sum()):,} records after bounding to k={max_points_per_user}, "
           f"{keys.size:,} occupied of {domain_size:,} bins")
    out = human_out(json_out)
    rows = []
    for eps in parse_epsilons(epsilon):
        acc: dict[str, list[float]] = {}
        for trial in range(trials):
            noise = NoiseSource.seeded(seed * 1000 + trial)
            for key, v in sparse_errors(keys, counts, domain_size, eps, max_points_per_user, eta, top_percent,
                                        noise).items():
                acc.setdefault(key, []).append(v)
        row = {"epsilon": eps, "trials": trials, **{k: float(np.mean(v)) for k, v in acc.items()}}
        rows.append(row)
        line = f"ε={eps:g}: total |error| laplace {row['laplace']:,.0f}  threshold(η={eta:g}) {row['threshold']:,.0f}"
        if "top_percent" in row:
            line += f"  top-{top_percent:g}% {row['top_percent']:,.0f}"
        print(line + f"  (released {row['threshold_released_bins']:,.0f} bins, θ={row['threshold_theta']:.1f})",
              file=out)
    if json_out is not None:
        emit_json({"domain_size": domain_size, "bin_column": bin_column, "max_points_per_user": max_points_per_user,
                   "eta": eta, "occupied_bins": int(keys.size), "results": rows}, json_out)
    return 0
