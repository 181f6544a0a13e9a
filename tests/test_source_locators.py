"""One source, one ledger: the same files reached through another locator (a file:// URL, a symlink,
the folder or a glob holding them; on S3 the folder or a glob) belong to the dataset that first
released them, so another dataset name for them is refused (one line, exit 2, nothing charged), and
the same dataset reached that way charges the same ledger. Through the CLI."""

import boto3
import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store


def _frame() -> pd.DataFrame:
    region = city_region("new-york")
    rng = np.random.default_rng(5)
    x, y = rng.uniform(-0.3, 0.3, (2, 200)) * region.side_m
    lat, lon = region.unproject(x, y)
    return pd.DataFrame({"user_id": np.arange(200) % 40,
                         "timestamp": pd.Timestamp("2024-01-01T09:00Z") + pd.to_timedelta(np.arange(200), "h"),
                         "lat": lat, "lon": lon})


def _release(data: str, store: str, day: str, *extra: str):
    return run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
                     "--param", "cell_width_m=2000", "--period", day, "--store", store, "--no-prefect", *extra,
                     ok=False)


def _refused(proc) -> None:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "already the source of dataset 'checkins'" in last


@pytest.mark.slow
def test_local_locators_of_the_same_file_are_one_source(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "checkins.parquet"
    _frame().to_parquet(path)
    (tmp_path / "link.parquet").symlink_to(path)
    store = str(tmp_path / "store")
    assert _release(str(path), store, "2024-01-01").returncode == 0
    for other in (f"file://{path}", str(tmp_path / "link.parquet"), str(folder), f"{folder}/*.parquet"):
        _refused(_release(other, store, "2024-01-02", "--dataset", "other"))
    _refused(_release(str(folder), store, "2024-01-02"))  # the folder's own name is another dataset
    assert ReleaseStore(store).listdir("datasets") == ["checkins"]
    # the same file by URL, under its dataset: one ledger, one budget
    assert _release(f"file://{path}", store, "2024-01-02").returncode == 0
    assert len(DatasetLedger(ReleaseStore(store), "checkins").held()) == 4  # profiles charged alone, and the rest


def test_an_s3_folder_or_glob_holding_a_released_object_is_the_same_source(tmp_path, moto_s3):
    store = new_s3_store(moto_s3)
    bucket = store.split("/")[2]
    path = tmp_path / "checkins.parquet"
    _frame().to_parquet(path)
    boto3.client("s3", endpoint_url=moto_s3).upload_file(str(path), bucket, "input/checkins.parquet")
    assert _release(f"s3://{bucket}/input/checkins.parquet", store, "2024-01-01").returncode == 0
    for other in (f"s3://{bucket}/input/", f"s3://{bucket}/input/*.parquet"):
        _refused(_release(other, store, "2024-01-02", "--dataset", "other"))
    assert ReleaseStore(store).listdir("datasets") == ["checkins"]
