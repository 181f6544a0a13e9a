"""`geodp release plan` is a dry run: it writes nothing, not even an empty store folder (issue 46: it left
one), and a seeded plan does not mark the store as one of experiments."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.geo import city_region
from tests.cli_runner import run_geodp


def _checkins(path) -> None:
    nyc, rng = city_region("new-york"), np.random.default_rng(0)
    n = 2_000
    pd.DataFrame({"user_id": np.arange(n) % 200,
                  "timestamp": pd.Timestamp("2024-01-01", tz="UTC") + pd.to_timedelta(np.arange(n) % 24, unit="h"),
                  "lat": nyc.center_lat + rng.uniform(-0.05, 0.05, n),
                  "lon": nyc.center_lon + rng.uniform(-0.05, 0.05, n)}).to_parquet(path)


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_release_plan_writes_nothing(tmp_path):
    data = tmp_path / "c.parquet"
    _checkins(data)
    plan = ["release", "plan", data, "--cities", "new-york", "--epsilon", "1", "--period", "2024-01-01"]
    run_geodp(*plan, "--store", tmp_path / "new")
    run_geodp(*plan, "--store", tmp_path / "seeded", "--seed", "3")
    assert not (tmp_path / "new").exists() and not (tmp_path / "seeded").exists()

    store = tmp_path / "store"
    # a period the data do not cover: its own profile's verdict refuses it unless published anyway
    run_geodp("release", "run", data, "--cities", "new-york", "--epsilon", "1", "--period", "2024-01-02",
              "--store", store, "--no-prefect", "--publish-anyway")
    before = _tree(store)
    shown = run_geodp(*plan, "--store", store).stdout
    assert "new-york 2024-01-01" in shown and _tree(store) == before
