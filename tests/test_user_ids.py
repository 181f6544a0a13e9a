"""One person is one user key whatever type each file gives their id: 88 (integer), 88.0 (float) and
"88" or "88.0" (text) are the same person, bounded once; a float id that is not a whole number is an
input error (one line, exit 2, nothing charged). Through the CLI, and on the in-memory path."""

import numpy as np
import pandas as pd
import pytest

from dpcore.data.points import DataError, load_points
from dpcore.geo import city_region
from tests.cli_runner import bounded_total, run_geodp

REGION = city_region("new-york")
N_PEOPLE = 40


def _people(points_each: int, seed: int) -> pd.DataFrame:
    """N_PEOPLE people with ``points_each`` points each, well inside the region, on 2024-01-01."""
    rng = np.random.default_rng(seed)
    n = N_PEOPLE * points_each
    x, y = rng.uniform(-0.4, 0.4, (2, n)) * REGION.side_m
    lat, lon = REGION.unproject(x, y)
    return pd.DataFrame({"user_id": np.repeat(np.arange(N_PEOPLE), points_each) + 80,
                         "timestamp": pd.Timestamp("2024-01-01T12:00:00Z") + pd.to_timedelta(rng.integers(0, 3600, n), "s"),
                         "lat": lat, "lon": lon})


@pytest.fixture(scope="module")
def typed_folder(tmp_path_factory):
    """The same people in three files: integer ids, float ids (88.0) and text ids ("88.0" / "88")."""
    folder = tmp_path_factory.mktemp("typed") / "checkins"
    folder.mkdir()
    as_int = _people(3, 1)
    as_float = _people(3, 2).astype({"user_id": "float64"})
    as_text = _people(3, 3)
    as_text["user_id"] = [f"{u}.0" if u % 2 else str(u) for u in as_text["user_id"]]
    as_int.to_parquet(folder / "a.parquet")
    as_float.to_parquet(folder / "b.parquet")
    as_text.to_parquet(folder / "c.parquet")
    return folder


def test_an_id_typed_int_float_and_text_in_three_files_is_one_person(typed_folder, tmp_path):
    out = tmp_path / "out"
    run_geodp("release", typed_folder, "--city", "new-york", "--epsilon", "1000", "--mechanism", "identity",
              "--param", "cell_width_m=2000", "--max-points-per-user", "1", "--seed", "4", "--out", out)
    # k = 1: each person keeps one of their 9 points, however their id was typed (ε = 1000: the
    # noise is 0 but for ~e^-1000)
    assert bounded_total(str(out), REGION) == pytest.approx(N_PEOPLE, abs=0.5)


def test_in_memory_reads_merge_the_typed_ids_too(typed_folder):
    points = load_points(str(typed_folder)).points
    assert points.n_users == N_PEOPLE and len(points) == 9 * N_PEOPLE


def test_a_non_integral_float_id_is_a_one_line_error_and_nothing_is_charged(tmp_path):
    folder = tmp_path / "checkins"
    folder.mkdir()
    _people(2, 1).to_parquet(folder / "a.parquet")
    bad = _people(2, 2).astype({"user_id": "float64"})
    bad.loc[5, "user_id"] = 88.5
    bad.to_parquet(folder / "b.parquet")
    store = tmp_path / "store"
    proc = run_geodp("release", folder, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
                     "--param", "cell_width_m=2000", "--store", store, "--no-prefect", ok=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "b.parquet" in last and "not whole" in last
    assert not (store / "datasets").exists() and not (store / "releases").exists()
    with pytest.raises(DataError, match="not whole"):
        load_points(str(folder))
