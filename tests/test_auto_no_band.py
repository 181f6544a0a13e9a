"""`auto` with no declared band serves 25 m – 5 km squares with one fit (issue 35 item 4): its setting
at user level (dpcore.mechanisms.auto_rule.WIDE_PICKS) keeps the noise of 1–5 km squares below that of the 100–1000 m
setting, which a release without a band ran before and which was ×1.5 AG's error there on held-out data."""

from __future__ import annotations

import numpy as np

from dpcore.geo import Region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.mechanisms.auto_rule import NO_BAND, band_params, band_pick
from dpcore.privacy.noise import NoiseSource

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
