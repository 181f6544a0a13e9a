"""`paramselect-train`: build ParamSelect's training table on public data (Dask, cached), train, save.

One Dask task per public dataset (Gowalla sample cities × user subsamples, Gowalla NYC, synthetic
cities). Each task's rows are cached as CSV under ``cache_dir`` keyed by the dataset spec and the
search configuration, so a re-run only computes what changed. The flow then trains the ExtraTrees
models, runs leave-one-city-out cross-validation and writes the model file, the training table (CSV)
and a JSON report with the CV error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from dpcore.geo import city_region
from dpcore.mechanisms.snh import DENOISED_RULES_KEY, PLAIN_RULES_KEY
from dpcore.models.pyramid_denoiser import (
    BAND_DENOISER_PATH,
    load_meta,
    model_fingerprint,
    shipped_denoiser_usable,
    usable_for,
)
from dpcore.paramselect import (
    DEFAULT_MODEL_PATH,
    DEFAULT_REPORT_PATH,
    DEFAULT_TABLE_PATH,
    RHO_GRID_M,
    SELF_TUNED_MECHANISMS,
    ParamSelectModel,
    PublicProfile,
    cross_validate,
    tag_denoised,
    with_served_entropy,
    write_report,
)
from tasks.paramselect_tasks import dataset_rows
from tasks.runtime import dask_task_runner, environment

#: Gowalla-sample cities with enough points to learn from (PROVENANCE.md: rows per 20 km box).
GOWALLA_SAMPLE_CITIES = ("austin", "san-francisco", "new-york", "kansas-city", "chicago", "boston", "los-angeles")


@dataclass
class TrainParams:
    shared_data: str = "../shared/data"
    cache_dir: str = str(Path.home() / ".cache" / "geodp" / "paramselect")
    model_path: str = str(DEFAULT_MODEL_PATH)
    table_path: str = str(DEFAULT_TABLE_PATH)
    report_path: str = str(DEFAULT_REPORT_PATH)
    epsilons: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4, 0.8, 1.6])
    fractions: list[float] = field(default_factory=lambda: [1.0, 0.3])
    synthetic_seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    #: The cheap mechanisms by default: on squares centred on the data snh does not beat PrivTree or the
    #: hindsight grid (docs/decisions/0017-snh-data-centred.md), and its rows (one neural fit per case)
    #: cost about 2 h of CPU; add snh to weigh it in the cost model (docs/decisions/0007-paramselect-model.md).
    mechanisms: list[str] = field(default_factory=lambda: ["identity", "ug", "ag", "privtree"])
    #: Self-tuned mechanisms (snh: one neural fit per case, 20-40 s on 2 CPU cores) are run only on the
    #: datasets of these user fractions; the cheap ones on all.
    self_tuned_fractions: list[float] = field(default_factory=lambda: [1.0])
    rhos: list[float] = field(default_factory=lambda: list(RHO_GRID_M))
    user_ks: list[int] = field(default_factory=lambda: [1, 5, 20])
    bands: list[list[float]] = field(default_factory=lambda: [[25.0, 100.0], [100.0, 1000.0], [1000.0, 5000.0]])
    n_queries: int = 400
    #: Noise draws averaged per case of a self-tuned mechanism (one neural fit each).
    trials: int = 1
    #: Noise draws averaged per case of the cheap mechanisms, whose identity rows are ρ's labels: with one
    #: draw the best ρ of a case is partly the luckiest draw's (docs/decisions/0007-paramselect-model.md).
    cheap_trials: int = 10
    seed: int = 0
    n_estimators: int = 50
    include_nyc_full: bool = True
    #: A denoiser trained without the cities the shipped one learned from, for their denoised SNH rows
    #: (None, the default: those cities get plain rows only). Off by default: such rows of sparse cities
    #: teach the cost model that the denoised snh wins on dense cities too, where it does not
    #: (docs/decisions/0007-paramselect-model.md).
    holdout_denoiser: str | None = None
    dask_address: str | None = None
    n_workers: int = 2


def public_datasets(p: TrainParams) -> list[dict]:
    """The public training datasets. Every one has a group = its city, for leave-city-out use."""
    root = Path(p.shared_data)
    specs = []
    sample = root / "gowalla_sample_1000users.parquet"
    if sample.exists():
        for city in GOWALLA_SAMPLE_CITIES:
            for frac in p.fractions:
                specs.append({"name": f"gowalla-sample-{city}-{frac:g}", "group": city, "city": city,
                              "source": str(sample), "fraction": frac, "seed": p.seed})
    nyc = root / "gowalla_nyc_checkins.tsv.gz"
    if p.include_nyc_full and nyc.exists():
        for frac in p.fractions:
            specs.append({"name": f"gowalla-nyc-{frac:g}", "group": "new-york", "city": "new-york",
                          "source": str(nyc), "fraction": frac, "seed": p.seed})
    specs += [synthetic_spec(s) for s in p.synthetic_seeds]
    return specs


def synthetic_spec(seed: int) -> dict:
    """A synthetic public dataset: placed in a catalog city the real data do not cover, as its own group,
    with more users and hotspots for larger seeds."""
    city = ("phoenix", "houston", "miami", "tulsa", "fargo")[seed % 5]
    return {"name": f"synthetic-{city}-{seed}", "group": f"synthetic-{seed}", "city": city, "source": "synthetic",
            "seed": seed, "n_users": 1500 * seed, "n_hotspots": 20 * seed}


def _search_settings(p: TrainParams, mechs: list[str]) -> dict:
    """The settings every dataset's rows depend on, whichever snh variant they hold."""
    trials = p.trials if set(mechs) & set(SELF_TUNED_MECHANISMS) else p.cheap_trials
    return {"epsilons": p.epsilons, "mechanisms": mechs, "rhos": p.rhos, "user_ks": p.user_ks, "bands": p.bands,
            "n_queries": p.n_queries, "trials": trials, "seed": p.seed}


