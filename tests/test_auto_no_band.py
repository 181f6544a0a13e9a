"""`auto` with no declared band serves 25 m – 5 km squares with one fit (issue 35 item 4): its setting
at user level (dpcore.mechanisms.auto_rule.WIDE_PICKS) keeps the noise of 1–5 km squares below that of the 100–1000 m
setting, which a release without a band ran before and which was ×1.5 AG's error there on held-out data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import Region, city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.mechanisms.ag import constrained_inference
from dpcore.mechanisms.ag_levels import tree_inference
from dpcore.mechanisms.auto_rule import NO_BAND, band_params, band_pick
from dpcore.privacy.bounding import contribution_weights
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import load_synopsis
from tests.cli_runner import run_geodp

REGION = Region("test", 40.7, -74.0, side_km=20.0)


def clustered_checkins(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense neighbourhoods spread over the city, 20 points per person on average."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3000, (12, 2))
    hood = rng.choice(12, n, p=rng.dirichlet(np.ones(12)))
    x = np.clip(centres[hood, 0] + rng.normal(0, 600, n), -9_999, 9_999)
    y = np.clip(centres[hood, 1] + rng.normal(0, 600, n), -9_999, 9_999)
    return x, y, rng.integers(0, n // 20, n)


def squares_on_points(x: np.ndarray, y: np.ndarray, band: tuple[float, float], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    i = rng.integers(0, x.size, 400)
    half = rng.uniform(*band, 400) / 2
    return np.c_[x[i] - half, y[i] - half, x[i] + half, y[i] + half]


def test_a_release_without_a_band_serves_every_size_and_adds_less_noise_to_large_squares() -> None:
    x, y, user = clustered_checkins(50_000, 3)
    data = FitInput(x, y, REGION, "user", 20, user=user, sample_size=float(x.size))
    no_band = get_mechanism("auto").fit(data, 1.0, NoiseSource.seeded(1))
    mid = get_mechanism("auto", query_sides_m=(100.0, 1000.0)).fit(data, 1.0, NoiseSource.seeded(1))
    params = no_band.privacy.params
    # what it serves is recorded, and it is every band, not the 100-1000 m one
    assert params["query_sides_m"] == list(NO_BAND)
    assert band_pick(NO_BAND, "user") != band_pick((100.0, 1000.0), "user")
    assert params["chosen"]["mechanism"] == "ag"
    assert params["chosen"]["params"] == band_params(NO_BAND, "ag", REGION.side_m, "user")
    # 1-5 km squares centred on the data sum many leaves: the no-band release's noise there is lower
    large = squares_on_points(x, y, (1000.0, 5000.0), 5)
    assert no_band.noise_model().sd(large).mean() < mid.noise_model().sd(large).mean()
    # and it is not bought with more noise on 100-1000 m squares
    small = squares_on_points(x, y, (100.0, 1000.0), 6)
    assert no_band.noise_model().sd(small).mean() <= mid.noise_model().sd(small).mean()


def test_only_bands_wider_than_one_decade_get_the_no_band_setting() -> None:
    for unit in ("record", "user"):
        wide = band_pick(NO_BAND, unit)
        assert band_pick((100.0, 5000.0), unit) == wide
        assert band_pick((25.0, 1000.0), unit) == wide
        for band in ((25.0, 100.0), (100.0, 1000.0), (1000.0, 5000.0)):
            assert band_pick(band, unit) != wide


def test_three_level_inference_with_two_levels_is_ags_constrained_inference() -> None:
    rng = np.random.default_rng(4)
    m2 = rng.integers(1, 5, 9)
    parent = np.repeat(np.arange(9), m2 * m2)
    v, u = rng.normal(50, 10, 9), rng.normal(3, 2, parent.size)
    expected = constrained_inference(v, u, m2 * m2, 0.3, 0.7)
    leaves = tree_inference([v, u], [2 / 0.3 ** 2, 2 / 0.7 ** 2], [parent])
    np.testing.assert_allclose(leaves, expected)
    # three levels: counts that already agree are kept; a level-1 count 6 above its subtree moves that cell's
    # leaves by its inverse-variance weight against the subtree's estimate
    m3 = rng.integers(1, 4, parent.size)
    parent3 = np.repeat(np.arange(parent.size), m3 * m3)
    w = rng.normal(1, 2, parent3.size)
    u3 = np.bincount(parent3, w, parent.size)
    v3 = np.bincount(parent, u3, 9)
    variances = [2.0, 5.0, 9.0]
    np.testing.assert_allclose(tree_inference([v3, u3, w], variances, [parent, parent3]), w)
    moved = tree_inference([v3 + 6.0 * (np.arange(9) == 0), u3, w], variances, [parent, parent3])
    sub = 1.0 / (1.0 / 5.0 + 1.0 / (9.0 * m3 * m3))  # each level-2 cell's estimate from itself and its leaves
    var_subtree = sub[parent == 0].sum()
    gain = (1 / 2.0) / (1 / 2.0 + 1 / var_subtree)
    cell0 = parent[parent3] == 0
    assert moved[cell0].sum() - w[cell0].sum() == pytest.approx(6.0 * gain)
    np.testing.assert_allclose(moved[~cell0], w[~cell0])


def test_a_record_level_release_without_a_band_runs_three_level_ag_and_states_its_budget_split(tmp_path) -> None:
    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=400, days=5, seed=3).to_parquet(data)
    out = tmp_path / "rel"
    run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--privacy-unit", "record", "--mechanism",
              "auto", "--seed", "2", "--out", out)
    (manifest_path,) = out.glob("releases/*/new-york/all/v1/_MANIFEST.json")
    manifest = json.loads(manifest_path.read_text())
    chosen = manifest["params"]["chosen"]
    want = band_params(NO_BAND, "ag", city_region("new-york").side_m, "record")
    assert chosen["mechanism"] == "ag" and chosen["params"] == want and want["levels"] == 3
    # the budget split, as the ledger charged it: total, then level 1, level 2, level 3 of what remains
    eps = {c["name"]: c["epsilon"] for c in manifest["privacy"]["charges"]}
    assert set(eps) == {"total_count", "ag/level1_counts", "ag/level2_counts", "ag/level3_counts"}
    assert sum(eps.values()) == pytest.approx(1.0)
    rest = 1.0 - eps["total_count"]
    assert eps["ag/level1_counts"] == pytest.approx(want["alpha"] * rest)
    assert eps["ag/level2_counts"] == pytest.approx(want["level2_fraction"] * (rest - eps["ag/level1_counts"]))
    # answers carry 95% intervals from the three-level noise model
    (version,) = (p.parent for p in [manifest_path])
    r = run_geodp("query", version, "--box", "40.7080,-74.0110,40.7180,-74.0010", "--json")
    (row,) = json.loads(r.stdout)
    assert row["lower"] < row["estimate"] < row["upper"]
    assert "three-level" in r.stderr  # the method, stated once


def test_three_level_ag_keeps_the_mechanism_contract_and_its_intervals_survive_a_save(tmp_path) -> None:
    from tests.test_mechanism_contract import (
        EPSILON,
        check_bad_params,
        check_charges,
        check_round_trip,
        contract_region,
        contract_sample,
    )

    sample = contract_sample(contract_region())
    for weights in (None, contribution_weights(sample.user, 3)):
        data = FitInput(sample.x, sample.y, sample.region, sample.unit, user=sample.user, weights=weights)
        syn = get_mechanism("ag", levels=3, c=4.0, c3=2.0).fit(data, EPSILON, NoiseSource.seeded(3))
        assert {c["name"] for c in syn.privacy.charges} >= {"level1_counts", "level2_counts", "level3_counts"}
        check_charges("ag", syn, sample)
        check_round_trip(syn, tmp_path / f"ag3-{weights is None}")
        boxes = np.array([[-400.0, -400.0, 400.0, 400.0], [100.0, -200.0, 300.0, 0.0]])
        back = load_synopsis(tmp_path / f"ag3-{weights is None}")
        sd = syn.noise_model().sd(boxes)
        assert np.all(sd > 0) and np.array_equal(back.noise_model().sd(boxes), sd)
    check_bad_params("ag", {"levels": 4}, sample)
    check_bad_params("ag", {"levels": 3, "level2_fraction": 1.0}, sample)
