"""Per-person privacy accounting over time: a dataset's policy and what any one person can have lost.

A dataset has one :class:`PrivacyPolicy`: the privacy unit, the contribution bound k and the window it
applies to (one release, or one UTC day), and a budget — the most one person may lose over any
``window_days`` consecutive UTC days (w-event privacy, Kellaris et al., VLDB 2014), or over the
dataset's whole life when ``window_days`` is None. Losses are pure ε under sequential composition, or
ρ under zero-concentrated DP (Bun & Steinke 2016), whose composition of many small releases is much
tighter; (ε, δ) is shown beside ρ.

Every release is a :class:`LedgerCharge`: the UTC days it covers, its ε (or ρ), and the region and
bounding draw it belongs to. What a person can lose over a window of days:

- charges of one *bounding draw* (the cities of one run, whose users were bounded to k together) over
  disjoint regions compose in parallel: a person's k points are split between them, so the draw costs
  the most any one point can reach — the largest sum over regions that overlap at a point;
- different draws compose sequentially (they add);
- a charge whose bound is per release costs its full amount in any window it touches; one bounded per
  UTC day costs its amount once per covered day inside the window (a person brings k on each day);
- under zCDP, sensitivities add, so √ρ adds within a draw and across days of one release (group
  privacy), and ρ adds across draws.

Everything here is pure: it reads public ledger records only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Literal

import numpy as np

from dpcore import GeoDPError

Accounting = Literal["pure", "zcdp"]
BoundWindow = Literal["release", "day"]
DAY_S = 86_400
#: Day numbers standing for "every day" (a release without a period and no declared horizon).
EVERY_DAY = (-(10**7), 10**7)
_REL_TOL = 1e-9
#: The largest budget a policy holds: beyond it no guarantee means anything, and sums of charges stay exact.
MAX_POLICY_BUDGET = 1e4


class PolicyError(GeoDPError, ValueError):
    """A privacy policy, or a release's fit to it, is invalid."""


class BudgetRefused(GeoDPError, ValueError):
    """A release would take some person past the dataset's budget; refused before any noise."""


def budget_label(epsilon: float | None, rho: float | None = None) -> str:
    """'ε=0.5' for a pure-ε release, 'ρ=0.01' for a zCDP one."""
    return f"ρ={rho:g}" if epsilon is None and rho is not None else f"ε={epsilon:g}"


def day_number(text: str) -> int:
    """'2012-05-01' → days since 1970-01-01 (UTC)."""
    try:
        return (date.fromisoformat(str(text)) - date(1970, 1, 1)).days
    except ValueError as exc:
        raise PolicyError(f"a day must be YYYY-MM-DD, got {text!r}") from exc


def day_text(day: int) -> str:
    return datetime.fromtimestamp(int(day) * DAY_S, UTC).date().isoformat()


def days_of_window(start_s: int | None, end_s: int | None) -> tuple[int, int] | None:
    """The UTC days a half-open time window [start_s, end_s) touches, as (first, last); None if unbounded."""
    if start_s is None or end_s is None:
        return None
    return int(start_s) // DAY_S, (int(end_s) - 1) // DAY_S


def zcdp_epsilon(rho: float, delta: float) -> float:
    """(ε, δ)-DP implied by ρ-zCDP: ε = ρ + 2·sqrt(ρ·ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3)."""
    if rho <= 0:
        return 0.0
    return float(rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)))


