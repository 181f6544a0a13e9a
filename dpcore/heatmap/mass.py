"""The user-normalised heatmaps' input as integer masses on their Δ × Δ grid, from any subset of people.

A heatmap's input is the sum over privacy units of each unit's mass on the grid, in integer units of
1/Q (dpcore.heatmap.quadtree explains why). What a :class:`MassSpec` says about one unit's mass:

- each person's points inside the region share Q units (``point_units`` None; the paper's user
  normalisation): a person with m points there puts ⌊Q·c/m⌋ units on a cell holding c of them;
- or every point adds ``point_units`` units: Q at record level (every record is its own unit), ⌊Q/k⌋
  under the ``"bound"`` normalisation (≤ k points per person over the release, so ≤ Q per person).

A release of several regions normalises each person over the union of its regions: a person's Q
units are shared by all of their points inside any of the run's regions (``person_total``: the
count of (point, region) pairs of that person), so their mass over the whole run is ≤ Q, and the
regions' heatmaps together have L1 sensitivity Q, like one heatmap (the regions then compose in
parallel in the ledger, as the k points of a count release do). A person normalised per region
would have mass Q in every region they visit.

Every unit's mass is a function of that unit's own points only, so the input of a union of disjoint
groups of people is the exact int64 sum of the groups' inputs. A cluster's data pass uses this
(dpcore.data.chunks, tasks/dask_path.py): after the shuffle on the user key each partition holds all
of its people's points, computes :func:`cell_units` for them, and the partitions' sums are the
heatmap's input, equal to the one computed from all the points in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcore import GeoDPError
from dpcore.grid.histogram import flat_cell_index


class MassError(GeoDPError, ValueError):
    pass


@dataclass(frozen=True)
class MassSpec:
    """What a mass grid holds (public parameters only): ``resolution`` Δ cells per side over the
    region, integer units of 1/``quantum``, and ``point_units`` units per point, or None when each
    person's points in the region share ``quantum`` units."""

    resolution: int
    quantum: int
    point_units: int | None = None

    @property
    def size(self) -> int:
        return int(self.resolution) ** 2


def heatmap_mass_spec(resolution: int, quantum: int, normalisation: str, privacy_unit: str,
                      k: int | None) -> MassSpec:
    """The mass a heatmap with these parameters reads under privacy unit ``privacy_unit`` with bound k:
    ``"user"`` normalisation shares Q units over each person's points; ``"bound"`` gives ⌊Q/k⌋ per
    point; at record level every record is its own unit of Q (both normalisations agree)."""
    d, q = int(resolution), int(quantum)
    if privacy_unit == "record":
        return MassSpec(d, q, q)
    if normalisation == "bound":
        if k is None or int(k) < 1:
            raise MassError("normalisation='bound' needs the release-wide bound max_points_per_user (k)")
        return MassSpec(d, q, q // int(k))
    if normalisation != "user":
        raise MassError(f"normalisation must be 'user' or 'bound', got {normalisation!r}")
    return MassSpec(d, q, None)


@dataclass(frozen=True)
class MassGrid:
    """A heatmap's input: int64 (Δ, Δ) ``units`` indexed [ix, iy], built as ``spec`` says."""

    spec: MassSpec
    units: np.ndarray

    def __post_init__(self) -> None:
        d = int(self.spec.resolution)
        if self.units.shape != (d, d) or self.units.dtype != np.int64:
            raise MassError(f"a mass grid is int64 ({d}, {d}), got {self.units.dtype} {self.units.shape}")


def mass_cells(x: np.ndarray, y: np.ndarray, user: np.ndarray | None, bounds: tuple[float, float, float, float],
               spec: MassSpec) -> tuple[np.ndarray, np.ndarray]:
    """(flat cell ix·Δ + iy, int64 units) of the non-empty cells of these points' mass (points outside
    ``bounds`` are ignored). With ``spec.point_units`` None, ``user`` gives every point's person and
    every person's points inside the bounds must all be here (a person split over two calls would
    get mass Q in each)."""
    d = int(spec.resolution)
    pix, inside = flat_cell_index(x, y, bounds, d, d)
    if user is not None:
        if np.shape(user) != np.shape(x):
            raise MassError("user must have one entry per point")
        user = np.asarray(user)[inside]
    return cell_units(pix, user, spec)


def person_mass(pix: np.ndarray, user: np.ndarray | None, n_cells: int,
                quantum: int | None, person_total: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(flat cell, float64 mass) of the non-empty cells when each person's points share one unit of
    mass: a person with m points puts c/m on a cell holding c of them (``quantum`` None: exact), or
    ⌊Q·c/m⌋ units of 1/Q (floored per person and cell, so a person adds at most Q units in all).
    ``user`` None: every point is its own unit (1, or Q units). ``person_total`` (per point, ≥ the
    person's points here) replaces m: the person's points over every region of a run."""
    if user is None:
        cells, count = np.unique(pix, return_counts=True)
        return cells, count * (1.0 if quantum is None else float(quantum))
    _, u = np.unique(np.asarray(user), return_inverse=True)
    u = u.astype(np.int64)
    # One entry per (person, cell): how many of the person's m points fall there.
    pair, first, c = np.unique(u * n_cells + pix, return_index=True, return_counts=True)
    if person_total is None:
        m = np.bincount(u)[pair // n_cells].astype(np.float64)
    else:
        m = np.asarray(person_total, dtype=np.float64)[first]
    share = c / m if quantum is None else np.floor(c * (float(quantum) / m))
    cells, inv = np.unique(pair % n_cells, return_inverse=True)
    return cells, np.bincount(inv, weights=share, minlength=cells.size)


def cell_units(pix: np.ndarray, user: np.ndarray | None, spec: MassSpec,
               person_total: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(flat cell, int64 units) of the non-empty cells of the mass of points already on the grid:
    ``pix`` each point's flat cell ix·Δ + iy, ``user`` its person (needed when ``spec.point_units`` is
    None, and then every person's points in the region must all be here); ``person_total`` as in
    :func:`person_mass` (a run of several regions)."""
    if spec.point_units is not None:
        cells, count = np.unique(pix, return_counts=True)
        return cells, count.astype(np.int64) * int(spec.point_units)
    if user is None:
        raise MassError("user-normalised mass needs the user of every point")
    cells, mass = person_mass(pix, user, spec.size, int(spec.quantum), person_total)
    # Shares are integers and a cell's sum ≤ Q·(people) < 2^53, so the float64 sums are exact.
    return cells, np.rint(mass).astype(np.int64)


def mass_grid(x: np.ndarray, y: np.ndarray, user: np.ndarray | None, bounds: tuple[float, float, float, float],
              spec: MassSpec) -> MassGrid:
    """The mass grid of all these points (every person's points in the region included)."""
    grid = np.zeros(spec.size, dtype=np.int64)
    cells, units = mass_cells(x, y, user, bounds, spec)
    grid[cells] = units
    return MassGrid(spec, grid.reshape(int(spec.resolution), int(spec.resolution)))
