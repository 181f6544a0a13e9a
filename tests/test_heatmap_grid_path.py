"""Heatmaps fit from a mass grid the data pass builds on the workers, never from points.

The user-normalised heatmaps (dpheatmap, laplace, laplace-top) spread each person's mass over their
own points. The data pass does that in each partition after the shuffle on the user key and sums the
partitions (dpcore.heatmap.mass, Mechanism.fine_mass). These tests check that the mass grid equals the
one computed from the bounded points in one process and gives the same release bit for bit, that one
person still adds at most mass 1, and that no registered mechanism receives points in a release.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import dpcore.mechanisms as registry
from dpcore.data.chunks import GridSpec
from dpcore.geo import city_region
from dpcore.heatmap.mass import MassGrid, MassSpec
from dpcore.heatmap.quadtree import DEFAULT_QUANTUM, user_normalised_grid
from dpcore.mechanisms import (
    FitInput,
    Mechanism,
    MechanismError,
    MechanismTags,
    PrivacyUnit,
    get_mechanism,
    get_mechanism_class,
    mechanism_names,
    register,
)
from dpcore.mechanisms.dpheatmap import heatmap_units, mass_spec
from dpcore.privacy.noise import NoiseSource
from tasks.config import parse_period
from tasks.dask_path import release_counts, release_frame
from tasks.release_city_plan import ReleaseError, make_plans
from tasks.release_tasks import grid_specs, privatize

CITIES = ["austin", "chicago", "new-york"]
T0 = 1_704_067_200  # 2024-01-01 UTC
WINDOW = (T0, T0 + 86400)
HEATMAPS = ["dpheatmap", "laplace", "laplace-top"]
Q = DEFAULT_QUANTUM
K = 10  # no one but the heavy person has more than K rows, so bounding only ever cuts that person


def _rows(user: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    n = user.size
    city = rng.integers(0, 3, n)
    lat = np.array([city_region(c).center_lat for c in CITIES])[city] + rng.normal(0, 0.02, n)
    lon = np.array([city_region(c).center_lon for c in CITIES])[city] + rng.normal(0, 0.02, n)
    ts = T0 + rng.integers(0, 86400, n)
    lat[rng.random(n) < 0.03] = 10.0
    ts[rng.random(n) < 0.05] -= 86400
    return pd.DataFrame({"user_id": user, "timestamp": pd.to_datetime(ts, unit="s", utc=True), "lat": lat,
                         "lon": lon})


def _write_files(folder, with_heavy: bool = True) -> None:
    """Six Parquet files. 600 people with 1..K rows each; person 0 (with ``with_heavy``) has 120 rows
    spread over every file and all three cities. Some rows lie outside every region or the window."""
    rng = np.random.default_rng(8)
    frame = _rows(np.repeat(np.arange(1, 601), rng.integers(1, K + 1, 600)), rng)
    if with_heavy:
        frame = pd.concat([frame, _rows(np.zeros(120, dtype=np.int64), np.random.default_rng(9))])
    frame = frame.sample(frac=1.0, random_state=1)  # person 0's rows land in every file
    bounds = np.linspace(0, len(frame), 7).astype(int)
    for i in range(6):
        frame.iloc[bounds[i]:bounds[i + 1]].to_parquet(folder / f"part-{i}.parquet")


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spread")
    _write_files(folder)
    return folder


@pytest.fixture(scope="module")
def without_heavy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("light")
    _write_files(folder, with_heavy=False)
    return folder


def _points_and_mass(folder, unit: PrivacyUnit, normalisation: str, resolution: int):
    """One data pass that hands each city both its bounded points (what a heatmap fit read before)
    and its worker-built mass grid, so both come from the same bounded sample."""
    specs = []
    for c in CITIES:
        region = city_region(c)
        specs.append(GridSpec(f"{c}/points", region, None))
        spec = mass_spec(resolution, Q, normalisation, unit)
        specs.append(GridSpec(f"{c}/mass", region, spec.resolution, mass=spec))
    return release_counts(str(folder), specs, WINDOW, privacy_unit=unit.kind, max_points_per_user=K, seed=4)


def _union_normalised(got, city: str) -> np.ndarray:
    """A city's user-normalised units from the bounded points, each person's Q units shared over their
    points in every city of the run (the formula of dpcore.heatmap.mass, written out here)."""
    users, per_person = np.unique(np.concatenate([got.cities[f"{c}/points"].user for c in CITIES]),
                                  return_counts=True)
    pts, region = got.cities[f"{city}/points"], city_region(city)
    ix = np.clip(((pts.x - region.bounds_m[0]) / region.side_m * 64).astype(int), 0, 63)
    iy = np.clip(((pts.y - region.bounds_m[1]) / region.side_m * 64).astype(int), 0, 63)
    out = np.zeros((64, 64), dtype=np.int64)
    person = pd.DataFrame({"u": pts.user, "ix": ix, "iy": iy})
    for (u, cx, cy), c in person.value_counts().items():
        out[cx, cy] += (c * Q) // per_person[np.searchsorted(users, u)]
    return out


@pytest.mark.parametrize("kind,normalisation", [("user", "user"), ("user", "bound"), ("record", "user")])
def test_the_worker_mass_grid_gives_the_point_paths_release_bit_for_bit(spread, kind, normalisation):
    unit = PrivacyUnit.of(kind, K)
    frame, _, _ = release_frame(str(spread), [GridSpec(c, city_region(c), 64) for c in CITIES], WINDOW,
                                max_points_per_user=K)
    assert frame.npartitions == 6  # the mass is summed over several partitions (record level: files)
    got = _points_and_mass(spread, unit, normalisation, 64)
    for c in CITIES:
        pts, mass = got.cities[f"{c}/points"], got.cities[f"{c}/mass"]
        assert mass.x is None and mass.fine is None and isinstance(mass.mass, MassGrid)
        region = city_region(c)
        grid_input = FitInput(np.empty(0), np.empty(0), region, unit, fine_mass=mass.mass)
        if kind == "user" and normalisation == "user":
            # several cities: each person's mass 1 is shared over all of them, not 1 per city
            expected = _union_normalised(got, c)
            alone = user_normalised_grid(pts.x, pts.y, pts.user, region.bounds_m, 64, Q)
            assert expected.sum() < alone.sum()  # people seen in other cities weigh less here
            np.testing.assert_array_equal(mass.mass.units, expected)
            continue
        points_input = FitInput(pts.x, pts.y, region, unit, user=pts.user if kind == "user" else None)
        expected = heatmap_units(points_input, 64, Q, normalisation)
        assert expected.sum() > 100 * (Q // K)
        np.testing.assert_array_equal(mass.mass.units, expected)
        for name in HEATMAPS:
            mech = get_mechanism(name, resolution=64, normalisation=normalisation)
            a = mech.fit(points_input, 1.0, NoiseSource.seeded(9))
            b = mech.fit(grid_input, 1.0, NoiseSource.seeded(9))
            np.testing.assert_array_equal(a.values, b.values)
            assert a.privacy.charges == b.privacy.charges and a.privacy.notes == b.privacy.notes


@pytest.mark.parametrize("normalisation", ["user", "bound"])
def test_one_person_adds_at_most_mass_one_to_the_worker_grids(spread, without_heavy, normalisation):
    """Person 0's 120 rows are spread over every file and city; k = 10 cuts only them. Removing them
    changes the worker-built grids by a non-negative vector of mass ≤ 1 over the whole release
    ("user": their mass 1 shared over all cities; "bound": 1/k per point, ≤ k points)."""
    unit = PrivacyUnit.user(K)
    with_p = _points_and_mass(spread, unit, normalisation, 64)
    without = _points_and_mass(without_heavy, unit, normalisation, 64)
    diffs = [with_p.cities[f"{c}/mass"].mass.units - without.cities[f"{c}/mass"].mass.units for c in CITIES]
    assert all((d >= 0).all() for d in diffs)
    totals = [int(d.sum()) for d in diffs]
    if normalisation == "user":
        assert sum(totals) <= Q
        # person 0 has points in every city: one whole unit of mass (less < 1 unit per cell of
        # flooring) over all of them together, some of it in each
        assert sum(totals) > Q - 3 * 64 * 64 and all(t > 0 for t in totals)
    else:
        assert sum(totals) <= K * (Q // K) <= Q
        assert sum(totals) == K * (Q // K)  # all k kept points are inside a region here
    # the people who were not cut are the same in both runs
    for c in CITIES:
        pts_with = with_p.cities[f"{c}/points"]
        pts_without = without.cities[f"{c}/points"]
        assert np.sum(pts_with.user != 0) == pts_without.user.size


def _plans_for(name: str, **extra):
    params = dict(get_mechanism_class(name).tags.fast_params)
    common = {"dataset": "grid-path", "cities": ["austin"], "center": None, "side_km": None,
              "period": parse_period("2024-01-01"), "mechanism": name, "params": params, "epsilon": 1.0,
              "privacy_unit": "user", "max_points_per_user": K, "seed": 3, "data_version": "v1"}
    return make_plans(**{**common, **extra})


def test_no_registered_mechanism_receives_points_in_a_release(spread):
    plans = [dataclasses.replace(p, city=name) for name in mechanism_names() for p in _plans_for(name)]
    got = release_counts(str(spread), grid_specs(plans), WINDOW, privacy_unit="user", max_points_per_user=K, seed=3)
    heatmaps = set()
    for plan in plans:
        data = got.cities[plan.city]
        assert data.x is None and data.y is None and data.user is None, plan.mechanism
        heatmap = get_mechanism_class(plan.mechanism).tags.heatmap
        assert (data.mass is not None) == heatmap and (data.fine is not None) != heatmap, plan.mechanism
        if heatmap:
            heatmaps.add(plan.mechanism)
            assert data.mass.units.sum() > 0
            syn = privatize.fn(plan, data)
            assert sum(c["epsilon"] for c in syn.privacy.charges) == pytest.approx(1.0)
    assert heatmaps == set(HEATMAPS)


def test_a_mass_grid_of_other_parameters_is_refused():
    region = city_region("austin")
    unit = PrivacyUnit.user(K)
    grid = MassGrid(MassSpec(32, Q, None), np.zeros((32, 32), dtype=np.int64))
    data = FitInput(np.empty(0), np.empty(0), region, unit, fine_mass=grid)
    with pytest.raises(MechanismError, match="mass grid"):
        get_mechanism("laplace", resolution=64).fit(data, 1.0, NoiseSource.seeded(1))
    with pytest.raises(MechanismError, match="mass grid"):
        get_mechanism("laplace", resolution=32, normalisation="bound").fit(data, 1.0, NoiseSource.seeded(1))
    # a count mechanism cannot read a mass grid as if it held points
    with pytest.raises(MechanismError, match="no point counts"):
        get_mechanism("identity", grid_size=8).fit(data, 1.0, NoiseSource.seeded(1))
    with pytest.raises(MechanismError, match="only one"):
        FitInput(np.zeros(3), np.zeros(3), region, unit, fine_mass=grid)


class _PointsOnly(Mechanism):
    """A mechanism that declares no grid (it would need the points themselves)."""

    name = "toy-points-only"
    tags = MechanismTags()

    def __init__(self, *, scale: float = 1.0):
        self.scale = scale

    def fine_grid(self, region):
        return None

    def _fit(self, data, acct, noise):  # pragma: no cover - a release refuses it before any fit
        raise AssertionError("never fitted")


def test_a_mechanism_without_a_grid_and_a_heatmap_with_a_public_total_are_refused_in_planning(monkeypatch):
    monkeypatch.setattr(registry, "_EXTRA", dict(registry._EXTRA))
    register(_PointsOnly)
    with pytest.raises(ReleaseError, match="never points"):
        _plans_for(_PointsOnly.name)
    with pytest.raises(ReleaseError, match="user mass"):
        _plans_for("laplace", public_total=1000.0)
    plans = _plans_for("laplace")
    (spec,) = grid_specs(plans)
    assert spec.mass == MassSpec(256, Q, None) and spec.cells == 256 and spec.n_slots is None
