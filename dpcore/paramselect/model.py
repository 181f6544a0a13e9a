"""ParamSelect's model: two ExtraTrees regressors over a public training table, saved with joblib."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.paramselect.features import (
    BASE_FEATURES,
    DENOISED_COLUMN,
    RHO_GRID_M,
    ParamSelectError,
    PublicProfile,
    config_columns,
    cost_features,
    searches_rho,
    self_tuned_mechanisms,
    with_denoised_column,
)

MODEL_DIR = Path(__file__).resolve().parent.parent / "models"
DEFAULT_MODEL_PATH = MODEL_DIR / "paramselect_model.joblib"
DEFAULT_TABLE_PATH = MODEL_DIR / "paramselect_table.csv"
DEFAULT_REPORT_PATH = MODEL_DIR / "paramselect_model.json"
#: Leaf sizes: leaves of 10 keep the shipped cost model a few MB (docs/decisions/0007-paramselect-model.md).
COST_LEAF = 10
RHO_LEAF = 3
#: How far beyond the largest n·ε/s of its training rows a mechanism's predicted cost is trusted.
EXTRAPOLATION_FACTOR = 4.0
#: Ties in predicted error go to the least mean log-regret (log of error over the case's best) over
#: training cases within ±REGRET_WINDOW of the release's log10(n·ε/s), widened to take in at least the
#: REGRET_MIN_CASES nearest distinct values. Regret, not rank: the goal is the ratio to the best, and a
#: mechanism second by 1% ranks as badly as one second by 30%.
REGRET_WINDOW = 0.5
REGRET_MIN_CASES = 3


@dataclass(frozen=True)
class Scored:
    """One candidate of a choice: its predicted error, and whether that prediction is within reach."""

    mechanism: str
    cell_width_m: float
    predicted_error: float
    within_reach: bool


class ParamSelectModel:
    """Two ExtraTrees regressors trained on a public training table (see module docstring)."""

    def __init__(self, table: pd.DataFrame, profiles: dict[str, PublicProfile], seed: int = 0,
                 n_estimators: int = 50, exclude_groups: tuple[str, ...] = ()):
        self.table = with_denoised_column(table.reset_index(drop=True))
        self.profiles = profiles
        self.seed = seed
        self.n_estimators = n_estimators
        self.exclude_groups = tuple(sorted(set(exclude_groups)))
        train = self.table[~self.table["group"].isin(self.exclude_groups)]
        if train.empty:
            raise ParamSelectError("the ParamSelect training table is empty after excluding "
                                   f"{list(self.exclude_groups)}")
        self.cost_model = _extra_trees(seed, n_estimators, COST_LEAF).fit(train[cost_features()].to_numpy(),
                                                                np.log10(train["error"].to_numpy() + 1e-6))
        best = best_rho_labels(train)
        self.rho_model = _extra_trees(seed, n_estimators, RHO_LEAF).fit(best[BASE_FEATURES].to_numpy(),
                                                               np.log10(best["best_rho"].to_numpy()))
        self._summarise(train)

    def _summarise(self, train: pd.DataFrame) -> None:
        """What choices read from the training rows besides the two models (derived, not saved)."""
        self.groups = sorted(train["group"].unique())
        self.mechanisms = sorted(train["mechanism"].unique())
        self.reach = training_reach(train)
        self.case_regrets = case_regrets(train)

    # Training-time helpers are static so the flow and the CV can use them on any table.
    def without(self, groups: tuple[str, ...]) -> ParamSelectModel:
        """The same model retrained without some groups (cities) of the table."""
        return ParamSelectModel(self.table, self.profiles, self.seed, self.n_estimators,
                                tuple(set(self.exclude_groups) | set(groups)))

    def predict_rho(self, features: dict[str, float]) -> float:
        x = np.array([[features[c] for c in BASE_FEATURES]])
        return float(10 ** self.rho_model.predict(x)[0])

    def rho_extrapolation(self, features: dict[str, float]) -> float | None:
        """How far (×) the release's n·ε/s lies beyond the largest one among the ρ labels, or None within
        them. Past its data a tree predicts a constant, so ρ̂ there stops shrinking as n·ε grows while the
        best ρ does not."""
        # The labels are the identity grid's cases, so their reach is the plain grid's.
        reach = self.reach.get(variant_key("identity", False))
        if reach is None:
            return None
        excess = features["log_n"] + features["log_eps_s"] - reach
        return float(10 ** excess) if excess > 0 else None

    def choose_rho(self, features: dict[str, float]) -> float:
        """The paper's regressed ρ̂, snapped to the nearest searched ρ (the widths the labels were measured at)."""
        rho_hat = self.predict_rho(features)
        grid = np.asarray(RHO_GRID_M, dtype=np.float64)
        return float(grid[int(np.argmin(np.abs(np.log(grid) - math.log(rho_hat))))])

    def predict_error(self, features: dict[str, float], mechanism: str, rho: float | None,
                      denoised: bool = False) -> float:
        row = {**features, **config_columns(mechanism, rho, denoised)}
        x = np.array([[row[c] for c in cost_features()]])
        return float(10 ** self.cost_model.predict(x)[0])

    def score_candidates(self, features: dict[str, float], mechanisms: tuple[str, ...] | list[str],
                         snh_denoised: bool = False, privacy_unit: str = "record",
                         rho: float | None = None) -> list[Scored]:
        """Predicted error of each candidate at these features (ρ mechanisms at ``rho``, by default
        :meth:`choose_rho`'s), in tie-break order (see :func:`pick_candidate`)."""
        rho = self.choose_rho(features) if rho is None else rho
        out = []
        # Trees share leaves across mechanisms where rows are few (large n·ε/s), so exact ties in
        # predicted error happen. They go to the mechanism closest to the best on the nearest training
        # cases (public data; least mean log-regret), and never to a self-tuned (neural, slow) one first.
        regret = self._mean_regret(privacy_unit, features)
        for mech in sorted(mechanisms, key=lambda m: (m in self_tuned_mechanisms(), regret.get(m, math.inf))):
            # A lone ρ mechanism without rows of its own uses the grid's predicted error at ρ.
            proxy = mech if mech in self.mechanisms else "identity"
            denoised = snh_denoised and proxy == "snh"
            err = self.predict_error(features, proxy, rho if searches_rho(proxy) else None, denoised)
            out.append(Scored(mech, rho, err, self.within_reach(features, proxy, denoised)))
        return out

    def _mean_regret(self, privacy_unit: str, features: dict[str, float]) -> dict[str, float]:
        """Mean log-regret of each mechanism over the training cases nearest to these features: same
        privacy unit, nearest band, log10(n·ε/s) within ±REGRET_WINDOW (wider if fewer than
        REGRET_MIN_CASES distinct values are that near)."""
        r = self.case_regrets
        r = r[r["privacy_unit"] == privacy_unit] if (r["privacy_unit"] == privacy_unit).any() else r
        if r.empty:
            return {}
        bands = r["log_band"].unique()
        r = r[r["log_band"] == bands[np.argmin(np.abs(bands - features["log_band"]))]]
        distance = (r["snr"] - (features["log_n"] + features["log_eps_s"])).abs()
        cases = np.sort(distance.unique())
        limit = max(REGRET_WINDOW, float(cases[min(REGRET_MIN_CASES, cases.size) - 1]))
        return r[distance <= limit].groupby("mechanism")["log_regret"].mean().to_dict()

    def within_reach(self, features: dict[str, float], mechanism: str, denoised: bool = False) -> bool:
        """Whether the release's n·ε/s is at most EXTRAPOLATION_FACTOR × the largest one the mechanism
        (variant) has training rows at."""
        reach = self.reach.get(variant_key(mechanism, bool(denoised) and mechanism == "snh"))
        return reach is not None and features["log_n"] + features["log_eps_s"] <= reach + math.log10(
            EXTRAPOLATION_FACTOR)

    def save(self, path: str | Path = DEFAULT_MODEL_PATH, table_path: str | Path | None = None) -> None:
        """Write the model (joblib) and its training table (CSV, default: next to it, same stem)."""
        import joblib

        p = Path(path)
        tp = Path(table_path) if table_path else _table_path_for(p)
        self.table.to_csv(tp, index=False, float_format="%.6g")
        joblib.dump({"cost_model": self.cost_model, "rho_model": self.rho_model, "seed": self.seed,
                     "n_estimators": self.n_estimators, "exclude_groups": self.exclude_groups,
                     "profiles": {k: v.to_dict() for k, v in self.profiles.items()},
                     "table_file": tp.name}, p, compress=3)

    @classmethod
    def load(cls, path: str | Path = DEFAULT_MODEL_PATH) -> ParamSelectModel:
        import joblib

        p = Path(path)
        if not p.exists():
            raise ParamSelectError(f"no ParamSelect model at {p}; train one with `geodp paramselect train`")
        try:
            blob = joblib.load(p)
        except Exception as exc:  # joblib raises pickle, zlib or key errors for a file that is not a model
            raise ParamSelectError(f"{p} is not a ParamSelect model file ({type(exc).__name__})") from exc
        if not isinstance(blob, dict) or "table_file" not in blob:
            raise ParamSelectError(f"{p} is not a ParamSelect model file (written by `geodp paramselect train`)")
        table_path = p.parent / blob["table_file"]
        if not table_path.exists():
            # The trees are refitted without the released city from this table, so the model needs it.
            raise ParamSelectError(f"the ParamSelect model {p} needs its training table {table_path}, which is "
                                   "missing: keep the two files together")
        obj = cls.__new__(cls)
        obj.table = with_denoised_column(pd.read_csv(table_path))
        obj.profiles = {k: PublicProfile.from_dict(v) for k, v in blob["profiles"].items()}
        obj.seed, obj.n_estimators = blob["seed"], blob["n_estimators"]
        obj.exclude_groups = tuple(blob["exclude_groups"])
        obj.cost_model, obj.rho_model = blob["cost_model"], blob["rho_model"]
        obj._summarise(obj.table[~obj.table["group"].isin(obj.exclude_groups)])
        return obj


