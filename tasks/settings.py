"""The platform configuration (budget caps, the served deployments) as a typed settings model.

Sources, strongest first: ``GEODP_…`` environment variables (``__`` separates nested keys, e.g.
``GEODP_NIGHTLY__RELEASE__STORE=s3://b/p`` or ``GEODP_BUDGET__CAPS__CHECKINS=4``), then the TOML file.
The file is found the same way by the CLI, ``geodp serve`` and served runs: an explicit path, else the
``GEODP_CONFIG`` environment variable, else the default packaged with geodp (tasks/geodp.toml).
Unknown keys and bad values are refused with one line naming the key, before anything runs.
"""

from __future__ import annotations

import math
import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dpcore.privacy.accounting import MAX_POLICY_BUDGET, PrivacyPolicy
from tasks.config import ConfigError, PrivacyUnitName, ReleaseParams

DEFAULT_BUDGET_CAP = 10.0
CONFIG_ENV = "GEODP_CONFIG"

#: A budget as `geodp dataset create --budget` takes it (dpcore.privacy.accounting.MAX_POLICY_BUDGET).
PositiveCap = Annotated[float, Field(gt=0, le=MAX_POLICY_BUDGET, allow_inf_nan=False)]


class BudgetSettings(BaseModel):
    """[budget]: the ε budget a NEW dataset's policy gets (an existing policy is never changed here)."""

    model_config = ConfigDict(extra="forbid")

    default_cap: PositiveCap = Field(default=DEFAULT_BUDGET_CAP,
                                     description="ε one person may lose from a new dataset over its life")
    caps: dict[str, PositiveCap] = Field(default_factory=dict, description="per-dataset budgets")


class DatasetPolicySettings(BaseModel):
    """[nightly.policy]: the nightly dataset's privacy policy, with the options of `geodp dataset create`.
    The first release into the dataset stores it; a dataset whose stored policy differs is refused."""

    model_config = ConfigDict(extra="forbid")

    budget: PositiveCap = Field(description="the most one person may lose over any window: ε, or ρ with "
                                "accounting = zcdp")
    privacy_unit: PrivacyUnitName = PrivacyUnitName.USER
    max_points_per_user: Annotated[int, Field(ge=1, le=1_000_000)] | Literal["auto"] | None = Field(
        default=None, description="k per bound window (user level; default 20), or auto: each release's plan "
        "chooses k (at most 200) from the newest published release")
    bound_window: Literal["release", "day"] = Field(default="release", description="k applies per release or "
                                                    "per UTC day (a day bound is charged once per covered day)")
    window_days: Annotated[int, Field(ge=1, le=36_600)] | Literal["lifetime"] = Field(default="lifetime", description="the budget's window in UTC "
                                                   "days (w-event privacy), or lifetime")
    accounting: Literal["pure", "zcdp"] = "pure"
    delta: float = Field(default=1e-9, gt=0, lt=1, description="δ shown beside ρ (zcdp)")
    max_records_per_person: int | None = Field(default=None, ge=1, le=1_000_000)
    horizon: str | None = Field(default=None, description="FIRST..LAST: UTC days a release without a period covers")

    @model_validator(mode="after")
    def _valid_policy(self) -> DatasetPolicySettings:
        self.policy()  # a PolicyError is a ValueError: reported with the key like any other bad value
        return self

    def policy(self) -> PrivacyPolicy:
        """The policy these options declare (what `geodp dataset create` would store)."""
        from tasks.config import period_days
        from tasks.ledger_tasks import AUTO, AUTO_K_MAX

        user, auto = self.privacy_unit == PrivacyUnitName.USER, self.max_points_per_user == AUTO
        return PrivacyPolicy(privacy_unit=self.privacy_unit.value, budget=float(self.budget),
                             max_points_per_user=(AUTO_K_MAX if auto else self.max_points_per_user or 20)
                             if user else None, k_auto=user and auto,
                             bound_window=self.bound_window,
                             window_days=None if self.window_days == "lifetime" else self.window_days,
                             accounting=self.accounting, delta=self.delta,
                             max_records_per_person=self.max_records_per_person,
                             horizon=period_days(self.horizon, "horizon") if self.horizon else None)


