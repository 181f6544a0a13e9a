"""The release's data pass on a real Dask LocalCluster (tasks/dask_path.py): the same pre-noise counts
as reading everything into one process, and user-level bounding over the whole release when a
person's rows are spread over many files and cities."""

import numpy as np
import pandas as pd
import pytest

from dpcore.data.chunks import GridSpec, dense_counts
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
    pts, _ = _today(spread, window)
    # only the window's rows are validated (issue 42 item 5); the rest are counted as outside it
    assert got.n_files == 6 and (got.report.rows_read, got.report.rows_outside) == (len(pts), 18000 - len(pts))
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
    specs = [GridSpec(c, r, 64) for c, r in zip(CITIES, regions, strict=True)]
    frame, _, _ = release_frame(str(spread), specs, window, max_points_per_user=k)
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


def _ulps(v: float, k: int) -> np.ndarray:
    out = [v]
    for direction in (np.inf, -np.inf):
        w = v
        for _ in range(k):
            w = np.nextafter(w, direction)
            out.append(w)
    return np.array(out)


def test_block_cells_are_the_cells_of_project_and_flat_cell_index():
    """chunks.spatial_cells (blockwise, in place) puts every point in the cell Region.project +
    flat_cell_index give, at region edges, across the antimeridian and outside; outside = n²."""
    from dpcore.data.chunks import BLOCK, spatial_cells
    from dpcore.geo import Region
    from dpcore.grid.histogram import flat_cell_index

    rng = np.random.default_rng(7)
    for region, n in [(city_region("new-york"), 200), (Region("fiji", -17.7, 179.9, 80.0), 333),
                      (Region("small", 51.5, -0.1, 0.05), 7)]:
        h = region.half_m
        edge = np.array([-h, h, -h * (1 - 1e-16), h * (1 - 1e-16), 0.0, np.nextafter(h, 0), np.nextafter(-h, 0)])
        xs = np.r_[rng.uniform(-1.2 * h, 1.2 * h, 3 * BLOCK), np.repeat(edge, edge.size)]
        ys = np.r_[rng.uniform(-1.2 * h, 1.2 * h, 3 * BLOCK), np.tile(edge, edge.size)]
        lat, lon = region.unproject(xs, ys)
        lon = (lon + 180.0) % 360.0 - 180.0  # a point past the antimeridian is stored as lon < -180 + …
        # every float within 40 ulps of each edge, in each axis, so that rounding at the edge is hit
        e_lat, e_lon = region.unproject(np.array([-h, h]), np.array([-h, h]))
        walk = np.concatenate([_ulps(v, 40) for v in e_lat])
        lat = np.r_[lat, walk, np.full(walk.size, region.center_lat), 10.0, -89.0]
        walk = np.concatenate([_ulps(v, 40) for v in e_lon])
        lon = np.r_[lon, np.full(walk.size, region.center_lon), walk, region.center_lon, 180.0]
        x, y = region.project(lat, lon)
        flat, inside = flat_cell_index(x, y, region.bounds_m, n, n)
        expected = np.full(lat.size, n * n)
        expected[inside] = flat
        got = spatial_cells(region, n, lat, lon)
        assert inside.sum() > BLOCK and (~inside).sum() > 1000
        np.testing.assert_array_equal(got, expected)


