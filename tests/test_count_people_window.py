"""`--count people` says what it bounds under each bound window (issue 42 item 6): per release, a person
once per cell and in at most k cells over the release; per UTC day, once per cell per day, so over D
days up to D times in one cell. Through the CLI, the manifest's privacy note."""

import json

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp


@pytest.mark.parametrize("window", ["release", "day"])
def test_the_manifest_says_what_count_people_bounds_under_the_bound_window(window, tmp_path):
    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=30, days=2, seed=4).to_parquet(data)
    store = tmp_path / "s"
    run_geodp("dataset", "create", store, "checkins", "--source", data, "--budget", "10",
              "--max-points-per-user", "3", "--bound-window", window)
    out = run_geodp("release", data, "--dataset", "checkins", "--city", "new-york", "--epsilon", "1",
                    "--mechanism", "identity", "--param", "cell_width_m=2000", "--count", "people",
                    "--period", "2024-01-01..2024-01-02", "--store", store, "--no-prefect", "--json")
    url = json.loads(out.stdout)["releases"][0]["url"]
    manifest = json.loads((tmp_path / url.split(str(tmp_path) + "/", 1)[1] / "_MANIFEST.json").read_text())
    (note,) = [n for n in manifest["privacy"]["notes"] if "distinct people" in n]
    if window == "day":
        assert "per UTC day" in note and "up to D times in one cell" in note, note
    else:
        assert "over the whole release" in note, note
