"""Typed parameters of the platform flows (pydantic: the Prefect UI renders them as forms), periods,
config hashes. The platform configuration file (budget caps, schedules) is tasks.settings.

A release key names one (dataset, city, period, config): it is derived from public configuration and
the input's data version only, never from noise, so a retry or re-run maps to the same key.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from dpcore import GeoDPError


class ConfigError(GeoDPError, ValueError):
    pass


# ---- a release's budget: the one owner of "exactly one of ε and ρ" and of their range -----------------

#: The range ε (or ρ) of a release takes: its noise scale (k/ε) must stay a number the samplers and the
#: answers' intervals can represent (1e-300 overflowed after the charge).
MIN_BUDGET, MAX_BUDGET = 1e-6, 1000.0
ONE_BUDGET = "give exactly one of epsilon (pure ε-DP) and rho (ρ-zCDP)"


def check_budget_value(value: object, name: str = "epsilon") -> float:
    """ε (or ρ, ``name``) of a release, in [MIN_BUDGET, MAX_BUDGET]; a ConfigError (a ValueError, so a
    pydantic model reports it as its own) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not MIN_BUDGET <= float(value) <= MAX_BUDGET:
        shown = f"{value:g}" if isinstance(value, int | float) else repr(value)
        raise ConfigError(f"{name} must be > 0 and in [{MIN_BUDGET:g}, {MAX_BUDGET:g}], got {shown}")
    return float(value)


def release_budget(epsilon: float | None, rho: float | None) -> tuple[str, float]:
    """("epsilon", ε) or ("rho", ρ): exactly one of them, in range."""
    if (epsilon is None) == (rho is None):
        raise ConfigError(ONE_BUDGET)
    return ("epsilon", check_budget_value(epsilon)) if rho is None else ("rho", check_budget_value(rho, "rho"))


def _budget_field(name: str) -> Any:
    """The type of ReleaseParams.epsilon and .rho: checked by :func:`check_budget_value`; the form's schema
    says a number > 0 and ≤ MAX_BUDGET."""
    return Annotated[float, AfterValidator(lambda v: check_budget_value(v, name)),
                     WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_BUDGET})]


class PrivacyUnitName(StrEnum):
    """Whom a release protects: a person (all their points, bounded to k) or one record."""

    USER = "user"
    RECORD = "record"


@dataclass(frozen=True)
class Period:
    """A half-open UTC time window [start_s, end_s) with the label used in store paths.

    ``label`` 'all' with no bounds is the whole input (the core CLI's single release).
    """

    label: str
    start_s: int | None
    end_s: int | None

    @property
    def seconds(self) -> int | None:
        return None if self.start_s is None or self.end_s is None else self.end_s - self.start_s

    def to_dict(self) -> dict:
        iso = lambda s: None if s is None else datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
        return {"label": self.label, "start": iso(self.start_s), "end": iso(self.end_s)}


#: The days a period may name: those whose timestamps pandas holds (nanoseconds since 1970 in 64 bits),
#: as every step after the plan reads time so; a day outside is a one-line error, not an OverflowError.
FIRST_DAY, LAST_DAY = date(1678, 1, 1), date(2261, 12, 31)


def _day(text: str) -> date:
    try:
        d = date.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"a date must be YYYY-MM-DD, got {text!r}") from exc
    if not FIRST_DAY <= d <= LAST_DAY:
        raise ConfigError(f"the date {text} is outside the days geodp handles "
                          f"({FIRST_DAY.isoformat()} to {LAST_DAY.isoformat()})")
    return d


def _epoch(d: date) -> int:
    return int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp())


