"""The one interface every mechanism implements.

Modelled on scikit-learn's estimator contract: constructor arguments are the (public) parameters and
are stored unchanged; :meth:`Mechanism.fit` reads private data, spends budget through an
:class:`~dpcore.privacy.budget.Accountant` and returns a :class:`~dpcore.synopsis.base.Synopsis`. Modelled on
OpenDP for being explicit: the privacy unit, the sensitivity each noisy step is calibrated to and
the ε each step consumes are recorded in the synopsis's charges.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dpcore import GeoDPError
from dpcore.geo import Region
from dpcore.grid.countgrid import coarsen, fine_centres
from dpcore.grid.histogram import grid_counts, grid_counts_3d
from dpcore.privacy.bounding import WEIGHT_QUANTUM, check_privacy_unit, check_weights, count_sensitivity
from dpcore.privacy.budget import Accountant, check_epsilon
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance
from dpcore.synopsis.base import PrivacyInfo, Synopsis


class MechanismError(GeoDPError, ValueError):
    pass


#: Cells per side of the fine count grid a mechanism reads by default on a cluster (2048² int64 =
#: 32 MB per region; a cell is 4.9 m of a 10 km region).
DEFAULT_FINE_GRID = 2048


@dataclass(frozen=True)
class FitInput:
    """Private input of one city-release, already bounded and projected.

    ``x``, ``y`` are metres in the region (only points inside it). Under user-level privacy the
    points are the bounded sample (≤ k per user over the whole release) and ``sensitivity`` is k;
    under record-level privacy it is 1. ``user`` (dense codes) is given for mechanisms that need the
    user structure (heatmaps); ``slot`` / ``n_slots`` for spatio-temporal ones.

    ``public_total`` is the region's full point count (all points, before bounding) when the caller
    declares it public (configuration, a published statistic); mechanisms may use it for free, e.g.
    to scale a bounded release to full counts.
    ``sample_size`` is a DP estimate of ``n`` (the points given here, after bounding) that the caller
    has *already paid for* (see dpcore.privacy.scaling); reusing it is post-processing. Mechanisms that need
    n (grid-size rules, ψ, ParamSelect) take it from here when set, else pay for their own estimate.
    Never the raw n. ``sample_size_variance`` is its noise variance (public: it follows from the ε and
    sensitivity it was paid with), for mechanisms that combine it with their own measurements.

    ``weights`` (weighted user-level bounding, dpcore.privacy.bounding.contribution_weights): every point of
    the release is given, each weighing min(1, k/n_u) on the WEIGHT_QUANTUM lattice, so a person's
    weights add up to ≤ k and a weighted count histogram keeps sensitivity k. Checked on construction.
    Mechanisms that support it (``Mechanism.supports_weights``) count through :meth:`grid_counts`,
    :attr:`mass` and :meth:`add_count_noise`, which are the plain counts and the integer discrete
    Laplace without weights.

    ``fine`` (a release built on a cluster, tasks/dask_path): the points arrive as int64 counts on a
    fine (R, R) grid over the region's bounds, or (R, R, n_slots) with time slots, summed over the
    input's partitions; ``x`` and ``y`` are then empty. :meth:`grid_counts`, :meth:`grid_counts_3d`,
    :attr:`n` and :meth:`point_masses` read it (dpcore.grid.countgrid says how a coarser grid is made).
    A mechanism picks R through :meth:`Mechanism.fine_grid`.
    """

    x: np.ndarray
    y: np.ndarray
    region: Region
    privacy_unit: str
    max_points_per_user: int | None
    user: np.ndarray | None = None
    slot: np.ndarray | None = None
    n_slots: int | None = None
    slot_seconds: int | None = None
    window_start_s: int | None = None
    public_total: float | None = None
    sample_size: float | None = None
    sample_size_variance: float | None = None
    weights: np.ndarray | None = None
    fine: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_privacy_unit(self.privacy_unit)
        if self.fine is not None:
            if self.weights is not None or self.x.size:
                raise MechanismError("give points or a fine count grid, not both")
            if self.fine.ndim not in (2, 3) or self.fine.shape[0] != self.fine.shape[1]:
                raise MechanismError("a fine count grid is (R, R) or (R, R, n_slots)")
            if self.fine.ndim == 3 and self.fine.shape[2] != self.n_slots:
                raise MechanismError("a spatio-temporal fine grid has one layer per slot")
        if self.x.shape != self.y.shape:
            raise MechanismError("x and y must have the same shape")
        if self.weights is not None:
            if self.privacy_unit != "user":
                raise MechanismError("contribution weights bound a person's points: user-level privacy only")
            if np.shape(self.weights) != self.x.shape:
                raise MechanismError("one weight per point is needed")
            check_weights(self.user, self.weights, count_sensitivity("user", self.max_points_per_user))

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    @property
    def mass(self) -> float:
        """What a count over all the points measures: their number, or the sum of their weights."""
        return float(self.n) if self.weights is None else float(np.sum(self.weights))

    def grid_counts(self, nx: int, ny: int | None = None) -> np.ndarray:
        """(nx, ny) counts over the region: int64 point counts, or weight sums on the lattice."""
        if self.fine is not None:
            fine = self.fine if self.fine.ndim == 2 else self.fine.sum(axis=2)
            return coarsen(fine, nx, ny)
        return grid_counts(self.x, self.y, self.region.bounds_m, nx, ny, weights=self.weights)

    def grid_counts_3d(self, m: int) -> np.ndarray:
        """int64 (m, m, n_slots) counts of the points by cell and time slot (points outside are ignored)."""
        if self.n_slots is None or int(self.n_slots) < 1:
            raise MechanismError("a spatio-temporal count needs n_slots ≥ 1")
        if self.fine is not None:
            if self.fine.ndim != 3:
                raise MechanismError("this fine count grid has no time slots")
            return coarsen(self.fine, m, m)
        if self.slot is None or np.asarray(self.slot).shape != self.x.shape:
            raise MechanismError("a spatio-temporal count needs one slot index per point (FitInput.slot)")
        return grid_counts_3d(self.x, self.y, self.slot, self.region.bounds_m, m, m, int(self.n_slots))

    def point_masses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(x, y, mass) to count point by point: the points with their weights (None: 1 each), or the
        centres of a fine grid's non-empty cells with their counts."""
        if self.fine is None:
            return self.x, self.y, self.weights
        fine = self.fine if self.fine.ndim == 2 else self.fine.sum(axis=2)
        cx, cy = fine_centres(fine.shape[0], self.region.bounds_m)
        flat = fine.ravel()
        nz = np.flatnonzero(flat)
        return cx[nz], cy[nz], flat[nz].astype(np.float64)

    def add_count_noise(self, counts: np.ndarray, epsilon: float, noise: NoiseSource) -> np.ndarray:
        """counts + ε-DP noise of the count sensitivity: integer discrete Laplace on point counts, the
        same on the WEIGHT_QUANTUM lattice on weight sums (NoiseSource.add_lattice_laplace)."""
        if self.weights is None:
            return noise.add_discrete_laplace(counts, self.sensitivity, epsilon)
        return noise.add_lattice_laplace(counts, self.sensitivity, epsilon, WEIGHT_QUANTUM)

    def count_noise_variance(self, epsilon: float) -> float:
        """Variance of :meth:`add_count_noise`'s noise per count (public: ε and the sensitivity)."""
        if self.weights is None:
            return discrete_laplace_variance(self.sensitivity / epsilon)
        return WEIGHT_QUANTUM ** 2 * discrete_laplace_variance(self.sensitivity / epsilon / WEIGHT_QUANTUM)

    @property
    def sensitivity(self) -> int:
        """L1 sensitivity of any count histogram of these points under the privacy unit."""
        return count_sensitivity(self.privacy_unit, self.max_points_per_user)

    @property
    def n(self) -> int:
        return int(self.x.size) if self.fine is None else int(self.fine.sum())