def training_reach(table: pd.DataFrame) -> dict[str, float]:
    """Per mechanism variant (:func:`variant_key`): the largest log10(n·ε/s) of its rows."""
    variant = [variant_key(m, bool(d)) for m, d in zip(table["mechanism"], table[DENOISED_COLUMN], strict=True)]
    return (table["log_n"] + table["log_eps_s"]).groupby(variant).max().to_dict()


def variant_key(mechanism: str, denoised: bool) -> str:
    """A mechanism variant's name in :attr:`ParamSelectModel.reach`: "snh/1" is the denoised snh."""
    return f"{mechanism}/{int(denoised)}"


def case_regrets(table: pd.DataFrame) -> pd.DataFrame:
    """Per training case (dataset, ε, unit, k, band): each mechanism's log-regret, ln(error / least
    error of any mechanism measured on the case; 0 = the best; ρ mechanisms at their best ρ), with the
    case's unit, log_band and log10(n·ε/s)."""
    keys = ["dataset", "epsilon", "privacy_unit", "k", "log_band"]
    plain = table[table[DENOISED_COLUMN] == 0]  # one row set per mechanism and case
    best = plain.groupby(keys + ["mechanism"], dropna=False).agg(
        error=("error", "min"), snr=("log_n", "first"), log_eps_s=("log_eps_s", "first")).reset_index()
    best["snr"] = best["snr"] + best.pop("log_eps_s")
    # The floor keeps a zero-error case (an empty band) from making every regret infinite.
    floor = best.groupby(keys, dropna=False)["error"].transform("min").clip(lower=1e-12)
    best["log_regret"] = np.log(best["error"].clip(lower=1e-12) / floor)
    return best[["privacy_unit", "log_band", "snr", "mechanism", "log_regret"]]


def _table_path_for(model_path: Path) -> Path:
    stem = model_path.name.split(".")[0]
    return model_path.with_name(stem.replace("_model", "") + "_table.csv")


def _extra_trees(seed: int, n_estimators: int, min_samples_leaf: int):
    from sklearn.ensemble import ExtraTreesRegressor

    return ExtraTreesRegressor(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf, random_state=seed,
                               n_jobs=1)


def best_rho_labels(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, ε, unit, k, band): the identity-grid ρ with the lowest error (the label)."""
    ident = table[table["mechanism"] == "identity"]
    keys = ["dataset", "group", "epsilon", "privacy_unit", "k", "band_lo", "band_hi"]
    idx = ident.groupby(keys, dropna=False)["error"].idxmin()
    best = ident.loc[idx].copy()
    best["best_rho"] = best["rho"].astype(np.float64)  # self-tuned rows leave ρ empty (object dtype)
    return best
