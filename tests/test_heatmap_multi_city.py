"""A user-normalised heatmap release over several cities gives each person mass ≤ 1 over all of them
together (not 1 per city), so one charge of ε covers a person present in two cities. Through the
CLI, with dpheatmap's baselines and dpheatmap itself."""

import json

import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from tests.cli_runner import run_geodp

NYC, CHICAGO = city_region("new-york"), city_region("chicago")


def _points(region, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x, y = rng.uniform(-0.3, 0.3, (2, n)) * region.side_m
    return region.unproject(x, y)


@pytest.fixture(scope="module")
def two_cities(tmp_path_factory):
    """Person 1: 2 points in New York and 2 in Chicago. Person 2: 3 points in New York only."""
    rng = np.random.default_rng(11)
    rows = []
    for user, region, n in ((1, NYC, 2), (1, CHICAGO, 2), (2, NYC, 3)):
        lat, lon = _points(region, n, rng)
        rows.append(pd.DataFrame({"user_id": user, "timestamp": pd.Timestamp("2024-01-01T10:00Z"),
                                  "lat": lat, "lon": lon}))
    path = tmp_path_factory.mktemp("hm") / "checkins.parquet"
    pd.concat(rows, ignore_index=True).to_parquet(path)
    return path


def _mass(url: str, region) -> float:
    box = ",".join(map(str, region.bbox_latlon()))
    return json.loads(run_geodp("query", url, "--box", box, "--json").stdout)[0]["estimate"]


@pytest.mark.parametrize("mechanism,params", [("dpheatmap", ["--param", "resolution=4"]),
                                              ("laplace", ["--param", "resolution=4"]),
                                              ("laplace-top", ["--param", "resolution=4", "--param",
                                                               "top_percent=50"])])
def test_a_person_in_two_cities_has_mass_one_in_all(two_cities, tmp_path, mechanism, params):
    # ε = 1000: noise of scale 1/1000 mass on 16 cells per city, a bias of < 0.01 after zeroing
    summary = json.loads(run_geodp("release", two_cities, "--cities", "new-york,chicago", "--epsilon", "1000",
                                   "--mechanism", mechanism, *params, "--budget-cap", "1000", "--out", tmp_path / "out",
                                   "--json").stdout)
    urls = {r["city"]: r["url"] for r in summary["releases"]}
    assert _mass(urls["new-york"], NYC) == pytest.approx(0.5 + 1.0, abs=0.05)
    assert _mass(urls["chicago"], CHICAGO) == pytest.approx(0.5, abs=0.05)
    assert summary["loss"]["lifetime"] == pytest.approx(1000)  # one ε for the two cities
