"""`geodp paramselect predict|train` (ParamSelect: grid width ρ, k and mechanism from public data, no
budget) and `geodp denoiser train` (SNH's public pyramid denoiser)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.cli.common import (
    CLIError,
    at_least,
    comma,
    emit_json,
    eprint,
    model_option,
    names,
    noun,
    numbers,
    working,
)
from flows.cli.inputs import Center, City, Json, SideKm, region
from flows.denoiser_flow import DenoiserParams
from flows.paramselect_flow import TrainParams

app = noun("paramselect", "Choose grid width ρ, k and mechanism from public data (spends no budget).")
denoiser_app = noun("denoiser", "SNH's pyramid denoiser, trained on public data.")

if TYPE_CHECKING:
    from dpcore.paramselect.choose import Choice

T, D = TrainParams, DenoiserParams


@denoiser_app.callback()
def _denoiser() -> None:
    """SNH's pyramid denoiser, trained on public data."""

#: How many of ParamSelect's candidates `predict` prints (best first); --json has them all.
CANDIDATES_SHOWN = 8


@app.command("predict")
def predict(
    city: City = None,
    center: Center = None,
    side_km: SideKm = None,
    n: float = typer.Option(..., "--n", help="PUBLIC number of points in the region (a published figure or a DP "
                                             "estimate)"),
    epsilon: float = typer.Option(..., "--epsilon", help="ε of the planned release"),
    privacy_unit: str = typer.Option("user", "--privacy-unit", help="user or record"),
    max_points_per_user: int | None = typer.Option(None, "--max-points-per-user", metavar="K",
                                                   help="k of a user-level release; omit to let ParamSelect "
                                                        "choose it"),
    mechanisms: str = typer.Option("identity", "--mechanisms",
                                   help="candidates, comma-separated, from identity,snh,ug,ag,privtree (identity "
                                        "alone: the paper's ρ choice); several: ParamSelect also picks the "
                                        "mechanism; auto: what `release --mechanism auto` runs (its band "
                                        "rule and parameters), every mechanism the model knows weighed"),
    query_sides_m: str = typer.Option("100:1000", "--query-sides-m", help="the query band A:B in metres"),
    public_data: str | None = typer.Option(None, "--public-data", metavar="PATH",
                                           help="a PUBLIC dataset of the region for the entropy feature "
                                                "(default: the shipped profile)"),
    model: str | None = typer.Option(None, "--model", help="model file (default: the one shipped with geodp)"),
    json_out: Json = None,
) -> int:
    """Recommend ρ (and k, mechanism) for a release; reads no private data."""
    if privacy_unit not in ("user", "record"):
        raise CLIError(f"--privacy-unit must be user or record, got {privacy_unit!r}")
    from dpcore.paramselect import PublicProfile, rho_extrapolation_note, select_params, trained_mechanisms
    from dpcore.queries.range import parse_query_sides

    reg = region(city, center, side_km)
    bands = parse_query_sides(query_sides_m)
    if len(bands) != 1:
        raise CLIError("--query-sides-m takes one band A:B")
    candidates = tuple(names(mechanisms))
    as_auto = candidates == ("auto",)
    if as_auto:
        candidates = trained_mechanisms(model)
    elif "auto" in candidates:
        raise CLIError("--mechanisms auto stands alone (it means every mechanism the model knows); "
                       "otherwise list candidates from identity,snh,ug,ag,privtree")
    profile = None
    if public_data:
        from dpcore.data.points import clip_to_region, load_points

        pts = load_points(public_data).points
        idx, x, y = clip_to_region(pts, reg)
        profile = PublicProfile.from_points(x, y, pts.user[idx], reg, source=str(public_data))
    if max_points_per_user is not None and max_points_per_user < 1:
        raise CLIError("--max-points-per-user must be ≥ 1")
    user = privacy_unit == "user"
    choice = select_params(region=reg, n=n, epsilon=epsilon,
                           sensitivity=float(max_points_per_user or 1) if user else 1.0,
                           privacy_unit=privacy_unit, band=bands[0], mechanisms=candidates,
                           choose_k=user and max_points_per_user is None,
                           max_points_per_user=max_points_per_user, profile=profile, model_path=model)
    grid_rule = None
    if as_auto:
        choice, grid_rule = _as_auto(choice, bands[0], candidates, epsilon, privacy_unit, reg.side_m)
    if json_out is not None:
        emit_json(choice.to_dict(), json_out)
        return 0
    print(f"region {reg.name}: n={n:g}, ε={epsilon:g}, {privacy_unit}-level, "
          f"queries {bands[0][0]:g}-{bands[0][1]:g} m")
    if grid_rule is not None:
        print(f"  cell width         {reg.side_m / grid_rule['grid_size']:.0f} m (a {grid_rule['grid_size']}² grid, "
              "the data-centred size rule)")
    elif as_auto and "cell_width_m" not in choice.inputs["auto"]["params"]:
        params = choice.inputs["auto"]["params"]
        print(f"  parameters         {', '.join(f'{k}={v:g}' for k, v in params.items()) or 'its defaults'}")
    else:
        print(f"  cell width ρ       {choice.cell_width_m:.0f} m")
    if extrapolated := rho_extrapolation_note(choice):
        print(f"  ρ extrapolated     {extrapolated}")
    if choice.max_points_per_user is not None:
        print(f"  max points / user  {choice.max_points_per_user}")
    print(f"  mechanism          {choice.mechanism}"
          + (f"  (auto's choice, by the {choice.inputs['auto']['chosen_by']} rule)" if as_auto else ""))
    print(f"  predicted error    {choice.predicted_error:.3f} (mean relative error"
          + (", the cost model's, on uniformly placed queries)" if as_auto else ")"))
    if "snh" in candidates:
        print(f"  snh weighed        {'with' if choice.inputs['snh_denoised'] else 'without'} the public denoiser")
    if choice.inputs["beyond_training_reach"]:
        print(f"  not weighed        {', '.join(choice.inputs['beyond_training_reach'])} (n·ε/s far beyond "
              "their training rows)")
    cands = choice.inputs["candidates"]
    if len(cands) > 1:
        print("  candidates         predicted error (the chosen one marked *)")
        for c in cands[:CANDIDATES_SHOWN]:
            what = c["mechanism"] + (f" k={c['max_points_per_user']}" if c["max_points_per_user"] else "") + \
                (f" ρ={c['cell_width_m']:.0f} m" if c["cell_width_m"] else "")
            why = []
            if c["self_tuned"]:
                why.append(f"self-tuned: weighed at ×{1 + choice.inputs['self_tuned_margin']:g}")
            if not c["within_reach"]:
                why.append("beyond its training reach")
            print(f"    {'*' if c['chosen'] else ' '} {what:<24} {c['predicted_error']:.4f}"
                  + (f"  ({'; '.join(why)})" if why else ""))
        if len(cands) > CANDIDATES_SHOWN:
            print(f"      … {len(cands) - CANDIDATES_SHOWN} more (--json lists all)")
    print(f"  public profile     {choice.inputs['profile_source']}"
          + (f"; trained without {', '.join(choice.excluded_groups)}" if choice.excluded_groups else ""))
    return 0