class NightlySettings(BaseModel):
    """[nightly]: the cron (UTC) and parameters of the scheduled release, and its dataset's policy."""

    model_config = ConfigDict(extra="forbid")

    cron: str = "30 2 * * *"
    release: ReleaseParams
    policy: DatasetPolicySettings | None = None

    @property
    def dataset(self) -> str:
        from tasks.release_city_plan import dataset_name

        return dataset_name(self.release.data, self.release.dataset)

    @model_validator(mode="after")
    def _known_cities(self) -> NightlySettings:
        """The nightly's cities are catalog slugs, as `geodp release run --cities` checks them: an unknown
        one is refused when the config is loaded (`geodp serve`), not at the first scheduled run."""
        from dpcore.geo import UnknownCityError, city_region

        if self.release.center is None:
            for city in self.release.cities:
                try:
                    city_region(city)
                except UnknownCityError as exc:
                    raise ValueError(str(exc).replace("; or give a custom region with --center LAT,LON "
                                                      "--side-km S.", "")) from exc
        return self

    @model_validator(mode="after")
    def _release_fits_policy(self) -> NightlySettings:
        k = self.release.max_points_per_user
        if self.policy is None or k is None or self.release.privacy_unit != PrivacyUnitName.USER:
            return self
        policy = self.policy.policy()
        if policy.k_auto and k != "auto" and k > policy.max_points_per_user:
            raise ValueError(f"release.max_points_per_user = {k} is above the policy's bound of "
                             f"{policy.max_points_per_user} (k = auto); drop one")
        if not policy.k_auto and k != policy.max_points_per_user:
            raise ValueError(f"release.max_points_per_user = {k} differs from the policy's k = "
                             f"{policy.max_points_per_user}; drop one")
        return self

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=v)
        except ValueError as exc:
            raise ValueError(f"not a cron string: {v!r}") from exc
        return v


class PlatformSettings(BaseSettings):
    """The whole platform config. Build it with :func:`load_settings`, which picks the file."""

    model_config = SettingsConfigDict(env_prefix="GEODP_", env_nested_delimiter="__", extra="forbid",
                                      nested_model_default_partial_update=True)

    store: str | None = Field(default=None, description="the platform's release store URL (folder, file://, "
                              "s3://), which holds the datasets' ledgers too unless `ledger` names another home: a "
                              "release form or nightly without a store of its own releases into it")
    ledger: str | None = Field(default=None, description="the ledger home: the one store (folder, file://, s3://) "
                               "that holds the datasets' policies and charges for every release store, so a source "
                               "released into several stores spends one budget; default: each store is its own")
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    nightly: NightlySettings | None = None

    def release_store(self, given: str | None) -> str:
        """The store a release goes to: the one it names, else this configuration's."""
        if given:
            return given
        if not self.store:
            raise ConfigError("no release store: name one in the release (store) or set `store` in the platform "
                              "configuration (or GEODP_STORE)")
        return self.store

    def ledger_home(self, store):
        """The ledger home of releases into ``store`` (a ReleaseStore): this configuration's ``ledger``,
        else the home the store recorded, else the store itself (tasks/storage/ledger_home.py)."""
        from tasks.storage.ledger_home import resolve_home

        return resolve_home(store, self.ledger)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_cls.model_config.get("toml_file"):
            sources.append(TomlConfigSettingsSource(settings_cls))
        return tuple(sources)

    def budget_cap_for(self, dataset: str, override: float | None = None) -> float:
        """The ε budget of a new dataset: an explicit override, else [budget.caps], else default_cap."""
        cap = float(override) if override is not None else self.budget.caps.get(dataset, self.budget.default_cap)
        if not math.isfinite(cap) or cap <= 0:
            raise ConfigError(f"budget cap must be a positive number, got {cap}")
        return cap

    def declared_policy(self, dataset: str) -> PrivacyPolicy | None:
        """The policy [nightly.policy] declares for ``dataset`` (the nightly's), else None."""
        if self.nightly is None or self.nightly.policy is None or dataset != self.nightly.dataset:
            return None
        return self.nightly.policy.policy()

    @model_validator(mode="after")
    def _caps_fit_policy(self) -> PlatformSettings:
        if self.nightly is not None and self.nightly.policy is not None:
            cap = self.budget.caps.get(self.nightly.dataset)
            if cap is not None and abs(cap - self.nightly.policy.budget) > 1e-12:
                raise ValueError(f"budget.caps.{self.nightly.dataset} = {cap:g} differs from nightly.policy.budget "
                                 f"= {self.nightly.policy.budget:g}; drop one")
        return self

    def explicit_budget_cap(self, dataset: str, override: float | None = None) -> float | None:
        """A cap that was asked for explicitly (an override, or [budget.caps] naming the dataset): it must
        match the dataset's stored policy. None when only the default applies."""
        if override is not None or dataset in self.budget.caps:
            return self.budget_cap_for(dataset, override)
        return None


