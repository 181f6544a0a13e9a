"""What a mechanism class can do (:class:`MechanismTags`), declared once on the class and read by ParamSelect,
the evaluators, release planning, the CLI and the contract test instead of knowing a mechanism by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from dpcore.mechanisms.contract import PrivacyUnit
from dpcore.mechanisms.inputs import MechanismInput, PointsInput

#: How ParamSelect (and so ``auto``) treats a mechanism: it searches the cell width for it ("width"),
#: the mechanism picks its own width through ParamSelect ("self_tuned"), or it has no width ("fixed").
AutoRole = Literal["width", "self_tuned", "fixed"]


@dataclass(frozen=True)
class MechanismTags:
    """What a mechanism class can do, declared once on the class (``Mechanism.tags``).

    - ``input_type``: the data shape it reads (a :class:`~dpcore.mechanisms.inputs.MechanismInput`
      subclass that knows how to build itself from a bounded sample).
    - ``sensitivity``: every charge is calibrated to the count sensitivity of the privacy unit ("count":
      k, or 1 at record level) or to 1 per privacy unit whatever k is ("unit": user-normalised mass).
    - ``supports_weights``: every count goes through the input's weighted helpers (weighted bounding).
    - ``supports_zcdp``: it can spend a :class:`ZCDP` budget.
    - ``tunes_band``: the parameter naming the query band it tunes itself to, if any.
    - ``auto_role``: whether ``auto``/ParamSelect weighs it, and how (see :data:`AutoRole`).
    - ``heatmap``: its output is a user-mass heatmap (evaluated by the heatmap harness).
    - ``scales_to_public_total``: it scales its own output to ``public_total`` (else the release
      pipeline wraps it in dpcore.privacy.scaling).
    - ``fast_params``: cheap parameters for tests (training mechanisms default to real-release sizes).
    """

    input_type: type[MechanismInput] = PointsInput
    sensitivity: Literal["count", "unit"] = "count"
    supports_weights: bool = False
    supports_zcdp: bool = False
    tunes_band: str | None = None
    auto_role: AutoRole | None = None
    heatmap: bool = False
    scales_to_public_total: bool = False
    fast_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast_params", MappingProxyType(dict(self.fast_params)))

    @property
    def auto_candidate(self) -> bool:
        return self.auto_role is not None

    def charge_sensitivity(self, unit: PrivacyUnit) -> float:
        """The L1 sensitivity every charge of this mechanism is calibrated to under ``unit``."""
        return 1.0 if self.sensitivity == "unit" else float(unit.count_sensitivity)

