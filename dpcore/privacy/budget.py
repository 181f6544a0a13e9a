"""Explicit privacy accounting: budgets that say how they are split, and the ledger model.

Composition is sequential (basic) composition of pure ε-DP steps: every step that reads private data
is recorded as a :class:`Charge` with the ε it consumes, the sensitivity it was calibrated to and
what it released. A mechanism receives an :class:`Accountant` holding its ε and spends parts of it;
spending beyond the total raises. The charges travel with the synopsis into the release manifest.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from dpcore import GeoDPError

# Relative slack for float round-off when parts are computed as fractions of ε.
_REL_TOL = 1e-9


class BudgetError(GeoDPError, ValueError):
    pass


class BudgetExceeded(BudgetError):
    pass


def check_epsilon(epsilon: float, what: str = "epsilon") -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError) as exc:
        raise BudgetError(f"{what} must be a number, got {epsilon!r}") from exc
    if not math.isfinite(eps) or eps <= 0:
        raise BudgetError(f"{what} must be a finite number > 0, got {epsilon!r}")
    return eps


@dataclass(frozen=True)
class Charge:
    """One ε-DP step: ``epsilon`` spent on a query of L1 ``sensitivity`` released through ``noise``.

    ``quantum``: the lattice quantum·ℤ of discrete noise on non-integer values (weight sums), None for
    integer counts; the noise is then quantum × discrete Laplace of scale sensitivity/(ε·quantum)."""

    name: str
    epsilon: float
    sensitivity: float
    noise: str
    note: str = ""
    quantum: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.quantum is None:
            del d["quantum"]
        return d


@dataclass
class Accountant:
    """Tracks the parts of one ε as a mechanism spends them (sequential composition).

    ``count_quantum``: the lattice of the discrete Laplace noise its steps add (weighted bounding's
    weight sums), recorded on every ``discrete_laplace`` charge; None for integer counts."""

    epsilon: float
    charges: list[Charge] = field(default_factory=list)
    count_quantum: float | None = None

    def __post_init__(self) -> None:
        self.epsilon = check_epsilon(self.epsilon)

    @property
    def spent(self) -> float:
        return math.fsum(c.epsilon for c in self.charges)

    @property
    def remaining(self) -> float:
        return max(0.0, self.epsilon - self.spent)

    def spend(self, name: str, epsilon: float, sensitivity: float, noise: str = "discrete_laplace",
              note: str = "", quantum: float | None = None) -> float:
        """Record a step and return its ε; refuses to go past the total. ``quantum`` defaults to the
        accountant's ``count_quantum`` for discrete Laplace steps."""
        eps = check_epsilon(epsilon, f"epsilon of step {name!r}")
        if sensitivity <= 0:
            raise BudgetError(f"sensitivity of step {name!r} must be > 0")
        if self.spent + eps > self.epsilon * (1 + _REL_TOL):
            raise BudgetExceeded(
                f"step {name!r} asks for ε={eps:g} but only {self.remaining:g} of {self.epsilon:g} is left"
            )
        if quantum is None and noise == "discrete_laplace":
            quantum = self.count_quantum
        self.charges.append(Charge(name, eps, float(sensitivity), noise, note,
                                   None if quantum is None else float(quantum)))
        return eps

    def spend_fraction(self, name: str, fraction: float, sensitivity: float, noise: str = "discrete_laplace",
                       note: str = "") -> float:
        if not (0 < fraction <= 1):
            raise BudgetError(f"fraction for {name!r} must be in (0, 1], got {fraction}")
        return self.spend(name, self.epsilon * fraction, sensitivity, noise, note)

    def spend_rest(self, name: str, sensitivity: float, noise: str = "discrete_laplace", note: str = "") -> float:
        rest = self.epsilon - self.spent
        if rest <= self.epsilon * _REL_TOL:
            raise BudgetExceeded(f"no budget left for step {name!r}")
        return self.spend(name, rest, sensitivity, noise, note)

    def to_list(self) -> list[dict]:
        return [c.to_dict() for c in self.charges]


def split_epsilon(epsilon: float, weights: dict[str, float]) -> dict[str, float]:
    """Split ε in proportion to positive weights; the parts sum to ε exactly up to round-off."""
    eps = check_epsilon(epsilon)
    if not weights or any(w <= 0 for w in weights.values()):
        raise BudgetError("budget split weights must be positive")
    total = math.fsum(weights.values())
    return {k: eps * w / total for k, w in weights.items()}
