"""`auto`'s data-centred choice of mechanism: by query band, from public-data measurements.

On squares centred where people are, the public training sets (the Gowalla 1,000-user sample's
cities and synthetic cities; ``bench/public_choice.py``, bench/README.md) rank the cheap mechanisms by
band far more consistently than ParamSelect's cost model (trained on uniform query centres) predicts
them: under 1 km a uniform grid sized by the data-centred rule (dpcore.grid.size_rule) is the best or
within a few per cent of it, and on 1–5 km squares AG's adaptive second level wins. The rule reads only
the band (public configuration), so it is post-processing of nothing private.
"""

from __future__ import annotations

import math

#: Bands whose geometric mean side is at least this many metres go to AG; smaller ones to the grid.
AG_FROM_SIDE_M = 1000.0
#: What the band rule picks (in the order auto's candidates name them).
GRID_CHOICE = "ug"
COARSE_CHOICE = "ag"
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
