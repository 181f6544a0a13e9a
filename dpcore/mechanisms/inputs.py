"""Mechanism inputs: one type per data shape, each built from the bounded sample a pipeline holds.

A mechanism declares the shape it reads with ``MechanismTags.input_type``. Release planning and the
evaluators hold a :class:`PrivateSample` (one region's bounded points with whatever structure the data
has) and call ``input_type.from_sample(sample)``, so a new shape (a fine count grid, 1-D counts) is one
more :class:`MechanismInput` subclass next to its mechanism, with no edit to the pipeline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpcore.geo import Region
from dpcore.grid.countgrid import coarsen, fine_centres
from dpcore.grid.histogram import grid_counts, grid_counts_3d
from dpcore.heatmap.mass import MassGrid
from dpcore.mechanisms.contract import MechanismError, PrivacyUnit
from dpcore.privacy.bounding import WEIGHT_QUANTUM, check_weights
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance
from dpcore.synopsis.noise import NoiseLaw


class InputError(MechanismError):
    pass


@dataclass(frozen=True)
class PrivateSample:
    """One region's private data after bounding, as a pipeline holds it (points in region metres).

    Fields a data source lacks stay None; an input type that needs one refuses the sample."""

    x: np.ndarray
    y: np.ndarray
    region: Region
    unit: PrivacyUnit
    user: np.ndarray | None = None
    slot: np.ndarray | None = None
    n_slots: int | None = None
    slot_seconds: int | None = None
    window_start_s: int | None = None
    public_total: float | None = None
    weights: np.ndarray | None = None
    #: The points as int64 counts on a fine (R, R) or (R, R, n_slots) grid (a cluster's data pass,
    #: tasks/dask_path.py); ``x`` and ``y`` are then empty.
    fine: np.ndarray | None = None
    #: The points as a heatmap's user-normalised mass grid (Mechanism.fine_mass), built the same way.
    fine_mass: MassGrid | None = None


class MechanismInput(ABC):
    """Private input of one region-release. Every shape states its region and privacy unit."""

    region: Region
    unit: PrivacyUnit
    #: True when building it needs time slots (a public window and slot length): release planning
    #: then asks for a period before anything is read.
    needs_time_slots: ClassVar[bool] = False
    #: The shape in words, for refusals ("identity3d reads points with time slots, got 2-D points").
    shape: ClassVar[str] = ""

    @classmethod
    def shape_name(cls) -> str:
        return cls.shape or cls.__name__

    @classmethod
    @abstractmethod
    def from_sample(cls, sample: PrivateSample) -> MechanismInput:
        """This shape of ``sample`` (raise :class:`InputError` when the sample lacks what it needs)."""

    @property
    def weighted(self) -> bool:
        return False

    @property
    def count_quantum(self) -> float | None:
        """The lattice this input's count noise lies on (None: integers), for the charges' record."""
        return None

    @property
    def privacy_unit(self) -> str:
        return self.unit.kind

    @property
    def max_points_per_user(self) -> int | None:
        return self.unit.recorded_k

    @property
    def sensitivity(self) -> int:
        """L1 sensitivity of a count histogram of this input under its privacy unit."""
        return self.unit.count_sensitivity


@dataclass(frozen=True)
class PointsInput(MechanismInput):
    """2-D points, already bounded and projected: ``x``, ``y`` metres inside the region.

    Under user-level privacy the points are the bounded sample (≤ k per user over the whole release).
    ``user`` (dense codes) is given for mechanisms that need the user structure (heatmaps).

    ``public_total`` is the region's full point count when the caller declares it public; mechanisms
    may use it for free. ``sample_size`` is a DP estimate of ``n`` the caller has *already paid for*
    (dpcore.privacy.scaling); reusing it is post-processing. Never the raw n. ``sample_size_variance`` is its
    (public) noise variance.

    ``weights`` (weighted user-level bounding): every point weighs min(1, k/n_u) on the WEIGHT_QUANTUM
    lattice, so a person's weights add up to ≤ k and a weighted count histogram keeps sensitivity k.
    Mechanisms tagged ``supports_weights`` count through :meth:`grid_counts`, :attr:`mass` and
    :meth:`add_count_noise`, which are the plain counts and integer discrete Laplace without weights.

    ``fine`` (a release built on a cluster, tasks/dask_path.py): the points arrive as int64 counts on a
    fine (R, R) grid over the region's bounds, or (R, R, n_slots) with time slots, summed over the
    input's partitions; ``x`` and ``y`` are then empty. :meth:`grid_counts`, :meth:`grid_counts_3d`,
    :attr:`n` and :meth:`point_masses` read it (dpcore.grid.countgrid says how a coarser grid is made).
    A mechanism picks R through :meth:`Mechanism.fine_grid`.

    ``fine_mass`` (the user-normalised heatmaps, :meth:`Mechanism.fine_mass`): instead of counts, the
    heatmap's input mass grid (dpcore.heatmap.mass), summed the same way; ``x`` and ``y`` are empty and
    only the heatmaps read it (the counts and :attr:`n` are refused: a mass grid holds no point count).
    """

    x: np.ndarray
    y: np.ndarray
    region: Region
    unit: PrivacyUnit
    user: np.ndarray | None = None
    public_total: float | None = None
    sample_size: float | None = None
    sample_size_variance: float | None = None
    weights: np.ndarray | None = None
    fine: np.ndarray | None = None
    fine_mass: MassGrid | None = None

    shape: ClassVar[str] = "2-D points"

    def __post_init__(self) -> None:
        if not isinstance(self.unit, PrivacyUnit):
            raise InputError(f"unit must be a PrivacyUnit, got {self.unit!r}")
        if self.fine_mass is not None and (self.fine is not None or self.weights is not None or np.size(self.x)):
            raise InputError("give points, a fine count grid or a mass grid, only one")
        if self.fine is not None:
            if self.weights is not None or np.size(self.x):
                raise InputError("give points or a fine count grid, not both")
            if self.fine.ndim not in (2, 3) or self.fine.shape[0] != self.fine.shape[1]:
                raise InputError("a fine count grid is (R, R) or (R, R, n_slots)")
        if np.shape(self.x) != np.shape(self.y):
            raise InputError("x and y must have the same shape")
        if self.weights is not None:
            if self.unit.kind != "user":
                raise InputError("contribution weights bound a person's points: user-level privacy only")
            if np.shape(self.weights) != np.shape(self.x):
                raise InputError("one weight per point is needed")
            check_weights(self.user, self.weights, self.unit.count_sensitivity)

    @classmethod
    def from_sample(cls, sample: PrivateSample) -> PointsInput:
        fine = sample.fine
        if fine is not None and fine.ndim == 3:  # a 2-D mechanism reads the slots' sum
            fine = fine.sum(axis=2)
        return cls(sample.x, sample.y, sample.region, sample.unit, user=sample.user, weights=sample.weights,
                   public_total=sample.public_total, fine=fine, fine_mass=sample.fine_mass)

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    def to_sample(self) -> PrivateSample:
        """The points as a pipeline's sample, for mechanisms that read another shape of them."""
        return PrivateSample(self.x, self.y, self.region, self.unit, user=self.user, public_total=self.public_total,
                             weights=self.weights, fine=self.fine, fine_mass=self.fine_mass)

    def _counts_only(self) -> None:
        if self.fine_mass is not None:
            raise InputError("this input is a heatmap's mass grid: it holds no point counts")

    @property
    def n(self) -> int:
        self._counts_only()
        return int(self.x.size) if self.fine is None else int(self.fine.sum())

    @property
    def mass(self) -> float:
        """What a count over all the points measures: their number, or the sum of their weights."""
        return float(self.n) if self.weights is None else float(np.sum(self.weights))

    def grid_counts(self, nx: int, ny: int | None = None) -> np.ndarray:
        """(nx, ny) counts over the region: int64 point counts, or weight sums on the lattice."""
        self._counts_only()
        if self.fine is not None:
            fine = self.fine if self.fine.ndim == 2 else self.fine.sum(axis=2)
            return coarsen(fine, nx, ny)
        return grid_counts(self.x, self.y, self.region.bounds_m, nx, ny, weights=self.weights)

    def point_masses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(x, y, mass) to count point by point: the points with their weights (None: 1 each), or the
        centres of a fine grid's non-empty cells with their counts."""
        self._counts_only()
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

    @property
    def count_quantum(self) -> float | None:
        """The lattice :meth:`add_count_noise` adds noise on: weight sums' WEIGHT_QUANTUM, else integers."""
        return None if self.weights is None else WEIGHT_QUANTUM

    def count_noise_law(self, epsilon: float) -> NoiseLaw:
        """The law :meth:`add_count_noise` draws from: what the release's noise model reads."""
        return NoiseLaw("laplace", float(self.sensitivity) / float(epsilon), float(self.count_quantum or 1.0))

    def count_noise_variance(self, epsilon: float) -> float:
        """Variance of :meth:`add_count_noise`'s noise per count (public: ε and the sensitivity)."""
        if self.weights is None:
            return discrete_laplace_variance(self.sensitivity / epsilon)
        return WEIGHT_QUANTUM ** 2 * discrete_laplace_variance(self.sensitivity / epsilon / WEIGHT_QUANTUM)


