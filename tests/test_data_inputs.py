"""Inputs as datasets: folders, globs, hive partitions with pruning, S3, summed reports, public version."""

import os
import uuid

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpcore.data.points import DataError, load_points, parse_column_map, source_version
from dpcore.data.synthetic import generate_checkin_chunks, generate_checkins, write_partitioned
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

DAY = 86400
T0 = int(pd.Timestamp("2024-03-01", tz="UTC").timestamp())


def canonical(res) -> pd.DataFrame:
    """Rows as (original user id, ts, lat, lon), sorted: comparable across inputs and file orders."""
    p = res.points
    df = pd.DataFrame({"user": p.user_ids[p.user].astype(str), "ts": p.ts, "lat": p.lat, "lon": p.lon})
    return df.sort_values(["user", "ts", "lat", "lon"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The same synthetic check-ins as one file, as 4 time-sliced files, and hive-partitioned by day."""
    root = tmp_path_factory.mktemp("inputs")
    region = city_region("new-york")
    generate_checkins(region, n_users=400, start="2024-03-01", days=5, seed=7).to_parquet(root / "one.parquet")

    def chunks():
        return generate_checkin_chunks(region, n_users=400, start="2024-03-01", days=5, seed=7)

    write_partitioned(chunks(), root / "sliced", "2024-03-01", 5, 4)
    write_partitioned(chunks(), root / "hive", "2024-03-01", 5, "day")
    return root


def test_folder_glob_and_hive_load_the_same_rows_as_one_file(datasets):
    one = load_points(datasets / "one.parquet")
    assert one.n_files == 1
    for src, n_files in [(datasets / "sliced", 4), (f"{datasets}/sliced/part-*.parquet", 4),
                         (datasets / "hive", 5), (f"{datasets}/hive/date=*/*.parquet", 5)]:
        res = load_points(src)
        assert res.n_files == n_files, src
        pd.testing.assert_frame_equal(canonical(res), canonical(one))
        # users are one code space across files: a user's points in many files are one user
        assert res.points.n_users == one.points.n_users


def test_hive_pruning_never_opens_partitions_outside_the_window(datasets, tmp_path):
    hive = tmp_path / "hive"
    for d in (datasets / "hive").iterdir():
        (hive / d.name).mkdir(parents=True)
        (hive / d.name / "part-0.parquet").write_bytes((d / "part-0.parquet").read_bytes())
    (hive / "date=2024-03-05" / "part-0.parquet").write_bytes(b"PAR1 not really parquet")
    window = (T0 + DAY, T0 + 3 * DAY)  # 03-02 and 03-03
    res = load_points(hive, window=window)
    assert res.n_files == 2 and res.n_pruned == 3
    assert res.points.ts.min() >= T0 + DAY and res.points.ts.max() < T0 + 3 * DAY
    full = canonical(load_points(datasets / "hive"))
    expect = full[(full.ts >= window[0]) & (full.ts < window[1])].reset_index(drop=True)
    pd.testing.assert_frame_equal(canonical(res), expect)
    # an open-ended window that reaches the corrupt day reads it and fails on it, in one line
    with pytest.raises(DataError, match=r"cannot read .*date=2024-03-05.*part-0\.parquet as parquet") as err:
        load_points(hive, window=(T0 + 3 * DAY, None))
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="no partition of .* lies in the time window"):
        load_points(hive, window=(T0 + 30 * DAY, T0 + 31 * DAY))


def test_report_is_summed_over_files_and_strict_names_the_file(tmp_path):
    folder = tmp_path / "csvs"
    folder.mkdir()
    (folder / "a.csv").write_text("user_id,timestamp,lat,lon\nu1,2024-03-01T10:00:00Z,40.71,-74.0\n"
                                  "u2,2024-03-01T11:00:00Z,95,-74.0\n")
    (folder / "b.csv").write_text("user_id,timestamp,lat,lon\nu1,2024-03-02T10:00:00Z,40.72,-74.0\n"
                                  "u3,never,40.7,-74.0\n,2024-03-02T10:00:00Z,40.7,-74.0\n"
                                  "u4,2024-03-02T12:00:00Z,91,-74.0\n")
    (folder / "_SUCCESS").write_text("")  # writers' marker files are not data
    res = load_points(folder)
    r = res.report
    assert (r.rows_read, r.rows_kept) == (6, 2)
    assert r.dropped == {"lat_out_of_range": 2, "bad_timestamp": 1, "missing_user": 1}
    assert (r.first_bad_row, r.first_bad_reason) == (2, "lat_out_of_range")
    assert r.first_bad_source.endswith("a.csv")
    assert res.points.n_users == 1  # u1 in both files is one user
    with pytest.raises(DataError, match=r"a\.csv: row 2 is invalid \(lat_out_of_range\)"):
        load_points(folder, strict=True)


def test_arrow_fast_path_agrees_with_the_text_path(tmp_path):
    """Parquet with typed columns and nulls converts (vectorised) to what the CSV reader makes of the
    same values: timestamps with a time zone, null ids, null and out-of-range coordinates."""
    ts = pd.to_datetime([T0, T0 + 61, None, T0 + 3600, T0 + 7200, T0 + 9000], unit="s", utc=True)
    table = pa.table({
        "uid": pa.array([5, 7, None, 5, 9, 7], pa.int64()),
        "time": pa.array(ts, pa.timestamp("ns", tz="Europe/Paris")),
        "y": pa.array([40.71, None, 40.7, 40.72, 95.0, 40.73]),
        "x": pa.array([-74.0, -74.0, -74.0, -74.01, -74.0, -74.02]),
    })
    pq.write_table(table, tmp_path / "t.parquet")
    csv = "uid,time,y,x\n" + "\n".join(
        f"{'' if u is None else u},{'' if t is pd.NaT else t.isoformat()},{'' if y is None else y},{x}"
        for u, t, y, x in zip(table["uid"].to_pylist(), ts, table["y"].to_pylist(), table["x"].to_pylist(),
                              strict=True)) + "\n"
    (tmp_path / "t.csv").write_text(csv)
    cols = parse_column_map("user_id=uid,timestamp=time,lat=y,lon=x")
    a, b = load_points(tmp_path / "t.parquet", columns=cols), load_points(tmp_path / "t.csv", columns=cols)
    assert a.report.to_dict() == b.report.to_dict()
    assert a.report.dropped == {"bad_coordinate": 1, "missing_user": 1, "lat_out_of_range": 1}
    pd.testing.assert_frame_equal(canonical(a), canonical(b))
    assert list(a.points.ts) == [T0, T0 + 3600, T0 + 9000]


def test_ids_merge_across_files_of_different_id_types_and_partition_keys_fill_columns(tmp_path):
    (tmp_path / "m").mkdir()
    base = {"timestamp": pd.to_datetime([T0, T0 + 5], unit="s", utc=True), "lat": [40.7, 40.71], "lon": [-74.0] * 2}
    pd.DataFrame({"user_id": [7, 8], **base}).to_parquet(tmp_path / "m" / "a.parquet")
    pd.DataFrame({"user_id": [" 7", "x"], **base}).to_parquet(tmp_path / "m" / "b.parquet")
    res = load_points(tmp_path / "m")
    assert sorted(res.points.user_ids) == ["7", "8", "x"] and len(res.points) == 4
    # a hive key can stand in for a column the files lack, here the user
    for u in ("alice", "bob"):
        (tmp_path / "h" / f"user_id={u}").mkdir(parents=True)
        pd.DataFrame(base).to_parquet(tmp_path / "h" / f"user_id={u}" / "p.parquet")
    res = load_points(tmp_path / "h")
    assert sorted(res.points.user_ids[res.points.user]) == ["alice", "alice", "bob", "bob"]
    # integer ids stay integers
    assert load_points(tmp_path / "m" / "a.parquet").points.user_ids.tolist() == [7, 8]


def test_mixed_empty_and_unmatched_inputs_are_one_line_errors(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.csv").write_text("user_id,timestamp,lat,lon\nu,2024-01-01,40.7,-74\n")
    pd.DataFrame({"user_id": [1]}).to_parquet(mixed / "b.parquet")
    empty = tmp_path / "empty"
    (empty / "_temporary").mkdir(parents=True)
    (empty / "_SUCCESS").write_text("")
    for src, message in [(mixed, r"mixes file formats \(1 csv, 1 parquet\)"), (empty, "holds no data files"),
                         (f"{tmp_path}/nothing-*.parquet", "no files match"),
                         (tmp_path / "absent", "input file not found")]:
        with pytest.raises(DataError, match=message) as err:
            load_points(src)
        assert "\n" not in str(err.value)


def test_source_version_is_public_metadata_not_content(tmp_path):
    p = tmp_path / "d" / "date=2024-03-01" / "part-0.csv"
    p.parent.mkdir(parents=True)
    p.write_text("user_id,timestamp,lat,lon\nu1,2024-03-01T10:00:00Z,40.71,-74.0\n")
    os.utime(p, (1_700_000_000.25, 1_700_000_000.25))
    v1 = source_version(tmp_path / "d")
    assert v1 == "20231114T221320-250000Z-1files"
    assert load_points(tmp_path / "d").data_version == v1
    # different content (and size) with the same modification time: the same version
    p.write_text("user_id,timestamp,lat,lon\nu9,2024-03-01T11:00:00Z,40.75,-73.9\nu8,2024-03-01T11:00:00Z,40.7,-74\n")
    os.utime(p, (1_700_000_000.25, 1_700_000_000.25))
    assert source_version(tmp_path / "d") == v1
    # touching a file is a new version
    os.utime(p, (1_700_000_060.0, 1_700_000_060.0))
    v2 = source_version(tmp_path / "d")
    assert v2 != v1 and v2.startswith("20231114T221420")
    # a new day's partition changes the version of a window that reads it, not of one that does not
    q = tmp_path / "d" / "date=2024-03-02" / "part-0.csv"
    q.parent.mkdir()
    q.write_text(p.read_text())
    os.utime(q, (1_800_000_000, 1_800_000_000))
    first_day = (T0, T0 + DAY)
    assert source_version(tmp_path / "d", window=first_day) == v2
    assert source_version(tmp_path / "d") != v2 and source_version(tmp_path / "d").endswith("-2files")


def test_s3_hive_folder_with_pruning(datasets, moto_s3):
    import boto3

    bucket = "in-" + uuid.uuid4().hex[:10]
    s3 = boto3.client("s3", endpoint_url=moto_s3)
    s3.create_bucket(Bucket=bucket)
    for f in sorted((datasets / "hive").rglob("*.parquet")):
        s3.upload_file(str(f), bucket, f"checkins/{f.relative_to(datasets / 'hive').as_posix()}")
    s3.put_object(Bucket=bucket, Key="checkins/date=2024-03-05/part-0.parquet", Body=b"corrupt")
    window = (T0, T0 + 2 * DAY)
    res = load_points(f"s3://{bucket}/checkins", window=window)
    assert res.n_files == 2 and res.n_pruned == 3
    local = canonical(load_points(datasets / "hive", window=window))
    pd.testing.assert_frame_equal(canonical(res), local)
    assert source_version(f"s3://{bucket}/checkins", window=window) == res.data_version
    with pytest.raises(DataError, match=f"cannot read s3://{bucket}/checkins/date=2024-03-05"):
        load_points(f"s3://{bucket}/checkins/date=*/*.parquet")


def test_synth_partitions_cli(tmp_path):
    run_geodp("synth", tmp_path / "one.parquet", "--users", "300", "--days", "3", "--seed", "2")
    r = run_geodp("synth", tmp_path / "hive", "--partitions", "day", "--users", "300", "--days", "3", "--seed", "2")
    assert "3 Parquet files" in r.stdout
    assert sorted(d.name for d in (tmp_path / "hive").iterdir()) == [
        "date=2024-01-01", "date=2024-01-02", "date=2024-01-03"]
    run_geodp("synth", tmp_path / "six", "--partitions", "6", "--users", "300", "--days", "3", "--seed", "2")
    assert len(list((tmp_path / "six").glob("part-*.parquet"))) == 6
    one = canonical(load_points(tmp_path / "one.parquet"))
    for folder in ("hive", "six"):  # the same rows as the single file, split
        pd.testing.assert_frame_equal(canonical(load_points(tmp_path / folder)), one)
    bad = run_geodp("synth", tmp_path / "hive", "--partitions", "day", ok=False)
    assert bad.returncode == 2 and "not an empty folder" in bad.stderr and "Traceback" not in bad.stderr


def test_release_and_evaluate_of_a_folder_through_the_cli(datasets, tmp_path):
    hive = tmp_path / "hive"
    for f in (datasets / "hive").rglob("*.parquet"):
        (hive / f.parent.name).mkdir(parents=True)
        (hive / f.parent.name / f.name).write_bytes(f.read_bytes())
    (hive / "date=2024-03-04" / "part-0.parquet").write_bytes(b"corrupt")  # outside the period: unread
    out = tmp_path / "rel"
    # published anyway: one day of this small table with 100 m cells is a release the verdict refuses
    release = ("release", hive, "--city", "new-york", "--epsilon", "1", "--period", "2024-03-02", "--out", out,
               "--publish-anyway")
    r = run_geodp(*release)
    assert "release written to" in r.stdout
    (manifest,) = out.glob("releases/hive/new-york/2024-03-02/v1/_MANIFEST.json")
    assert "already committed" in run_geodp(*release).stdout
    whole = run_geodp("release", hive, "--city", "new-york", "--epsilon", "1", "--out", out, ok=False)
    assert whole.returncode == 2 and "cannot read" in whole.stderr and "date=2024-03-04" in whole.stderr
    ev = run_geodp("evaluate", datasets / "sliced", "--city", "new-york", "--mechanisms", "identity",
                   "--epsilon", "1", "--queries", "50", "--trials", "1", "--json", tmp_path / "ev.json")
    assert "mean rel.err" in ev.stdout and "from 4 files" in ev.stderr


def test_csv_epoch_numbers_are_timestamps_in_seconds_or_milliseconds(tmp_path):
    """A CSV's timestamp column of plain numbers (seconds or milliseconds) is read as epochs, not dropped
    as unparseable dates; a mixed column keeps its ISO rows."""
    from dpcore.data.points import load_points

    path = tmp_path / "epochs.csv"
    path.write_text("user_id,timestamp,lat,lon\n"
                    "u1,1270000000000,40.71,-74.0\n"
                    "u2,1270000001,40.72,-74.01\n"
                    "u3,2010-05-01T00:00:00Z,40.70,-74.0\n")
    loaded = load_points(str(path))
    assert loaded.report.rows_kept == 3
    assert sorted(loaded.points.ts.tolist()) == [1270000000, 1270000001, 1272672000]
