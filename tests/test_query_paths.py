"""`geodp query` answers a version folder, a store folder or an `--out` folder wherever it sits (issue 45
item 1): the README's `geodp query range releases/nyc-demo` exited 2 with "a time series needs both the
dataset and the city", because any path with `releases/` in it was read as STORE/releases/DATASET. And
the Python API's `period=` on a 2-D release is one clear error (item 6), not an AttributeError, and a
period outside a spatio-temporal release is an error there as in the CLI (it answered 0)."""

import json

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

BOX = "40.708,-74.012,40.717,-74.000"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Stores as users make them: `--out releases/nyc-demo` (a store inside a folder named releases),
    `--out out/releases` (a store named releases), and a spatio-temporal release in `st`."""
    work = tmp_path_factory.mktemp("paths")
    (work / "data").mkdir()
    generate_checkins(city_region("new-york"), n_users=300, start="2024-01-01", days=5, seed=5).to_parquet(
        work / "data" / "nyc.parquet")
    for out in ("releases/nyc-demo", "out/releases"):
        run_geodp("release", "run", "data/nyc.parquet", "--city", "new-york", "--epsilon", "1", "--param",
                  "cell_width_m=500", "--out", out, cwd=work)
    run_geodp("release", "run", "data/nyc.parquet", "--city", "new-york", "--period", "2024-01-01..2024-01-05",
              "--slot", "1d", "--epsilon", "1", "--mechanism", "identity3d", "--param", "grid_size=16",
              "--max-points-per-user", "20", "--out", "st", "--no-prefect", cwd=work)
    return work


def _answer(work, target: str, *extra: str) -> list[dict]:
    done = run_geodp("query", "range", target, "--box", BOX, "--json", *extra, ok=False, cwd=work)
    assert done.returncode == 0, (target, done.stderr)
    return json.loads(done.stdout)


def test_a_store_a_version_and_a_series_are_answered_wherever_they_sit(work):
    # the README's line: a store inside a folder named releases is one release
    (row,) = _answer(work, "releases/nyc-demo")
    assert _answer(work, "releases/nyc-demo/releases/nyc/new-york/all/v1")[0]["estimate"] == row["estimate"]
    assert _answer(work, str(work / "releases" / "nyc-demo"))[0]["estimate"] == row["estimate"]
    # a store named releases: the store, its version and its place's series
    (one,) = _answer(work, "out/releases")
    assert _answer(work, "out/releases/releases/nyc/new-york/all/v1")[0]["estimate"] == one["estimate"]
    series = _answer(work, "releases/nyc-demo/releases/nyc/new-york")
    assert [r["period"] for r in series] == ["all", "sum all..all"]
    assert series[0]["estimate"] == pytest.approx(row["estimate"])
    # a dataset's folder is still a series that needs its city
    bad = run_geodp("query", "range", "releases/nyc-demo/releases/nyc", "--box", BOX, ok=False, cwd=work)
    assert bad.returncode == 2 and "needs both the dataset and the city" in bad.stderr


def test_a_period_on_a_2d_release_in_python_is_one_clear_error(work):
    import geodp

    release = geodp.open_store(str(work / "releases" / "nyc-demo")).releases()[0]
    with pytest.raises(ValueError, match="no time axis"):
        release.query([(40.708, -74.012, 40.717, -74.000)], period="2024-01-02..2024-01-03")
    with pytest.raises(ValueError, match="lies outside"):
        geodp.open_store(str(work / "st")).releases()[0].query([(40.708, -74.012, 40.717, -74.000)],
                                                                 period="2025-01-01..2025-01-02")
