"""`auto`'s data-centred choice of mechanism: by query band, from public-data measurements.

On squares centred where people are, the public training sets (the Gowalla 1,000-user sample's
cities and synthetic cities; ``bench/public_choice.py``, bench/README.md) rank the cheap mechanisms by
band far more consistently than ParamSelect's cost model (trained on uniform query centres) predicts
them: under 1 km a uniform grid sized by the data-centred rule (dpcore.grid.size_rule) is the best or
within a few per cent of it, and on 1–5 km squares AG's adaptive second level wins. The rule reads only
the band (public configuration), so it is post-processing of nothing private.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpcore.paramselect.choose import Choice

#: Bands whose geometric mean side is at least this many metres go to AG; smaller ones to the grid.
AG_FROM_SIDE_M = 1000.0
#: What the band rule picks (in the order auto's candidates name them).
GRID_CHOICE = "ug"
COARSE_CHOICE = "ag"
#: Choices whose grid side the data-centred rule sets (they are one uniform grid of noisy counts).
RULE_SIZED = ("identity", "ug")
#: auto's ways of choosing: the band rule (default), or ParamSelect's cost model alone.
CHOOSERS = ("band", "model")


def band_choice(query_sides_m: tuple[float, float], candidates: tuple[str, ...]) -> str | None:
    """The mechanism the band rule picks, or None when it is not among ``candidates`` (then the cost
    model chooses). A grid choice may be run as ``ug`` or ``identity`` with the rule's size; they are
    the same release then."""
    lo, hi = (float(v) for v in query_sides_m)
    want = COARSE_CHOICE if math.sqrt(lo * hi) >= AG_FROM_SIDE_M else GRID_CHOICE
    if want in candidates:
        return want
    if want == GRID_CHOICE and "identity" in candidates:
        return "identity"
    return None


@dataclasses.dataclass(frozen=True)
class AutoDecision:
    """What ``auto`` runs: the (possibly band-replaced) ParamSelect choice, the inner mechanism's
    parameters, the grid-size rule's record when the rule sized a grid, and whether the band chose."""

    choice: Choice
    inner_params: dict
    grid_rule: dict | None
    by_band: bool


def decide(choice: Choice, query_sides_m: tuple[float, float], candidates: tuple[str, ...], epsilon: float,
           sensitivity: float, privacy_unit: str, choose: str = "band") -> AutoDecision:
    """auto's decision from ParamSelect's scored choice and public inputs only: the band rule's pick
    (``choose="band"``) or the cost model's, with a uniform grid sized by the data-centred rule for
    the points the grid noises (ParamSelect's ``log_n`` feature: the bounded sample) and ``epsilon``,
    the ε the grid gets. ``auto`` releases and ``geodp paramselect predict --mechanisms auto`` both
    call this, so the prediction is what a release runs."""
    from dpcore.grid.size_rule import data_grid_size, rule_record

    lo, hi = (float(v) for v in query_sides_m)
    by_band = band_choice((lo, hi), candidates) if choose == "band" else None
    if by_band is not None and by_band != choice.mechanism:
        predicted = {c["mechanism"]: c["predicted_error"] for c in choice.inputs["candidates"]}
        choice = dataclasses.replace(choice, mechanism=by_band, predicted_error=predicted.get(by_band))
    inner_params = choice.mechanism_params()
    rule = None
    if choice.mechanism in RULE_SIZED:
        n_noised = 10 ** choice.inputs["features"]["log_n"]
        m = data_grid_size(n_noised, epsilon, sensitivity, (lo, hi), privacy_unit)
        inner_params = {"grid_size": m}
        rule = {**rule_record((lo, hi), privacy_unit), "n": n_noised, "epsilon": float(epsilon), "grid_size": m}
    return AutoDecision(choice, inner_params, rule, by_band is not None)