def parse_period(text: str | None, now: datetime | None = None) -> Period:
    """'2010-05-01' (a UTC day), '2010-05' (a month), '2010-05-01..2010-05-07' (days, inclusive), or
    None / 'all' (the whole input). 'yesterday', 'today' and 'last-N-days' (the N UTC days that end
    with yesterday: a rolling window) are relative to ``now`` (a scheduled run passes its scheduled
    start, so a late or retried run still releases the days it was meant for)."""
    if text is None or str(text).strip().lower() in ("", "all"):
        return Period("all", None, None)
    t = str(text).strip()
    rolling = re.fullmatch(r"last-(\d{1,4})-days?", t.lower())
    if rolling:
        n = int(rolling.group(1))
        if not 1 <= n <= 3660:
            raise ConfigError(f"period {t!r}: a rolling window is 1 to 3660 days")
        b = (now or datetime.now(UTC)).astimezone(UTC).date() - timedelta(days=1)
        a = b - timedelta(days=n - 1)
        return Period(f"{a.isoformat()}_{b.isoformat()}", _epoch(a), _epoch(b + timedelta(days=1)))
    if t.lower() in ("yesterday", "today"):
        d = (now or datetime.now(UTC)).astimezone(UTC).date() - timedelta(days=1 if t.lower() == "yesterday" else 0)
        return Period(d.isoformat(), _epoch(d), _epoch(d + timedelta(days=1)))
    if ".." in t:
        a, b = (_day(s) for s in t.split("..", 1))
        if b < a:
            raise ConfigError(f"period {t!r} ends before it starts")
        return Period(f"{a.isoformat()}_{b.isoformat()}", _epoch(a), _epoch(b + timedelta(days=1)))
    if re.fullmatch(r"\d{4}-\d{2}", t):
        a = _day(t + "-01")
        nxt = date(a.year + (a.month == 12), a.month % 12 + 1, 1)
        return Period(t, _epoch(a), _epoch(nxt))
    d = _day(t)
    return Period(d.isoformat(), _epoch(d), _epoch(d + timedelta(days=1)))


def period_days(text: str, what: str = "period") -> tuple[str, str]:
    """The first and last UTC day (YYYY-MM-DD) of days A..B, a month, a day or last-N-days: a backfill's
    days and a dataset's horizon read their FIRST..LAST with :func:`parse_period`, as a release does."""
    p = parse_period(text)
    if p.start_s is None or p.end_s is None or str(text).strip().lower() in ("today", "yesterday"):
        raise ConfigError(f"{what} must be days FIRST..LAST or a month, got {text!r}")
    day = lambda s: datetime.fromtimestamp(s, UTC).date().isoformat()  # noqa: E731
    return day(p.start_s), day(p.end_s - 1)


def days_between(start: str, end: str) -> list[str]:
    """Every day from start to end inclusive, as YYYY-MM-DD."""
    a, b = _day(start), _day(end)
    if b < a:
        raise ConfigError(f"--end {end} is before --start {start}")
    if (b - a).days > 3660:
        raise ConfigError("a backfill covers at most ten years of days")
    return [(a + timedelta(days=i)).isoformat() for i in range((b - a).days + 1)]


def canonical_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _split_commas(v: Any) -> Any:
    """'a, b,c' → ['a', 'b', 'c'] (CLI and UI forms may give one comma-separated string)."""
    if isinstance(v, str):
        return [c.strip() for c in v.split(",") if c.strip()]
    return v


#: A list of names that also accepts one comma-separated string; the JSON schema (the Prefect form and the
#: server's parameter check) says so too, so 'a,b' from a form or the API is not refused before validation.
NameList = Annotated[list[str], BeforeValidator(_split_commas, json_schema_input_type=list[str] | str)]


def _mechanism_enum(schema: dict[str, Any]) -> None:
    """The form's mechanism choice: every registered name (dpcore.mechanisms), read when a schema is
    built, so a mechanism added to the registry appears without an edit here."""
    from dpcore.mechanisms import mechanism_names

    schema["enum"] = mechanism_names()


def _mechanism_params_schema(schema: dict[str, Any]) -> None:
    """The form's parameters: one typed object per mechanism, its constructor's parameters with their
    constraints and defaults (the pydantic model the mechanism base class builds from them)."""
    from dpcore.mechanisms import get_mechanism_class, mechanism_names

    variants = []
    for name in mechanism_names():
        model = get_mechanism_class(name)._params_model
        variant = model.model_json_schema() if model is not None else {"type": "object", "properties": {},
                                                                       "additionalProperties": False}
        variants.append({**variant, "title": f"{name} parameters"})
    schema.pop("additionalProperties", None)
    schema["anyOf"] = variants