def search_config(p: TrainParams, mechanisms: list[str] | None = None, city: str | None = None,
                  denoised: bool = True) -> dict:
    """The search settings a dataset's rows depend on (their cache key). ``city``: the dataset's city,
    for SNH, whose rows also depend on the shipped public denoiser where snh applies it; with
    ``denoised=False`` SNH runs without it there (``denoiser="none"``), so the table has both variants."""
    mechs = p.mechanisms if mechanisms is None else mechanisms
    if "snh" not in mechs:
        return _search_settings(p, mechs)
    return _snh_search_config(p, mechs, city is None or shipped_denoiser_usable(city_region(city))[0], denoised)


def _snh_search_config(p: TrainParams, mechs: list[str], shipped_applies: bool, denoised: bool) -> dict:
    """:func:`search_config` with snh among ``mechs``, once it is known whether the shipped denoiser
    applies to the dataset's city."""
    config = _search_settings(p, mechs)
    if shipped_applies and denoised:
        # A new denoiser is a new cache entry for the rows it changes, and only for those.
        config["snh_denoiser"] = model_fingerprint()
        config["snh_band_denoiser"] = model_fingerprint(BAND_DENOISER_PATH)  # "none" without one
        config["snh_answer"] = DENOISED_RULES_KEY  # the denoised snh's post-processing rules change its rows too
        return config
    if shipped_applies:
        config["mechanism_params"] = {"snh": {"denoiser": "none"}}
    config["snh_plain_answer"] = PLAIN_RULES_KEY  # the plain pyramid's answer rule changes its rows
    return config


def holdout_config(p: TrainParams, slow: list[str], city: str) -> dict | None:
    """SNH with the hold-out denoiser, for a city the shipped one was trained on (None where it cannot)."""
    path = Path(p.holdout_denoiser) if p.holdout_denoiser else None
    if path is None or not path.exists() or not usable_for(load_meta(path), city_region(city))[0]:
        return None
    # Denoised rows, so the denoised snh's post-processing rules are part of their key.
    return {**_search_settings(p, slow), "snh_denoiser": model_fingerprint(path),
            "snh_answer": DENOISED_RULES_KEY, "mechanism_params": {"snh": {"denoiser": str(path)}}}


def snh_configs(p: TrainParams, slow: list[str], city: str) -> list[tuple[dict, bool]]:
    """(config, rows are denoised) for a dataset's self-tuned rows: SNH with and without a public
    denoiser (the cost model must not call both "snh"). The denoised rows use the shipped denoiser where
    it applies, else the hold-out one where that applies; otherwise there is only the plain variant."""
    if not slow:
        return []
    if "snh" not in slow:
        return [(_search_settings(p, slow), False)]
    if shipped_denoiser_usable(city_region(city))[0]:
        return [(_snh_search_config(p, slow, True, True), True), (_snh_search_config(p, slow, True, False), False)]
    held = holdout_config(p, slow, city)
    return [(_snh_search_config(p, slow, False, True), False)] + ([(held, True)] if held else [])