def packaged_config() -> Path:
    """The default config shipped inside the package (present in a non-editable install too)."""
    return Path(str(resources.files("tasks").joinpath("geodp.toml")))


def config_path(path: str | os.PathLike | None = None) -> Path:
    """Which file configures this process: ``path``, else $GEODP_CONFIG, else the packaged default."""
    chosen = path or os.environ.get(CONFIG_ENV) or packaged_config()
    p = Path(chosen).expanduser().resolve()
    if not p.is_file():
        source = "--config" if path else CONFIG_ENV if os.environ.get(CONFIG_ENV) else "the packaged default"
        raise ConfigError(f"config file {p} ({source}) not found")
    return p


def load_settings(path: str | os.PathLike | None = None) -> PlatformSettings:
    """The platform settings from the file :func:`config_path` picks, with GEODP_ environment overrides.
    A missing file, invalid TOML, an unknown key or a bad value is a one-line ConfigError."""
    p = config_path(path)
    bound = type("PlatformSettingsFromFile", (PlatformSettings,),
                 {"model_config": {**PlatformSettings.model_config, "toml_file": p}})
    try:
        return bound()
    except ValidationError as exc:
        raise ConfigError(f"{p}: {describe_errors(exc)}") from None
    except ValueError as exc:  # TOML syntax (tomllib.TOMLDecodeError is a ValueError)
        raise ConfigError(f"{p} is not valid TOML: {exc}") from None


class _LedgerSetting(BaseSettings):
    """The `ledger` key alone, from the same sources as PlatformSettings (the ledger commands need it
    and nothing else, so a nightly configured for another process does not stop them)."""

    model_config = SettingsConfigDict(env_prefix="GEODP_", extra="ignore")

    ledger: str | None = None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return PlatformSettings.settings_customise_sources.__func__(
            cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings)


def configured_ledger(path: str | os.PathLike | None = None) -> str | None:
    """The configured ledger home (``ledger``, GEODP_LEDGER) from the file :func:`config_path` picks;
    None: each store is its own. A bad file is a one-line ConfigError."""
    p = config_path(path)
    bound = type("LedgerSettingFromFile", (_LedgerSetting,), {"model_config": {**_LedgerSetting.model_config,
                                                                               "toml_file": p}})
    try:
        return bound().ledger
    except ValidationError as exc:
        raise ConfigError(f"{p}: {describe_errors(exc)}") from None
    except ValueError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from None


def describe_errors(exc: ValidationError) -> str:
    """A pydantic error list on one line: 'nightly.release.citys: unknown key; budget.default_cap: …'."""
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = "unknown key (misspelled?)" if e["type"] == "extra_forbidden" else str(e["msg"]).removeprefix("Value error, ")
        value: Any = e.get("input")
        shown = "" if e["type"] in ("extra_forbidden", "missing") or isinstance(value, dict) else f" (got {value!r})"
        parts.append(f"{where}: {msg}{shown}")
    return "; ".join(parts)
