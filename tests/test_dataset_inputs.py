"""Inputs as datasets: a folder, a glob, hive day partitions pruned by the release period."""

import pandas as pd
import pytest

from dpcore.data import DataError, load_points, source_version
from dpcore.geo import city_region
from dpcore.synthetic import generate_checkins
from flows.store import ReleaseStore
from tests.cli_runner import run_geodp


@pytest.fixture()
def hive(tmp_path):
    df = generate_checkins(city_region("new-york"), n_users=150, days=3, seed=8)
    root = tmp_path / "checkins"
    day = pd.to_datetime(df["timestamp"], utc=True).dt.strftime("%Y-%m-%d")
    for d, part in df.groupby(day):
        (root / f"date={d}").mkdir(parents=True)
        part.to_parquet(root / f"date={d}" / "part-0.parquet")
    return root, df, sorted(day.unique())


def test_folder_glob_and_hive_pruning(hive, tmp_path):
    root, df, days = hive
    whole = load_points(root)
    assert whole.report.rows_read == len(df) == len(whole.points)  # the report sums every file
    globbed = load_points(str(root / "date=*" / "*.parquet"))
    assert len(globbed.points) == len(df)
    # a corrupt partition outside the window is never opened; inside it, it is a one-line error
    (root / f"date={days[-1]}" / "part-0.parquet").write_bytes(b"not parquet at all")
    first = pd.Timestamp(days[0], tz="UTC").value // 10**9
    one_day = load_points(root, window=(first, first + 86_400))
    assert len(one_day.points) == int((pd.to_datetime(df["timestamp"], utc=True).dt.strftime("%Y-%m-%d")
                                       == days[0]).sum())
    with pytest.raises(DataError, match="cannot read"):
        load_points(root)
    # a new partition does not change the public version of days it does not hold
    before = source_version(root, (first, first + 86_400))
    (root / "date=2099-01-01").mkdir()
    df.head(3).to_parquet(root / "date=2099-01-01" / "part-0.parquet")
    assert source_version(root, (first, first + 86_400)) == before
    assert source_version(root) != before


def test_mixed_and_empty_folders_are_clean_errors(tmp_path, hive):
    root, df, _ = hive
    df.head(5).to_csv(root / "extra.csv", index=False)
    with pytest.raises(DataError, match="mixes formats"):
        load_points(root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no"):
        load_points(tmp_path / "empty")
    with pytest.raises(DataError, match="no file matches"):
        load_points(str(tmp_path / "nothing-*.parquet"))


def test_release_of_a_hive_folder_through_the_cli(hive, tmp_path):
    root, _, days = hive
    store = tmp_path / "s"
    r = run_geodp("release", root, "--city", "new-york", "--period", days[1], "--epsilon", "1",
                  "--param", "cell_width_m=2000", "--out", store)
    assert "release written to" in r.stdout
    (m,) = ReleaseStore(str(store)).list_releases()
    assert m["dataset"] == "checkins" and m["period"] == days[1]


def test_synth_partitions_writes_a_hive_folder_that_loads_whole(tmp_path):
    out = tmp_path / "hive"
    run_geodp("synth", out, "--users", "100", "--days", "3", "--partitions", "2")
    files = sorted(out.glob("date=*/part-*.parquet"))
    assert len(files) == 6
    single = tmp_path / "one.parquet"
    run_geodp("synth", single, "--users", "100", "--days", "3")
    assert len(load_points(out).points) == len(load_points(single).points)