class Mechanism(ABC):
    """Base class. Subclasses set ``name`` and implement :meth:`_fit`.

    Constructor parameters must be public (not derived from private data) and keyword-only with
    defaults, so :meth:`get_params` can list them for manifests, like scikit-learn.
    """

    name: ClassVar[str]
    #: True when the mechanism consumes ``slot``/``n_slots`` and returns a spatio-temporal synopsis.
    spatio_temporal: ClassVar[bool] = False
    #: True when the mechanism can spend a ρ-zCDP budget with discrete Gaussian noise (:meth:`fit_zcdp`).
    supports_zcdp: ClassVar[bool] = False
    #: True when every count the mechanism reads goes through FitInput.grid_counts / mass /
    #: add_count_noise, so weighted bounding (FitInput.weights) keeps its sensitivity; others refuse it.
    supports_weights: ClassVar[bool] = False

    def fine_grid(self, region: Region) -> int | None:
        """Cells per side R of the fine count grid a cluster builds for this mechanism over ``region``
        (public parameters only), or None when it must read the bounded points themselves. The default
        serves every grid up to DEFAULT_FINE_GRID cells per side (exactly where m divides R)."""
        return DEFAULT_FINE_GRID

    def get_params(self) -> dict[str, Any]:
        sig = inspect.signature(type(self).__init__)
        return {p: getattr(self, p) for p in sig.parameters if p != "self"}

    def tuned_band_parameter(self) -> str | None:
        """The parameter naming the query band this configuration tunes itself to (auto's and
        identity@ParamSelect's ``query_sides_m``), or None. An evaluation over several bands fits such a
        configuration once per band, unless the caller gave that parameter."""
        return None

    def check_params(self) -> None:
        """Raise :class:`MechanismError` for parameter values that cannot work, without data.

        Called by :meth:`fit` and by the platform when it plans a release, so a bad value fails before
        the ledger is charged. Subclasses extend it; the default checks nothing."""
        return None

    def fit(self, data: FitInput, epsilon: float, noise: NoiseSource) -> Synopsis:
        """Spend ``epsilon`` on ``data`` and return a synopsis. Validates ε and records the charges."""
        eps = check_epsilon(epsilon)
        self.check_params()
        if data.weighted and not self.supports_weights:
            raise MechanismError(f"{self.name} does not support weighted bounding; use k-sampling")
        acct = Accountant(eps)
        synopsis = self._fit(data, acct, noise)
        if not acct.charges:
            raise MechanismError(f"{self.name} released without recording any charge")
        spent = acct.spent
        if spent > eps * (1 + 1e-9):  # pragma: no cover - Accountant refuses this already
            raise MechanismError(f"{self.name} spent {spent} > ε={eps}")
        synopsis.privacy.charges = acct.to_list()
        return synopsis

    def fit_zcdp(self, data: FitInput, rho: float, noise: NoiseSource) -> Synopsis:
        """Spend a ρ-zCDP budget on ``data`` (discrete Gaussian noise); only where ``supports_zcdp``."""
        raise MechanismError(f"{self.name} spends a pure ε budget only; under zCDP use a mechanism that "
                             "supports ρ (identity), or release with --epsilon (charged ε²/2 in ρ)")

    @abstractmethod
    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> Synopsis:
        """Read data, spend budget via acct, return a synopsis whose ``privacy`` is filled by
        :meth:`privacy_info`."""

    def privacy_info(self, data: FitInput, acct: Accountant, noise: NoiseSource,
                     notes: list[str] | None = None, params: dict | None = None) -> PrivacyInfo:
        notes = list(notes or [])
        if data.weighted:
            notes.append("weighted bounding: every point weighs min(1, k/n_u) (a person's weights add up to ≤ k); "
                         "counts are weight sums with discrete Laplace noise on the 2^-20 lattice")
        return PrivacyInfo(self.name, _jsonable(params if params is not None else self.get_params()),
                           acct.epsilon, acct.to_list(), data.privacy_unit, float(data.sensitivity),
                           data.max_points_per_user if data.privacy_unit == "user" else None,
                           noise.description, notes)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


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
