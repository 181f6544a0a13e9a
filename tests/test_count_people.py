"""`geodp release run --count people`: distinct people per cell, each person in at most L cells
(L = --max-points-per-user, the sensitivity), answered in the unit "people"."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from dpcore.data.points import load_points
from dpcore.geo import city_region
from tests.cli_runner import run_geodp


def test_count_people_releases_distinct_people_per_cell_with_each_person_in_at_most_l_cells(gowalla_nyc_path,
                                                                                            tmp_path):
    pts = load_points(gowalla_nyc_path).points
    region = city_region("new-york")
    x, y = region.project(pts.lat, pts.lon)
    inside = region.contains_m(x, y)
    n = 20
    xmin, ymin, _, _ = region.bounds_m
    ix = ((x[inside] - xmin) / region.side_m * n).astype(int)
    iy = ((y[inside] - ymin) / region.side_m * n).astype(int)
    people = pd.DataFrame({"u": pts.user[inside], "c": ix * n + iy}).drop_duplicates().groupby("c").size()
    busiest = people.sort_values().index[-3:]
    cell_m = region.side_m / n
    boxes = []
    for c in busiest:  # each box is one cell, shrunk by 1 m so that it cannot touch a neighbour
        x0, y0 = xmin + (c // n) * cell_m + 1, ymin + (c % n) * cell_m + 1
        boxes.append(region.unproject(x0, y0) + region.unproject(x0 + cell_m - 2, y0 + cell_m - 2))
    csv = tmp_path / "cells.csv"
    pd.DataFrame(boxes, columns=["min_lat", "min_lon", "max_lat", "max_lon"]).to_csv(csv, index=False)
    common = ["--city", "new-york", "--epsilon", "1000", "--mechanism", "identity", "--param", f"grid_size={n}",
              "--count", "people", "--seed", "3"]

    run_geodp("release", "run", gowalla_nyc_path, *common, "--max-points-per-user", "1000", "--out", tmp_path / "a")
    rows = json.loads(run_geodp("query", "range", tmp_path / "a", "--boxes", csv, "--json").stdout)
    assert {r["unit"] for r in rows} == {"people"}
    est = np.array([r["estimate"] for r in rows])
    truth = people.loc[busiest].to_numpy()
    assert np.all(np.abs(est - truth) <= 0.02 * truth + 5), (est, truth)  # near-noise-free: distinct people
    assert np.all(truth < 0.5 * np.bincount(ix * n + iy)[busiest])  # and not points, which are far more

    # L = 1: each person counts in one cell, so the whole region counts each person once
    run_geodp("release", "run", gowalla_nyc_path, *common, "--max-points-per-user", "1", "--out", tmp_path / "b")
    whole = ",".join(f"{v:.6f}" for v in region.bbox_latlon())
    (row,) = json.loads(run_geodp("query", "range", tmp_path / "b", "--box", whole, "--json").stdout)
    assert abs(row["estimate"] - np.unique(pts.user[inside]).size) <= 10
