"""`auto`: ParamSelect picks the mechanism and its grid width from public inputs, then runs it.

Privacy accounting:
- ParamSelect's inputs are public: the region, ε, the sensitivity (k or 1), the query band, the
  shipped model trained on public data, and n. n is ``public_total`` when the caller declares one
  (free), or the caller's already-paid sample-size estimate (free); otherwise a noisy count is paid:
  1% of ε first (step ``total_count``), and only when that is not within 10% relative std, the rest
  of ``total_fraction`` (step ``total_count_refine``), see dpcore.mechanisms.sample_size.public_n_for_fit.
  Sensitivity k user-level / 1 record-level.
- The chosen mechanism then runs on the rest of the budget, given that n as ``public_total`` (the
  noisy count is already released, so re-using it is post-processing: nothing is paid twice); its
  own charges are recorded as
  ``<mechanism>/<step>`` so the ledger shows every part, and the parts sum to ε.
Candidates: by default every mechanism the ParamSelect model has error rows for (the shipped model:
identity, ug, ag, privtree; a model trained with snh adds it); SNH, when chosen, runs with its defaults
and reaches the same ρ. SNH is weighed as the variant it would run here (with the public denoiser where
that applies) and must be predicted better than the others by ``SELF_TUNED_MARGIN``; a candidate whose
training rows stop far below this release's n·ε/s is not weighed (see
dpcore.paramselect.pick_candidate). The release's parameters list every candidate's predicted error.
By default (``choose="band"``) the query band picks the mechanism (dpcore.mechanisms.auto_rule: a
rule-sized uniform grid for 25–100 m, AG with band settings from 100 m, measured on public data with
queries where people are); with no declared band (``query_sides_m`` = ``NO_BAND``, 25 m – 5 km) one
AG fit serves every size. The cost model still scores every candidate for the manifest, and chooses
alone with ``choose="model"`` or when the band's pick is not among the candidates.
When the choice is a uniform grid (identity or ug), its side comes from the data-centred grid-size rule
(dpcore.grid.size_rule) for the band ``query_sides_m``, from the same public n and the ε left for the
grid, instead of ParamSelect's ρ or the ICDE rule: both were tuned on queries placed uniformly over the
region, and cells sized for them are several times too wide where people are (bench/README.md).
k (``max_points_per_user``) is fixed before a mechanism sees the data (bounding happens upstream for the
whole release), so ``auto`` does not change it; ``geodp paramselect predict`` recommends k.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from dpcore.mechanisms.auto_rule import NO_BAND, decide
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Band, Fraction
from dpcore.mechanisms.sample_size import public_n_for_fit
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import Synopsis


class AutoMechanism(Mechanism):
    name = "auto"
    #: under weighted bounding auto chooses only among candidates that support it (not SNH)
    tags = MechanismTags(supports_weights=True, tunes_band="query_sides_m")

    def __init__(self, *, mechanisms: tuple[str, ...] | str | None = None,
                 query_sides_m: Band = NO_BAND, total_fraction: Fraction = 0.05,
                 model_path: str | None = None, choose: Literal["band", "model"] = "band"):
        self.choose = choose
        self.mechanisms = mechanisms
        self.query_sides_m = query_sides_m
        self.total_fraction = total_fraction
        self.model_path = model_path

    def _candidates(self) -> tuple[str, ...]:
        from dpcore.paramselect import auto_candidates, trained_mechanisms

        if self.mechanisms is None:
            # Default: every mechanism the ParamSelect model has error rows for, so auto weighs exactly
            # what it can predict.
            return trained_mechanisms(self.model_path)
        cands = tuple(m.strip() for m in self.mechanisms.split(",")) if isinstance(self.mechanisms, str) \
            else tuple(self.mechanisms)
        known = auto_candidates()
        bad = [m for m in cands if m not in known]
        if not cands or bad:
            raise MechanismError(f"auto chooses among {list(known)}; got {list(cands)}")
        return cands

    def check_params(self) -> None:
        self._candidates()

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> Synopsis:
        from dpcore.mechanisms import get_mechanism, get_mechanism_class
        from dpcore.paramselect import rho_extrapolation_note, select_params

        cands = self._candidates()
        if data.weighted:
            cands = tuple(c for c in cands if get_mechanism_class(c).tags.supports_weights)
            if not cands:
                raise MechanismError("none of auto's candidates supports weighted bounding")
        lo, hi = (float(v) for v in self.query_sides_m)
        n, how, bounded, n_var = public_n_for_fit(data, acct, noise, self.total_fraction)
        choice = select_params(region=data.region, n=n, epsilon=acct.remaining, sensitivity=float(data.sensitivity),
                               privacy_unit=data.privacy_unit, max_points_per_user=data.max_points_per_user,
                               band=(lo, hi), mechanisms=cands, n_is_bounded=bounded, model_path=self.model_path)
        decision = decide(choice, (lo, hi), cands, acct.remaining, float(data.sensitivity), data.privacy_unit,
                          data.region.side_m, self.choose)
        choice, inner_params, rule = decision.choice, decision.inner_params, decision.grid_rule
        inner = get_mechanism(choice.mechanism, **inner_params)
        # The inner mechanism splits its own (smaller) budget; its charges are copied into ours.
        sub = FitRecord(acct.remaining, count_quantum=acct.count_quantum)
        # A paid estimate of the bounded sample's size is reused by the inner mechanism; a declared
        # public total stays what it is (the full count) and is not mistaken for the sample size.
        inner_data = (dataclasses.replace(data, sample_size=n, sample_size_variance=n_var)
                      if bounded and data.sample_size is None else data)
        synopsis = inner._fit(inner_data, sub, noise)
        for c in sub.charges:
            acct.spend(f"{choice.mechanism}/{c.name}", c.epsilon, c.sensitivity, c.noise, c.note, c.quantum)
        params = {**self.get_params(), "mechanisms": list(cands), "query_sides_m": [lo, hi],
                  "chosen": {"mechanism": choice.mechanism, "params": inner_params,
                             "predicted_error": choice.predicted_error},
                  # What was weighed (public inputs only), best predicted first.
                  "candidates": [{"mechanism": c["mechanism"], "predicted_error": c["predicted_error"],
                                  "within_reach": c["within_reach"]} for c in choice.inputs["candidates"]],
                  "self_tuned_margin": choice.inputs["self_tuned_margin"]}
        if rule is not None:
            params["grid_size_rule"] = rule
        chooser = ("the data-centred band rule (dpcore.mechanisms.auto_rule)" if decision.by_band
                   else "ParamSelect's cost model")
        params["chosen_by"] = "band" if decision.by_band else "model"
        notes = ["; ".join(filter(None, (
            f"{chooser} chose {choice.mechanism} {inner_params} from public inputs; n from {how}",
            rho_extrapolation_note(choice))))]
        if choice.inputs.get("beyond_training_reach"):
            notes.append(f"not weighed: {', '.join(choice.inputs['beyond_training_reach'])} (this release's n·ε/s "
                         "is far beyond the training rows the cost model has for them)")
        acct.describe([*notes, *sub.notes], params=params)
        return synopsis