@dataclass(frozen=True, kw_only=True)
class SpatioTemporalInput(PointsInput):
    """2-D points with a time slot each: ``slot`` indexes ``n_slots`` slots of ``slot_seconds`` from
    ``window_start_s`` (public configuration, never read from the data)."""

    slot: np.ndarray | None = None
    n_slots: int
    slot_seconds: int | None = None
    window_start_s: int | None = None

    needs_time_slots: ClassVar[bool] = True
    shape: ClassVar[str] = "points with time slots (slot, n_slots)"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_slots is None or (self.slot is None and self.fine is None):
            raise InputError("a spatio-temporal input needs n_slots and a slot per point (or a fine grid per slot)")
        if self.fine is not None and (self.fine.ndim != 3 or self.fine.shape[2] != self.n_slots):
            raise InputError("a spatio-temporal fine grid has one layer per slot")
        if self.fine is None and np.shape(self.slot) != np.shape(self.x):
            raise InputError("slot must have one slot index per point")

    def grid_counts_3d(self, m: int) -> np.ndarray:
        """int64 (m, m, n_slots) counts of the points by cell and time slot (points outside are ignored)."""
        if int(self.n_slots) < 1:
            raise InputError(f"n_slots must be ≥ 1, got {self.n_slots}")
        if self.fine is not None:
            return coarsen(self.fine, m, m)
        return grid_counts_3d(self.x, self.y, self.slot, self.region.bounds_m, m, m, int(self.n_slots))

    def to_sample(self) -> PrivateSample:
        return PrivateSample(self.x, self.y, self.region, self.unit, user=self.user, slot=self.slot,
                             n_slots=self.n_slots, slot_seconds=self.slot_seconds, window_start_s=self.window_start_s,
                             public_total=self.public_total, weights=self.weights, fine=self.fine)

    @classmethod
    def from_sample(cls, sample: PrivateSample) -> SpatioTemporalInput:
        has_slots = sample.slot is not None or (sample.fine is not None and sample.fine.ndim == 3)
        if not has_slots or sample.n_slots is None:
            raise InputError("a spatio-temporal mechanism needs time slots: give a period (a public window)")
        return cls(sample.x, sample.y, sample.region, sample.unit, user=sample.user, weights=sample.weights,
                   public_total=sample.public_total, slot=sample.slot, n_slots=int(sample.n_slots),
                   slot_seconds=sample.slot_seconds, window_start_s=sample.window_start_s, fine=sample.fine)