def _as_auto(choice: Choice, band: tuple[float, float], candidates: tuple[str, ...], epsilon: float,
             privacy_unit: str, side_m: float) -> tuple[Choice, dict | None]:
    """ParamSelect's choice turned into what `auto` (its default ``choose="band"``) would run, through the
    same decision a release makes (dpcore.mechanisms.auto_rule.decide); the cost model's own pick stays
    in ``inputs["auto"]["cost_model"]``. n is public here, so the whole ε reaches the chosen mechanism."""
    import dataclasses

    from dpcore.mechanisms.auto_rule import decide

    sens = float(choice.max_points_per_user or 1) if privacy_unit == "user" else 1.0
    decision = decide(choice, band, candidates, epsilon, sens, privacy_unit, side_m)
    picked = decision.choice
    rule = decision.grid_rule
    cands = [{**c, "chosen": (c["mechanism"], c["max_points_per_user"]) == (picked.mechanism, picked.max_points_per_user)}
             for c in choice.inputs["candidates"]]
    auto = {"mechanism": picked.mechanism, "params": decision.inner_params,
            "chosen_by": "band" if decision.by_band else "model",
            "cost_model": {"mechanism": choice.mechanism, "predicted_error": choice.predicted_error},
            "grid_size_rule": rule}
    width = picked.cell_width_m if rule is None else side_m / rule["grid_size"]
    return dataclasses.replace(picked, cell_width_m=float(width),
                               inputs={**choice.inputs, "candidates": cands, "auto": auto}), rule


