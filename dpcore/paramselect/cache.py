"""The shipped ParamSelect model, read once per process (and refitted without a release's own city)."""

from __future__ import annotations

import functools
from pathlib import Path

from dpcore.paramselect.features import auto_candidates
from dpcore.paramselect.model import DEFAULT_MODEL_PATH, ParamSelectModel


@functools.lru_cache(maxsize=16)
def _cached_model(path: str, exclude: tuple[str, ...]) -> ParamSelectModel:
    # A model without some groups is retrained from the cached full one, so the file is read once per
    # process (auto reads the full model for its candidates, then the one without the release's city).
    base = _cached_model(path, ()) if exclude else ParamSelectModel.load(path)
    present = tuple(g for g in exclude if g in set(base.table["group"]))
    return base.without(present) if present else base


def load_model(path: str | Path | None = None, exclude_groups: tuple[str, ...] = ()) -> ParamSelectModel:
    """The shipped model (default), retrained without ``exclude_groups`` when they are in its table."""
    return _cached_model(str(path or DEFAULT_MODEL_PATH), tuple(sorted(exclude_groups)))


def trained_mechanisms(path: str | Path | None = None) -> tuple[str, ...]:
    """Every mechanism the model has error rows for, in column order (:func:`auto_candidates`): what ``auto`` weighs by
    default (the shipped model: the grid, UG, AG and PrivTree)."""
    trained = set(load_model(path).mechanisms)
    return tuple(m for m in auto_candidates() if m in trained)