def input_for(input_type: type[MechanismInput], data: MechanismInput | PrivateSample) -> MechanismInput:
    """``data`` in the shape ``input_type`` reads: itself when it already has it, else built from its
    sample (a :class:`PrivateSample`, or the points of a :class:`PointsInput`)."""
    if isinstance(data, input_type):
        return data
    if isinstance(data, PointsInput):
        data = data.to_sample()
    if not isinstance(data, PrivateSample):
        raise InputError(f"cannot build {input_type.__name__} from {type(data).__name__}")
    return input_type.from_sample(data)


def FitInput(x: np.ndarray, y: np.ndarray, region: Region, privacy_unit: str | PrivacyUnit,
             max_points_per_user: int | None = None, *, user: np.ndarray | None = None,
             slot: np.ndarray | None = None, n_slots: int | None = None, slot_seconds: int | None = None,
             window_start_s: int | None = None, public_total: float | None = None,
             sample_size: float | None = None, sample_size_variance: float | None = None,
             weights: np.ndarray | None = None, fine: np.ndarray | None = None,
             fine_mass: MassGrid | None = None) -> PointsInput:
    """The input of a points mechanism from the classic argument list: a :class:`SpatioTemporalInput`
    when time slots are given, else a :class:`PointsInput`."""
    unit = PrivacyUnit.of(privacy_unit, max_points_per_user)
    common = {"user": user, "public_total": public_total, "sample_size": sample_size,
              "sample_size_variance": sample_size_variance, "weights": weights, "fine": fine, "fine_mass": fine_mass}
    if slot is not None or (fine is not None and fine.ndim == 3):
        return SpatioTemporalInput(x, y, region, unit, slot=slot, n_slots=n_slots, slot_seconds=slot_seconds,
                                   window_start_s=window_start_s, **common)
    return PointsInput(x, y, region, unit, **common)
