"""The release's data pass on a real Dask LocalCluster (tasks/dask_path.py): the same pre-noise counts
as reading everything into one process, and user-level bounding over the whole release when a
person's rows are spread over many files and cities."""

import numpy as np
import pandas as pd
import pytest

from dpcore.data.chunks import GridSpec
from dpcore.data.points import load_points
from dpcore.geo import city_region, time_slots
from dpcore.grid.histogram import grid_counts, grid_counts_3d
from tasks.dask_path import release_counts, release_frame

CITIES = ["austin", "chicago", "new-york"]
T0 = 1_704_067_200  # 2024-01-01 UTC


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as cl, \
            Client(cl) as c:
        yield c


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    """Six Parquet files; person 0 has 40 rows in every file, spread over three cities; the others have
    1–25 rows each, some outside every region or outside the window."""
    folder = tmp_path_factory.mktemp("spread")
    rng = np.random.default_rng(5)
    for i in range(6):
        n = 3000
        user = rng.integers(1, 400, n)
        city = rng.integers(0, 3, n)
        user[:40] = 0
        lat = np.array([city_region(c).center_lat for c in CITIES])[city] + rng.normal(0, 0.02, n)
        lon = np.array([city_region(c).center_lon for c in CITIES])[city] + rng.normal(0, 0.02, n)
        lat[-50:] = 10.0  # outside every region
        ts = T0 + rng.integers(-86400, 2 * 86400, n)  # a third outside the one-day window
        pd.DataFrame({"user_id": user, "timestamp": pd.to_datetime(ts, unit="s", utc=True),
                      "lat": lat, "lon": lon}).to_parquet(folder / f"part-{i}.parquet")
    return folder


def _today(folder, window):
    """Today's single-process reading: every valid point in the window."""
    pts = load_points(folder).points.between(*window)
    return pts, np.asarray(pts.user_ids)[pts.user]


def test_record_level_counts_are_bit_identical_to_one_process(client, spread):
    window = (T0, T0 + 86400)
    specs = [GridSpec(c, city_region(c), 128) for c in CITIES]
    specs.append(GridSpec("austin-slots", city_region("austin"), 32, T0, 3600, 24))
    got = release_counts(str(spread), specs, window)
    assert got.n_files == 6 and got.report.rows_read == 18000
    pts, _ = _today(spread, window)
    for spec in specs:
        x, y = spec.region.project(pts.lat, pts.lon)
        if spec.n_slots:
            slot = time_slots(pts.ts, T0, 3600, 24)
            expected = grid_counts_3d(x, y, slot, spec.region.bounds_m, 32, 32, 24)
        else:
            expected = grid_counts(x, y, spec.region.bounds_m, 128)
        assert expected.sum() > 1000
        np.testing.assert_array_equal(got.cities[spec.city].fine, expected)


def test_user_level_keeps_min_of_rows_and_k_per_person_over_all_files_and_cities(client, spread):
    window = (T0, T0 + 86400)
    regions = [city_region(c) for c in CITIES]
    k = 7
    frame, _, _ = release_frame(str(spread), regions, window, privacy_unit="user", max_points_per_user=k)
    assert frame.npartitions == 6
    kept = frame.compute().groupby("user").size()
    pts, ids = _today(spread, window)
    inside = np.zeros(len(pts), dtype=bool)
    for r in regions:
        inside |= r.contains(pts.lat, pts.lon)
    n_u = pd.Series(ids[inside]).value_counts()
    assert n_u[0] > 3 * k and (n_u < k).any()  # the spread person and light ones are both there
    expected = np.minimum(n_u, k).sort_index()
    pd.testing.assert_series_equal(kept.sort_index(), expected, check_names=False, check_dtype=False)
    # the counts the fits get hold exactly the kept points, each in its city
    specs = [GridSpec(c, r, 64) for c, r in zip(CITIES, regions, strict=True)]
    got = release_counts(str(spread), specs, window, privacy_unit="user", max_points_per_user=k)
    assert sum(int(got.cities[c].fine.sum()) for c in CITIES) == int(expected.sum())


def test_a_fit_input_of_fine_counts_gives_the_points_grids():
    """Block sums of a fine grid are the points' own coarser grids (m divides R); other sizes keep
    every point, each in one cell; the mass a fit counts point by point is the same."""
    from dpcore.mechanisms.base import FitInput

    region = city_region("austin")
    rng = np.random.default_rng(1)
    x, y = rng.uniform(-region.half_m, region.half_m, (2, 20000))
    points = FitInput(x, y, region, "record", None)
    fine = FitInput(np.empty(0), np.empty(0), region, "record", None, fine=grid_counts(x, y, region.bounds_m, 512))
    assert fine.n == points.n == 20000
    for m in (1, 8, 64, 512):
        np.testing.assert_array_equal(fine.grid_counts(m), points.grid_counts(m))
    odd = fine.grid_counts(100)
    assert odd.sum() == 20000 and np.abs(odd - points.grid_counts(100)).sum() < 0.2 * 20000
    assert fine.point_masses()[2].sum() == 20000
