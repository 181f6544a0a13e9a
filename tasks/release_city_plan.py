"""A release's city plans: everything public about each city-release (its region, period, mechanism,
budget, privacy unit and noise), checked before any data is read or budget charged, and its release key.

:func:`make_plans` builds one :class:`CityPlan` per region (the plan, tasks/release_plan.py, calls it
once per run); the checks here refuse a grid that cannot fit, numbers out of range and combinations of
options a release does not accept, each as one line (:class:`ReleaseError`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcore import GeoDPError
from dpcore.data.inputs import normalised_locator
from dpcore.geo import Region, parse_slot, resolve_region
from dpcore.heatmap.mass import MassSpec
from dpcore.mechanisms import ZCDP, Mechanism, PrivacyUnit, get_mechanism
from dpcore.privacy.noise import NoiseSource
from tasks.config import Period, PrivacyUnitName, canonical_hash, release_budget
from tasks.storage.store import check_slug


class ReleaseError(GeoDPError, ValueError):
    pass


def public_locator(path: str) -> str:
    """The input's public identity: its URL, or its real absolute local path (a ``file://`` URL too)."""
    return normalised_locator(path)


def dataset_name(path: str, given: str | None = None) -> str:
    if given:
        return check_slug(given, "dataset")
    stem = Path(str(path)).name
    stem = re.sub(r"(\.(gz|bz2|zst|parquet|pq|csv|tsv|txt))+$", "", stem, flags=re.IGNORECASE)
    return check_slug(re.sub(r"[^A-Za-z0-9._+-]", "-", stem).strip("-.") or "dataset", "dataset")


@dataclass(frozen=True)
class NoiseSpec:
    """Where a release's noise comes from: the secure source (``seed`` None), or a seed, for experiments
    whose noise anyone with the seed can remove (NOT FOR PUBLICATION)."""

    seed: int | None = None

    @property
    def label(self) -> str:
        """What the release key hashes: "secure" or "seeded:<seed>"."""
        return "secure" if self.seed is None else f"seeded:{self.seed}"

    def source(self, *stream: str) -> NoiseSource:
        """The noise of one named stream (a city and period; the run's profile): seeded streams differ
        by name and are the same wherever the input lives (the release key also names its path)."""
        if self.seed is None:
            return NoiseSource.secure()
        return NoiseSource.seeded(self.seed).spawn(int(canonical_hash(list(stream))[:8], 16))


@dataclass(frozen=True)
class CityPlan:
    """Everything public about one city-release; its release key names it in the ledger and store.
    ``mech`` is the mechanism, built and checked once by :func:`make_plans`."""

    dataset: str
    city: str
    region: Region
    period: Period
    mechanism: str
    params: dict
    epsilon: float | None
    privacy_unit: PrivacyUnitName
    max_points_per_user: int
    noise: NoiseSpec
    data_version: str
    slot_seconds: int | None = None
    public_total: float | None = None
    source: str = ""
    config: dict = field(default_factory=dict)
    bound_per_day: bool = False
    rho: float | None = None
    records_per_person: int | None = None  # m: a record-level release into a person-level dataset
    mech: Mechanism | None = field(default=None, compare=False, repr=False)
    #: the plan's expected error per band (tasks/release_usefulness.py), recorded in the manifest's quality
    expected: dict | None = field(default=None, compare=False)
    #: "points", or "people": distinct people per cell (and slot), each person in at most k (L) cells
    count: str = "points"

    @property
    def built(self) -> Mechanism:
        """The plan's mechanism (built here only for a plan made by hand, not by make_plans)."""
        return self.mech if self.mech is not None else get_mechanism(self.mechanism, **self.params)

    @property
    def unit(self) -> PrivacyUnit:
        return PrivacyUnit.of(self.privacy_unit, self.max_points_per_user)

    @property
    def budget(self) -> ZCDP | float:
        """What the fit spends: ρ-zCDP, or pure ε."""
        return ZCDP(self.rho) if self.rho is not None else float(self.epsilon)

    @property
    def n_slots(self) -> int | None:
        """Time slots of a spatio-temporal release's period."""
        return -(-self.period.seconds // self.slot_seconds) if self.slot_seconds and self.period.seconds else None

    @property
    def config_hash(self) -> str:
        return canonical_hash(self.config)[:24]

    @property
    def release_key(self) -> str:
        return canonical_hash([self.dataset, self.city, self.period.label, self.config_hash])[:32]


def build_mechanism(name: str, params: dict[str, Any]) -> Mechanism:
    """Build mechanism ``name`` with ``params`` and check their values: the one instance every city of a
    run fits with. A bad value (or one of the wrong type) is one line, before data is read or budget charged."""
    try:
        mech = get_mechanism(name, **params)
        mech.check_params()
    except GeoDPError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:  # an unknown parameter name or a value of the wrong type
        shown = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in params.items())
        raise ReleaseError(f"{name} cannot use the parameters {shown}: {exc}") from exc
    return mech


