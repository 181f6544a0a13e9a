"""Data loading/validation, regions and projection, grid counting and prefix-sum answering."""

import gzip

import numpy as np
import pandas as pd
import pytest

from dpcore.data.points import DataError, load_points, parse_column_map
from dpcore.geo import (
    CITY_CENTRES,
    Region,
    RegionError,
    UnknownCityError,
    city_region,
    parse_slot,
    resolve_region,
)
from dpcore.grid.histogram import answer_boxes, grid_counts, grid_counts_3d, prefix_sums, resample_grid
from dpcore.queries.range import square_workload, true_counts

GOOD = "user_id,timestamp,lat,lon\nu1,2024-01-01T10:00:00Z,40.71,-74.00\nu2,2024-01-01T11:00:00Z,40.72,-74.01\n"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_and_parquet_roundtrip(tmp_path):
    res = load_points(write(tmp_path, "a.csv", GOOD))
    assert len(res.points) == 2 and res.report.rows_dropped == 0
    assert res.points.ts[0] == pd.Timestamp("2024-01-01T10:00:00Z").timestamp()
    res.points.to_frame().to_parquet(tmp_path / "a.parquet")
    res2 = load_points(tmp_path / "a.parquet")
    assert np.array_equal(res2.points.lat, res.points.lat) and np.array_equal(res2.points.ts, res.points.ts)


def test_bad_rows_dropped_and_counted_or_strict(tmp_path):
    text = GOOD + ("u3,2024-01-01T12:00:00Z,NaN,-74.0\n" "u4,not-a-time,40.7,-74.0\n"
                   "u5,2024-01-01T12:00:00Z,95.0,-74.0\n" "u6,2024-01-01T12:00:00Z,40.7,-200\n"
                   ",2024-01-01T12:00:00Z,40.7,-74.0\n" "u7,2024-01-01T12:00:00Z,abc,-74.0\n")
    p = write(tmp_path, "bad.csv", text)
    res = load_points(p)
    assert len(res.points) == 2
    assert res.report.dropped == {"bad_coordinate": 2, "bad_timestamp": 1, "lat_out_of_range": 1,
                                  "lon_out_of_range": 1, "missing_user": 1}
    assert res.report.first_bad_row == 3
    with pytest.raises(DataError, match="row 3 is invalid"):
        load_points(p, strict=True)


def test_column_mapping_and_missing_column(tmp_path):
    p = write(tmp_path, "m.csv", "uid,time,y,x\n1,2024-01-01,40.7,-74.0\n")
    with pytest.raises(DataError, match="missing column"):
        load_points(p)
    res = load_points(p, columns=parse_column_map("user_id=uid,timestamp=time,lat=y,lon=x"))
    assert len(res.points) == 1
    with pytest.raises(DataError):
        parse_column_map("colour=uid")


def test_clear_errors_for_unreadable_inputs(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_points(tmp_path / "nope.csv")
    with pytest.raises(DataError, match="empty"):
        load_points(write(tmp_path, "e.csv", ""))
    with pytest.raises(DataError, match="no valid rows"):
        load_points(write(tmp_path, "h.csv", "user_id,timestamp,lat,lon\nu,bad,x,y\n"))
    (tmp_path / "x.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(DataError, match="cannot read"):
        load_points(tmp_path / "x.parquet")
    with pytest.raises(DataError, match="format"):
        load_points(write(tmp_path, "x.json", "{}"))


def test_snap_format(tmp_path):
    p = tmp_path / "s.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write("0\t2010-10-19T23:55:27Z\t40.72\t-73.99\t22847\n0\t2010-10-18T22:17:43Z\t40.73\t-74.00\t420315\n"
                "1\tgarbage\t40.7\t-74\t1\n")
    res = load_points(p)
    assert len(res.points) == 2 and res.report.dropped == {"bad_timestamp": 1}


def test_real_gowalla_nyc(gowalla_nyc_path):
    res = load_points(gowalla_nyc_path)
    assert len(res.points) > 130_000 and res.points.n_users > 7000
    inside = city_region("new-york").contains(res.points.lat, res.points.lon)
    assert 110_000 < inside.sum() < 120_000  # PROVENANCE: 115,743 in the 20 km box


def test_catalog_and_errors():
    for slug in ["fargo", "kansas-city", "salt-lake-city", "tulsa", "phoenix", "los-angeles", "houston",
                 "milwaukee", "miami", "chicago", "san-francisco", "boston", "new-york"]:
        assert slug in CITY_CENTRES
    assert city_region("New York").center_lat == 40.713
    with pytest.raises(UnknownCityError, match="Did you mean: new-york"):
        city_region("new-yrok")
    with pytest.raises(RegionError):
        resolve_region(city="boston", center="1,2")
    with pytest.raises(RegionError):
        resolve_region(center="91,0")
    with pytest.raises(RegionError):
        resolve_region(center="abc")
    assert parse_slot("1h") == 3600 and parse_slot("1d") == 86400
    with pytest.raises(RegionError):
        parse_slot("-1h")


def test_projection_roundtrip_and_scale():
    r = Region("t", 40.0, -74.0, 20.0)
    lat = np.array([40.0, 40.05, 39.93])
    lon = np.array([-74.0, -73.9, -74.1])
    x, y = r.project(lat, lon)
    lat2, lon2 = r.unproject(x, y)
    assert np.allclose(lat, lat2) and np.allclose(lon, lon2)
    # 0.1° of longitude at 40°N ≈ 8.5 km; 0.05° of latitude ≈ 5.56 km
    assert x[1] == pytest.approx(8_527, rel=0.002) and y[1] == pytest.approx(5_560, rel=0.002)
    assert r.contains_m(np.array([9_999.0, 10_000.0]), np.array([0.0, 0.0])).tolist() == [True, False]


def test_grid_counts_match_histogram2d():
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-10, 10, 5000), rng.uniform(-10, 10, 5000)
    g = grid_counts(x, y, (-10, -10, 10, 10), 8, 5)
    ref, _, _ = np.histogram2d(x, y, bins=[8, 5], range=[[-10, 10], [-10, 10]])
    assert np.array_equal(g, ref)
    slot = rng.integers(-1, 4, 5000)
    g3 = grid_counts_3d(x, y, slot, (-10, -10, 10, 10), 8, 5, 3)
    assert g3.shape == (8, 5, 3)
    assert g3.sum() == np.count_nonzero((slot >= 0) & (slot < 3))
    assert np.array_equal(g3[:, :, 1], grid_counts(x[slot == 1], y[slot == 1], (-10, -10, 10, 10), 8, 5))


