"""Mechanism registry. Adding a method = one module + one line in ``_BUILTIN`` (or :func:`register`).

What a mechanism can do is read from its class's ``tags`` (:class:`MechanismTags`), never from its name.

Modules are imported on first use so that e.g. the CLI does not import torch for a grid release.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError
from dpcore.mechanisms.contract import ZCDP, Budget, MechanismTags, PrivacyUnit, PureDP
from dpcore.mechanisms.inputs import (
    MechanismInput,
    PointsInput,
    PrivateSample,
    SpatioTemporalInput,
    input_for,
)

_BUILTIN: dict[str, str] = {
    "identity": "dpcore.mechanisms.identity:IdentityGrid",
    "ug": "dpcore.mechanisms.ug:UniformGrid",
    "ag": "dpcore.mechanisms.ag:AdaptiveGrid",
    "hb": "dpcore.mechanisms.hb:HierarchicalGrid",
    "privtree": "dpcore.mechanisms.privtree:PrivTree",
    "snh": "dpcore.mechanisms.snh:SpatialNeuralHistogram",
    "identity3d": "dpcore.mechanisms.identity3d:IdentityGrid3D",
    "vdr": "dpcore.mechanisms.vdr:VDR",
    "dpheatmap": "dpcore.mechanisms.dpheatmap:DPHeatmap",
    "laplace": "dpcore.mechanisms.heatmap_baselines:LaplaceHeatmap",
    "laplace-top": "dpcore.mechanisms.heatmap_baselines:LaplaceTopHeatmap",
    "auto": "dpcore.mechanisms.auto:AutoMechanism",
}

_EXTRA: dict[str, type[Mechanism]] = {}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Register a mechanism class defined outside dpcore (e.g. in a research script)."""
    _EXTRA[cls.name] = cls
    return cls


def _available() -> dict[str, str]:
    out = {}
    for name, target in _BUILTIN.items():
        module = target.partition(":")[0]
        if importlib.util.find_spec(module) is not None:
            out[name] = target
    return out


def mechanism_names(where: Callable[[MechanismTags], bool] | None = None) -> list[str]:
    """Registered names (sorted), those whose tags satisfy ``where`` when given."""
    names = sorted({*_available(), *_EXTRA})
    if where is None:
        return names
    return [n for n in names if where(get_mechanism_class(n).tags)]


def builtin_order() -> list[str]:
    """Built-in names in registry order, then registered ones: the stable order of ParamSelect's columns."""
    return [*_available(), *(n for n in _EXTRA if n not in _BUILTIN)]


def get_mechanism_class(name: str) -> type[Mechanism]:
    if name in _EXTRA:
        return _EXTRA[name]
    target = _available().get(name)
    if target is None:
        raise MechanismError(f"unknown mechanism {name!r}; available: {', '.join(mechanism_names())}")
    module_name, _, cls_name = target.partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def get_mechanism(name: str, **params) -> Mechanism:
    cls = get_mechanism_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise MechanismError(f"bad parameters for {name}: {exc}") from exc


__all__ = ["ZCDP", "Budget", "FitInput", "Mechanism", "MechanismError", "MechanismInput", "MechanismTags",
           "PointsInput", "PrivacyUnit", "PrivateSample", "PureDP", "SpatioTemporalInput", "builtin_order",
           "get_mechanism", "get_mechanism_class", "input_for", "mechanism_names", "register"]
