"""ParamSelect's choice: (mechanism, ρ, k) from public inputs only. Nothing here reads private data or
spends budget; a mechanism that needs a private n pays for it itself (dpcore.mechanisms.sample_size)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dpcore.geo import Region
from dpcore.paramselect.cache import load_model
from dpcore.paramselect.features import (
    DEFAULT_BAND_M,
    K_GRID,
    ParamSelectError,
    PublicProfile,
    auto_candidates,
    feature_row,
    rho_mechanisms,
    searches_rho,
    self_tuned_mechanisms,
)
from dpcore.paramselect.model import ParamSelectModel, Scored

#: A self-tuned (neural) candidate is chosen only if its predicted error is below every cheap one's by
#: more than this share: its training rows are one noise draw and one fit each (the cheap rows average
#: several draws), so its predictions are noisier, and an argmin over predictions of unequal noise
#: favours the noisiest (docs/decisions/0007-paramselect-model.md).
SELF_TUNED_MARGIN = 0.075


@dataclass
class Choice:
    """What ParamSelect recommends, and why."""

    mechanism: str
    cell_width_m: float
    max_points_per_user: int | None
    predicted_error: float
    inputs: dict
    excluded_groups: list[str]

    def mechanism_params(self) -> dict:
        # A self-tuned mechanism (snh) is run with its defaults: it reaches the same ρ through
        # ParamSelect itself, and an explicit ρ would switch SNH to the paper's flat grid.
        if searches_rho(self.mechanism):
            return {"cell_width_m": self.cell_width_m}
        return {}

    def to_dict(self) -> dict:
        return asdict(self)


def pick_candidate(scored: list[Scored], self_tuned_margin: float = SELF_TUNED_MARGIN) -> tuple[Scored, list[str]]:
    """The least predicted error among the candidates within reach (all, if none is), and those left out.

    Trees predict a constant beyond the signal-to-noise their rows cover, so a mechanism measured only on
    small releases (the denoised snh, when New York is held out) would be rated at a far larger release
    as at its largest one. Such extrapolated candidates are weighed only if all are. A self-tuned
    candidate is weighed at (1 + ``self_tuned_margin``) × its predicted error (see SELF_TUNED_MARGIN);
    the returned Scored keeps the prediction itself. min() keeps the first of equal errors, so ties
    follow the order of :meth:`ParamSelectModel.score_candidates`.
    """
    if not self_tuned_margin >= 0:
        raise ParamSelectError(f"self_tuned_margin must be >= 0, got {self_tuned_margin}")
    reachable = [c for c in scored if c.within_reach] or scored
    beyond = [c.mechanism for c in scored if not c.within_reach] if len(reachable) < len(scored) else []

    def weighed(c: Scored) -> float:
        return c.predicted_error * (1.0 + self_tuned_margin if c.mechanism in self_tuned_mechanisms() else 1.0)

    return min(reachable, key=weighed), beyond


def select_params(*, region: Region, n: float, epsilon: float, sensitivity: float = 1.0,
                  privacy_unit: str = "record", band: tuple[float, float] = DEFAULT_BAND_M,
                  mechanisms: tuple[str, ...] = ("identity",), choose_k: bool = False,
                  max_points_per_user: int | None = None, profile: PublicProfile | None = None,
                  n_is_bounded: bool = False, model_path: str | Path | None = None,
                  snh_denoised: bool | None = None) -> Choice:
    """Recommend (mechanism, ρ, k) from public inputs only. There is no private-data argument.

    ``n`` is the public (or DP-estimated) number of points in the region; under user-level privacy it
    is the unbounded count and the number surviving bounding is estimated with the public profile's
    kept fraction (unless ``n_is_bounded``: n already counts the bounded sample). ``profile`` defaults to the shipped public profile of ``region.name`` (Gowalla
    sample), else the median of the training profiles. With ``choose_k`` the bound k is chosen from
    K_GRID (user-level only); otherwise ``sensitivity`` (= k or 1) is used as given. ``snh_denoised``:
    whether snh would run with the public denoiser (default: whether the shipped one applies to the
    region, as for snh's ``denoiser="auto"``).
    """
    if not (n > 0 and math.isfinite(n)):
        raise ParamSelectError(f"n must be a positive number, got {n}")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ParamSelectError(f"epsilon must be a positive number, got {epsilon}")
    known = auto_candidates()
    unknown = [m for m in mechanisms if m not in known]
    if unknown:
        raise ParamSelectError(f"ParamSelect knows mechanisms {list(known)}, not {unknown}")
    model = load_model(model_path, exclude_groups=(region.name,))
    prof = profile or model.profiles.get(region.name) or _median_profile(model, region.name)
    if privacy_unit == "user":
        ks = list(K_GRID) if choose_k else [int(max_points_per_user or sensitivity)]
    else:
        ks = [None]
    untrained = [m for m in mechanisms if m not in model.mechanisms]
    # Only a lone ρ mechanism may stand in for itself with the grid's error (snh asking for its ρ from
    # a model whose table has no SNH rows); a choice *between* mechanisms needs every one's rows.
    if untrained and (len(mechanisms) > 1 or mechanisms[0] not in rho_mechanisms()):
        raise ParamSelectError(f"the ParamSelect model has no training rows for {untrained}; retrain with "
                               f"`geodp paramselect train --mechanisms ...` (it knows {model.mechanisms})")
    if snh_denoised is None:
        snh_denoised = "snh" in mechanisms and _denoiser_applies(region)
    scored: list[tuple[Scored, int | None, dict]] = []
    for k in ks:
        kept = kept_fraction_for(prof, k) if k is not None else 1.0
        sens = float(k) if k is not None else float(sensitivity)
        feats = feature_row(n if n_is_bounded else n * kept, epsilon, sens, prof.entropy, band, kept)
        scored += [(c, k, feats) for c in model.score_candidates(feats, mechanisms, bool(snh_denoised), privacy_unit)]
    best, beyond = pick_candidate([c for c, _, _ in scored])
    _, k, feats = next(item for item in scored if item[0] is best)
    err, mech, rho = best.predicted_error, best.mechanism, best.cell_width_m
    # Every candidate's prediction, so a user can see how close the choice was (and what decided it).
    candidates = sorted(({"mechanism": c.mechanism, "max_points_per_user": ck,
                          "cell_width_m": float(c.cell_width_m) if searches_rho(c.mechanism) else None,
                          "predicted_error": float(c.predicted_error), "within_reach": bool(c.within_reach),
                          "self_tuned": c.mechanism in self_tuned_mechanisms(), "chosen": c is best}
                         for c, ck, _ in scored),
                        key=lambda row: row["predicted_error"])
    inputs = {"region": region.name, "n": float(n), "epsilon": float(epsilon), "privacy_unit": privacy_unit,
              "band_m": list(band), "profile_source": prof.source, "features": feats,
              "snh_denoised": bool(snh_denoised), "beyond_training_reach": sorted(set(beyond)),
              "rho_extrapolated_by": model.rho_extrapolation(feats),
              "self_tuned_margin": SELF_TUNED_MARGIN, "candidates": candidates}
    return Choice(mech, float(rho), k, float(err), inputs, list(model.exclude_groups))


def _denoiser_applies(region: Region) -> bool:
    """Whether snh's default would apply the shipped public denoiser to ``region`` (its rows then differ)."""
    from dpcore.models.denoiser_meta import shipped_denoiser_usable

    return shipped_denoiser_usable(region)[0]


def kept_fraction_for(profile: PublicProfile, k: int) -> float:
    if k in profile.kept_fraction:
        return profile.kept_fraction[k]
    # Interpolate in log k between the grid values measured on public data.
    ks = np.array(sorted(profile.kept_fraction))
    vs = np.array([profile.kept_fraction[int(v)] for v in ks])
    return float(np.interp(np.log(k), np.log(ks), vs)) if ks.size else 1.0


def _median_profile(model: ParamSelectModel, region_name: str) -> PublicProfile:
    profs = list(model.profiles.values())
    if not profs:
        # Only reached when the caller gave no profile and the model has none for the region: say both ways out.
        raise ParamSelectError(
            f"no public profile for region {region_name!r}: none was passed and the ParamSelect model has no "
            "public profiles (e.g. it was trained on synthetic data only), so there is no median to fall back "
            "on. Pass profile=PublicProfile.from_points(...) built from a public dataset of the region "
            "(`geodp paramselect predict --public-data PATH`), or retrain the model with full-size public "
            "datasets of some city (`geodp paramselect train`), whose profiles are kept in the model")
    ent = float(np.median([p.entropy for p in profs]))
    kept = {k: float(np.median([p.kept_fraction.get(k, 1.0) for p in profs])) for k in K_GRID}
    return PublicProfile("unknown", "median of the training profiles", 0, 0, ent, kept)


def rho_extrapolation_note(choice: Choice) -> str:
    """The warning that ParamSelect's ρ was extrapolated, for release notes and `predict` ("" when it was not)."""
    factor = choice.inputs.get("rho_extrapolated_by")
    if not factor:
        return ""
    return (f"n·ε/s is {factor:.1f}× beyond ParamSelect's largest training case, so ρ is extrapolated "
            "(it may be too coarse for small squares)")
