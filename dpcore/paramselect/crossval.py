"""Leave-one-city-out cross-validation of ParamSelect's choices, and its report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.paramselect.choose import pick_candidate
from dpcore.paramselect.features import (
    BASE_FEATURES,
    DENOISED_COLUMN,
    PublicProfile,
    auto_candidates,
    with_denoised_column,
)
from dpcore.paramselect.model import ParamSelectModel


def cross_validate(table: pd.DataFrame, profiles: dict[str, PublicProfile], seed: int = 0,
                   n_estimators: int = 50, useful_error: float = 1.0) -> dict:
    """Leave-one-group(city)-out CV of the ρ choice and of the mechanism choice.

    For each held-out group, a model that never saw it chooses:
    - ρ (:meth:`ParamSelectModel.choose_rho`: the paper's regressed ρ̂ snapped to the searched grid);
      the identity-grid error there is compared with the best
      searched ρ's. Cases whose best error exceeds ``useful_error`` (releases too noisy to be useful:
      tiny n·ε/k) are counted separately.
    - the mechanism, as ``auto`` does (:meth:`ParamSelectModel.score_candidates`, :func:`pick_candidate`),
      on every case with rows for all mechanisms; snh is the variant a release of that city would run
      (denoised where the table has denoised rows). The chosen candidate's error (the grid's at its
      chosen ρ) is compared with the best candidate's.
    The table's features are those a release would use (see :func:`with_served_entropy`).
    """
    table = with_denoised_column(table)
    groups = sorted(table["group"].unique())
    mechs = [m for m in auto_candidates() if m in set(table["mechanism"])]
    out: dict[str, list[float]] = {"chosen": []}
    choice: dict[str, list[float]] = {"record": [], "user": []}
    per_group = {}
    skipped = 0
    keys = ["dataset", "epsilon", "privacy_unit", "k", "band_lo"]
    for g in groups:
        train = table[table["group"] != g]
        if train.empty:
            continue
        model = ParamSelectModel(train, profiles, seed, n_estimators)
        g_ratios = []
        for (_, _, unit, _, _), grp in table[table["group"] == g].groupby(keys, dropna=False):
            feats = {c: float(grp.iloc[0][c]) for c in BASE_FEATURES}
            ident = grp[grp["mechanism"] == "identity"]
            rhos = ident["rho"].to_numpy(dtype=float)
            errs = ident["error"].to_numpy(dtype=float)
            rho_ref = model.choose_rho(feats)
            at_ref = float(errs[np.argmin(np.abs(np.log(rhos) - math.log(rho_ref)))])
            best_err = float(errs.min())
            if best_err > useful_error:
                skipped += 1
            else:
                out["chosen"].append(at_ref / best_err)
                g_ratios.append(at_ref / best_err)
            if set(mechs) <= set(grp["mechanism"]):
                denoised = bool((grp[DENOISED_COLUMN] == 1).any())
                truth = {"identity": at_ref}
                for m in mechs:
                    rows = grp[(grp["mechanism"] == m) & ((grp[DENOISED_COLUMN] == 1) == (denoised and m == "snh"))]
                    if m != "identity" and len(rows):
                        truth[m] = float(rows["error"].iloc[0])
                if len(truth) == len(mechs):
                    chosen, _ = pick_candidate(model.score_candidates(feats, mechs, denoised, unit, rho_ref))
                    choice[unit].append(truth[chosen.mechanism] / min(truth.values()))
        if g_ratios:
            per_group[g] = {"cases": len(g_ratios), "median_error_ratio": float(np.median(g_ratios)),
                            "within_10pct": float(np.mean(np.array(g_ratios) <= 1.10))}
    summary = {}
    for name, vals in out.items():
        v = np.array(vals)
        summary[name] = {"cases": int(v.size), "median_error_ratio": float(np.median(v)),
                         "mean_error_ratio": float(np.mean(v)),
                         "within_10pct": float(np.mean(v <= 1.10)), "within_25pct": float(np.mean(v <= 1.25)),
                         "worse_than_2x": float(np.mean(v > 2.0))}
    choice_summary = {}
    for name, vals in {**choice, "all": choice["record"] + choice["user"]}.items():
        v = np.array(vals)
        if v.size:
            choice_summary[name] = {"cases": int(v.size), "mean_error_ratio": float(v.mean()),
                                    "within_5pct": float(np.mean(v <= 1.05)), "worse_than_1.2x": float(np.mean(v > 1.2))}
    return {"cv": "leave-one-group-out", "groups": groups, "useful_error": useful_error,
            "skipped_useless_cases": skipped, "chosen_rho": summary["chosen"],
            "per_group": per_group, "mechanism_choice": {"candidates": mechs, **choice_summary}}


def write_report(path: str | Path, report: dict) -> None:
    Path(path).write_text(json.dumps(report, indent=2, default=float))


# -- building the training table (called per dataset by flows/paramselect_flow.py) ------------------
