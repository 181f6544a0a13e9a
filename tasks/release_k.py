"""`--max-points-per-user auto`: one k for a run, chosen before the charge from public inputs only.

Each region's basis is the newest release already published for it (tasks/release_usefulness.basis_of:
its noisy contribution profile and its map, both public). For every candidate k
(dpcore.synopsis.expected_error.K_CANDIDATES, at most the policy's bound) the plan predicts each band's
expected |error| relative to the band's typical count; the run takes the k with the smallest mean over
its regions and bands (the regions of a run share one bounding, so one k). Nothing of the run's own
data is read. Without a basis that can tell (the first release of a region, a basis without a profile,
or one whose noise hides every band) the run takes DEFAULT_K, at most the bound, and says so
(docs/decisions/0018-contribution-profile.md).
"""

from __future__ import annotations

import numpy as np

from dpcore.synopsis.expected_error import K_CANDIDATES, choose_k
from dpcore.synopsis.uncertainty import DEFAULT_BANDS
from tasks.ledger_tasks import DEFAULT_K
from tasks.release_city_plan import CityPlan
from tasks.release_tasks import profile_applies
from tasks.release_usefulness import basis_of, no_prediction
from tasks.storage.store import ReleaseStore, as_store


def _bands(plan: CityPlan) -> tuple[tuple[float, float], ...]:
    """The bands a release serves: the band its mechanism was tuned to when the run declares one, else
    the plan's bands."""
    tuned = plan.built.tags.tunes_band
    if tuned and tuned in plan.params:
        lo, hi = getattr(plan.built, tuned)
        return ((float(lo), float(hi)),)
    return DEFAULT_BANDS


def _band_words(bands) -> str:
    return ", ".join(f"{lo:g}–{hi:g} m" for lo, hi in bands)


def _why_not(store: ReleaseStore, plan: CityPlan, candidates: list[int]) -> tuple[str | None, dict | None]:
    """(why the region cannot choose k, None) or (None, its basis's url and scores per candidate)."""
    reason = no_prediction(plan)
    if reason is None and not profile_applies(plan):
        reason = ("auto chooses k for releases scaled to full counts by their contribution profile "
                  "(user level, ε, point counts, no --public-total)")
    if reason is not None:
        return reason, None
    bands = _bands(plan)
    basis = basis_of(store, plan, bands)
    if basis is None:
        return f"no published release of {plan.dataset}/{plan.city} to choose from", None
    if basis.profile is None:
        return f"the published release {basis.url} has no contribution profile", None
    k, scores = choose_k(basis.inputs, basis.typical, basis.profile, candidates, bands)
    if k is None:
        return f"the noise of the published release {basis.url} hides every band's typical count", None
    return None, {"city": plan.city, "basis": basis.url, "bands": [list(b) for b in bands], "scores": scores}


def choose_run_k(store_url: ReleaseStore | str, plans: list[CityPlan], k_max: int) -> dict:
    """The run's k and how it was chosen: {"k", "chosen_by": "auto" | "default", "statement", "regions"
    (per region: basis url, bands, each candidate's predicted mean relative error)}."""
    store = as_store(store_url)
    candidates = [k for k in K_CANDIDATES if k <= k_max] or [int(k_max)]
    reasons, regions = [], []
    for p in plans:
        reason, region = _why_not(store, p, candidates)
        if region is None:
            reasons.append(f"{p.city}: {reason}")
        else:
            regions.append(region)
    if not regions:
        k = min(DEFAULT_K, int(k_max))
        return {"k": k, "chosen_by": "default", "regions": [],
                "statement": f"k = {k}, the default: nothing public to choose it from ({'; '.join(reasons)})"}
    mean = np.mean([[s["mean_relative_error"] for s in r["scores"]] for r in regions], axis=0)
    best = int(np.argmin(mean))  # the first (smallest k) on a tie
    others = ", ".join(f"k = {k}: {m:.3g}" for k, m in zip(candidates, mean, strict=True) if k != candidates[best])
    words = "; ".join(f"{r['basis']} for squares of {_band_words(r['bands'])}" for r in regions)
    skipped = f"; not from {'; '.join(reasons)}" if reasons else ""
    return {"k": candidates[best], "chosen_by": "auto", "regions": regions,
            "statement": f"k = {candidates[best]}, chosen from the release {words} (predicted mean relative "
                         f"error {mean[best]:.3g}; {others}){skipped}"}