def test_record_level_reads_no_user_or_time_only_when_statistics_prove_them_valid(tmp_path):
    """A clean Parquet file is counted from lat/lon alone; a null user or time, or a time outside the
    window, makes the pass read that column. The report counts every bad row inside the window; a row with
    no time lies in no charged day, so it is counted as outside the window and not validated."""
    import pyarrow.parquet as pq

    from dpcore.data.chunks import file_counts, read_valid
    from dpcore.data.inputs import resolve_input
    from dpcore.data.readers import proven_columns, sources_for

    region = city_region("austin")
    n = 1000
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"user_id": rng.integers(0, 50, n),
                          "timestamp": pd.to_datetime(T0 + rng.integers(0, 86400, n), unit="s", utc=True),
                          "lat": region.center_lat + rng.normal(0, 0.01, n),
                          "lon": region.center_lon + rng.normal(0, 0.01, n)})
    frame.to_parquet(tmp_path / "clean.parquet")
    dirty = frame.astype({"user_id": "Int64"})
    dirty.loc[[5, 9], "user_id"] = pd.NA
    dirty.loc[7, "timestamp"] = pd.NaT
    dirty.to_parquet(tmp_path / "dirty.parquet")
    skip = frozenset({"user_id", "timestamp"})
    day = (T0, T0 + 86400)
    clean = pq.ParquetFile(tmp_path / "clean.parquet")
    assert proven_columns(clean, sources_for(None), skip, day) == {"user_id", "timestamp"}
    assert proven_columns(clean, sources_for(None), skip, (T0 + 3600, None)) == {"user_id"}
    assert proven_columns(pq.ParquetFile(tmp_path / "dirty.parquet"), sources_for(None), skip, day) == set()

    spec = GridSpec("austin", region, 64)
    expected = grid_counts(*region.project(frame.lat.to_numpy(), frame.lon.to_numpy()), region.bounds_m, 64)
    for name, read, kept, dropped in [("clean", n, n, {}), ("dirty", n - 1, n - 3, {"missing_user": 2})]:
        inp = resolve_input(str(tmp_path / f"{name}.parquet"), "auto", day)
        user, ts, _, _, rep = read_valid(inp, inp.files[0], None, False, skip, day)
        assert (user is None, ts is None) == (name == "clean", name == "clean")
        counts, report = file_counts(inp, inp.files[0], None, False, [spec], day)
        assert (report.rows_read, report.rows_outside, report.rows_kept, report.dropped) == (read, n - read, kept, dropped)
        fine = dense_counts(spec, counts["austin"])
        if name == "clean":
            np.testing.assert_array_equal(fine, expected)
        assert fine.sum() == kept
    # a window that cuts the file: the time is read and the rows outside it are not counted
    late = (T0 + 43200, T0 + 86400)
    inp = resolve_input(str(tmp_path / "clean.parquet"), "auto", late)
    counts, _ = file_counts(inp, inp.files[0], None, False, [spec], late)
    in_late = (frame.timestamp >= pd.Timestamp(T0 + 43200, unit="s", tz="UTC")).sum()
    assert dense_counts(spec, counts["austin"]).sum() == in_late < n


def test_user_level_rows_are_a_user_key_and_int32_cells():
    """What goes through the shuffle: 12 bytes a row for one grid (no float coordinates, no time)."""
    from dpcore.data.chunks import compact_rows

    region = city_region("austin")
    spec = GridSpec("austin", region, 128)
    lat = region.center_lat + np.r_[0.0, 0.01, 5.0]
    lon = np.full(3, region.center_lon)
    rows = compact_rows(np.array([4, 5, 6]), None, lat, lon, [spec], (None, None))
    assert list(rows.columns) == ["user", "c0"] and rows.c0.dtype == np.int32
    assert rows.user.tolist() == [4, 5]  # the point outside every region does not travel
    assert rows.memory_usage(index=False, deep=True).sum() == 2 * 12


def test_fits_that_read_points_and_an_in_memory_table_get_the_same_data(client, spread):
    """A spec with cells None gets the window's in-region points (record level: all of them, with
    their users; user level: at most k per person); an in-memory table counts as its files do."""
    from dpcore.data.points import LoadResult

    window = (T0, T0 + 86400)
    region = city_region("chicago")
    specs = [GridSpec("chicago", region, None), GridSpec("chicago-grid", region, 64)]
    got = release_counts(str(spread), specs, window)
    pts, ids = _today(spread, window)
    x, y = region.project(pts.lat, pts.lon)
    inside = region.contains_m(x, y)
    pd.testing.assert_frame_equal(
        pd.DataFrame({"x": got.cities["chicago"].x, "y": got.cities["chicago"].y,
                      "user": got.cities["chicago"].user}).sort_values(["x", "y"], ignore_index=True),
        pd.DataFrame({"x": x[inside], "y": y[inside], "user": ids[inside]}).sort_values(["x", "y"], ignore_index=True))
    loaded = load_points(spread)
    in_memory = release_counts(LoadResult(loaded.points, loaded.report, "mem", "v"), specs, window)
    np.testing.assert_array_equal(in_memory.cities["chicago-grid"].fine, got.cities["chicago-grid"].fine)
    assert in_memory.cities["chicago"].x.size == inside.sum()
    k = 3
    bounded = release_counts(str(spread), specs, window, privacy_unit="user", max_points_per_user=k)
    per_user = pd.Series(bounded.cities["chicago"].user).value_counts()
    assert per_user.max() == k and per_user.sum() == bounded.cities["chicago-grid"].fine.sum()
    assert set(per_user.index) == set(ids[inside])