def resolve_regions(cities: list[str], center: str | None, side_km: float | None) -> list[Region]:
    """The run's regions: one custom centre, or catalog cities (each once)."""
    if center:
        regions = [resolve_region(center=center, side_km=side_km)]
    else:
        if not cities:
            raise ReleaseError("give --cities A,B (catalog slugs, see `geodp cities`) or --center LAT,LON")
        regions = [resolve_region(city=c, side_km=side_km) for c in cities]
    if len({r.name for r in regions}) != len(regions):
        raise ReleaseError("a city is listed twice")
    return regions


def make_plans(*, dataset: str, cities: list[str], center: str | None, side_km: float | None,
               period: Period, mechanism: str, params: dict, epsilon: float | None, privacy_unit: str,
               max_points_per_user: int, seed: int | None, data_version: str, slot: str = "1h",
               public_total: float | None = None, source: str = "", bound_per_day: bool = False,
               rho: float | None = None, records_per_person: int | None = None,
               count: str = "points", mech: Mechanism | None = None,
               regions: Sequence[Region] | None = None) -> list[CityPlan]:
    """One plan per region. Validates names and parameters before any data is touched; ``mech`` and
    ``regions``, when given, are the request's (tasks/release_request.py), built and checked once.

    The release key and config hash are functions of public configuration only: the dataset, the
    source's locator and its public data version (an operator-declared version or the files'
    modification time), the region, period, mechanism, parameters, ε and bounding. ``records_per_person``
    (m, from a person-level dataset's policy) bounds each person to m records in a record-level release."""
    mech = mech if mech is not None else build_mechanism(mechanism, params)
    try:
        unit_name = PrivacyUnitName(privacy_unit)
    except ValueError as exc:
        raise ReleaseError(str(exc)) from exc
    tags = mech.tags
    release_budget(epsilon, rho)
    check_numbers(max_points_per_user, public_total)
    if rho is not None and not tags.supports_zcdp:
        raise ReleaseError(f"{mechanism} spends pure ε only; a ρ-zCDP release needs a mechanism that supports "
                           "it (identity)")
    if rho is not None and public_total is not None:
        raise ReleaseError("--public-total scaling spends part of the budget in pure ε; not with --rho")
    slot_seconds = None
    if tags.input_type.needs_time_slots:
        if period.start_s is None:
            raise ReleaseError(f"{mechanism} is spatio-temporal: give a --period (the time window is public "
                               "configuration, never read from the data)")
        slot_seconds = parse_slot(slot)
    regions = list(regions) if regions is not None else resolve_regions(cities, center, side_km)
    if public_total is not None and len(regions) != 1:
        raise ReleaseError("--public-total applies to a single-region release")
    if public_total is not None and tags.heatmap:
        raise ReleaseError(f"{mechanism} releases user mass (each person adds at most 1), not point counts: "
                           "--public-total scaling does not apply")
    if count not in ("points", "people"):
        raise ReleaseError(f"--count is points or people, got {count!r}")
    if count == "people" and (privacy_unit != "user" or tags.heatmap or public_total is not None):
        raise ReleaseError("--count people counts distinct people per cell at user level (each person in at most "
                           "--max-points-per-user cells): not at record level, with a heatmap or a --public-total")
    unit = PrivacyUnit.of(unit_name, int(max_points_per_user))
    noise = NoiseSpec(seed)
    for region in regions:
        check_grid_fits(mechanism, params, region, period, slot_seconds)
        check_fine_grid_fits(mech, region, period, slot_seconds, unit)
    check_slots_carried(mech, unit, epsilon, public_total, period, slot_seconds)
    plans = []
    for region in regions:
        city = re.sub(r"[^A-Za-z0-9._+-]", "-", region.name)
        config = {"dataset": dataset, "region": region.to_dict(), "period": period.to_dict(),
                  "mechanism": mechanism, "params": params,
                  "epsilon": None if epsilon is None else float(epsilon), "rho": rho,
                  "privacy_unit": unit_name.value,
                  "max_points_per_user": int(max_points_per_user) if privacy_unit == "user" else None,
                  "noise": noise.label, "source": source,
                  "data_version": data_version, "slot_seconds": slot_seconds, "public_total": public_total,
                  "bound_per_day": bool(bound_per_day and privacy_unit == "user")}
        m = int(records_per_person) if records_per_person is not None and privacy_unit == "record" else None
        if m is not None:  # only when set, so the keys of every other release stay what they were
            config["records_per_person"] = m
        if count == "people":  # likewise
            config["count"] = count
        plans.append(dataclasses.replace(
            CityPlan(dataset, city, region, period, mechanism, dict(params), config["epsilon"], unit_name,
                     int(max_points_per_user), noise, data_version, slot_seconds, public_total, source, config,
                     config["bound_per_day"], rho, m, mech), count=count))
    return plans


