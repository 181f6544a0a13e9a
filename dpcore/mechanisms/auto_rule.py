"""`auto`'s data-centred choice of mechanism: by query band, from public-data measurements.

On squares centred where people are, the public training sets (the Gowalla 1,000-user sample's
cities and synthetic cities; ``bench/public_choice.py``, ``bench/adaptive_choice.py``, bench/README.md)
rank the cheap mechanisms by band far more consistently than ParamSelect's cost model (trained on
uniform query centres) predicts them:

- 25–100 m squares: a uniform grid sized by the data-centred rule (dpcore.grid.size_rule); no adaptive
  grid tried beats it there (AG's leaves in moderately dense cells are too coarse for such squares);
- 100–1000 m squares: AG with a light level 1 (α = 0.2: most of ε goes to the leaves the squares
  read), level-1 cells of at most 625 m and c = 5 (a leaf holds about (c/2)·k/ε₂ points, half AG's
  default), which beats every uniform size on the public sets;
- 1–5 km squares: AG with α = 0.3 and c = 5, and AG's own level-1 floor (coarser than the 100–1000 m one).

A band wider than one decade (``WIDE_RATIO``), such as ``NO_BAND`` (25 m – 5 km, what ``auto`` serves
when no band is declared), is not one of these: one fit answers squares of every size, so it runs AG
with a setting per privacy unit (``WIDE_PICKS``, bench/auto_no_band.py): at user level α = 0.2, c = 10
and level-1 cells of at most 1,250 m, whose coarser leaves keep 1–5 km squares, which sum many of them,
from drowning in the noise of k-bounded counts (the 100–1000 m setting's c = 5 is ×1.2–1.5 the best
mechanism there on the public sets); at record level a three-level AG (``levels=3``: level 1 with
α = 0.2 on cells of at most 850 m, level 2 with c = 14 on 0.3 of ε, level 3 cut by each level-2 cell's
noisy count with c3 = 10 on the rest), whose third level cuts finely only where check-ins pile up on
venues, so small squares get PrivTree-like leaves while large squares keep AG's few precise counts.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpcore.paramselect.choose import Choice


@dataclasses.dataclass(frozen=True)
class BandPick:
    """One row of the band rule: bands whose geometric mean side is at least ``from_side_m`` run
    ``mechanism`` with ``params``; ``level1_cell_m`` (AG only) caps AG's level-1 cell side, turned into
    its ``min_m1`` for the release's region."""

    from_side_m: float
    mechanism: str
    params: dict
    level1_cell_m: float | None = None


#: The band ``auto`` serves when none is declared: squares of 25 m to 5 km, one fit for all.
NO_BAND: tuple[float, float] = (25.0, 5000.0)
#: A band whose largest side is more than this many times its smallest spans several of the bands
#: below (each is ×4–×10 wide) and gets its privacy unit's ``WIDE_PICKS`` row.
WIDE_RATIO = 10.0
#: The settings for wide bands by privacy unit, chosen on public data with one fit answering all three
#: bands (bench/auto_no_band.py: leave-one-dataset-out picks the user row for 9 of 9 public sets;
#: bench/auto_no_band_record.py: the record row, a three-level AG, for 7 of 9). The record row's budget
#: after the total: level 1 0.2, level 2 0.375 of the rest (0.3 of it all), level 3 the rest (0.5).
WIDE_PICKS: dict[str, BandPick] = {
    "user": BandPick(0.0, "ag", {"alpha": 0.2, "c": 10.0}, level1_cell_m=1250.0),
    "record": BandPick(0.0, "ag", {"alpha": 0.2, "c": 14.0, "levels": 3, "level2_fraction": 0.375, "c3": 10.0,
                                   "merge_unsplit": True}, level1_cell_m=850.0),
}
#: The band rule, largest bands first (the first row whose ``from_side_m`` the band reaches applies).
#: 125 m is the geometric midpoint of the 25–100 m and 100–1000 m bands' centres (50 m and 316 m).
BAND_RULE: tuple[BandPick, ...] = (
    BandPick(1000.0, "ag", {"alpha": 0.3, "c": 5.0}),
    BandPick(125.0, "ag", {"alpha": 0.2, "c": 5.0}, level1_cell_m=625.0),
    BandPick(0.0, "ug", {}),
)
#: Choices whose grid side the data-centred rule sets (they are one uniform grid of noisy counts).
RULE_SIZED = ("identity", "ug")
#: auto's ways of choosing: the band rule (default), or ParamSelect's cost model alone.
CHOOSERS = ("band", "model")


