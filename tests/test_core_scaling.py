"""Scaling a user-level release to full counts: charges add up, the factor is bounded, N is reused."""

import numpy as np
import pytest

from dpcore.geo import Region
from dpcore.mechanisms import FitInput, SpatioTemporalInput, get_mechanism
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.scaling import fit_scaled
from dpcore.synopsis.base import load_synopsis


def fit_input(n=5000, k=5):
    rng = np.random.default_rng(0)
    region = Region("t", 40.0, -74.0, 4.0)
    return FitInput(rng.uniform(-2000, 2000, n), rng.uniform(-2000, 2000, n), region, "user", k)


def test_charges_add_up_and_the_sample_total_is_not_paid_twice():
    syn = fit_scaled(get_mechanism("ug"), fit_input(), 1.0, NoiseSource.seeded(1), 20_000, "test")
    names = [c["name"] for c in syn.privacy.charges]
    assert names[0] == "sample_total_for_scaling" and "total_count" not in names
    assert sum(c["epsilon"] for c in syn.privacy.charges) == pytest.approx(1.0)
    assert all(c["sensitivity"] == 5 for c in syn.privacy.charges)
    h = syn.region.half_m
    total = syn.answer(np.array([[-h, -h, h, h]]))[0]
    assert total == pytest.approx(20_000, rel=0.1)


def test_factor_never_below_one_even_at_tiny_epsilon():
    for seed in range(30):
        syn = fit_scaled(get_mechanism("identity", cell_width_m=500.0), fit_input(n=50), 0.001, NoiseSource.seeded(seed),
                         60, "test")
        assert 1.0 <= syn.factor <= 60.0


def test_scaled_synopsis_round_trips(tmp_path):
    syn = fit_scaled(get_mechanism("identity", cell_width_m=500.0), fit_input(), 1.0, NoiseSource.seeded(2), 9000, "test")
    syn.save(tmp_path / "s")
    loaded = load_synopsis(tmp_path / "s")
    boxes = np.array([[-1000, -1000, 500, 700], [0, 0, 100, 100]])
    assert np.array_equal(loaded.answer(boxes), syn.answer(boxes))
    assert loaded.privacy.to_dict() == syn.privacy.to_dict()


def test_record_level_is_refused():
    data = fit_input()
    rec = FitInput(data.x, data.y, data.region, "record", None)
    with pytest.raises(ValueError):
        fit_scaled(get_mechanism("identity"), rec, 1.0, NoiseSource.seeded(0), 10, "test")


def test_factor_is_bounded_by_the_noise_floor():
    # n̂ is floored at one noise scale k/ε_n, so the factor never exceeds N·ε_n/k however bad the draw.
    eps, k, total = 0.05, 5, 1_000_000
    eps_n = 0.10 * eps
    for seed in range(40):
        syn = fit_scaled(get_mechanism("ug"), fit_input(n=200, k=k), eps, NoiseSource.seeded(seed), total, "test")
        assert 1.0 <= syn.factor <= total * eps_n / k + 1e-9


def test_a_paid_sample_size_is_reused_not_mistaken_for_the_public_total():
    import dataclasses

    from dpcore.mechanisms import get_mechanism

    base = fit_input()
    st = SpatioTemporalInput(base.x, base.y, base.region, base.unit, user=base.user,
                             slot=np.zeros(base.n, dtype=np.int64) % 3, n_slots=3, slot_seconds=3600,
                             window_start_s=0, public_total=20_000.0)
    paid = get_mechanism("identity3d", grid_size=8).fit(st, 1.0, NoiseSource.seeded(0))
    assert "sample_size" in [c["name"] for c in paid.privacy.charges]
    reused = get_mechanism("identity3d", grid_size=8).fit(
        dataclasses.replace(st, sample_size=4_900.0), 1.0, NoiseSource.seeded(0))
    assert "sample_size" not in [c["name"] for c in reused.privacy.charges]
    assert sum(c["epsilon"] for c in reused.privacy.charges) == pytest.approx(1.0)
    # the full total still drives the scale: N / n̂ with n̂ the reused estimate
    h = reused.region.half_m
    assert reused.answer(np.array([[-h, -h, h, h]]))[0] == pytest.approx(20_000, rel=0.05)


def test_spatio_temporal_cell_width_is_not_silently_overridden():
    from dpcore.mechanisms.identity3d import st_grid_size

    data = fit_input()
    assert st_grid_size(data, None, 500.0) == 8  # 4 km / 500 m
    assert st_grid_size(data, None, None) == 256
    assert st_grid_size(data, 16, None) == 16
