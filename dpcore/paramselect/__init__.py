"""ParamSelect: choose the grid width ρ (and k, and the mechanism) from PUBLIC data only, no budget.

SNH paper (Zeighami et al., VLDB 2022, §5): the best cell width depends on n, ε and how skewed the
data are; learn it from public datasets with a tree ensemble. Here:

- **Features** of a release: n, ε/s (s = sensitivity: k user-level, 1 record-level — user-level
  noise at ε with sensitivity k is record-level noise at ε/k), 1/(n·ε/s), 1/sqrt(n·ε/s), the entropy
  (bits) of a 512 × 512 histogram of a *public* dataset of the same region, the query band, and for
  user-level releases the fraction of points that survive bounding to k, measured on public data.
  No feature is ever computed from the dataset being released: :func:`select_params` has no data
  argument. n must be public (``public_total``) or a DP estimate the *mechanism* pays from its budget
  (dpcore.mechanisms.sample_size); the release records which. Nothing in this package spends budget.
- **Labels** (training table, built by ``flows/paramselect_flow.py`` on public data): the mean
  relative error of every (mechanism, ρ, k) configuration on public datasets × ε × query bands, with query centres drawn from the
  dataset's points; SNH (self-tuned; only when trained with it, not in the shipped table) at the ρ it
  chooses itself, on the full-size datasets only (one neural fit per case).
- **Models** (scikit-learn ExtraTrees, as in the paper):
  ``rho_model`` regresses log10 of the empirically best identity-grid ρ (the paper's ParamSelect);
  ``cost_model`` regresses log10 of the error of a configuration, which generalises ParamSelect to
  choosing k (``max_points_per_user``) and the mechanism: the choice is the argmin of predicted error
  (:func:`pick_candidate`), among the candidates whose training rows reach within
  ``EXTRAPOLATION_FACTOR`` of the release's n·ε/s, a self-tuned candidate (snh) needing a lead of
  ``SELF_TUNED_MARGIN``, ties going to the least mean log-regret on the nearest public cases. SNH is scored as
  the variant the release would run (``snh_denoised``: with the public denoiser or without; the
  table holds both where the denoiser applies). Every choice lists its candidates' predictions.
- **Train as served**: a release's entropy feature comes from its region's public profile, so the
  training rows carry that profile's entropy too (:func:`with_served_entropy`), not their own dataset's.
- **The released city is never in its own training set**: the shipped model file holds the training
  table; a prediction for a city that appears in it refits both models without that city's rows.

Which mechanisms are weighed, and how, comes from their tags (``MechanismTags.auto_role``).

Modules: :mod:`.features` (features and the candidate families), :mod:`.model` (the regressors and their
joblib file), :mod:`.cache` (the shipped model, read once), :mod:`.choose` (the choice),
:mod:`.crossval` (leave-one-city-out evaluation), :mod:`.table` (training rows on public data). Pure
library code (numpy, pandas, scikit-learn); the Prefect/Dask flow that builds the table lives in
``flows/paramselect_flow.py``.
"""

from __future__ import annotations

from typing import Any

from dpcore.paramselect.cache import load_model, trained_mechanisms
from dpcore.paramselect.choose import (
    SELF_TUNED_MARGIN,
    Choice,
    kept_fraction_for,
    pick_candidate,
    rho_extrapolation_note,
    select_params,
)
from dpcore.paramselect.crossval import cross_validate, write_report
from dpcore.paramselect.features import (
    BASE_FEATURES,
    DEFAULT_BAND_M,
    DENOISED_COLUMN,
    ENTROPY_BINS,
    K_GRID,
    RHO_GRID_M,
    ParamSelectError,
    PublicProfile,
    auto_candidates,
    config_columns,
    cost_features,
    feature_row,
    fixed_mechanisms,
    histogram_entropy,
    kept_fractions,
    rho_mechanisms,
    searches_rho,
    self_tuned_mechanisms,
    tag_denoised,
    with_denoised_column,
    with_served_entropy,
)
from dpcore.paramselect.model import (
    COST_LEAF,
    DEFAULT_MODEL_PATH,
    DEFAULT_REPORT_PATH,
    DEFAULT_TABLE_PATH,
    EXTRAPOLATION_FACTOR,
    MODEL_DIR,
    REGRET_MIN_CASES,
    REGRET_WINDOW,
    RHO_LEAF,
    ParamSelectModel,
    Scored,
    best_rho_labels,
    case_regrets,
    training_reach,
    variant_key,
)
from dpcore.paramselect.table import training_rows

#: The candidate families as tuples, computed from the mechanisms' tags on first use.
_FAMILIES = {"RHO_MECHANISMS": rho_mechanisms, "SELF_TUNED_MECHANISMS": self_tuned_mechanisms,
             "FIXED_MECHANISMS": fixed_mechanisms, "ALL_MECHANISMS": auto_candidates, "COST_FEATURES": cost_features}


def __getattr__(name: str) -> Any:
    if name in _FAMILIES:
        return _FAMILIES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BASE_FEATURES", "COST_LEAF", "DEFAULT_BAND_M", "DEFAULT_MODEL_PATH", "DEFAULT_REPORT_PATH", "DEFAULT_TABLE_PATH",
    "DENOISED_COLUMN", "ENTROPY_BINS", "EXTRAPOLATION_FACTOR", "K_GRID", "MODEL_DIR", "REGRET_MIN_CASES",
    "REGRET_WINDOW", "RHO_GRID_M", "RHO_LEAF", "SELF_TUNED_MARGIN", "Choice", "ParamSelectError", "ParamSelectModel",
    "PublicProfile", "Scored", "auto_candidates", "best_rho_labels", "case_regrets", "config_columns",
    "cost_features", "cross_validate", "feature_row", "fixed_mechanisms", "histogram_entropy", "kept_fraction_for",
    "kept_fractions", "load_model", "pick_candidate", "rho_extrapolation_note", "rho_mechanisms", "searches_rho",
    "select_params", "self_tuned_mechanisms", "tag_denoised", "trained_mechanisms", "training_reach",
    "training_rows", "variant_key", "with_denoised_column", "with_served_entropy", "write_report",
]
