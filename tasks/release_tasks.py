"""Prefect tasks of a release, one step each, as thin wrappers over dpcore and the release store.

Steps: plan (release keys) → read, validate, bound contributions (once, all cities together) and
count each city's fine grid on the Dask cluster → charge the ledger → privatize (mechanism on the
counts: the only step that draws noise) → render preview (of the released map only) → persist (stage
files, then the manifest).

Retries go on the steps that touch storage. No task caches on anything derived from noise: the
release key is a hash of public configuration and the input's data version, and the exactly-once
logic lives in the store (tasks/storage/store.py), so a retried task finds what an earlier attempt did.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpcore import GeoDPError, __version__
from dpcore.data.chunks import GridSpec
from dpcore.data.inputs import InputSet, normalised_locator
from dpcore.data.points import LoadResult, load_points, parse_column_map
from dpcore.geo import Region, parse_slot, resolve_region
from dpcore.heatmap.mass import MassSpec
from dpcore.mechanisms import (
    ZCDP,
    Mechanism,
    PrivacyUnit,
    PrivateSample,
    get_mechanism,
    input_for,
)
from dpcore.privacy.accounting import budget_label
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.profile import PROFILE_FRACTION, ContributionProfile, noisy_profile
from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.uncertainty import release_quality
from tasks.config import Period, PrivacyUnitName, canonical_hash, release_budget
from tasks.dask_path import CityData, DataPass, release_counts
from tasks.lazy_task import NO_CACHE, task
from tasks.preview import render_heatmap_png
from tasks.progress import Progress
from tasks.public_errors import retry_unless_refused, without_private_detail
from tasks.storage.manifest import Manifest
from tasks.storage.store import (
    ReleaseStore,
    as_store,
    check_slug,
)

PREVIEW = "preview.png"


class ReleaseError(GeoDPError, ValueError):
    pass


def code_version() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"geodp {__version__}" + (f" ({rev})" if rev else "")


def public_locator(path: str) -> str:
    """The input's public identity: its URL, or its real absolute local path (a ``file://`` URL too)."""
    return normalised_locator(path)


def dataset_name(path: str, given: str | None = None) -> str:
    if given:
        return check_slug(given, "dataset")
    stem = Path(str(path)).name
    stem = re.sub(r"(\.(gz|bz2|zst|parquet|pq|csv|tsv|txt))+$", "", stem, flags=re.IGNORECASE)
    return check_slug(re.sub(r"[^A-Za-z0-9._+-]", "-", stem).strip("-.") or "dataset", "dataset")


# -- plan ---------------------------------------------------------------------------------------
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


# -- tasks --------------------------------------------------------------------------------------
# Tasks whose return value is private (points, counts, the validation report) never persist it,
# whatever PREFECT_RESULTS_PERSIST_BY_DEFAULT says: result storage is readable through the Prefect API.
@task(name="load-and-validate", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE, persist_result=False,
      retry_condition_fn=retry_unless_refused)
def load_and_validate(path: str, columns: str | None = None, fmt: str = "auto", strict: bool = False,
                      window: tuple[int | None, int | None] | None = None) -> LoadResult:
    """The whole input, read and validated in the flow's process. A data error names what is wrong
    from public facts only (tasks/public_errors.py): this runs under Prefect, whose UI shows it."""
    return without_private_detail(
        lambda: load_points(path, columns=parse_column_map(columns), fmt=fmt, strict=strict, window=window),
        path, columns, fmt, strict)


@task(name="check-committed", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE,
      retry_condition_fn=retry_unless_refused)
def check_committed(store_url: ReleaseStore | str, plans: list[CityPlan]) -> dict[str, Manifest | None]:
    """The committed manifest of each plan's release key, or None (re-running a commit is a no-op)."""
    store = as_store(store_url)
    return {p.city: store.find_committed(p.dataset, p.city, p.period.label, p.release_key) for p in plans}