def _one_budget_required(schema: dict[str, Any]) -> None:
    """ε or ρ is required: the form and the Prefect server's parameter check refuse a run without one."""
    schema["anyOf"] = [{"required": [name], "properties": {name: {"type": "number"}}} for name in ("epsilon", "rho")]


class ReleaseParams(BaseModel):
    """One release: a dataset, a period, a list of cities, the mechanism and its budget."""

    # extra="forbid": a misspelled key (config file, form, API) is an error
    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_budget_required)

    data: str = Field(description="input point table (path or URL readable on the workers)")
    cities: NameList = Field(default_factory=list,
                             description="catalog city slugs (see `geodp cities`); at least one, unless a center is given")
    period: str | None = Field(default=None, description="YYYY-MM-DD, YYYY-MM, A..B, yesterday, "
                                  "last-N-days (rolling), or empty for the whole input")
    epsilon: _budget_field("epsilon") | None = Field(
        default=None, description="ε per city-release (pure ε-DP); this or rho is required")
    rho: _budget_field("rho") | None = Field(
        default=None, description="ρ per city-release (ρ-zCDP with discrete Gaussian noise), instead of ε")
    mechanism: str = Field(default="identity", json_schema_extra=_mechanism_enum,
                           description="the mechanism (README: which mechanism to use when), or auto")
    mechanism_params: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra=_mechanism_params_schema,
        description="parameters of the chosen mechanism (its own typed set; a name it does not take is refused)")
    max_points_per_user: Annotated[int, Field(ge=1, le=1_000_000)] | Literal["auto"] | None = Field(
        default=None, description="k: contribution bound per person (default: the dataset's policy, 20 for a "
        "new dataset), or auto: chosen before the charge from the newest published release of each region "
        "(its noisy contribution profile and map), under a policy that allows it")
    privacy_unit: PrivacyUnitName = PrivacyUnitName.USER
    store: str | None = Field(default=None, description="release store URL (folder, file://, s3://); empty = "
                              "the configuration's store, which holds the datasets' ledgers too")
    dataset: str | None = Field(default=None, description="dataset name in the store (default: file stem)")
    budget_cap: float | None = Field(default=None, gt=0,
                                     description="ε one person may lose from a NEW dataset over its life "
                                     "(sets its policy; must match an existing one)")
    data_version: str | None = Field(default=None, description="operator-declared public version of the "
                                     "input (default: its files' modification time)")
    center: str | None = Field(default=None, description="custom region LAT,LON instead of cities")
    side_km: float | None = Field(default=None, gt=0)
    slot: str = Field(default="1h", description="time slot for spatio-temporal mechanisms")
    public_total: float | None = Field(default=None, description="PUBLIC point total (single region only)")
    seed: int | None = Field(default=None, description="seeded noise for experiments (NOT for publication)")
    columns: str | None = None
    format: str = "auto"
    strict: bool = Field(default=False, description="fail on the first invalid row instead of dropping it (the "
                         "run's message names the option only; `geodp data check DATA --strict` shows the row)")
    dask_address: str | None = Field(default=None, description="Dask scheduler address; empty = LocalCluster")
    n_workers: int = Field(default=2, ge=1, le=64, description="LocalCluster workers when no address is given")
    count: Literal["points", "people"] = Field(default="points", description="what cells count: points, or "
                                               "distinct people (each person in at most k cells, user level)")
    publish_anyway: bool = Field(default=False, description="publish a release the plan expects to be worse than "
                                 "a blank map at every band (the manifest's quality.plan records it)")


    @field_validator("mechanism")
    @classmethod
    def _known_mechanism(cls, v: str) -> str:
        from dpcore.mechanisms import mechanism_names

        if v not in mechanism_names():
            raise ValueError(f"unknown mechanism {v!r}; one of {', '.join(mechanism_names())}")
        return v

    @model_validator(mode="after")
    def _one_budget(self) -> ReleaseParams:
        release_budget(self.epsilon, self.rho)
        if not self.cities and not self.center:
            # an empty list once meant every catalog city: one click released (and charged) all of them
            raise ValueError("give at least one city (catalog slugs, see `geodp cities`) or a center")
        from dpcore.mechanisms import get_mechanism_class

        model = get_mechanism_class(self.mechanism)._params_model
        known = set(model.model_fields) if model is not None else set()
        unknown = sorted(set(self.mechanism_params) - known)
        if unknown:
            raise ValueError(f"{self.mechanism} takes no parameter {', '.join(unknown)}; its parameters: "
                             f"{', '.join(sorted(known)) or 'none'}")
        return self


