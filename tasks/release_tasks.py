"""Prefect tasks of a release, one step each, as thin wrappers over dpcore and the release store.

Steps: plan (each city's plan and release key: tasks/release_city_plan.py) → read, validate, bound
contributions (once, all cities together) and count each city's fine grid on the Dask cluster → charge
the ledger → privatize (mechanism on the counts: the only step that draws noise) → render preview (of
the released map only) → persist (stage files, then the manifest).

Retries go on the steps that touch storage. No task caches on anything derived from noise: the
release key is a hash of public configuration and the input's data version, and the exactly-once
logic lives in the store (tasks/storage/store.py), so a retried task finds what an earlier attempt did.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from dpcore import __version__
from dpcore.data.chunks import GridSpec
from dpcore.data.inputs import InputSet
from dpcore.data.points import LoadResult, load_points, parse_column_map
from dpcore.mechanisms import PrivateSample, input_for
from dpcore.privacy.accounting import budget_label
from dpcore.privacy.profile import PROFILE_FRACTION, ContributionProfile, noisy_profile
from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.uncertainty import release_quality
from tasks.dask_path import CityData, DataPass, release_counts
from tasks.lazy_task import NO_CACHE, task
from tasks.preview import render_heatmap_png
from tasks.progress import Progress
from tasks.public_errors import retry_unless_refused, without_private_detail
from tasks.release_city_plan import CityPlan, ReleaseError, fine_cells
from tasks.storage.manifest import Manifest
from tasks.storage.store import ReleaseStore, as_store

PREVIEW = "preview.png"


def code_version() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"geodp {__version__}" + (f" ({rev})" if rev else "")


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