@app.command("train")
def train(
    shared_data: str = model_option(T, "shared_data", "--shared-data", help="folder of public datasets"),
    cache_dir: str = model_option(T, "cache_dir", "--cache-dir", help="cache of computed training rows"),
    out_dir: str | None = typer.Option(None, "--out-dir", help="where to write model, table and report "
                                       "(default: the package)"),
    epsilons: str = model_option(T, "epsilons", "--epsilons", fmt=comma, help="ε values of the training rows"),
    mechanisms: str = model_option(T, "mechanisms", "--mechanisms", fmt=comma,
                                   help="mechanisms of the training rows; add snh to weigh it in the cost model "
                                        "(self-tuned: one neural fit per case at its own ρ, on "
                                        "--self-tuned-fractions only; about 2 h more on 2 cores)"),
    self_tuned_fractions: str = model_option(T, "self_tuned_fractions", "--self-tuned-fractions", fmt=comma,
                                             help="user fractions of the datasets that snh (20-40 s per fit on "
                                                  "2 cores) is run on"),
    user_ks: str = model_option(T, "user_ks", "--user-ks", fmt=comma, help="k values of user-level rows ('' for "
                                "none)"),
    fractions: str = model_option(T, "fractions", "--fractions", fmt=comma,
                                  help="user subsample fractions of each public dataset"),
    synthetic_seeds: str = model_option(T, "synthetic_seeds", "--synthetic-seeds", fmt=comma,
                                        help="seeds of the synthetic training datasets"),
    queries: int = model_option(T, "n_queries", "--queries", help="range queries per case"),
    trials: int = model_option(T, "trials", "--trials", help="noise draws averaged per snh case"),
    cheap_trials: int = model_option(T, "cheap_trials", "--cheap-trials",
                                     help="noise draws averaged per case of identity, ug, ag, privtree (ρ's "
                                          "labels)"),
    workers: int = model_option(T, "n_workers", "--workers", help="Dask LocalCluster workers"),
    dask_address: str | None = model_option(T, "dask_address", "--dask-address", help="Dask scheduler address"),
    holdout_denoiser: str | None = typer.Option(None, "--holdout-denoiser", metavar="NPZ",
                                                help="also build denoised SNH rows with this denoiser (trained "
                                                     "with `geodp denoiser train --exclude-cities`) for the "
                                                     "cities the shipped one was trained on"),
    quick: bool = typer.Option(False, "--quick", help="a tiny search for smoke tests: 2 ε, 1 band, few ρ, "
                               "no snh rows"),
) -> int:
    """Build the training table on public data (Prefect flow on Dask, cached) and train the model."""
    from flows.paramselect_flow import run_paramselect_train
    from tasks.runtime import local_prefect

    for what, v in (("--queries", queries), ("--trials", trials), ("--cheap-trials", cheap_trials),
                    ("--workers", workers)):
        at_least(v, 1, what)
    params = TrainParams(shared_data=shared_data, cache_dir=cache_dir, epsilons=numbers(epsilons, "--epsilons"),
                         mechanisms=names(mechanisms), user_ks=numbers(user_ks, "--user-ks", int),
                         fractions=numbers(fractions, "--fractions"),
                         self_tuned_fractions=numbers(self_tuned_fractions, "--self-tuned-fractions"),
                         synthetic_seeds=numbers(synthetic_seeds, "--synthetic-seeds", int), n_queries=queries,
                         trials=trials, cheap_trials=cheap_trials, n_workers=workers, dask_address=dask_address)
    if holdout_denoiser is not None:
        if not Path(holdout_denoiser).exists():
            raise CLIError(f"--holdout-denoiser {holdout_denoiser} does not exist")
        params.holdout_denoiser = holdout_denoiser
    if quick:
        params.epsilons, params.bands = params.epsilons[:2], [[100.0, 1000.0]]
        params.rhos, params.user_ks, params.n_estimators = [100.0, 200.0, 400.0, 800.0], [], 20
        params.cheap_trials = min(params.cheap_trials, 2)
        params.fractions, params.synthetic_seeds, params.include_nyc_full = [1.0], params.synthetic_seeds[:1], False
        params.mechanisms = [m for m in params.mechanisms if m != "snh"] or params.mechanisms
    if not Path(params.shared_data).exists():
        raise CLIError(f"--shared-data {params.shared_data} does not exist")
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        params.model_path = str(out / "paramselect_model.joblib")
        params.table_path = str(out / "paramselect_table.csv")
        params.report_path = str(out / "paramselect_model.json")
    eprint(f"paramselect-train: public data from {params.shared_data}, cache {params.cache_dir}")
    with local_prefect(), working("paramselect-train flow on Dask"):
        report = run_paramselect_train(params)
    cv = report["cross_validation"]
    print(f"model: {params.model_path}\ntable: {params.table_path} ({report['rows']} rows)\n"
          f"report: {params.report_path}\nleave-one-city-out, error at chosen ρ / best ρ: median "
          f"{cv['chosen_rho']['median_error_ratio']:.3f}, {cv['chosen_rho']['within_10pct']:.0%} within 10%, "
          f"{cv['chosen_rho']['worse_than_2x']:.0%} worse than 2×")
    return 0


