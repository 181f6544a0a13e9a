"""Rows of ParamSelect's training table, measured on PUBLIC datasets (the flow in
flows/paramselect_flow.py runs them)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpcore.geo import Region
from dpcore.paramselect.choose import kept_fraction_for
from dpcore.paramselect.features import (
    RHO_GRID_M,
    ParamSelectError,
    PublicProfile,
    config_columns,
    feature_row,
    searches_rho,
)


def training_rows(dataset: str, group: str, x: np.ndarray, y: np.ndarray, user: np.ndarray, region: Region,
                  profile: PublicProfile, *, epsilons: tuple[float, ...], privacy_unit: str,
                  ks: tuple[int | None, ...] = (None,), mechanisms: tuple[str, ...] = ("identity",),
                  rhos: tuple[float, ...] = RHO_GRID_M, bands: tuple[tuple[float, float], ...] | None = None,
                  n_queries: int = 400, trials: int = 1, seed: int = 0,
                  mechanism_params: dict[str, dict] | None = None,
                  progress: Callable[[int, int, str], None] | None = None,
                  workload: str = "data") -> list[dict]:
    """Error of every configuration on one PUBLIC dataset, with the evaluation harness's protocol
    (query centres from ``workload``: by default the dataset's own points, as the evaluation's).

    ``profile`` is the public profile used for the features (the dataset's own: it is public data).
    Rows carry the features, the configuration and ``error`` (mean relative error over the band).
    ``progress(done, total, what)`` is called after each configuration's fits.
    """
    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.evaluation.range import (
        PARAMSELECT_WORKLOAD_STREAM,
        RegionData,
        fit_and_scale,
        make_fit_input,
        protocol_workloads,
    )
    from dpcore.privacy.noise import NoiseSource
    from dpcore.queries.range import DEFAULT_QUERY_SIDES_M

    bands = tuple(bands or DEFAULT_QUERY_SIDES_M)
    data = RegionData(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), np.asarray(user), region)
    if data.n_points == 0:
        raise ParamSelectError(f"public dataset {dataset} has no points in {region.name}")
    psi = psi_for(data.n_points)
    workloads = protocol_workloads(data, bands, n_queries, seed, stream=PARAMSELECT_WORKLOAD_STREAM,
                                   workload=workload)
    extra = mechanism_params or {}
    rows = []
    configs = [(m, r) for m in mechanisms if searches_rho(m) for r in rhos]
    configs += [(m, None) for m in mechanisms if not searches_rho(m)]
    total, done = len(ks) * len(epsilons) * len(configs), 0
    for k in ks:
        kept = profile.kept_fraction.get(k, kept_fraction_for(profile, k)) if k is not None else 1.0
        for eps in epsilons:
            for mech, rho in configs:
                errs: list[list[np.ndarray]] = [[] for _ in workloads]
                for trial in range(trials):
                    noise = NoiseSource.seeded(int(np.random.SeedSequence(
                        [seed, trial, int(eps * 1e6), k or 0, sum(map(ord, mech)), int(rho or 0)]).generate_state(1)[0]))
                    fit_input = make_fit_input(data, privacy_unit, int(k) if k is not None else 1, noise.rng)
                    params = {**extra.get(mech, {}), **({"cell_width_m": rho} if rho else {})}
                    syn = fit_and_scale(mech, params, fit_input, eps, noise, data.n_points)
                    for w, (_, boxes, truth) in enumerate(workloads):
                        errs[w].append(relative_error(syn.answer(boxes), truth, psi))
                sens = float(k) if k is not None else 1.0
                n_noised = data.n_points * kept
                for w, ((a, b), _, _) in enumerate(workloads):
                    rows.append({"dataset": dataset, "group": group, "privacy_unit": privacy_unit,
                                 "k": k, "epsilon": eps, "band_lo": a, "band_hi": b, "mechanism": mech,
                                 "rho": rho, "n_points": data.n_points,
                                 "error": float(np.concatenate(errs[w]).mean()),
                                 **feature_row(n_noised, eps, sens, profile.entropy, (a, b), kept),
                                 **config_columns(mech, rho)})
                done += 1
                if progress is not None:
                    progress(done, total, f"{privacy_unit} k={k or '-'} ε={eps:g} {mech}"
                                          + (f" ρ={rho:g}" if rho else ""))
    return rows
