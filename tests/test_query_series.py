"""Time series across releases: `geodp query range` over a dataset and city answers every committed release
in the window, one row per period, and their sum with a combined interval that covers at its rate."""

import json

import numpy as np
import pandas as pd
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import Region, city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource
from dpcore.queries.answers import answer_table
from dpcore.queries.series import sum_rows
from tests.cli_runner import run_geodp

BOX = "40.60,-74.10,40.80,-73.90"
DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]


@pytest.fixture(scope="module")
def daily(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series")
    data = tmp / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, start="2024-01-01", days=3, seed=9).to_parquet(data)
    store = tmp / "store"
    for day in DAYS:
        run_geodp("release", data, "--city", "new-york", "--period", day, "--epsilon", "1", "--privacy-unit",
                  "record", "--param", "cell_width_m=1000", "--out", store)
    (dataset,) = {r["dataset"] for r in json.loads(run_geodp("releases", "list", store, "--json").stdout)}
    return {"store": store, "dataset": dataset}


def _single(daily, day):
    url = daily["store"] / "releases" / daily["dataset"] / "new-york" / day / "v1"
    return json.loads(run_geodp("query", "range", url, "--box", BOX, "--json").stdout)[0]


def test_a_city_path_answers_every_period_and_their_sum(daily):
    path = daily["store"] / "releases" / daily["dataset"] / "new-york"
    r = run_geodp("query", "range", path, "--box", BOX, "--json")
    rows = json.loads(r.stdout)
    assert [row["period"] for row in rows] == [*DAYS, "sum 2024-01-01..2024-01-03"]
    singles = [_single(daily, d) for d in DAYS]
    assert [row["estimate"] for row in rows[:3]] == pytest.approx([s["estimate"] for s in singles])
    assert [row["lower"] for row in rows[:3]] == pytest.approx([s["lower"] for s in singles])
    total = rows[3]
    assert total["estimate"] == pytest.approx(sum(s["estimate"] for s in singles))
    # the intervals cover the spread inside cut cells too, which recurs from day to day where points pile
    # up: each day's own noise adds in quadrature, the rest of its half-width adds
    halves = np.array([s["estimate"] - s["lower"] for s in singles])
    half = total["estimate"] - total["lower"]
    assert np.sqrt(np.sum(halves ** 2)) < half < np.sum(halves)
    assert total["interval_covers"] == "noise and spread in cut cells"
    assert "3 releases" in r.stderr and "own noise added in quadrature" in r.stderr


def test_a_store_with_dataset_city_and_period_asks_only_the_window(daily):
    r = run_geodp("query", "range", daily["store"], "--dataset", daily["dataset"], "--city", "new-york",
                  "--box", BOX, "--period", "2024-01-02..2024-01-03", "--csv")
    table = pd.read_csv(pd.io.common.StringIO(r.stdout))
    assert list(table["period"]) == ["2024-01-02", "2024-01-03", "sum 2024-01-02..2024-01-03"]
    assert table["estimate"].iloc[2] == pytest.approx(table["estimate"].iloc[:2].sum(), rel=1e-5)
    bad = run_geodp("query", "range", daily["store"], "--dataset", daily["dataset"], "--box", BOX, ok=False)
    assert bad.returncode == 2 and "--city" in bad.stderr
    none = run_geodp("query", "range", daily["store"], "--dataset", daily["dataset"], "--city", "new-york",
                     "--box", BOX, "--period", "2023-06-01..2023-06-02", ok=False)
    assert none.returncode == 2 and "no committed release" in none.stderr


def test_the_sums_interval_covers_the_true_sum_at_its_rate():
    """Three independently noised daily releases (ε = 0.5, fine cells: Laplace tails matter); the sum's
    interval covers the true count of the three days' points (issue 43 item 2)."""
    region = Region("r", 40.0, -74.0, 2.0)
    rng = np.random.default_rng(2)
    days = [FitInput(*rng.uniform(-1000, 1000, (2, 1500)), region, "record") for _ in range(3)]
    boxes_m = np.array([[-430, -270, 130, 310], [-120, 60, 40, 230], [-990, -990, 990, 990], [-10, -10, 10, 10],
                        [0, 0, 50, 50], [3, 3, 97, 53], [205, -615, 515, -5], [-800, 300, -100, 900]],
                       dtype=np.float64)
    boxes = np.column_stack([*region.unproject(boxes_m[:, 0], boxes_m[:, 1]),
                             *region.unproject(boxes_m[:, 2], boxes_m[:, 3])])
    truth = sum(np.array([np.sum((d.x >= b[0]) & (d.x < b[2]) & (d.y >= b[1]) & (d.y < b[3])) for b in boxes_m])
                for d in days)
    hits = 0
    for s in range(100):
        frames = []
        for i, d in enumerate(days):
            t = answer_table(get_mechanism("identity", grid_size=40).fit(d, 0.5, NoiseSource.seeded(1000 * s + i)),
                             boxes)
            t.insert(0, "period", f"d{i}")
            frames.append(t)
        total = sum_rows(pd.concat(frames, ignore_index=True), "w")
        hits += int(np.sum((total["lower"] <= truth) & (truth <= total["upper"])))
    assert 0.93 <= hits / (100 * len(boxes)) <= 1.0, hits / (100 * len(boxes))


def test_a_forecast_past_three_daily_releases_is_refused_naming_their_slots(daily):
    """Three releases are too few for the model to judge its own error (issue 43 item 3): one line, exit 2."""
    path = daily["store"] / "releases" / daily["dataset"] / "new-york"
    bad = run_geodp("query", "forecast", path, "--box", BOX, "--horizon", "2", "--json", ok=False)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "3 slots of 1 day" in bad.stderr and "at least 8" in bad.stderr


def test_hotspots_in_every_release_of_the_window(daily):
    import geodp

    path = daily["store"] / "releases" / daily["dataset"] / "new-york"
    grids = {r.manifest.period: r.to_xarray() for r in geodp.open_store(str(daily["store"])).series(
        daily["dataset"], "new-york")}
    threshold = 0.5 * min(float(g.max()) for g in grids.values())
    rows = json.loads(run_geodp("query", "hotspot", path, "--at", "40.713,-74.006", "--threshold", str(threshold),
                                "--extent-km", "5", "--period", "2024-01-02..2024-01-03", "--json").stdout)
    assert [r["period"] for r in rows] == DAYS[1:]
    for r in rows:
        assert r["found"] and r["released_count"] >= threshold and r["distance_m"] <= 5000
        g = grids[r["period"]]
        cell = np.unravel_index(int(np.argmin((g.lat.values - r["cell_lat"]) ** 2 + (g.lon.values - r["cell_lon"]) ** 2)),
                                g.shape)
        assert float(g.values[cell]) == pytest.approx(r["released_count"])
    above = max(float(g.max()) for g in grids.values()) + 1
    none = json.loads(run_geodp("query", "hotspot", path, "--at", "40.713,-74.006", "--threshold", str(above),
                                "--json").stdout)
    assert len(none) == 3 and not any(r["found"] for r in none)