@denoiser_app.command("train")
def train_denoiser(
    shared_data: str = model_option(D, "shared_data", "--shared-data", help="folder of public datasets"),
    out: str | None = typer.Option(None, "--out", help="model file (.npz; default: the general model shipped "
                                   "with geodp, or with --signal-range the shipped specialist that snh applies "
                                   "to the releases of its band)"),
    exclude_cities: str = model_option(D, "exclude_cities", "--exclude-cities", fmt=comma,
                                       help="cities kept out of training, comma-separated (new-york: the "
                                            "benchmark city)"),
    steps: int = model_option(D, "steps", "--steps", help="training steps (batches of 6 simulated releases)"),
    channels: int = model_option(D, "channels", "--channels",
                                 help="width of the U-Net (the shipped models': 32); a conv layer's compute grows "
                                      "with its square"),
    record_only: bool = typer.Option(False, "--record-only", help="train on record-level releases only"),
    signal_range: str | None = typer.Option(None, "--signal-range", metavar="LOW:HIGH",
                                            help="draw each simulated release's signal n·ε/s from LOW..HIGH "
                                                 "(log-uniform) instead of ε: a specialist for one band of "
                                                 "signals"),
    synthetic_seeds: str = model_option(D, "synthetic_seeds", "--synthetic-seeds", fmt=comma,
                                        help="seeds of the synthetic training datasets"),
    workers: int = model_option(D, "n_workers", "--workers", help="Dask LocalCluster workers"),
    dask_address: str | None = model_option(D, "dask_address", "--dask-address", help="Dask scheduler address"),
) -> int:
    """Train SNH's pyramid denoiser on public data (Prefect flow on Dask)."""
    from flows.denoiser_flow import run_denoiser_train
    from tasks.runtime import local_prefect

    at_least(steps, 1, "--steps")
    at_least(channels, 1, "--channels")
    band = None
    if signal_range is not None:
        from dpcore.models.pyramid_denoiser import check_signal_range

        band = numbers(signal_range.replace(":", ","), "--signal-range")
        try:
            check_signal_range(band)  # before Prefect starts, not inside the flow
        except ValueError as exc:
            raise CLIError(f"--signal-range must be LOW:HIGH with 0 < LOW < HIGH, got {signal_range!r}") from exc
    if not Path(shared_data).exists():
        raise CLIError(f"--shared-data {shared_data} does not exist")
    params = DenoiserParams(shared_data=shared_data, steps=steps, n_workers=workers, channels=channels,
                            record_only=record_only, signal_range=band, dask_address=dask_address,
                            exclude_cities=names(exclude_cities),
                            synthetic_seeds=numbers(synthetic_seeds, "--synthetic-seeds", int))
    if out:
        params.model_path = out
    elif band is not None:
        from dpcore.models.pyramid_denoiser import BAND_DENOISER_PATH

        params.model_path = str(BAND_DENOISER_PATH)
    eprint(f"snh-denoiser-train: public data from {params.shared_data}, {params.steps} steps, "
           f"excluding {params.exclude_cities or 'nothing'}")
    with local_prefect(), working("snh-denoiser-train flow on Dask"):
        meta = run_denoiser_train(params)
    print(f"model: {params.model_path} (+ .json)\ntrained on: "
          + ", ".join(d["name"] for d in meta["training_datasets"])
          + f"\nmean relative error, last 100 batches: {meta['report']['loss_last_100']:.4f}")
    return 0


# `geodp paramselect train-denoiser` is the name scripts used before `geodp denoiser train`.
app.command("train-denoiser", hidden=True)(train_denoiser)
