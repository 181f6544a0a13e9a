"""A --strict release validates only the rows of the days it is charged for: a bad row dated weeks
after a one-day period does not fail it (the failure bit would otherwise depend on rows the release
never charges), while a bad row inside the day does. In process and through the Prefect flow on Dask;
through the CLI."""

import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from tests.cli_runner import run_geodp
from tests.test_store_faults import one_line_error

REGION = city_region("new-york")


def _rows(bad_day: str) -> pd.DataFrame:
    """20 people with one point a day on 2024-01-01 and 2024-01-02, and one row with latitude 999 at
    noon of ``bad_day``."""
    rng = np.random.default_rng(3)
    days = pd.to_datetime(["2024-01-01", "2024-01-02"], utc=True)
    x, y = rng.uniform(-0.4, 0.4, (2, 40)) * REGION.side_m
    lat, lon = REGION.unproject(x, y)
    good = pd.DataFrame({"user_id": np.tile(np.arange(20), 2), "timestamp": np.repeat(days, 20) + pd.Timedelta(hours=9),
                         "lat": lat, "lon": lon})
    bad = pd.DataFrame({"user_id": [99], "timestamp": [pd.Timestamp(bad_day, tz="UTC") + pd.Timedelta(hours=12)],
                        "lat": [999.0], "lon": [lon[0]]})
    return pd.concat([good, bad], ignore_index=True)


def _strict_release(rows: pd.DataFrame, tmp_path, *form: str, ok: bool = True):
    tmp_path.mkdir()
    data = tmp_path / "checkins.parquet"
    rows.to_parquet(data)
    return run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
                     "--param", "cell_width_m=2000", "--period", "2024-01-01", "--strict",
                     "--store", tmp_path / "store", *form, ok=ok)


@pytest.mark.parametrize("form", [("--no-prefect",), ("--workers", "1")], ids=["in-process", "prefect"])
def test_strict_fails_only_on_the_charged_days_rows(form, tmp_path, request):
    if form[0] == "--workers":
        request.getfixturevalue("prefect_harness")
    _strict_release(_rows("2024-01-25"), tmp_path / "later", *form)  # weeks later: never read
    line = one_line_error(_strict_release(_rows("2024-01-01"), tmp_path / "inside", *form, ok=False))
    # in process the operator's terminal names the row (its number in the file); the flow says only --strict
    assert ("row 41 is invalid" if form[0] == "--no-prefect" else "--strict") in line, line


def test_a_period_in_which_no_one_has_a_row_is_released(tmp_path):
    """Review of ea41785: once validation read only the period's rows, a day with no rows in the file was
    refused as '… holds no rows', a public line (the Prefect UI shows it) and a refusal that say, with no
    noise, that no one has a row that day; the release of that day went ahead before. Through the CLI."""
    data = tmp_path / "checkins.parquet"
    _rows("2024-01-25").to_parquet(data)  # rows on 2024-01-01, 2024-01-02 and 2024-01-25 only
    store = tmp_path / "store"
    run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
              "--param", "cell_width_m=2000", "--period", "2024-01-10", "--store", store, "--no-prefect")
    assert list(store.glob("releases/**/2024-01-10/v1/_MANIFEST.json"))