def test_prefix_answers_equal_brute_force_on_aligned_boxes_and_uniformity_on_partial():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 50, size=(10, 10)).astype(float)
    p = prefix_sums(values)
    bounds = (0.0, 0.0, 10.0, 10.0)
    assert answer_boxes(p, bounds, np.array([[2, 3, 7, 9]]))[0] == values[2:7, 3:9].sum()
    # half of one cell → half its count
    assert answer_boxes(p, bounds, np.array([[4, 4, 4.5, 5]]))[0] == pytest.approx(values[4, 4] / 2)
    # boxes beyond the region are clipped to it
    assert answer_boxes(p, bounds, np.array([[-5, -5, 20, 20]]))[0] == pytest.approx(values.sum())
    r = resample_grid(values, 5, 5)
    assert r.sum() == pytest.approx(values.sum()) and r[0, 0] == pytest.approx(values[:2, :2].sum())


def test_true_counts_brute_force():
    rng = np.random.default_rng(2)
    x, y = rng.normal(0, 1000, 3000), rng.normal(0, 1000, 3000)
    boxes = square_workload(Region("t", 0, 0, 6), 200, 100, 2000, rng)
    brute = ((x[None] >= boxes[:, :1]) & (x[None] < boxes[:, 2:3]) & (y[None] >= boxes[:, 1:2])
             & (y[None] < boxes[:, 3:4])).sum(1)
    assert np.array_equal(true_counts(x, y, boxes), brute)


def test_headerless_tsv_by_position_and_non_iso_times(tmp_path):
    # Foursquare-style layout: 8 columns, no header, Twitter-style timestamps, latin-1 bytes.
    rows = ["470\t49bbd6c0f964a520f4531fe3\tc1\tArts \xe9\t40.7198\t-74.0025\t-240\tTue Apr 03 18:00:09 +0000 2012",
            "979\t4a43c0aef964a520c6a61fe3\tc2\tBar\t40.6061\t-74.0441\t-240\tTue Apr 03 18:00:25 +0000 2012"]
    p = tmp_path / "fsq.txt"
    p.write_bytes("\n".join(rows).encode("latin-1"))
    with pytest.raises(DataError, match="map columns by position"):
        load_points(p)
    res = load_points(p, columns=parse_column_map("user_id=0,timestamp=7,lat=4,lon=5"))
    assert len(res.points) == 2
    assert res.points.ts[0] == pd.Timestamp("2012-04-03T18:00:09Z").timestamp()


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_answer_boxes_is_cumulative_at_read_at_the_four_corners(dtype):
    """answer_boxes finds each edge's cell once and reads in blocks: it must give exactly the four bilinear
    reads of the prefix table (cumulative_at), boxes inverted, past the edges and of no area included."""
    from dpcore.grid.histogram import cumulative_at

    rng = np.random.default_rng(3)
    values = rng.integers(0, 9, (37, 23)).astype(dtype)
    p = prefix_sums(values).astype(dtype)
    bounds = (-500.0, 100.0, 1350.0, 790.0)
    n = 70_000  # more than one block
    x, y = rng.uniform(-700, 1500, (2, n)), rng.uniform(0, 900, (2, n))
    boxes = np.stack([x[0], y[0], x[1], y[1]], axis=1)
    boxes[::9, 2] = boxes[::9, 0]
    sx, sy = 37 / 1850.0, 23 / 690.0
    gx0, gx1 = (boxes[:, 0] + 500.0) * sx, (boxes[:, 2] + 500.0) * sx
    gy0, gy1 = (boxes[:, 1] - 100.0) * sy, (boxes[:, 3] - 100.0) * sy
    want = (cumulative_at(p, gx1, gy1) - cumulative_at(p, gx0, gy1) - cumulative_at(p, gx1, gy0)
            + cumulative_at(p, gx0, gy0))
    assert np.array_equal(answer_boxes(p, bounds, boxes), want)