def grid_specs(plans: list[CityPlan]) -> list[GridSpec]:
    """What each city's fit reads, from public configuration: its mechanism's fine count grid over the
    region (× the period's time slots for a spatio-temporal one), or a heatmap's mass grid."""
    specs = []
    for p in plans:
        cells, mass = fine_cells(p.built, p.region, p.unit)
        specs.append(GridSpec(p.city, p.region, cells, p.period.start_s, p.slot_seconds,
                              p.n_slots if mass is None else None, mass=mass))
    return specs


@task(name="read-bound-count", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE, persist_result=False,
      retry_condition_fn=retry_unless_refused)
def read_bound_count(data: str | InputSet | LoadResult, plans: list[CityPlan], seed: int | None, per_day: bool = False,
                     columns: str | None = None, fmt: str = "auto", strict: bool = False,
                     window: tuple[int | None, int | None] | None = None,
                     progress_topic: str | None = None) -> DataPass:
    """:func:`count_release_data` as a Prefect task: a data error names what is wrong from public
    facts only (tasks/public_errors.py), since the Prefect UI shows a failed task's message and
    traceback; the in-process form calls :func:`count_release_data` and shows the detail."""
    return without_private_detail(
        lambda: count_release_data(data, plans, seed, per_day, columns, fmt, strict, window, progress_topic),
        data, columns, fmt, strict)


def count_release_data(data: str | InputSet | LoadResult, plans: list[CityPlan], seed: int | None, per_day: bool = False,
                       columns: str | None = None, fmt: str = "auto", strict: bool = False,
                       window: tuple[int | None, int | None] | None = None,
                       progress_topic: str | None = None) -> DataPass:
    """The release's data pass on the Dask cluster it runs on (tasks/dask_path.py): read and validate
    the period's files, keep points inside any release region, bound each user to k points once over
    all of them together (or per UTC day with ``per_day``), and sum each city's fine count grid.

    Regions are half-open squares; a point inside two overlapping custom regions counts in both, and
    the ledger charges such regions as if they were separate releases (dpcore.privacy.accounting).
    ``window`` (default: the period) is the time the run is charged for (ledger_tasks.read_window):
    no row outside it is read."""
    if not plans:
        raise ReleaseError("nothing to release")
    first = plans[0]
    window = (first.period.start_s, first.period.end_s) if window is None else tuple(window)
    unit, k = first.privacy_unit, first.max_points_per_user
    if unit == "record" and first.records_per_person is not None:
        # a person-level dataset charges this release m·ε: each person keeps at most m records, drawn
        # as k points are, so that charge is true whatever a person contributed
        unit, k, per_day = "user", first.records_per_person, False
    return release_counts(data, grid_specs(plans), window,
                          columns=parse_column_map(columns), fmt=fmt, strict=strict,
                          privacy_unit=unit, max_points_per_user=k, per_day=per_day, seed=seed,
                          count_people=first.count == "people", topic=progress_topic)


def profile_applies(plan: CityPlan) -> bool:
    """Whether the plan's release is scaled to full counts by the paid contribution profile: user level
    in pure ε, no public total, a mechanism that counts points and does not scale itself."""
    tags = plan.built.tags
    return (plan.privacy_unit == "user" and plan.rho is None and plan.public_total is None
            and plan.count == "points"
            and not tags.scales_to_public_total and not tags.heatmap)


def paid_profile(plans: list[CityPlan], counts: np.ndarray | None) -> ContributionProfile | None:
    """The run's contribution profile, noised once for all its regions with PROFILE_FRACTION of ε
    (each region's fit records that charge): only after the ledger charge. None where it does not apply."""
    if counts is None or not plans or not all(profile_applies(p) for p in plans):
        return None
    first = plans[0]
    noise = first.noise.source("contribution-profile", first.period.label)
    return noisy_profile(counts, PROFILE_FRACTION * min(float(p.epsilon) for p in plans), noise, first.bound_per_day)


