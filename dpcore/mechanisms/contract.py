"""The typed parts of the mechanism contract: privacy unit, budget, capability tags and the record a fit fills.

scikit-learn describes what an estimator can do with *tags* read by its checks and meta-estimators;
geodp's mechanisms do the same with :class:`MechanismTags`, so ParamSelect, the evaluators, release
planning, the CLI and the contract test ask a class what it can do instead of knowing it by name.
The privacy unit and the budget are values (as in OpenDP and Tumult Analytics), not strings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from dpcore import GeoDPError
from dpcore.privacy.bounding import check_privacy_unit, count_sensitivity
from dpcore.privacy.budget import Accountant, BudgetError, check_epsilon

if TYPE_CHECKING:
    from dpcore.mechanisms.inputs import MechanismInput


class MechanismError(GeoDPError, ValueError):
    pass


# -- privacy unit -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrivacyUnit:
    """Whose presence the guarantee hides: a person contributing at most ``k`` points, or one record.

    ``k`` may be None under user-level privacy only for mechanisms whose charges are calibrated per
    person whatever k is (``MechanismTags.sensitivity == "unit"``: user-normalised heatmaps)."""

    kind: Literal["user", "record"]
    k: int | None = None

    def __post_init__(self) -> None:
        check_privacy_unit(self.kind)
        if self.kind == "record" and self.k is not None:
            object.__setattr__(self, "k", None)

    @classmethod
    def user(cls, k: int | None) -> PrivacyUnit:
        return cls("user", k)

    @classmethod
    def record(cls) -> PrivacyUnit:
        return cls("record", None)

    @classmethod
    def of(cls, unit: PrivacyUnit | str, k: int | None = None) -> PrivacyUnit:
        """A unit from the legacy pair (``"user"``/``"record"``, k) or an existing unit."""
        return unit if isinstance(unit, PrivacyUnit) else cls(unit, k)  # type: ignore[arg-type]

    @property
    def count_sensitivity(self) -> int:
        """L1 sensitivity of a count histogram: k under user-level privacy, 1 under record-level."""
        return count_sensitivity(self.kind, self.k)

    @property
    def recorded_k(self) -> int | None:
        """k as release records state it (None at record level)."""
        return self.k if self.kind == "user" else None


# -- budget --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PureDP:
    """A pure ε-DP budget (sequential composition of Laplace-type steps)."""

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))


@dataclass(frozen=True)
class ZCDP:
    """A ρ-zCDP budget (discrete Gaussian steps)."""

    rho: float

    def __post_init__(self) -> None:
        r = self.rho
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r) or not 0 < r <= 1e3:
            raise BudgetError(f"rho must be a number in (0, 1000], got {r!r}")
        object.__setattr__(self, "rho", float(r))


Budget = PureDP | ZCDP


def as_budget(budget: Budget | float) -> Budget:
    """A bare number is a pure ε (what every caller passed before budgets had a type)."""
    return budget if isinstance(budget, PureDP | ZCDP) else PureDP(budget)


# -- capability tags -----------------------------------------------------------------------------------
#: How ParamSelect (and so ``auto``) treats a mechanism: it searches the cell width for it ("width"),
#: the mechanism picks its own width through ParamSelect ("self_tuned"), or it has no width ("fixed").
AutoRole = Literal["width", "self_tuned", "fixed"]


@dataclass(frozen=True)
class MechanismTags:
    """What a mechanism class can do, declared once on the class (``Mechanism.tags``).

    - ``input_type``: the data shape it reads (a :class:`~dpcore.mechanisms.inputs.MechanismInput`
      subclass that knows how to build itself from a bounded sample).
    - ``sensitivity``: every charge is calibrated to the count sensitivity of the privacy unit ("count":
      k, or 1 at record level) or to 1 per privacy unit whatever k is ("unit": user-normalised mass).
    - ``supports_weights``: every count goes through the input's weighted helpers (weighted bounding).
    - ``supports_zcdp``: it can spend a :class:`ZCDP` budget.
    - ``tunes_band``: the parameter naming the query band it tunes itself to, if any.
    - ``auto_role``: whether ``auto``/ParamSelect weighs it, and how (see :data:`AutoRole`).
    - ``heatmap``: its output is a user-mass heatmap (evaluated by the heatmap harness).
    - ``scales_to_public_total``: it scales its own output to ``public_total`` (else the release
      pipeline wraps it in dpcore.privacy.scaling).
    - ``fast_params``: cheap parameters for tests (training mechanisms default to real-release sizes).
    """

    input_type: type[MechanismInput] | None = None
    sensitivity: Literal["count", "unit"] = "count"
    supports_weights: bool = False
    supports_zcdp: bool = False
    tunes_band: str | None = None
    auto_role: AutoRole | None = None
    heatmap: bool = False
    scales_to_public_total: bool = False
    fast_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast_params", MappingProxyType(dict(self.fast_params)))
        if self.input_type is None:
            from dpcore.mechanisms.inputs import PointsInput

            object.__setattr__(self, "input_type", PointsInput)

    @property
    def auto_candidate(self) -> bool:
        return self.auto_role is not None

    def charge_sensitivity(self, unit: PrivacyUnit) -> float:
        """The L1 sensitivity every charge of this mechanism is calibrated to under ``unit``."""
        return 1.0 if self.sensitivity == "unit" else float(unit.count_sensitivity)


# -- what a fit records --------------------------------------------------------------------------------
@dataclass
class FitRecord(Accountant):
    """The accountant a mechanism spends through during a pure-ε fit, plus what it states about the fit:
    ``notes`` for the release record and ``params`` when the recorded parameters differ from
    ``get_params()`` (e.g. a width chosen during the fit). :meth:`Mechanism.fit` turns it into the
    synopsis's privacy record."""

    notes: list[str] = field(default_factory=list)
    params: dict | None = None

    def describe(self, notes: list[str] | tuple[str, ...] = (), params: dict | None = None) -> None:
        self.notes.extend(notes)
        if params is not None:
            self.params = params


@dataclass
class ZCDPRecord:
    """What a ρ-zCDP fit spends and states (charges are dicts with ``rho`` and an L2 sensitivity)."""

    rho: float
    charges: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    params: dict | None = None

    def spend(self, name: str, rho: float, l2_sensitivity: float, note: str = "") -> float:
        spent = sum(c["rho"] for c in self.charges)
        if spent + rho > self.rho * (1 + 1e-9):
            raise BudgetError(f"{name}: ρ {rho} exceeds the remaining {self.rho - spent}")
        self.charges.append({"name": name, "epsilon": None, "rho": float(rho), "sensitivity": float(l2_sensitivity),
                             "sensitivity_norm": "L2", "noise": "discrete_gaussian", "note": note})
        return float(rho)

    def describe(self, notes: list[str] | tuple[str, ...] = (), params: dict | None = None) -> None:
        self.notes.extend(notes)
        if params is not None:
            self.params = params