class BackfillParams(BaseModel):
    """A backfill: one release per day from start to end (inclusive), skipping committed days."""

    model_config = ConfigDict(extra="forbid")

    release: ReleaseParams
    start: str = Field(description="first day, YYYY-MM-DD")
    end: str = Field(description="last day, YYYY-MM-DD (inclusive)")


def parse_window(text: str) -> tuple[int, int]:
    """The one time-window syntax (every command, the read API, the flows' models) → [start_s, end_s) in
    UTC seconds. A..B with days is A to B inclusive (as a release's period); with times (2024-01-01T06:00)
    it is A up to B; YYYY-MM-DD is one day, YYYY-MM one month, and 'yesterday' / 'last-N-days' as in
    :func:`parse_period`. The older START/END form (END exclusive) is read too."""
    t = str(text).strip()
    if "/" in t and ".." not in t:
        a, sep, b = t.partition("/")
        return _timestamps(a, b, t, "a window must be A..B (or START/END), e.g. 2008-05-18..2008-06-07")
    if ".." in t:
        a, b = (s.strip() for s in t.split("..", 1))
        if not (_DAY.fullmatch(a) and _DAY.fullmatch(b)):
            return _timestamps(a, b, t, "a window must be A..B with dates or ISO times")
    period = parse_period(t)
    if period.start_s is None or period.end_s is None:
        raise ConfigError(f"a time window is needed (A..B, a day or a month), got {t!r}")
    return period.start_s, period.end_s


_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _timestamps(a: str, b: str, text: str, form: str) -> tuple[int, int]:
    """[a, b) from two ISO dates or times (UTC unless they say otherwise)."""
    import pandas as pd

    try:
        t0, t1 = (pd.Timestamp(v.strip()) for v in (a, b))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{form}, got {text!r}") from exc
    if pd.isna(t0) or pd.isna(t1):
        raise ConfigError(f"{form}, got {text!r}")
    t0, t1 = (t if t.tzinfo is not None else t.tz_localize("UTC") for t in (t0, t1))
    if t1 <= t0:
        raise ConfigError(f"window {text!r} ends before it starts")
    return int(t0.timestamp()), int(t1.timestamp())


