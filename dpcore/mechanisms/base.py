"""The one interface every mechanism implements.

Modelled on scikit-learn's estimator contract: constructor arguments are the (public) parameters,
stored unchanged and validated on construction against their annotations (pydantic, so a wrong type
or range is a one-line :class:`MechanismError` before anything is read or charged); capabilities are
declared once on the class as :class:`~dpcore.mechanisms.tags.MechanismTags`. :meth:`Mechanism.fit`
reads a typed input (:mod:`dpcore.mechanisms.inputs`), spends a typed budget and returns a
:class:`~dpcore.synopsis.base.Synopsis` whose privacy record it builds itself. Modelled on OpenDP for being
explicit: the privacy unit, the sensitivity each noisy step is calibrated to and the budget each step
consumes are recorded in the synopsis's charges.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import pydantic

from dpcore.geo import Region
from dpcore.heatmap.mass import MassSpec
from dpcore.mechanisms.contract import (
    ZCDP,
    Budget,
    FitRecord,
    MechanismError,
    PrivacyUnit,
    PureDP,
    ZCDPRecord,
    as_budget,
)
from dpcore.mechanisms.inputs import FitInput, MechanismInput, PointsInput, SpatioTemporalInput
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.bounding import SamplingError
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import PrivacyInfo, Synopsis

__all__ = ["ZCDP", "Budget", "FitInput", "FitRecord", "Mechanism", "MechanismError", "MechanismInput",
           "MechanismTags", "PointsInput", "PrivacyUnit", "PureDP", "SpatioTemporalInput", "ZCDPRecord"]

#: Cells per side of the fine count grid a mechanism reads by default on a cluster (2048² int64 =
#: 32 MB per region; a cell is 4.9 m of a 10 km region).
DEFAULT_FINE_GRID = 2048

WEIGHTED_NOTE = ("weighted bounding: every point weighs min(1, k/n_u) (a person's weights add up to ≤ k); "
                 "counts are weight sums with discrete Laplace noise on the 2^-20 lattice")


class Mechanism(ABC):
    """Base class. Subclasses set ``name`` and ``tags`` and implement :meth:`_fit` (and, where
    ``tags.supports_zcdp``, :meth:`_fit_zcdp`).

    Constructor parameters must be public (not derived from private data) and keyword-only with
    defaults, so :meth:`get_params` can list them for manifests, like scikit-learn. Their annotations
    are the declarative constraints (``Annotated[float, Field(gt=0)]``, ``Literal[...]``); what depends
    on several parameters at once goes in :meth:`check_params`.
    """

    name: ClassVar[str]
    tags: ClassVar[MechanismTags] = MechanismTags()
    _params_model: ClassVar[type[pydantic.BaseModel] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._wrap_check_params()
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        model = _params_model(cls, init)
        cls._params_model = model
        sig = inspect.signature(init)

        @functools.wraps(init)
        def validated_init(self: Mechanism, *args: Any, **kw: Any) -> None:
            bound = sig.bind(self, *args, **kw)  # an unknown parameter name is a TypeError here
            bound.apply_defaults()
            _validate(cls, model, {k: v for k, v in list(bound.arguments.items())[1:]})
            init(self, *args, **kw)

        cls.__init__ = validated_init  # type: ignore[method-assign]

    @classmethod
    def _wrap_check_params(cls) -> None:
        own = cls.__dict__.get("check_params")
        if own is None or getattr(own, "_declared_first", False):
            return

        @functools.wraps(own)
        def check_params(self: Mechanism) -> None:
            Mechanism.check_params(self)  # the declared constraints first, then the cross-parameter rules
            own(self)

        check_params._declared_first = True  # type: ignore[attr-defined]
        cls.check_params = check_params  # type: ignore[method-assign]

    @classmethod
    def legacy_noise_spec(cls, extra: dict, params: dict, charges: list[dict]) -> dict | None:
        """The noise-model spec of a release of this mechanism saved before synopses stored one, rebuilt
        from its recorded parameters, structure (``extra``) and charges (names unprefixed); None: no model."""
        return None

    def fine_grid(self, region: Region) -> int | None:
        """Cells per side R of the fine count grid a cluster builds for this mechanism over ``region``
        (public parameters only), or None when it reads the mass grid of :meth:`fine_mass` instead.
        The default serves every grid up to DEFAULT_FINE_GRID cells per side (exactly where m divides R).
        A release never hands a fit points: a mechanism reads one of these two grids."""
        return DEFAULT_FINE_GRID

    def fine_mass(self, region: Region, unit: PrivacyUnit) -> MassSpec | None:
        """The user-normalised mass grid (dpcore.heatmap.mass) a cluster builds for this mechanism under
        ``unit`` instead of a count grid, or None (the default: it reads :meth:`fine_grid`'s counts).
        It arrives as ``PointsInput.fine_mass``."""
        return None

    def get_params(self) -> dict[str, Any]:
        return {p: getattr(self, p) for p in _param_names(type(self))}

    def tuned_band_parameter(self) -> str | None:
        """The parameter naming the query band this configuration tunes itself to (``tags.tunes_band``),
        or None. An evaluation over several bands fits such a configuration once per band, unless the
        caller gave that parameter."""
        return self.tags.tunes_band

    def check_params(self) -> None:
        """Raise :class:`MechanismError` for parameter values that cannot work, without data.

        Re-validates the declared constraints (attributes may have been set after construction) and
        then whatever subclasses add. Called by :meth:`fit` and by release planning, so a bad value
        fails before the ledger is charged."""
        for klass in type(self).__mro__:
            model = klass.__dict__.get("_params_model")
            if model is not None:
                _validate(type(self), model, self.get_params())
                return

    def fit(self, data: MechanismInput, budget: Budget | float, noise: NoiseSource) -> Synopsis:
        """Spend ``budget`` (a :class:`PureDP` ε, a bare ε, or a :class:`ZCDP` ρ) on ``data`` and return a
        synopsis carrying the privacy record of what was spent."""
        budget = as_budget(budget)
        self.check_params()
        tags = self.tags
        if not isinstance(data, tags.input_type):
            raise MechanismError(f"{self.name} reads {tags.input_type.shape_name()}, got "
                                 f"{type(data).shape_name() if isinstance(data, MechanismInput) else type(data).__name__}")
        if data.weighted and not tags.supports_weights:
            raise MechanismError(f"{self.name} does not support weighted bounding; use k-sampling")
        try:
            sensitivity = tags.charge_sensitivity(data.unit)
        except SamplingError as exc:
            raise MechanismError(str(exc)) from exc
        if isinstance(budget, ZCDP):
            if not tags.supports_zcdp:
                raise MechanismError(f"{self.name} spends a pure ε budget only; under zCDP use a mechanism that "
                                     "supports ρ (identity), or release with --epsilon (charged ε²/2 in ρ)")
            if data.weighted:
                raise MechanismError("weighted bounding is not available under zCDP; use k-sampling")
            record: FitRecord | ZCDPRecord = ZCDPRecord(budget.rho)
            synopsis = self._fit_zcdp(data, record, noise)
            epsilon, rho, charges = None, budget.rho, list(record.charges)
        else:
            record = FitRecord(budget.epsilon, count_quantum=data.count_quantum)
            synopsis = self._fit(data, record, noise)
            epsilon, rho, charges = budget.epsilon, None, record.to_list()
            if record.spent > budget.epsilon * (1 + 1e-9):  # pragma: no cover - Accountant refuses this already
                raise MechanismError(f"{self.name} spent {record.spent} > ε={budget.epsilon}")
        if not charges:
            raise MechanismError(f"{self.name} released without recording any charge")
        if getattr(synopsis, "privacy", None) is not None:
            raise MechanismError(f"{self.name}._fit set a privacy record; fit builds it from the charges")
        notes = list(record.notes) + ([WEIGHTED_NOTE] if data.weighted else [])
        synopsis.privacy = PrivacyInfo(
            self.name, _jsonable(record.params if record.params is not None else self.get_params()), epsilon,
            charges, data.unit.kind, sensitivity, data.unit.recorded_k, noise.description, notes, rho=rho)
        return synopsis

    def fit_zcdp(self, data: MechanismInput, rho: float, noise: NoiseSource) -> Synopsis:
        """Spend a ρ-zCDP budget on ``data``: ``fit(data, ZCDP(rho), noise)``."""
        return self.fit(data, ZCDP(rho), noise)

    @abstractmethod
    def _fit(self, data: Any, acct: FitRecord, noise: NoiseSource) -> Synopsis:
        """Read data, spend ε through ``acct`` (stating notes / resolved parameters with
        ``acct.describe``) and return a synopsis with ``privacy=None``: :meth:`fit` fills it."""

    def _fit_zcdp(self, data: Any, record: ZCDPRecord, noise: NoiseSource) -> Synopsis:
        """The ρ-zCDP fit of mechanisms tagged ``supports_zcdp``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


@functools.cache
def _param_names(cls: type) -> tuple[str, ...]:
    """The parameters of ``cls.__init__`` but self, read once per class: a fit reads them twice (its check
    and its privacy record), and ``inspect.signature`` costs ~0.14 ms, a third of a small grid's fit."""
    return tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")


def _params_model(cls: type, init: Any) -> type[pydantic.BaseModel]:
    """A pydantic model of ``init``'s keyword parameters, from their (possibly ``Annotated``) hints."""
    hints = typing.get_type_hints(init, include_extras=True)
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(init).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = p.default if p.default is not inspect.Parameter.empty else ...
        fields[name] = (hints.get(name, Any), default)
    return pydantic.create_model(f"{cls.__name__}Params", __config__=pydantic.ConfigDict(
        arbitrary_types_allowed=True, extra="forbid"), **fields)


def _validate(cls: type, model: type[pydantic.BaseModel], values: dict[str, Any]) -> None:
    try:
        model.model_validate(values)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"][:1]) or "parameters"
        # The value as the caller wrote it on a command line (JSON), e.g. c="ten", cell_width_m=[1, 2].
        shown = json.dumps(values.get(where, err.get("input")), default=repr)
        raise MechanismError(f"{getattr(cls, 'name', cls.__name__)}: bad {where}={shown}: {err['msg']}") from None


def _jsonable(params: dict) -> dict:
    """Parameters as JSON will give them back (tuples as lists, numpy scalars as Python ones), so a
    saved release's privacy record equals the fitted one."""
    def native(v: Any) -> Any:
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, (tuple, list)):
            return [native(x) for x in v]
        return v

    return {k: native(v) for k, v in params.items()}
