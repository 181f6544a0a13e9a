"""The data-centred grid-size rule: a uniform grid's side m from the release's signal and query band.

Qardaji et al.'s m = sqrt(N·ε/10) balances noise against the uniformity error of queries placed
uniformly over the region. Queries where people are (centred on data points) cover dense cells, where
the uniformity error of a coarse cell is large and the noise relatively small, so finer grids win,
and by how much depends on the query size. Here, per query band,

    m = clip(round(a_band · s^b_band), SIZE_MIN, SIZE_MAX),   s = n·ε_grid/k,

with n the (public or paid, noisy) number of points the grid counts, ε_grid the ε its cells get and
k the count sensitivity (1 at record level); a and b are fitted per privacy unit as well (a k-bounded
sample is less concentrated than the full data, so at equal signal it wants coarser cells). The constants were fitted on public data only (the Gowalla
1,000-user sample's cities and synthetic cities; never the held-out Gowalla NYC or SF cabs) by
``bench/fit_grid_rule.py``, which writes ``dpcore/models/grid_size_rule.json`` with the command that
produced it. Between the fitted bands, log a and b are interpolated in the log of the band's geometric
mean side (held constant beyond the outer bands).

Every input is public: the rule never sees the points, so its choice is post-processing of n̂.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from dpcore import GeoDPError

RULE_PATH = Path(__file__).resolve().parents[1] / "models" / "grid_size_rule.json"
#: The bands the rule is fitted on (name → query sides in metres).
BANDS: dict[str, tuple[float, float]] = {"25-100": (25.0, 100.0), "100-1000": (100.0, 1000.0),
                                         "1000-5000": (1000.0, 5000.0)}
SIZE_MIN = 8
#: The largest raster a classic mechanism publishes (dpcore.mechanisms.ug.MAX_RASTER).
SIZE_MAX = 2048


class SizeRuleError(GeoDPError, ValueError):
    pass


@functools.lru_cache(maxsize=4)
def load_rule(path: str | None = None) -> dict:
    """The fitted constants (the shipped JSON unless ``path`` is given)."""
    p = Path(path) if path else RULE_PATH
    try:
        rule = json.loads(p.read_text())
        for band in rule["bands"].values():
            for unit in ("record", "user"):
                float(band[unit]["a"]), float(band[unit]["b"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SizeRuleError(f"cannot read the grid-size rule {p}: {exc}") from exc
    return rule


def band_constants(query_sides_m: tuple[float, float], privacy_unit: str = "record",
                   rule: dict | None = None) -> tuple[float, float]:
    """(a, b) for a query band and privacy unit: interpolated in log(geometric mean side) between the
    fitted bands."""
    lo, hi = (float(v) for v in query_sides_m)
    if not 0 < lo <= hi:
        raise SizeRuleError(f"query_sides_m must satisfy 0 < lo ≤ hi, got {[lo, hi]}")
    if privacy_unit not in ("record", "user"):
        raise SizeRuleError(f"privacy_unit must be 'record' or 'user', got {privacy_unit!r}")
    rule = rule or load_rule()
    fitted = sorted(((math.log(math.sqrt(v["query_sides_m"][0] * v["query_sides_m"][1])), v)
                     for v in rule["bands"].values()), key=lambda t: t[0])
    xs = [t[0] for t in fitted]
    x = math.log(math.sqrt(lo * hi))
    log_a = float(np.interp(x, xs, [math.log(t[1][privacy_unit]["a"]) for t in fitted]))
    b = float(np.interp(x, xs, [t[1][privacy_unit]["b"] for t in fitted]))
    return math.exp(log_a), b


def data_grid_size(n: float, epsilon: float, sensitivity: float, query_sides_m: tuple[float, float],
                   privacy_unit: str = "record", max_size: int = SIZE_MAX, rule: dict | None = None) -> int:
    """The rule's m for signal n·ε/k, a query band and the privacy unit. Public inputs only; monotone in
    n·ε/k."""
    if not (epsilon > 0 and sensitivity > 0 and math.isfinite(n)):
        raise SizeRuleError(f"need ε > 0, sensitivity > 0 and a finite n; got {epsilon}, {sensitivity}, {n}")
    rule = rule or load_rule()
    a, b = band_constants(query_sides_m, privacy_unit, rule)
    signal = max(float(n), 1.0) * float(epsilon) / float(sensitivity)
    m = int(round(a * signal ** b))
    return int(min(max(m, int(rule.get("size_min", SIZE_MIN))), int(rule.get("size_max", SIZE_MAX)), int(max_size)))


def rule_record(query_sides_m: tuple[float, float], privacy_unit: str = "record", rule: dict | None = None) -> dict:
    """What a release's parameters record about the rule: its band constants and provenance."""
    rule = rule or load_rule()
    a, b = band_constants(query_sides_m, privacy_unit, rule)
    return {"rule": rule["rule"], "query_sides_m": [float(v) for v in query_sides_m],
            "privacy_unit": privacy_unit, "a": a, "b": b,
            "size_min": rule.get("size_min", SIZE_MIN), "size_max": rule.get("size_max", SIZE_MAX),
            "fitted_by": rule.get("command"), "fitted_on": rule.get("training_sets"), "date": rule.get("date")}
