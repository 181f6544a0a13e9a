"""A release request: what one run asks for (its budget as ε or ρ, privacy unit, period, mechanism,
regions and input), validated in one place before any store is opened or any file read.

:func:`release_request` is the first step of the plan (tasks/release_plan.py): a bad value, name or
window is one line here, and nothing is written (the store is not even created), so the CLI runs no
checks of its own before the plan. The mechanism is built once here and the input listed once (over the
period's window): the plan reuses both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from dpcore.data.inputs import InputSet, resolve_files
from dpcore.geo import Region
from dpcore.mechanisms import Mechanism
from tasks.config import Period, PrivacyUnitName, ReleaseParams, parse_period, release_budget
from tasks.release_city_plan import build_mechanism, dataset_name, resolve_regions


@dataclass(frozen=True)
class Budget:
    """A release's budget: ε (pure DP) or ρ (zCDP), exactly one (tasks.config.release_budget)."""

    kind: Literal["epsilon", "rho"]
    value: float

    @property
    def epsilon(self) -> float | None:
        return self.value if self.kind == "epsilon" else None

    @property
    def rho(self) -> float | None:
        return self.value if self.kind == "rho" else None


@dataclass(frozen=True)
class ReleaseRequest:
    """One run's request, checked: every field is a parsed value, not a string."""

    params: ReleaseParams
    dataset: str
    budget: Budget
    privacy_unit: PrivacyUnitName
    period: Period
    mechanism: Mechanism  # the one instance every city of the run fits with, its parameters checked
    regions: tuple[Region, ...]
    #: the input as listed over ``listed_window`` (the period's; (None, None) for a period without bounds)
    input: InputSet
    listed_window: tuple[int | None, int | None]


def release_request(params: ReleaseParams, now: datetime | None = None) -> ReleaseRequest:
    """Check a run's request from its parameters alone (``now``: a scheduled run's start, which relative
    periods count from); raises the first problem as a GeoDPError (one line)."""
    kind, value = release_budget(params.epsilon, params.rho)
    period = parse_period(params.period, now=now)
    dataset = dataset_name(params.data, params.dataset)
    mechanism = build_mechanism(params.mechanism, params.mechanism_params)
    regions = tuple(resolve_regions(params.cities, params.center, params.side_km))
    window = (period.start_s, period.end_s)
    # the one listing of the input: a missing input, or none of its files in the period, fails here
    found = resolve_files(params.data, params.format, window)
    return ReleaseRequest(params, dataset, Budget(kind, value), PrivacyUnitName(params.privacy_unit), period,
                          mechanism, regions, found, window)