#: The most cells a grid may have (a 4096² grid or 64 M space-time cells): a larger one does not fit
#: the workers' memory, and it is refused before the ledger is charged.
MAX_GRID_CELLS = 1 << 26


#: The largest public total a release scales to (--public-total): a count, not an overflow.
MAX_PUBLIC_TOTAL = 1e15


def check_numbers(max_points_per_user: int, public_total: float | None = None) -> None:
    """k and a public total in ranges where the noise arithmetic cannot overflow or lose its meaning;
    checked in the plan, before the ledger is charged (ε and ρ: tasks.config.release_budget)."""
    if public_total is not None and not (isinstance(public_total, int | float)
                                         and 0 < float(public_total) <= MAX_PUBLIC_TOTAL):
        raise ReleaseError(f"--public-total must be a finite number of points in (0, {MAX_PUBLIC_TOTAL:g}], "
                           f"got {public_total!r}")
    if not (isinstance(max_points_per_user, int) and 1 <= max_points_per_user <= 1_000_000):
        raise ReleaseError(f"max points per user must be a whole number in [1, 1000000], got {max_points_per_user!r}")


def fine_cells(mech: Mechanism, region: Region, unit: PrivacyUnit) -> tuple[int, MassSpec | None]:
    """Cells per side of the grid a release's data pass builds for this fit, and the mass it holds
    (Mechanism.fine_mass) or None for counts (Mechanism.fine_grid). A fit that declares neither is
    refused: a release hands fits grids, never points."""
    mass = mech.fine_mass(region, unit)
    if mass is not None:
        return int(mass.resolution), mass
    cells = mech.fine_grid(region)
    if cells is None:
        raise ReleaseError(f"{mech.name} declares neither a fine count grid (Mechanism.fine_grid) nor a mass grid "
                           "(Mechanism.fine_mass): a release hands a fit one of them, never points")
    return int(cells), None


def check_fine_grid_fits(mech: Mechanism, region: Region, period: Period,
                         slot_seconds: int | None, unit: PrivacyUnit) -> None:
    """Refuse, before the ledger, a fit without a fine grid, or one that cannot fit in memory."""
    cells, _ = fine_cells(mech, region, unit)
    total = cells * cells * (-(-period.seconds // slot_seconds) if slot_seconds and period.seconds else 1)
    if total > MAX_GRID_CELLS:
        raise ReleaseError(f"{mech.name}: its count grid of {total:,} cells over {region.name} does not fit (at "
                           f"most {MAX_GRID_CELLS:,}); lower the parameter that sets the finest grid")


def check_slots_carried(mech: Mechanism, unit: PrivacyUnit, epsilon: float | None, public_total: float | None,
                        period: Period, slot_seconds: int | None) -> None:
    """Refuse, before the ledger, time slots a declared public total shows the data cannot carry (the
    mechanism's ``slots_refusal``: vdr and identity3d under their resolution rule); all of it is public."""
    refuse = getattr(mech, "slots_refusal", None)
    if refuse is None or epsilon is None or public_total is None or not slot_seconds or not period.seconds:
        return
    why = refuse(unit.kind, unit.count_sensitivity, float(epsilon), float(public_total),
                 -(-period.seconds // slot_seconds), slot_seconds)
    if why is not None:
        raise ReleaseError(why)


def check_grid_fits(mechanism: str, params: dict, region: Region, period: Period, slot_seconds: int | None) -> None:
    """Refuse a grid that cannot fit in memory (``cell_width_m`` or ``grid_size`` too fine) up front."""
    width = params.get("cell_width_m")
    side = params.get("grid_size")
    cells_per_side = None
    if isinstance(width, int | float) and not isinstance(width, bool):
        if not width > 0:
            raise ReleaseError(f"{mechanism}: cell_width_m must be > 0, got {width}")
        cells_per_side = region.side_m / float(width)
    elif isinstance(side, int | float) and not isinstance(side, bool):
        cells_per_side = float(side)
    if cells_per_side is None:
        return
    cells = cells_per_side ** 2
    if slot_seconds and period.seconds:
        cells *= -(-period.seconds // slot_seconds)
    if cells > MAX_GRID_CELLS:
        raise ReleaseError(f"{mechanism}: a grid of {cells:,.0f} cells over {region.name} does not fit (at most "
                           f"{MAX_GRID_CELLS:,}); use a coarser cell_width_m or grid_size")
