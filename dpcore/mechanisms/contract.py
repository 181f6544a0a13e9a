"""The typed parts of the mechanism contract: privacy unit, budget, capability tags and the record a fit fills.

scikit-learn describes what an estimator can do with *tags* read by its checks and meta-estimators;
geodp's mechanisms do the same with :class:`MechanismTags`, so ParamSelect, the evaluators, release
planning, the CLI and the contract test ask a class what it can do instead of knowing it by name.
Capability tags live in dpcore.mechanisms.tags (they name an input type, so they sit above
dpcore.mechanisms.inputs, which uses this module). The privacy unit and the budget are values (as in OpenDP and Tumult Analytics), not strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dpcore import GeoDPError
from dpcore.privacy.bounding import check_privacy_unit, count_sensitivity
from dpcore.privacy.budget import Accountant, BudgetError, check_epsilon


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
