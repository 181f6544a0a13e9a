"""ParamSelect's features: what a release looks like to the cost model, from public inputs only,
and which mechanisms ParamSelect weighs (read from the mechanisms' tags, never listed by name)."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from dpcore import GeoDPError
from dpcore.geo import Region
from dpcore.grid.histogram import grid_counts

#: Cell widths searched when building labels (geometric, ×√2 steps from 25 m to 3.2 km).
RHO_GRID_M: tuple[float, ...] = tuple(float(round(25 * 2 ** (i / 2), 1)) for i in range(15))
#: Contribution bounds searched for user-level releases.
K_GRID: tuple[int, ...] = (1, 2, 5, 10, 20, 50)
DEFAULT_BAND_M: tuple[float, float] = (100.0, 1000.0)
ENTROPY_BINS = 512

BASE_FEATURES = ["log_n", "log_eps_s", "inv_n_eps", "inv_sqrt_n_eps", "entropy", "log_band", "kept_fraction"]
#: SNH rows run with the public denoiser (1) or without it (0). Where the shipped denoiser applies
#: the table holds both variants; the cost model must tell them apart, as auto's snh is the denoised one
#: exactly where :func:`dpcore.models.denoiser_meta.shipped_denoiser_usable` says so.
DENOISED_COLUMN = "snh_denoised"


# -- which mechanisms ParamSelect weighs (MechanismTags.auto_role) -------------------------------------
@functools.cache
def _roles() -> tuple[tuple[str, str], ...]:
    from dpcore.mechanisms import builtin_order, get_mechanism_class

    roles = ((name, get_mechanism_class(name).tags.auto_role) for name in builtin_order())
    return tuple((name, role) for name, role in roles if role is not None)


def rho_mechanisms() -> tuple[str, ...]:
    """Mechanisms parameterised by a cell width ρ: ParamSelect searches it ("width") or they take it
    from ParamSelect themselves ("self_tuned"), in registry order."""
    return tuple(n for n, r in _roles() if r in ("width", "self_tuned"))


def self_tuned_mechanisms() -> tuple[str, ...]:
    """Those choosing their own ρ through ParamSelect: the table holds one row per case at that choice
    (not a ρ search, which would cost one neural fit per ρ), and ``auto`` runs them with their defaults."""
    return tuple(n for n, r in _roles() if r == "self_tuned")


def fixed_mechanisms() -> tuple[str, ...]:
    return tuple(n for n, r in _roles() if r == "fixed")


def auto_candidates() -> tuple[str, ...]:
    """Every mechanism the cost model has a column for, in column order (ρ mechanisms first, then the
    fixed ones, each in registry order). A new candidate adds a column: retrain the shipped model."""
    return rho_mechanisms() + fixed_mechanisms()


def cost_features() -> list[str]:
    return BASE_FEATURES + ["log_rho"] + [f"is_{m}" for m in auto_candidates()] + [DENOISED_COLUMN]


def searches_rho(mechanism: str) -> bool:
    """Whether the table searches ρ for this mechanism (and a choice passes ρ to it)."""
    return mechanism in rho_mechanisms() and mechanism not in self_tuned_mechanisms()


class ParamSelectError(GeoDPError, ValueError):
    pass


# -- public-data features ----------------------------------------------------------------------------
def histogram_entropy(x: np.ndarray, y: np.ndarray, region: Region, bins: int = ENTROPY_BINS) -> float:
    """Shannon entropy (bits) of the bins × bins histogram of (public) points over the region."""
    counts = grid_counts(x, y, region.bounds_m, bins).ravel().astype(np.float64)
    total = counts.sum()
    if total <= 0:
        raise ParamSelectError("no public points inside the region: cannot compute the entropy feature")
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def kept_fractions(user: np.ndarray, ks: tuple[int, ...] = K_GRID) -> dict[int, float]:
    """Fraction of points kept when every user is bounded to k points (exact expectation), per k."""
    _, counts = np.unique(np.asarray(user), return_counts=True)
    total = counts.sum()
    return {int(k): float(np.minimum(counts, k).sum() / total) for k in ks}


@dataclass
class PublicProfile:
    """What ParamSelect knows about a region, measured on a PUBLIC dataset of it."""

    region: str
    source: str
    n_points: int
    n_users: int
    entropy: float
    kept_fraction: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_points(cls, x: np.ndarray, y: np.ndarray, user: np.ndarray, region: Region, source: str) -> PublicProfile:
        return cls(region.name, source, int(x.size), int(np.unique(user).size), histogram_entropy(x, y, region),
                   kept_fractions(user))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kept_fraction"] = {str(k): v for k, v in self.kept_fraction.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PublicProfile:
        return cls(d["region"], d["source"], int(d["n_points"]), int(d["n_users"]), float(d["entropy"]),
                   {int(k): float(v) for k, v in d.get("kept_fraction", {}).items()})


def feature_row(n: float, epsilon: float, sensitivity: float, entropy: float, band: tuple[float, float],
                kept_fraction: float = 1.0) -> dict[str, float]:
    """The paper's features plus query band and bounding survival; n is the number of points noised."""
    n = max(float(n), 1.0)
    eps_s = float(epsilon) / float(sensitivity)
    ne = n * eps_s
    return {"log_n": math.log10(n), "log_eps_s": math.log10(eps_s), "inv_n_eps": 1.0 / ne,
            "inv_sqrt_n_eps": 1.0 / math.sqrt(ne), "entropy": float(entropy),
            "log_band": math.log10(math.sqrt(band[0] * band[1])), "kept_fraction": float(kept_fraction)}


def config_columns(mechanism: str, rho: float | None, denoised: bool = False) -> dict[str, float]:
    row = {"log_rho": math.log10(rho) if rho else 0.0}
    for m in auto_candidates():
        row[f"is_{m}"] = 1.0 if m == mechanism else 0.0
    row[DENOISED_COLUMN] = 1.0 if denoised and mechanism == "snh" else 0.0
    return row


def with_served_entropy(table: pd.DataFrame, profiles: dict[str, PublicProfile]) -> pd.DataFrame:
    """Rows take the entropy of the public profile their region is served with, where it has one.

    A release reads the entropy feature from its region's public profile, not from the data released,
    and a 512² histogram's entropy grows with the sample, so training on each dataset's own entropy would
    ask the model about a city at another entropy than it saw (docs/decisions/0007-paramselect-model.md).
    """
    served = table["group"].map({g: p.entropy for g, p in profiles.items()})
    return table.assign(entropy=served.fillna(table["entropy"]))


def with_denoised_column(table: pd.DataFrame) -> pd.DataFrame:
    """A table whose rows predate the denoiser column (or come from untagged sets) counts them as plain."""
    if DENOISED_COLUMN not in table.columns:
        return table.assign(**{DENOISED_COLUMN: 0.0})
    return table.assign(**{DENOISED_COLUMN: table[DENOISED_COLUMN].fillna(0.0)})


def tag_denoised(rows: pd.DataFrame, denoised: bool) -> pd.DataFrame:
    """Mark a dataset's SNH rows as run with (or without) the public denoiser."""
    return rows.assign(**{DENOISED_COLUMN: np.where(rows["mechanism"] == "snh", float(denoised), 0.0)})
