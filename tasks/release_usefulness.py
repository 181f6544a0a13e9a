"""Is a planned release expected to tell more than a blank map? Checked before any charge.

For each city plan, the basis is the newest release already committed for the same dataset and region
(public: its released map and its contribution profile); the run's ε, k and cell width set the new
noise (dpcore.synopsis.expected_error). A city expected to be worse than a blank map at every band is
refused with what would make it useful, unless the run says ``publish_anyway``; then the manifest's
``quality.plan`` records the expectation and that it was published anyway. Without a basis (the first
release of a region) there is nothing public to predict from and the release goes ahead, saying so
(docs/decisions/0018-contribution-profile.md, "The plan").
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile

import numpy as np

from dpcore.mechanisms import get_mechanism_class
from dpcore.privacy.profile import ContributionProfile
from dpcore.synopsis.base import Synopsis, load_synopsis
from dpcore.synopsis.expected_error import (
    PlanInputs,
    expected_errors,
    typical_counts,
    useless,
    what_would_help,
)
from dpcore.synopsis.uncertainty import DEFAULT_BANDS
from tasks.release_tasks import CityPlan, ReleaseError, profile_applies
from tasks.storage.store import ReleaseRef, ReleaseStore


def _cell_width(plan: CityPlan) -> float | None:
    width, side = plan.params.get("cell_width_m"), plan.params.get("grid_size")
    if plan.mechanism not in ("identity", "ug"):
        return None
    if isinstance(side, int | float) and not isinstance(side, bool) and side > 0:
        return plan.region.side_m / float(side)
    if isinstance(width, int | float) and not isinstance(width, bool) and width > 0:
        return float(width)
    return 100.0 if plan.mechanism == "identity" and width is None else None


def _basis(store: ReleaseStore, plan: CityPlan) -> tuple[Synopsis, float | None, str] | None:
    """The newest committed pure-ε release of the plan's dataset, region and privacy unit: (synopsis, its
    period's seconds, url)."""
    region = plan.region.to_dict()
    found = [m for m in store.list_releases(plan.dataset, plan.city)
             if m.region == region and (m.epsilon is not None or m.rho is not None)
             and m.privacy_unit == plan.privacy_unit]
    if not found:
        return None
    newest = max(found, key=lambda m: (m.committed_at or "", m.version))
    tmp = tempfile.mkdtemp(prefix="geodp-plan-")
    try:
        store.fetch(ReleaseRef(newest.dataset, newest.city, newest.period, newest.version).rel, tmp)
        synopsis = load_synopsis(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    window = newest.window or {}
    seconds = None
    if window.get("start") and window.get("end"):
        import pandas as pd

        seconds = (pd.Timestamp(window["end"]) - pd.Timestamp(window["start"])).total_seconds()
    return synopsis, seconds, str(newest.url or newest.period)


@dataclasses.dataclass(frozen=True)
class Basis:
    """What the newest published release of a plan's region tells the plan (public)."""

    url: str
    inputs: PlanInputs  # the run's options, with the ratio of its period to the basis's
    typical: np.ndarray  # per band (NaN: hidden by the basis's noise)
    profile: ContributionProfile | None
    at_most: np.ndarray  # per band, the largest typical count the basis leaves possible


def no_prediction(plan: CityPlan) -> str | None:
    """Why the plan's error cannot be predicted from a published release, or None when it can."""
    tags = get_mechanism_class(plan.mechanism).tags
    if tags.heatmap:
        return ("no verdict: a heatmap releases each person's mass (at most 1 per person, spread over cells), "
                "not counts of points; the plan's error model predicts counts")
    if tags.input_type.needs_time_slots:
        return ("no verdict: the plan predicts 2-D counts per band; a spatio-temporal release's error turns on "
                "its slots, the cells and slots its mechanism merges and the counts per slot, which it does not "
                "model")
    if plan.count == "people":
        return "no verdict: the plan predicts counts of points, and this release counts people"
    return None


def basis_of(store: ReleaseStore, plan: CityPlan, bands=DEFAULT_BANDS) -> Basis | None:
    """The plan's basis (None when its region has no published pure-ε release of its privacy unit)."""
    basis = _basis(store, plan)
    if basis is None:
        return None
    synopsis, seconds, url = basis
    profile_dict = getattr(synopsis, "profile", None)
    profile = ContributionProfile.from_dict(profile_dict) if profile_dict else None
    period_factor = plan.period.seconds / seconds if plan.period.seconds and seconds else 1.0
    inputs = PlanInputs(epsilon=float(plan.epsilon or 0.0), rho=plan.rho,
                        k=plan.max_points_per_user if plan.privacy_unit == "user" else 1,
                        cell_width_m=_cell_width(plan), profiled=profile_applies(plan), period_factor=period_factor)
    return Basis(url, inputs, typical_counts(synopsis, bands), profile, typical_counts(synopsis, bands, at_most=True))


def expectation(store: ReleaseStore, plan: CityPlan) -> dict:
    """The plan's expected error per band for one city, from public inputs; ``bands`` is empty (and
    ``statement`` says why) where nothing public predicts it."""
    why_not = no_prediction(plan)
    if why_not is not None:
        return {"bands": [], "statement": why_not}
    basis = basis_of(store, plan)
    if basis is None:
        return {"bands": [], "statement": f"no verdict: no release of {plan.dataset}/{plan.city} at "
                                          f"{plan.privacy_unit} level is published yet, and the plan predicts "
                                          "only from the region's newest published release"}
    url, inputs, typical, profile = basis.url, basis.inputs, basis.typical, basis.profile
    rows = expected_errors(inputs, typical, profile, at_most=basis.at_most)
    out = {"bands": rows, "basis": url, "useless": useless(rows),
           "statement": "; ".join(f"{r['query_sides_m'][0]:g}–{r['query_sides_m'][1]:g} m: |error| ≈ "
                                  f"{r['expected_abs_error']:.3g} vs a typical count "
                                  + (f"{r['typical_count']:.3g}" if r["typical_count"] is not None
                                     else "unknown (the published release's noise hides it"
                                     + (f"; at most {r['typical_count_at_most']:.3g}" if "typical_count_at_most" in r
                                        else "") + ")")
                                  + (f" (no verdict: {r['verdict_open']})" if r.get("verdict_open") else "")
                                  for r in rows)}
    if out["useless"]:
        out["would_help"] = what_would_help(inputs, typical, profile, at_most=basis.at_most)
    return out


def check_usefulness(store_url: str, plans: list[CityPlan], publish_anyway: bool = False) -> list[CityPlan]:
    """The plans with their expectation attached (``CityPlan.expected``); raises a one-line ReleaseError
    when a city is expected to be worse than a blank map at every band, unless ``publish_anyway``."""
    store = ReleaseStore(store_url)
    checked = []
    for p in plans:
        exp = expectation(store, p)
        if exp.get("useless") and not publish_anyway:
            helps = ", ".join(exp.get("would_help") or []) or "nothing tried here"
            raise ReleaseError(f"{p.city}: expected worse than a blank map at every band ({exp['statement']}; "
                               f"predicted from {exp['basis']}); would help: {helps}; nothing was charged. "
                               "--publish-anyway publishes it anyway")
        checked.append(dataclasses.replace(p, expected={**exp, "published_anyway": bool(exp.get("useless"))}))
    return checked