def band_pick(query_sides_m: tuple[float, float], privacy_unit: str = "record") -> BandPick:
    lo, hi = (float(v) for v in query_sides_m)
    if hi > WIDE_RATIO * lo:
        return WIDE_PICKS["user" if privacy_unit == "user" else "record"]
    side = math.sqrt(lo * hi)
    return next(r for r in BAND_RULE if side >= r.from_side_m)


def band_choice(query_sides_m: tuple[float, float], candidates: tuple[str, ...],
                privacy_unit: str = "record") -> str | None:
    """The mechanism the band rule picks, or None when it is not among ``candidates`` (then the cost
    model chooses). A grid choice may be run as ``ug`` or ``identity`` with the rule's size; they are
    the same release then."""
    want = band_pick(query_sides_m, privacy_unit).mechanism
    if want in candidates:
        return want
    if want in RULE_SIZED:
        return next((c for c in RULE_SIZED if c in candidates), None)
    return None


def band_params(query_sides_m: tuple[float, float], mechanism: str, region_side_m: float,
                privacy_unit: str = "record") -> dict:
    """The parameters the band rule gives ``mechanism`` (its pick) for a region of side ``region_side_m``."""
    pick = band_pick(query_sides_m, privacy_unit)
    if pick.mechanism != mechanism:
        return {}
    params = dict(pick.params)
    if pick.level1_cell_m is not None:
        params["min_m1"] = max(1, math.ceil(region_side_m / pick.level1_cell_m))
    return params


@dataclasses.dataclass(frozen=True)
class AutoDecision:
    """What ``auto`` runs: the (possibly band-replaced) ParamSelect choice, the inner mechanism's
    parameters, the grid-size rule's record when the rule sized a grid, and whether the band chose."""

    choice: Choice
    inner_params: dict
    grid_rule: dict | None
    by_band: bool


def decide(choice: Choice, query_sides_m: tuple[float, float], candidates: tuple[str, ...], epsilon: float,
           sensitivity: float, privacy_unit: str, region_side_m: float, choose: str = "band") -> AutoDecision:
    """auto's decision from ParamSelect's scored choice and public inputs only: the band rule's pick
    (``choose="band"``) with its parameters, or the cost model's, with a uniform grid sized by the data-centred rule for
    the points the grid noises (ParamSelect's ``log_n`` feature: the bounded sample) and ``epsilon``,
    the ε the grid gets. ``auto`` releases and ``geodp paramselect predict --mechanisms auto`` both
    call this, so the prediction is what a release runs."""
    from dpcore.grid.size_rule import data_grid_size, rule_record

    lo, hi = (float(v) for v in query_sides_m)
    by_band = band_choice((lo, hi), candidates, privacy_unit) if choose == "band" else None
    if by_band is not None and by_band != choice.mechanism:
        predicted = {c["mechanism"]: c["predicted_error"] for c in choice.inputs["candidates"]}
        choice = dataclasses.replace(choice, mechanism=by_band, predicted_error=predicted.get(by_band))
    inner_params = choice.mechanism_params()
    if by_band is not None:
        # the band rule's own parameters replace ParamSelect's ρ (tuned on uniformly placed queries)
        inner_params = {k: v for k, v in inner_params.items() if k != "cell_width_m"} | \
            band_params((lo, hi), by_band, region_side_m, privacy_unit)
    rule = None
    if choice.mechanism in RULE_SIZED:
        n_noised = 10 ** choice.inputs["features"]["log_n"]
        m = data_grid_size(n_noised, epsilon, sensitivity, (lo, hi), privacy_unit)
        inner_params = {"grid_size": m}
        rule = {**rule_record((lo, hi), privacy_unit), "n": n_noised, "epsilon": float(epsilon), "grid_size": m}
    return AutoDecision(choice, inner_params, rule, by_band is not None)
