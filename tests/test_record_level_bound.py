"""A record-level release into a person-level dataset is charged m·ε, so it keeps at most m records
per person (the same bounding as k): a person with many records moves the counts by at most m.
Through the CLI."""

import json

import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from tests.cli_runner import bounded_total, run_geodp

REGION = city_region("new-york")
N_PEOPLE, RECORDS_EACH, M = 30, 7, 2


def test_each_person_keeps_at_most_m_records(tmp_path):
    rng = np.random.default_rng(3)
    n = N_PEOPLE * RECORDS_EACH
    x, y = rng.uniform(-0.4, 0.4, (2, n)) * REGION.side_m
    lat, lon = REGION.unproject(x, y)
    data = tmp_path / "checkins.parquet"
    pd.DataFrame({"user_id": np.repeat(np.arange(N_PEOPLE), RECORDS_EACH),
                  "timestamp": pd.Timestamp("2024-01-01T08:00Z") + pd.to_timedelta(rng.integers(0, 9 * 3600, n), "s"),
                  "lat": lat, "lon": lon}).to_parquet(data)
    store = tmp_path / "store"
    run_geodp("dataset", "create", store, "checkins", "--source", data, "--budget", "5000",
              "--max-records-per-person", M)
    # ε = 1000 per record (charged m·ε = 2000 per person): the noise is 0 but for ~e^-1000
    summary = json.loads(run_geodp("release", data, "--city", "new-york", "--epsilon", "1000", "--mechanism",
                                   "identity", "--param", "cell_width_m=2000", "--privacy-unit", "record",
                                   "--period", "2024-01-01", "--store", store, "--no-prefect", "--json").stdout)
    assert summary["loss"]["lifetime"] == pytest.approx(M * 1000)
    total = bounded_total(summary["releases"][0]["url"], REGION)
    assert total == pytest.approx(M * N_PEOPLE, abs=0.5)  # not all 7 records of each person
    manifest = json.loads(run_geodp("release", "show", summary["releases"][0]["url"], "--json").stdout)
    assert f"m={M}" in json.dumps(manifest)
