"""A release's verdict per band, wherever the release is shown: the terminal line after each release,
the Prefect summary, `release list`, and a note on every answer from a band the release is expected to
serve worse than a blank map.

Two sources, both public: the plan's expectation (``quality.plan``, made before the main charge from the
run's paid contribution profile and the region's published basis, tasks/release_usefulness.py) and the
same error model read from the release's own map once it is fitted (``quality.own_map``: its typical count
per band with the map's noise variance taken out, dpcore.synopsis.expected_error.typical_counts). A band's
is worse than a blank map where either expects it, informative only where the plan says so, else unknown.
"""

from __future__ import annotations

import numpy as np

from dpcore.synopsis.base import Synopsis


def own_map_bands(plan, synopsis: Synopsis) -> list[dict]:
    """The error model of the plan read from the fitted release's own map (post-processing only): per band
    its expected |error| against the typical count of a data-centred square of the released map."""
    from dpcore.privacy.profile import ContributionProfile
    from dpcore.synopsis.expected_error import (
        PlanInputs,
        expected_errors,
        map_scale_without_top,
        typical_counts,
    )
    from tasks.release_tasks import profile_applies
    from tasks.release_usefulness import _cell_width, no_prediction

    if no_prediction(plan) is not None or (plan.epsilon is None and plan.rho is None):
        return []
    try:
        typical = typical_counts(synopsis)
        at_most = typical_counts(synopsis, at_most=True)
    except (AttributeError, NotImplementedError, ValueError):
        return []
    prof = getattr(synopsis, "profile", None)
    profile = ContributionProfile.from_dict(prof) if prof else None
    inputs = PlanInputs(epsilon=float(plan.epsilon or 0.0), rho=plan.rho,
                        k=plan.max_points_per_user if plan.privacy_unit == "user" else 1,
                        cell_width_m=_cell_width(plan), profiled=profile_applies(plan) and profile is not None)
    return expected_errors(inputs, typical, profile, at_most=at_most, map_scale_without_top=map_scale_without_top(synopsis))


def _worse(band: dict) -> bool | None:
    if band.get("worse_than_blank_map") is not None:
        return bool(band["worse_than_blank_map"])
    return True if band.get("hopeless") else None


def band_verdicts(quality: dict | None) -> list[dict]:
    """Per band {"query_sides_m", "worse": True | False | None, "from": "plan" | "own map"}: worse where the
    plan or the own map expects it; informative only where the plan (from a published basis, or the paid
    profile) says so; else unknown."""
    from dpcore.synopsis.uncertainty import DEFAULT_BANDS

    quality = quality or {}
    plan_q = quality.get("plan") or {}
    plan = {tuple(b["query_sides_m"]): b for b in plan_q.get("bands", [])}
    if plan_q.get("useless") and not plan:  # refused as a whole (a profile that shows no one)
        plan = {tuple(b): {"hopeless": True} for b in DEFAULT_BANDS}
    own = {tuple(b["query_sides_m"]): b for b in quality.get("own_map") or []}
    out = []
    for sides in sorted(set(plan) | set(own)):
        p = _worse(plan[sides]) if sides in plan else None
        # the own map may only say worse: its typical count is a ratio of noisy sums, which a map of noise
        # alone (an empty period) can make look large
        o = True if sides in own and _worse(own[sides]) else None
        if p or o:
            out.append({"query_sides_m": list(sides), "worse": True, "from": "plan" if p else "own map"})
        else:
            known = o if o is not None else p
            out.append({"query_sides_m": list(sides), "worse": known, "from": "own map" if o is not None else "plan"})
    return out


def _sides(bands: list[dict]) -> str:
    return ", ".join(f"{b['query_sides_m'][0]:g}–{b['query_sides_m'][1]:g} m" for b in bands)


def verdict_line(quality: dict | None) -> str:
    """One line: for which square sides the release is expected informative, worse than a blank map, or
    unknown; and whether it was published although the plan refused it."""
    bands = band_verdicts(quality)
    plan = (quality or {}).get("plan") or {}
    anyway = (" (published anyway: the plan expected it worse than a blank map at every band)"
              if plan.get("published_anyway") else
              " (expected worse than a blank map at every band, found after its charge from its own profile: no "
              "published release of the region could tell before)" if plan.get("found_after_charge") else "")
    if not bands:
        why = plan.get("statement") or (quality or {}).get("statement") or "nothing public predicts its error"
        return f"verdict: none: {why.removeprefix('no verdict: ')}{anyway}"
    parts = []
    for word, value in (("informative", False), ("worse than a blank map", True), ("unknown", None)):
        chosen = [b for b in bands if b["worse"] is value]
        if chosen:
            parts.append(f"{word} for squares of {_sides(chosen)}")
    empty = ("; its profile cannot tell the period from an empty one, where a blank map is exact"
             if plan.get("empty_like") else "")
    return "verdict: " + "; ".join(parts) + empty + anyway


def band_note_codes(quality: dict | None, boxes_m: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per box, the index of its note in the returned sorted words (-1 for none): a note where its side
    (√ area) falls in a band the release is expected to serve worse than a blank map. One mask per band,
    none per box: a million boxes cost a few array passes."""
    b = np.atleast_2d(np.asarray(boxes_m, dtype=np.float64))
    side = np.sqrt(np.abs((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])))
    codes = np.full(len(b), -1, dtype=np.int64)
    texts: list[str] = []
    for band in (b for b in band_verdicts(quality) if b["worse"]):
        lo, hi = band["query_sides_m"]
        codes[(side >= lo) & (side <= hi)] = len(texts)  # a later band's note wins, as bands are listed
        texts.append(f"this release is expected worse than a blank map for squares of {lo:g}–{hi:g} m "
                     f"(its {band['from']}): answering 0 is expected to err less")
    used = np.unique(codes[codes >= 0])
    words = sorted({texts[i] for i in used})
    remap = np.full(len(texts) + 1, -1, dtype=np.int64)  # the last slot keeps -1 as -1
    for i in used:
        remap[i] = words.index(texts[i])
    return remap[codes], words

