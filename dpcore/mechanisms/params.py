"""Declarative parameter constraints for mechanism constructors (pydantic annotations).

A mechanism annotates its keyword parameters with these types; :class:`~dpcore.mechanisms.base.Mechanism`
validates them on construction and in ``check_params`` (values are stored unchanged, so manifests keep
what the caller gave). Whole numbers refuse booleans and fractions (``levels=2.5``); numbers refuse
strings that are not numbers (``c=ten``) and lists (``cell_width_m=[1,2]``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("a boolean is not a number")
    return v


def _ordered_band(v: tuple[float, float]) -> tuple[float, float]:
    if not v[0] <= v[1]:
        raise ValueError(f"a band needs 0 < lo ≤ hi, got {list(v)}")
    return v


# every number is finite: an infinite cell width or a NaN share has no grid or budget behind it
Number = Annotated[float, BeforeValidator(_no_bool), Field(allow_inf_nan=False)]
Positive = Annotated[float, BeforeValidator(_no_bool), Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, BeforeValidator(_no_bool), Field(ge=0, allow_inf_nan=False)]
#: A share of the budget: strictly between 0 and 1.
Fraction = Annotated[float, BeforeValidator(_no_bool), Field(gt=0, lt=1)]
#: A share that may be 0 (the step is then skipped): [0, 1).
OptionalFraction = Annotated[float, BeforeValidator(_no_bool), Field(ge=0, lt=1)]
Whole = Annotated[int, BeforeValidator(_no_bool)]
PositiveInt = Annotated[int, BeforeValidator(_no_bool), Field(ge=1)]
NonNegativeInt = Annotated[int, BeforeValidator(_no_bool), Field(ge=0)]
#: A query band [lo, hi] in metres with 0 < lo ≤ hi.
Band = Annotated[tuple[Positive, Positive], AfterValidator(_ordered_band)]