class STEvaluateOptions(BaseModel):
    """The spatio-temporal part of an evaluation (dpcore.evaluation.spatiotemporal), run per (city, mechanism, ε)."""

    window: str = Field(description="public time window A..B (UTC days inclusive, or ISO times), e.g. 2008-05-18..2008-06-07")
    slot: str = Field(default="1d", description="time slot: 1h, 1d, ...")
    mechanisms: NameList = Field(default_factory=lambda: ["identity3d", "vdr"])
    epsilons: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: [0.1, 0.2, 0.5, 1.0])
    max_points_per_user: int = Field(default=50, ge=1, description="k over the whole window (user level)")
    query_sides_m: list[tuple[float, float]] = Field(default_factory=lambda: [(100, 1000), (1000, 5000)])
    queries: int = Field(default=1000, ge=1, description="range queries per workload")
    max_query_slots: int = Field(default=7, ge=1)
    hotspot_queries: int = Field(default=300, ge=1)
    hotspot_extent_km: float = Field(default=2.0, gt=0)
    hotspot_grid: int = Field(default=256, ge=4, description="cells per side of the hotspot (and image) grid")
    forecast_queries: int = Field(default=20, ge=1)
    horizon: int | None = Field(default=None, ge=1, description="forecast steps (default: one period)")
    trials: int = Field(default=1, ge=1)
    image_epsilon: float | None = Field(default=None, gt=0,
                                        description="ε whose releases are drawn (default: the smallest)")
    image_slots: int = Field(default=3, ge=1, le=12, description="slots drawn per city and mechanism")
    image_cells: int = Field(default=128, ge=4, description="cells per side at most in the drawn heatmaps "
                             "(the hotspot grid summed into blocks; sparse data reads better coarser)")
    forecast_plots: int = Field(default=3, ge=1, le=12, description="forecast series drawn per city and mechanism")

    @field_validator("window")
    @classmethod
    def _window(cls, v: str) -> str:
        parse_window(v)
        return v

    @field_validator("slot")
    @classmethod
    def _slot(cls, v: str) -> str:
        from dpcore.geo import parse_slot

        parse_slot(v)
        return v

    @model_validator(mode="after")
    def _drawn_is_evaluated(self) -> STEvaluateOptions:
        if not self.epsilons:
            raise ValueError("at least one ε is needed")
        if self.image_epsilon is not None and not any(math.isclose(self.image_epsilon, e) for e in self.epsilons):
            raise ValueError(f"image_epsilon {self.image_epsilon:g} is not one of the evaluated epsilons")
        return self

    def window_seconds(self) -> tuple[int, int]:
        return parse_window(self.window)

    def drawn_epsilon(self) -> float:
        """The ε whose releases go into the image and forecast artifacts."""
        return float(self.image_epsilon if self.image_epsilon is not None else min(self.epsilons))


class EvaluateParams(BaseModel):
    """The evaluation harness as a flow: one task per (city, mechanism, ε) for the 2-D mechanisms and,
    when ``spatio_temporal`` is given, one per (city, mechanism, ε) for the spatio-temporal ones."""

    data: str
    cities: NameList
    mechanisms: NameList = Field(default_factory=lambda: ["identity", "ug", "ag", "hb", "privtree"],
                                  description="2-D mechanisms; empty = only the spatio-temporal part")
    epsilons: list[float] = Field(default_factory=lambda: [0.1, 0.4, 1.6])
    privacy_unit: Literal["user", "record"] = "user"
    max_points_per_user: int = Field(default=20, ge=1)
    query_sides_m: list[tuple[float, float]] = Field(default_factory=lambda: [(25, 100), (100, 1000), (1000, 5000)])
    queries: int = Field(default=2000, ge=1)
    trials: int = Field(default=3, ge=1)
    seed: int = 0
    mechanism_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="public parameters per mechanism, e.g. {\"vdr\": {\"steps\": 100}}")
    spatio_temporal: STEvaluateOptions | None = Field(default=None,
                                                      description="also evaluate spatio-temporal mechanisms")
    output_dir: str | None = Field(default=None, description="also write the artifact images (PNG) here; "
                                   "operator output with true counts, never a release store")
    columns: str | None = Field(default=None, description="column map of the input, e.g. user_id=uid,lat=y")
    format: str = "auto"
    dask_address: str | None = None
    n_workers: int = Field(default=2, ge=1, le=64)
    workload: str = Field(default="data", description="query centres: data (points of the evaluated data, "
                          "where people are), uniform (over the region) or public:PATH (a public point file "
                          "readable on the workers)")
    bounding: Literal["sample", "weight"] = Field(
        default="sample", description="user-level bounding of the 2-D part: a k-sample per user, or every "
                                      "point weighted min(1, k/n_u) (grid mechanisms)")

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: str) -> str:
        from dpcore.queries.range import parse_workload

        return str(parse_workload(v))

    @model_validator(mode="after")
    def _something_to_do(self) -> EvaluateParams:
        if not self.cities:
            raise ValueError("at least one city is needed")
        if not self.mechanisms and self.spatio_temporal is None:
            raise ValueError("nothing to evaluate: give 2-D mechanisms, spatio_temporal options, or both")
        if self.bounding == "weight" and self.privacy_unit != "user":
            raise ValueError("weighted bounding needs privacy_unit user")
        return self