@task(name="privatize", cache_policy=NO_CACHE, persist_result=False)  # noise of an attempt that may be given back
def privatize(plan: CityPlan, data: CityData, profile: ContributionProfile | None = None) -> Synopsis:
    """Mechanism fit on the city's summed fine counts (or mass grid): the only step that draws noise
    (besides the run's contribution profile, :func:`paid_profile`, which it records and scales by).
    A failure that is not geodp's names only its type (tasks/public_errors.py): a library's message may
    quote the private counts the fit reads; the in-process form calls :func:`fit_city`."""
    return without_private_detail(lambda: fit_city(plan, data, profile), plan.source or plan.dataset,
                                  step=f"the {plan.mechanism} fit of {plan.city}")


def fit_city(plan: CityPlan, data: CityData, profile: ContributionProfile | None = None) -> Synopsis:
    """:func:`privatize`'s fit, with every failure as it is (the operator's own terminal). A mechanism
    that trains a model (VDR's VQ-VAE: a ``progress`` callback attribute) reports its steps through
    tasks/progress.py: a row of the fits' bar on the operator's terminal, lines in the Prefect run's log."""
    mech = plan.built
    if not hasattr(mech, "progress"):
        return _fit(plan, mech, data, profile)
    with Progress(f"{plan.city} {plan.mechanism} training", total=getattr(mech, "steps", None),
                  unit="steps") as shown:
        mech.progress = shown.steps()
        try:
            return _fit(plan, mech, data, profile)
        finally:
            mech.progress = None  # the plan travels to workers and into caches: no reporter with it


def _fit(plan: CityPlan, mech, data: CityData, profile: ContributionProfile | None) -> Synopsis:
    tags = mech.tags
    empty = np.empty(0, dtype=np.float64)
    # A mechanism that scales to a public full total itself (N / n̂ or γ) is handed it; others are
    # scaled by dpcore.privacy.scaling below (user level) or need none (record level: nothing is bounded).
    sample = PrivateSample(empty if data.x is None else data.x, empty if data.y is None else data.y, plan.region,
                           plan.unit, user=data.user, n_slots=plan.n_slots, slot_seconds=plan.slot_seconds,
                           window_start_s=plan.period.start_s,
                           public_total=plan.public_total if tags.scales_to_public_total else None, fine=data.fine,
                           fine_mass=data.mass)
    fit_input = input_for(tags.input_type, sample)
    noise = plan.noise.source(plan.city, plan.period.label)
    if plan.public_total is not None and plan.privacy_unit == "user" and not tags.scales_to_public_total:
        from dpcore.privacy.scaling import fit_scaled

        return fit_scaled(mech, fit_input, plan.epsilon, noise, plan.public_total,
                          "public total declared by the releaser (--public-total)")
    if profile is not None and profile_applies(plan):
        from dpcore.privacy.scaling import fit_profiled

        return fit_profiled(mech, fit_input, plan.epsilon, noise, profile)
    synopsis = mech.fit(fit_input, plan.budget, noise)
    if plan.count == "people":
        from dpcore.synopsis.base import PEOPLE_NOTE

        synopsis.privacy.notes.append(f"{PEOPLE_NOTE} ({people_bound(plan)})")
    return synopsis


def people_bound(plan: CityPlan) -> str:
    """What ``--count people`` bounds under the plan's bound window, in the manifest's words."""
    k = plan.max_points_per_user
    if plan.bound_per_day:
        return (f"bound per UTC day: each person counts at most once in a cell (and slot) per day and in at most "
                f"k = {k} cells each day, so over a period of D days a person can count up to D times in one cell "
                f"and in at most k·D cell-days; sensitivity k per day, charged for each day")
    return (f"bound per release: each person counts at most once in a cell (and slot) and in at most k = {k} "
            "cells over the whole release; sensitivity k")


@task(name="render-preview", cache_policy=NO_CACHE, persist_result=False)
def render_preview(plan: CityPlan, synopsis: Synopsis) -> bytes:
    return render_heatmap_png(synopsis, f"{plan.city} {plan.period.label} (released, {budget_label(plan.epsilon, plan.rho)})",
                              note=release_quality(synopsis)["statement"])
