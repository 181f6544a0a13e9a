"""`geodp paramselect predict|train|train-denoiser`: ParamSelect and SNH's public denoiser, from public data
(see dpcore.paramselect and dpcore.models.pyramid_denoiser)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.cli_common import CLIError, add_region_args, eprint, region_from_args


def register(sub: argparse._SubParsersAction) -> None:
    ps = sub.add_parser("paramselect", help="choose grid width ρ, k and mechanism from public data (no budget)")
    psub = ps.add_subparsers(dest="paramselect_command", required=True)

    p = psub.add_parser("predict", help="recommend ρ (and k, mechanism) for a release; reads no private data")
    add_region_args(p)
    p.add_argument("--n", type=float, required=True,
                   help="PUBLIC number of points in the region (a published figure or a DP estimate)")
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--privacy-unit", choices=["record", "user"], default="user")
    p.add_argument("--max-points-per-user", type=int, default=None,
                   help="k for user-level releases; omit to let ParamSelect choose it")
    p.add_argument("--mechanisms", default="identity",
                   help="candidates, comma-separated, from identity,snh,ug,ag,privtree (default identity: "
                        "the paper's ρ choice); several → ParamSelect also picks the mechanism; 'auto': every "
                        "mechanism the model knows, as `release --mechanism auto` weighs them")
    p.add_argument("--query-sides-m", default="100:1000", help="query band A:B in metres (default 100:1000)")
    p.add_argument("--public-data", metavar="PATH",
                   help="a PUBLIC dataset of the region for the entropy feature (default: the shipped profile)")
    p.add_argument("--model", default=None, help="model file (default: the one shipped with geodp)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_predict)

    t = psub.add_parser("train", help="build the training table on public data (Prefect + Dask, cached) and train")
    t.add_argument("--shared-data", default="../shared/data", help="folder of public datasets")
    t.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "geodp" / "paramselect"))
    t.add_argument("--out-dir", default=None, help="where to write model, table and report (default: the package)")
    t.add_argument("--epsilons", default="0.05,0.1,0.2,0.4,0.8,1.6")
    t.add_argument("--mechanisms", default="identity,ug,ag,privtree,snh",
                   help="snh is self-tuned: one neural fit per case at its own ρ, on --self-tuned-fractions only")
    t.add_argument("--self-tuned-fractions", default="1",
                   help="user fractions of the datasets that snh (20-40 s per fit on 2 cores) is run on")
    t.add_argument("--user-ks", default="1,5,20", help="k values for user-level rows ('' for none)")
    t.add_argument("--fractions", default="1,0.3", help="user subsample fractions of each public dataset")
    t.add_argument("--synthetic-seeds", default="1,2,3")
    t.add_argument("--queries", type=int, default=400)
    t.add_argument("--trials", type=int, default=1, help="noise draws averaged per snh case (default 1)")
    t.add_argument("--cheap-trials", type=int, default=10,
                   help="noise draws averaged per case of identity, ug, ag, privtree (default 10: ρ's labels)")
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--dask-address", default=None)
    t.add_argument("--holdout-denoiser", default=None, metavar="NPZ",
                   help="also build denoised SNH rows, with this denoiser (`train-denoiser --exclude-cities`), "
                        "for the cities the shipped one was trained on; off by default (bench/README.md)")
    t.add_argument("--quick", action="store_true", help="tiny search (for smoke tests): 2 ε, 1 band, few ρ, no snh rows")
    t.set_defaults(func=cmd_train)

    d = psub.add_parser("train-denoiser", help="train SNH's pyramid denoiser on public data (Prefect + Dask)")
    d.add_argument("--shared-data", default="../shared/data", help="folder of public datasets")
    d.add_argument("--out", default=None,
                   help="model file (.npz; default: the general model shipped with geodp, or with --signal-range "
                        "the shipped specialist that snh applies to the releases of its band)")
    d.add_argument("--exclude-cities", default="new-york",
                   help="cities kept out of training, comma-separated (default new-york, the benchmark city)")
    d.add_argument("--steps", type=int, default=1500, help="training steps (batches of 6 simulated releases)")
    d.add_argument("--channels", type=int, default=32,
                   help="width of the U-Net (default 32, the shipped models'); a conv layer's compute grows with its square")
    d.add_argument("--record-only", action="store_true", help="train on record-level releases only")
    d.add_argument("--signal-range", default=None, metavar="LOW:HIGH",
                   help="draw each simulated release's signal n·ε/s from LOW..HIGH (log-uniform) instead of ε: "
                        "a specialist for one band of signals, which snh's default applies to the releases in "
                        "that band (and at record level, with --record-only)")
    d.add_argument("--synthetic-seeds", default="1,2,3,4,5,6")
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--dask-address", default=None)
    d.set_defaults(func=cmd_train_denoiser)


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise CLIError(f"{what} must be comma-separated numbers, got {text!r}") from exc


#: How many of ParamSelect's candidates `predict` prints (best first); --json has them all.
CANDIDATES_SHOWN = 8


def cmd_predict(args: argparse.Namespace) -> int:
    from dpcore.paramselect import PublicProfile, rho_extrapolation_note, select_params, trained_mechanisms
    from dpcore.queries.range import parse_query_sides

    region = region_from_args(args)
    bands = parse_query_sides(args.query_sides_m)
    if len(bands) != 1:
        raise CLIError("--query-sides-m takes one band A:B")
    mechanisms = tuple(m.strip() for m in args.mechanisms.split(",") if m.strip())
    if mechanisms == ("auto",):
        mechanisms = trained_mechanisms(args.model)
    elif "auto" in mechanisms:
        raise CLIError("--mechanisms auto stands alone (it means every mechanism the model knows); "
                       "otherwise list candidates from identity,snh,ug,ag,privtree")
    profile = None
    if args.public_data:
        from dpcore.data.points import clip_to_region, load_points

        pts = load_points(args.public_data).points
        idx, x, y = clip_to_region(pts, region)
        profile = PublicProfile.from_points(x, y, pts.user[idx], region, source=str(args.public_data))
    if args.max_points_per_user is not None and args.max_points_per_user < 1:
        raise CLIError("--max-points-per-user must be ≥ 1")
    user = args.privacy_unit == "user"
    choice = select_params(region=region, n=args.n, epsilon=args.epsilon,
                           sensitivity=float(args.max_points_per_user or 1) if user else 1.0,
                           privacy_unit=args.privacy_unit, band=bands[0], mechanisms=mechanisms,
                           choose_k=user and args.max_points_per_user is None,
                           max_points_per_user=args.max_points_per_user, profile=profile, model_path=args.model)
    if args.json:
        print(json.dumps(choice.to_dict(), indent=2))
        return 0
    print(f"region {region.name}: n={args.n:g}, ε={args.epsilon:g}, {args.privacy_unit}-level, "
          f"queries {bands[0][0]:g}-{bands[0][1]:g} m")
    print(f"  cell width ρ       {choice.cell_width_m:.0f} m")
    if extrapolated := rho_extrapolation_note(choice):
        print(f"  ρ extrapolated     {extrapolated}")
    if choice.max_points_per_user is not None:
        print(f"  max points / user  {choice.max_points_per_user}")
    print(f"  mechanism          {choice.mechanism}")
    print(f"  predicted error    {choice.predicted_error:.3f} (mean relative error)")
    if "snh" in mechanisms:
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


def cmd_train(args: argparse.Namespace) -> int:
    from flows.paramselect_flow import TrainParams, run_paramselect_train
    from tasks.runtime import local_prefect

    params = TrainParams(shared_data=args.shared_data, cache_dir=args.cache_dir,
                         epsilons=_floats(args.epsilons, "--epsilons"),
                         mechanisms=[m.strip() for m in args.mechanisms.split(",") if m.strip()],
                         user_ks=[int(v) for v in _floats(args.user_ks, "--user-ks")],
                         fractions=_floats(args.fractions, "--fractions"),
                         self_tuned_fractions=_floats(args.self_tuned_fractions, "--self-tuned-fractions"),
                         synthetic_seeds=[int(v) for v in _floats(args.synthetic_seeds, "--synthetic-seeds")],
                         n_queries=args.queries, trials=args.trials, cheap_trials=args.cheap_trials,
                         n_workers=args.workers, dask_address=args.dask_address)
    if min(args.queries, args.trials, args.cheap_trials, args.workers) < 1:
        raise CLIError("--queries, --trials, --cheap-trials and --workers must be ≥ 1")
    if args.holdout_denoiser is not None:
        if not Path(args.holdout_denoiser).exists():
            raise CLIError(f"--holdout-denoiser {args.holdout_denoiser} does not exist")
        params.holdout_denoiser = args.holdout_denoiser
    if args.quick:
        params.epsilons, params.bands = params.epsilons[:2], [[100.0, 1000.0]]
        params.rhos, params.user_ks, params.n_estimators = [100.0, 200.0, 400.0, 800.0], [], 20
        params.cheap_trials = min(params.cheap_trials, 2)
        params.fractions, params.synthetic_seeds, params.include_nyc_full = [1.0], params.synthetic_seeds[:1], False
        params.mechanisms = [m for m in params.mechanisms if m != "snh"] or params.mechanisms
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        params.model_path = str(out / "paramselect_model.joblib")
        params.table_path = str(out / "paramselect_table.csv")
        params.report_path = str(out / "paramselect_model.json")
    if not Path(params.shared_data).exists():
        raise CLIError(f"--shared-data {params.shared_data} does not exist")
    eprint(f"paramselect-train: public data from {params.shared_data}, cache {params.cache_dir}")
    with local_prefect():
        report = run_paramselect_train(params)
    cv = report["cross_validation"]
    print(f"model: {params.model_path}\ntable: {params.table_path} ({report['rows']} rows)\n"
          f"report: {params.report_path}\nleave-one-city-out, error at chosen ρ / best ρ: median "
          f"{cv['chosen_rho']['median_error_ratio']:.3f}, {cv['chosen_rho']['within_10pct']:.0%} within 10%, "
          f"{cv['chosen_rho']['worse_than_2x']:.0%} worse than 2×")
    return 0


def cmd_train_denoiser(args: argparse.Namespace) -> int:
    from flows.denoiser_flow import DenoiserParams, run_denoiser_train
    from tasks.runtime import local_prefect

    if args.steps < 1:
        raise CLIError(f"--steps must be ≥ 1, got {args.steps}")
    if args.channels < 1:
        raise CLIError(f"--channels must be ≥ 1, got {args.channels}")
    signal_range = None
    if args.signal_range is not None:
        from dpcore.models.pyramid_denoiser import check_signal_range

        signal_range = _floats(args.signal_range.replace(":", ","), "--signal-range")
        try:
            check_signal_range(signal_range)  # before Prefect starts, not inside the flow
        except ValueError as exc:
            raise CLIError(f"--signal-range must be LOW:HIGH with 0 < LOW < HIGH, got {args.signal_range!r}") from exc
    if not Path(args.shared_data).exists():
        raise CLIError(f"--shared-data {args.shared_data} does not exist")
    params = DenoiserParams(shared_data=args.shared_data, steps=args.steps, n_workers=args.workers,
                            channels=args.channels,
                            record_only=args.record_only, signal_range=signal_range,
                            dask_address=args.dask_address,
                            exclude_cities=[c.strip() for c in args.exclude_cities.split(",") if c.strip()],
                            synthetic_seeds=[int(v) for v in _floats(args.synthetic_seeds, "--synthetic-seeds")])
    if args.out:
        params.model_path = args.out
    elif signal_range is not None:
        from dpcore.models.pyramid_denoiser import BAND_DENOISER_PATH

        params.model_path = str(BAND_DENOISER_PATH)
    eprint(f"snh-denoiser-train: public data from {params.shared_data}, {params.steps} steps, "
           f"excluding {params.exclude_cities or 'nothing'}")
    with local_prefect():
        meta = run_denoiser_train(params)
    print(f"model: {params.model_path} (+ .json)\ntrained on: "
          + ", ".join(d["name"] for d in meta["training_datasets"])
          + f"\nmean relative error, last 100 batches: {meta['report']['loss_last_100']:.4f}")
    return 0
