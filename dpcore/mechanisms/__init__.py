"""Mechanism registry. Adding a method = one module + one line in ``_BUILTIN`` (or :func:`register`).

What a mechanism can do is read from its class's ``tags`` (:class:`MechanismTags`), never from its name.

Modules are imported on first use so that e.g. the CLI does not import torch for a grid release.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dpcore.mechanisms.base import FitInput, Mechanism, MechanismError
from dpcore.mechanisms.contract import ZCDP, Budget, PrivacyUnit, PureDP
from dpcore.mechanisms.inputs import (
    MechanismInput,
    PointsInput,
    PrivateSample,
    SpatioTemporalInput,
    input_for,
)
from dpcore.mechanisms.tags import MechanismTags

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
    """Register a mechanism class defined outside dpcore (e.g. in a research script). A taken name is
    refused: a built-in one, or one registered by another class (the same class again, e.g. a script run
    twice in one session, is fine), so no release silently runs another mechanism under a known name."""
    name = cls.name
    taken = _EXTRA.get(name)
    if name in _BUILTIN:
        raise MechanismError(f"mechanism name {name!r} is a built-in mechanism's; register it under another name")
    if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
        raise MechanismError(f"mechanism name {name!r} is taken by {taken.__module__}.{taken.__qualname__}")
    _EXTRA[name] = cls
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


def charge_law(charges: list[dict], name: str):
    """The NoiseLaw of one recorded charge (discrete Laplace or Gaussian), or None."""
    from dpcore.synopsis.noise import NoiseLaw

    c = next((c for c in charges if c.get("name") == name), None)
    if c is None:
        return None
    if c.get("noise") == "discrete_gaussian" and c.get("rho"):
        return NoiseLaw("gaussian", float(c["sensitivity"]) ** 2 / (2.0 * float(c["rho"])))
    if c.get("noise") == "discrete_laplace" and c.get("epsilon"):
        return NoiseLaw("laplace", float(c["sensitivity"]) / float(c["epsilon"]), float(c.get("quantum") or 1.0))
    return None


def adopt_noise_model(synopsis):
    """A release saved before synopses stored their noise model gets one from the mechanism that made it
    (``Mechanism.legacy_noise_spec``: its recorded charges and structure), so older releases keep their
    intervals. Releases that store one, or whose mechanism has none, are left as they are."""
    target = synopsis
    while hasattr(target, "inner") and hasattr(target, "factor"):  # scaled to full counts
        target = target.inner
    extra = getattr(target, "_extra", None)
    if extra is None or "noise_model" in extra or getattr(target, "privacy", None) is None:
        return synopsis
    p = target.privacy
    name, params, charges = p.mechanism, dict(p.params), list(p.charges)
    chosen = params.get("chosen") if name == "auto" else None
    if isinstance(chosen, dict):  # auto: the chosen mechanism's charges, unprefixed
        name = str(chosen.get("mechanism"))
        charges = [{**c, "name": str(c["name"]).split("/", 1)[1]} for c in charges
                   if str(c.get("name", "")).startswith(name + "/")]
        params = dict(chosen.get("params") or {})
    try:
        cls = get_mechanism_class(name)
    except MechanismError:
        return synopsis
    spec = cls.legacy_noise_spec(extra, params, charges)
    if spec is not None:
        extra["noise_model"] = spec
        target.__dict__.pop("_noise_model", None)
        synopsis.__dict__.pop("_model", None)
    return synopsis