@flow(name="paramselect-train", log_prints=True)
def paramselect_train_flow(params: TrainParams) -> dict:
    specs = public_datasets(params)
    if not specs:
        raise FileNotFoundError(f"no public training data under {params.shared_data}")
    cheap = [m for m in params.mechanisms if m not in SELF_TUNED_MECHANISMS]
    slow = [m for m in params.mechanisms if m in SELF_TUNED_MECHANISMS]
    if not cheap:
        raise ValueError(f"paramselect-train needs the identity grid (its ρ labels); got {params.mechanisms}")
    config = search_config(params, cheap)
    slow_specs = [s for s in specs if slow and float(s.get("fraction", 1.0)) in params.self_tuned_fractions]
    # The slow tasks go first so the short ones fill the workers around them.
    slow_jobs = [(dataset_rows.submit(spec, cfg, params.cache_dir), denoised)
                 for spec in slow_specs for cfg, denoised in snh_configs(params, slow, spec["city"])]
    futures = [dataset_rows.submit(spec, config, params.cache_dir) for spec in specs]
    outs = [f.result() for f in futures]
    slow_outs = [(f.result(), denoised) for f, denoised in slow_jobs]
    table = pd.concat([pd.read_csv(o["rows"]) for o in outs]
                      + [tag_denoised(pd.read_csv(o["rows"]), denoised) for o, denoised in slow_outs],
                      ignore_index=True)
    profiles: dict[str, PublicProfile] = {}
    for spec, o in zip(specs, outs, strict=True):
        # One public profile per city for predictions: the full-size dataset of that city.
        if spec.get("fraction", 1.0) == 1.0 and not spec["group"].startswith("synthetic"):
            prof = PublicProfile.from_dict(o["profile"])
            if spec["name"].startswith("gowalla-sample") or spec["group"] not in profiles:
                profiles[spec["group"]] = prof
    print(f"training table: {len(table)} rows from {len(specs)} public datasets "
          f"({sum(o['cached'] for o in outs)} cached); {', '.join(slow) or 'no self-tuned mechanism'} on "
          f"{len(slow_specs)} of them, {len(slow_outs)} row sets ({sum(o['cached'] for o, _ in slow_outs)} cached)")
    here = environment()
    row_envs = group_by_environment(outs + [o for o, _ in slow_outs])
    unrecorded = sum(len(g["row_sets"]) for g in row_envs if g["environment"] is None)
    elsewhere = sum(len(g["row_sets"]) for g in row_envs if g["environment"] not in (None, here))
    if unrecorded or elsewhere:
        print(f"of {len(outs) + len(slow_outs)} row sets, {elsewhere} were computed in another environment and "
              f"{unrecorded} in an unrecorded one (report: row_environments); their snh rows may differ from "
              "what this machine computes (neural fits are sensitive to package versions and CPU)")
    table = with_served_entropy(table, profiles)
    model = ParamSelectModel(table, profiles, params.seed, params.n_estimators)
    cv = cross_validate(table, profiles, params.seed, params.n_estimators)
    Path(params.model_path).parent.mkdir(parents=True, exist_ok=True)
    model.save(params.model_path, params.table_path)
    report = {"datasets": [s["name"] for s in specs], "rows": len(table),
              "config": {**search_config(params), "cheap_trials": params.cheap_trials, "self_tuned_datasets": [s["name"] for s in slow_specs]},
              "profiles": {k: v.to_dict() for k, v in profiles.items()}, "cross_validation": cv,
              "params": asdict(params), "environment": here,
              # Rows read from the cache may have been computed in another environment.
              "row_environments": row_envs}
    write_report(params.report_path, report)
    create_markdown_artifact(
        f"# ParamSelect\n\n{len(table)} rows, {len(specs)} public datasets.\n\n"
        f"Leave-one-city-out, error at the chosen ρ / error at the best ρ: median "
        f"{cv['chosen_rho']['median_error_ratio']:.3f}, {cv['chosen_rho']['within_10pct']:.0%} of "
        f"{cv['chosen_rho']['cases']} cases within 10%.\n",
        key="paramselect-train", description="ParamSelect training")
    print(f"cross-validated: median error ratio {cv['chosen_rho']['median_error_ratio']:.3f}, "
          f"{cv['chosen_rho']['within_10pct']:.0%} within 10% of the best ρ")
    return report


def group_by_environment(outs: list[dict]) -> list[dict]:
    """Row-set files grouped by the environment they were computed in (None: not recorded)."""
    groups: list[dict] = []
    for o in outs:
        env = o.get("environment")
        group = next((g for g in groups if g["environment"] == env), None)
        if group is None:
            group = {"environment": env, "row_sets": []}
            groups.append(group)
        group["row_sets"].append(Path(o["rows"]).name)
    return groups


def run_paramselect_train(params: TrainParams) -> dict:
    return paramselect_train_flow.with_options(
        task_runner=dask_task_runner(params.dask_address, params.n_workers))(params)
