"""A release request: what one run asks for (its budget as ε or ρ, privacy unit, period, mechanism,
regions and input), validated in one place before any store is opened or any file read.

:func:`release_request` is the first step of the plan (tasks/release_plan.py): a bad value, name or
window is one line here, and nothing is written (the store is not even created), so the CLI runs no
checks of its own before the plan. The mechanism is built once here and the input listed once (over the
period's window): the plan reuses both. A backfill (tasks.release_plan.plan_days) checks its parameters and
lists its input once for all its days; each day's request is that one, narrowed to the day
(:meth:`ReleaseRequest.for_day`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from dpcore.data.inputs import InputSet, nonempty, resolve_files
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
    #: the input as listed over ``listed_window`` (the period's; (None, None) for a period without bounds);
    #: None when not listed here (a run submitted to a served deployment whose input only it can list)
    input: InputSet | None
    listed_window: tuple[int | None, int | None]


    def for_day(self, day: str) -> ReleaseRequest:
        """The same request for one UTC day of its period (a backfill's day): the input as this request
        listed it, narrowed to the day's files (the files, and so the data version in the release keys, a
        listing over the day alone finds); nothing is checked or listed again."""
        period = parse_period(day)
        window = (period.start_s, period.end_s)
        return dataclasses.replace(self, params=self.params.model_copy(update={"period": day}), period=period,
                                   input=nonempty(self.input.within(window)), listed_window=window)


def release_request(params: ReleaseParams, now: datetime | None = None, listed: bool = True) -> ReleaseRequest:
    """Check a run's request from its parameters alone (``now``: a scheduled run's start, which relative
    periods count from); raises the first problem as a GeoDPError (one line). ``listed`` False leaves the
    input unlisted (``input`` None)."""
    kind, value = release_budget(params.epsilon, params.rho)
    period = parse_period(params.period, now=now)
    dataset = dataset_name(params.data, params.dataset)
    mechanism = build_mechanism(params.mechanism, params.mechanism_params)
    regions = tuple(resolve_regions(params.cities, params.center, params.side_km))
    window = (period.start_s, period.end_s)
    # the one listing of the input: a missing input, or none of its files in the period, fails here
    found = resolve_files(params.data, params.format, window) if listed else None
    return ReleaseRequest(params, dataset, Budget(kind, value), PrivacyUnitName(params.privacy_unit), period,
                          mechanism, regions, found, window)

