"""A release reads only rows inside the days it is charged for: one without a period under a policy
horizon reads the horizon's rows only, so a person's points outside it cannot move the output. In
every form: a file, a hive folder and an S3 object in process, and a file through the Prefect flow
on Dask. Through the CLI."""

import json

import boto3
import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from tests.cli_runner import bounded_total, run_geodp
from tests.conftest import new_s3_store

REGION = city_region("new-york")
N_PEOPLE = 30
DAYS = pd.date_range("2024-01-01", periods=5, freq="D", tz="UTC")
HORIZON = "2024-01-02..2024-01-03"  # 2 of the 5 days


@pytest.fixture(scope="module")
def five_days() -> pd.DataFrame:
    """Every person has one point on each of 5 days, well inside the region."""
    rng = np.random.default_rng(7)
    n = N_PEOPLE * len(DAYS)
    x, y = rng.uniform(-0.4, 0.4, (2, n)) * REGION.side_m
    lat, lon = REGION.unproject(x, y)
    return pd.DataFrame({"user_id": np.tile(np.arange(N_PEOPLE), len(DAYS)),
                         "timestamp": np.repeat(DAYS, N_PEOPLE) + pd.Timedelta(hours=12),
                         "lat": lat, "lon": lon})


def _release_total(data: str, store: str, *form: str) -> float:
    """Create the dataset with a 2-day horizon, release it without a period (k = 5 ≥ any person's
    points, ε = 1000: the noise is 0 but for ~e^-200); its k-bounded count over the whole region."""
    run_geodp("dataset", "create", store, "checkins", "--source", data, "--budget", "1000",
              "--max-points-per-user", "5", "--horizon", HORIZON)
    summary = run_geodp("release", data, "--city", "new-york", "--epsilon", "1000", "--mechanism", "identity",
                        "--param", "cell_width_m=2000", "--dataset", "checkins", "--store", store, *form, "--json")
    return bounded_total(json.loads(summary.stdout)["releases"][0]["url"], REGION)


def test_a_file_and_a_hive_folder_in_process_read_the_horizon_only(five_days, tmp_path):
    path = tmp_path / "checkins.parquet"
    five_days.to_parquet(path)
    hive = tmp_path / "hive"
    for day, rows in five_days.groupby(five_days["timestamp"].dt.strftime("%Y-%m-%d")):
        (hive / f"date={day}").mkdir(parents=True)
        rows.to_parquet(hive / f"date={day}" / "part-0.parquet")
    for data in (path, hive):
        # 2 days × 1 point per person; the 3 days outside the horizon are never read
        assert _release_total(str(data), str(tmp_path / f"store-{data.name}"), "--no-prefect") == \
            pytest.approx(2 * N_PEOPLE, abs=0.5)


def test_an_s3_input_reads_the_horizon_only(five_days, tmp_path, moto_s3):
    store = new_s3_store(moto_s3)
    bucket = store.split("/")[2]
    path = tmp_path / "checkins.parquet"
    five_days.to_parquet(path)
    boto3.client("s3", endpoint_url=moto_s3).upload_file(str(path), bucket, "input/checkins.parquet")
    total = _release_total(f"s3://{bucket}/input/checkins.parquet", store, "--no-prefect")
    assert total == pytest.approx(2 * N_PEOPLE, abs=0.5)


def test_the_prefect_flow_on_dask_reads_the_horizon_only(prefect_harness, five_days, tmp_path):
    path = tmp_path / "checkins.parquet"
    five_days.to_parquet(path)
    # the run's own one-worker cluster: the module's only flow, so a shared two-worker one saves nothing
    total = _release_total(str(path), str(tmp_path / "store"), "--workers", "1")
    assert total == pytest.approx(2 * N_PEOPLE, abs=0.5)
