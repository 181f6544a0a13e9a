"""What a release's answers estimate, and what their intervals cover, read from the release alone.

Units (``Synopsis.unit()``, a typed :class:`~dpcore.synopsis.base.AnswerUnit`; its label in answers):
- ``full points``: every point of the data (a record-level release; a user-level one scaled to full
  counts by a public total or by its paid contribution profile);
- ``bounded points``: the points left after each person was cut to k (a user-level release that was not
  scaled: its counts fall short of the data's by the share the bound drops);
- ``people``: distinct people (a heatmap's user mass, or a people count).

An interval covers what the release's noise model says (``NoiseModel.covers``): ``noise`` (the release's
own noise; exact for record-level and bounded-point answers), ``noise and bounding bias`` (full counts
scaled by the contribution profile, dpcore.privacy.profile) or nothing (``none``); a release of cells
whose counts it spreads evenly over the part a box covers adds ``spread in cut cells``
(dpcore.synopsis.spread), so the answer's interval covers the true count, not only the noise-free answer. A user-level answer
of full counts scaled by a public total has no estimate of the bounding's bias, so its interval would
cover the noise only: :func:`honest_intervals` withholds it.
"""

from __future__ import annotations

import numpy as np

from dpcore.synopsis.base import Synopsis

FULL, BOUNDED, PEOPLE = "full points", "bounded points", "people"
COVERS_NOISE, COVERS_BIAS, COVERS_NONE = "noise", "noise and bounding bias", "none"
#: What an interval widened by the spread inside partly covered cells adds to its noise model's ``covers``.
COVERS_SPREAD = "spread in cut cells"


def covers_words(synopsis: Synopsis) -> str:
    """What the release's intervals cover: the noise model's ``covers``, and the spread in cut cells where
    the release spreads cells' counts over boxes."""
    covers = getattr(synopsis.noise_model(), "covers", COVERS_NOISE)
    if synopsis.spread_model() is None:
        return covers
    parts = covers.split(" and ")
    return ", ".join(parts[:-1] + [parts[-1]]) + f" and {COVERS_SPREAD}" if len(parts) > 1 \
        else f"{covers} and {COVERS_SPREAD}"


def answer_unit(synopsis: Synopsis) -> str:
    """What the release's range answers count (the label of ``synopsis.unit()``)."""
    return synopsis.unit().label


def interval_covers(synopsis: Synopsis, lower: np.ndarray) -> np.ndarray:
    """Per answer: what its interval covers (``none`` where there is no interval)."""
    return np.where(np.isfinite(np.asarray(lower, dtype=np.float64)), covers_words(synopsis), COVERS_NONE)


def unit_words(synopsis: Synopsis) -> str:
    """One line for a terminal: the unit, and for bounded points what they fall short of."""
    unit = synopsis.unit()
    if unit.kind == "bounded_points":
        return (f"answers count bounded points (each person cut to k = {unit.k} points), not the data's full counts; "
                "release without --public-total on a current geodp to get full counts")
    if unit.kind == "points" and getattr(synopsis, "profile", None) is not None:
        return "answers estimate full point counts (bounded counts scaled by the paid contribution profile)"
    return f"answers count {unit.label}"


def honest_intervals(synopsis: Synopsis, lower: np.ndarray, upper: np.ndarray,
                     method: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The intervals to show: a user-level answer of full counts whose interval covers the noise only
    (scaled by a public total: nothing tells the bounding's bias) gets none, and says why."""
    if synopsis.unit().kind == "points" and synopsis.privacy.privacy_unit == "user" \
            and getattr(synopsis, "profile", None) is None and np.isfinite(np.asarray(lower, float)).any():
        nan = np.full(np.shape(lower), np.nan)
        return nan, nan.copy(), ("none: this release was scaled to full counts by a public total, and nothing "
                                 "in it estimates the bias of bounding each person to k points, so an interval "
                                 "would cover the noise only; release without --public-total (the paid "
                                 "contribution profile estimates that bias)")
    return lower, upper, method