def zcdp_rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ whose (ε, δ) conversion is at most ``epsilon``: the inverse of :func:`zcdp_epsilon`."""
    a = math.log(1.0 / delta)
    root = -math.sqrt(a) + math.sqrt(a + epsilon)
    return float(root * root)


@dataclass(frozen=True)
class PrivacyPolicy:
    """What one person may lose from a dataset, and how a release must bound them.

    ``budget`` is ε (pure accounting) or ρ (zCDP) per person over any ``window_days`` consecutive UTC
    days; ``window_days`` None means over the dataset's whole life. ``max_records_per_person`` is a
    public bound m that lets record-level releases into a user-level dataset be charged m-fold (group
    privacy); without it they are refused. ``horizon`` (first and last UTC day) is what a release
    without a period covers; without one, such a release touches every window.
    """

    privacy_unit: Literal["user", "record"]
    budget: float
    max_points_per_user: int | None = 20
    bound_window: BoundWindow = "release"
    window_days: int | None = None
    accounting: Accounting = "pure"
    delta: float = 1e-9
    max_records_per_person: int | None = None
    horizon: tuple[str, str] | None = None
    #: True: each release's k is chosen by its plan from published releases, at most
    #: ``max_points_per_user`` (k sets only a release's noise scale; every release still costs ε).
    k_auto: bool = False

    def __post_init__(self) -> None:
        if self.privacy_unit not in ("user", "record"):
            raise PolicyError(f"privacy unit must be user or record, got {self.privacy_unit!r}")
        if self.accounting not in ("pure", "zcdp"):
            raise PolicyError(f"accounting must be pure or zcdp, got {self.accounting!r}")
        if self.bound_window not in ("release", "day"):
            raise PolicyError(f"the bound window must be release or day, got {self.bound_window!r}")
        if not (isinstance(self.budget, int | float) and math.isfinite(self.budget)
                and 0 < self.budget <= MAX_POLICY_BUDGET):
            raise PolicyError(f"the budget must be a number in (0, {MAX_POLICY_BUDGET:g}], got {self.budget!r}")
        if self.privacy_unit == "user":
            k = self.max_points_per_user
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1_000_000:
                raise PolicyError(f"a user-level policy needs k (max points per user) in [1, 1e6], got {k!r}")
        if self.window_days is not None and not (isinstance(self.window_days, int) and 1 <= self.window_days
                                                 <= 36_600):
            raise PolicyError(f"the window must be 1..36600 days or lifetime, got {self.window_days!r}")
        if not 0 < self.delta < 1:
            raise PolicyError(f"delta must be in (0, 1), got {self.delta!r}")
        if self.k_auto and self.privacy_unit != "user":
            raise PolicyError("k = auto bounds people's points: it needs privacy unit user")
        m = self.max_records_per_person
        if m is not None and not (isinstance(m, int) and 1 <= m <= 1_000_000):
            raise PolicyError(f"max records per person must be in [1, 1e6], got {m!r}")
        if self.horizon is not None:
            a, b = (day_number(d) for d in self.horizon)
            if b < a:
                raise PolicyError(f"horizon {self.horizon[0]}..{self.horizon[1]} ends before it starts")

    @property
    def unit(self) -> str:
        """The currency of the budget: 'ε' or 'ρ'."""
        return "ρ" if self.accounting == "zcdp" else "ε"

    @property
    def window_label(self) -> str:
        return "lifetime" if self.window_days is None else f"{self.window_days} days"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["horizon"] = list(self.horizon) if self.horizon else None
        if not d["k_auto"]:  # a fixed-k policy is stored as it was before k could be auto
            del d["k_auto"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PrivacyPolicy:
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if fields.get("horizon") is not None:
            fields["horizon"] = tuple(fields["horizon"])
        return cls(**fields)

    def describe(self) -> str:
        """The guarantee in plain words."""
        chosen = (f", k ≤ {self.max_points_per_user} chosen per release from published releases"
                  if self.k_auto else "")
        who = (f"each person (all their records; at most {'k' if self.k_auto else self.max_points_per_user} "
               f"points per person per {'UTC day' if self.bound_window == 'day' else 'release'} are used{chosen})"
               if self.privacy_unit == "user" else "each single record")
        over = "over the whole life of the dataset" if self.window_days is None else \
            f"over any {self.window_days} consecutive UTC days"
        if self.accounting == "zcdp":
            eps = zcdp_epsilon(self.budget, self.delta)
            return (f"{who} loses at most ρ={self.budget:g} (zero-concentrated DP), i.e. (ε={eps:.3g}, "
                    f"δ={self.delta:g})-DP, {over}")
        return f"{who} loses at most ε={self.budget:g} {over}"


@dataclass(frozen=True)
class LedgerCharge:
    """One city-release as the ledger sees it: public facts only.

    ``epsilon`` is the release's pure ε, or None when it is only ρ-zCDP (``rho``). ``multiplier`` is the
    group size a release is charged for (m records per person for a record-level release into a
    user-level dataset; 1 otherwise). ``first_day``/``last_day`` are UTC day numbers (EVERY_DAY when the
    release covers every day). ``draw`` names the bounding draw; ``bbox`` is the region's
    (min_lat, min_lon, max_lat, max_lon).
    """

    key: str
    draw: str
    epsilon: float | None
    rho: float | None
    first_day: int
    last_day: int
    per_day: bool
    bbox: tuple[float, float, float, float]
    multiplier: int = 1
    city: str = ""
    period: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def cost(self, accounting: Accounting) -> float:
        """What one person loses through this release alone (one day of it, when bounded per day)."""
        m = self.multiplier
        if accounting == "pure":
            if self.epsilon is None:
                raise PolicyError(f"release {self.key[:12]} is only ρ-zCDP; it has no pure-ε cost")
            return self.epsilon * m
        rho = self.rho if self.rho is not None else float(self.epsilon) ** 2 / 2.0
        return rho * m * m

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bbox"] = list(self.bbox)
        d.update(d.pop("extra"))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LedgerCharge:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "extra"}
        known["bbox"] = tuple(known["bbox"])
        return cls(**known, extra={k: v for k, v in d.items() if k not in cls.__dataclass_fields__})


def _overlap_rows(bboxes: list[tuple[float, float, float, float]]) -> list[frozenset[int]]:
    """The distinct sets of regions that share a point, maximal ones only.

    For closed axis-aligned boxes the deepest points include a corner (max of two mins), so the
    candidates are (min_lat of i, min_lon of j) pairs; a set contained in another is dropped.
    """
    if len(bboxes) == 1:
        return [frozenset([0])]
    b = np.asarray(bboxes, dtype=np.float64)
    lat = b[:, 0][:, None]
    lon = b[:, 1][None, :]
    sets = set()
    for i in range(len(b)):
        for j in range(len(b)):
            inside = (b[:, 0] <= lat[i, 0]) & (lat[i, 0] <= b[:, 2]) & (b[:, 1] <= lon[0, j]) & (lon[0, j] <= b[:, 3])
            if inside.any():
                sets.add(frozenset(np.flatnonzero(inside).tolist()))
    return [s for s in sets if not any(s < t for t in sets)]


def _window_starts(charges: list[LedgerCharge], window_days: int,
                   touching: tuple[int, int] | None) -> np.ndarray:
    """Window starts where the loss can peak: every charge's breakpoints (it is piecewise linear, or
    convex under zCDP, between them), limited to windows that touch ``touching`` when given."""
    first = np.array([c.first_day for c in charges], dtype=np.int64)
    last = np.array([c.last_day for c in charges], dtype=np.int64)
    w = window_days
    starts = np.unique(np.concatenate([first - w + 1, first, last - w + 1, last]))
    if touching is not None:
        lo, hi = touching
        starts = starts[(starts >= lo - w + 1) & (starts <= hi)]
        starts = np.unique(np.concatenate([starts, [max(lo - w + 1, EVERY_DAY[0]), min(hi, EVERY_DAY[1])]]))
    return starts


def _losses(charges: list[LedgerCharge], accounting: Accounting, window_days: int | None,
            starts: np.ndarray | None) -> np.ndarray:
    """Loss of one person over each window [s, s + W − 1] (or the one lifetime window)."""
    cost = np.array([c.cost(accounting) for c in charges], dtype=np.float64)
    per_day = np.array([c.per_day for c in charges], dtype=bool)
    first = np.array([c.first_day for c in charges], dtype=np.float64)
    last = np.array([c.last_day for c in charges], dtype=np.float64)
    if per_day.any() and ((first[per_day] <= EVERY_DAY[0]) | (last[per_day] >= EVERY_DAY[1])).any():
        raise PolicyError("a release bounded per UTC day needs a period (or a policy horizon)")
    if window_days is None:
        lo, hi = np.array([-np.inf]), np.array([np.inf])
    else:
        lo = starts.astype(np.float64)
        hi = lo + window_days - 1
    # days of each charge inside each window: (n_charges, n_windows)
    overlap = np.clip(np.minimum(last[:, None], hi[None, :]) - np.maximum(first[:, None], lo[None, :]) + 1, 0, None)
    days = np.where(per_day[:, None], overlap, (overlap > 0).astype(np.float64))
    base = np.sqrt(cost) if accounting == "zcdp" else cost
    piece = base[:, None] * days
    # Rows: for each draw, the maximal sets of its regions that share a point.
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(charges):
        groups.setdefault(c.draw, []).append(i)
    rows, cols, row_group = [], [], []
    for g, (_, idx) in enumerate(sorted(groups.items())):
        for members in _overlap_rows([charges[i].bbox for i in idx]):
            r = len(row_group)
            row_group.append(g)
            for m in members:
                rows.append(r)
                cols.append(idx[m])
    # per_row[r] = the sum of its members' pieces, added in column order (what a sparse 0/1 matrix
    # product does; np.add.at adds in the order given, so the sums are the same to the last bit)
    order = np.lexsort((cols, rows))
    per_row = np.zeros((len(row_group), piece.shape[1]))  # (n_rows, n_windows)
    np.add.at(per_row, np.asarray(rows, dtype=np.intp)[order], piece[np.asarray(cols, dtype=np.intp)[order]])
    row_group = np.asarray(row_group)
    bounds = np.flatnonzero(np.r_[True, row_group[1:] != row_group[:-1]])
    per_group = np.maximum.reduceat(per_row, bounds, axis=0)
    if accounting == "zcdp":
        per_group = per_group ** 2
    return per_group.sum(axis=0)


def worst_case_loss(policy: PrivacyPolicy, charges: list[LedgerCharge],
                    touching: tuple[int, int] | None = None) -> dict:
    """The most any one person can have lost: over the policy's window and over the dataset's life.

    Returns {"window": loss, "window_start": first day of the worst window or None, "lifetime": loss}
    in the policy's unit (ε, or ρ with its (ε, δ) beside it). ``touching`` limits the windows to those
    that touch the given (first, last) days.
    """
    if not charges:
        out = {"window": 0.0, "window_start": None, "lifetime": 0.0}
    else:
        lifetime = float(_losses(charges, policy.accounting, None, None)[0])
        if policy.window_days is None:
            out = {"window": lifetime, "window_start": None, "lifetime": lifetime}
        else:
            starts = _window_starts(charges, policy.window_days, touching)
            losses = _losses(charges, policy.accounting, policy.window_days, starts)
            i = int(np.argmax(losses))
            out = {"window": float(losses[i]), "window_start": day_text(int(starts[i]))
                   if EVERY_DAY[0] < starts[i] < EVERY_DAY[1] else None, "lifetime": lifetime}
    if policy.accounting == "zcdp":
        out["window_epsilon"] = zcdp_epsilon(out["window"], policy.delta)
        out["lifetime_epsilon"] = zcdp_epsilon(out["lifetime"], policy.delta)
    return out


def check_within_budget(policy: PrivacyPolicy, existing: list[LedgerCharge], new: list[LedgerCharge]) -> dict:
    """Refuse (:class:`BudgetRefused`) when adding ``new`` takes some person past the budget in any
    window the new charges touch; returns the loss after the charge otherwise."""
    after = worst_case_loss(policy, existing + new, touching=_span(new))
    if new and after["window"] > policy.budget * (1 + _REL_TOL):
        if policy.window_days is None or not existing:
            before = worst_case_loss(policy, existing)["window"]
            where = ""
        else:  # the same worst window, without the new charges
            start = day_number(after["window_start"]) if after["window_start"] else _span(new)[0]
            before = float(_losses(existing, policy.accounting, policy.window_days, np.array([start]))[0])
            where = f" (the {policy.window_days} days from {day_text(start)})"
        raise BudgetRefused(
            f"budget exceeded: a person could lose {policy.unit}={after['window']:.4g} over "
            f"{policy.window_label}{where}, the policy allows {policy.unit}={policy.budget:g}; "
            f"{policy.unit}={before:.4g} is already spent there, {max(0.0, policy.budget - before):.4g} left, "
            f"this release needs {policy.unit}={after['window'] - before:.4g}. Nothing was noised or charged.")
    return after


def _span(charges: list[LedgerCharge]) -> tuple[int, int] | None:
    return (min(c.first_day for c in charges), max(c.last_day for c in charges)) if charges else None
