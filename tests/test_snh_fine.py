"""SNH's fine level below the pyramid's finest grid (``fine_factor``): its maths, accounting and answers."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.geo import city_region
from dpcore.grid.histogram import answer_boxes, block_sum, prefix_sums
from dpcore.grid.pyramid import PyramidError, join_fine_level, refine_to_fine
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.mechanisms.base import MechanismError
from dpcore.mechanisms.snh.rules import blend_nets_weights
from dpcore.models.denoiser_meta import DEFAULT_DENOISER_PATH
from dpcore.privacy.noise import NoiseSource
from tasks.paramselect_tasks import dataset_points

TINY = dict(n_sizes=2, hidden=8, depth=1, max_epochs=2, samples_per_epoch=1024, batch_size=512, device="cpu")


def test_refinement_keeps_every_coarse_cell_mass_and_resolves_only_spikes_above_the_noise():
    """Each coarse cell's mass is split among its 4×4 fine cells: a spike far above the noise lands in its
    own fine cell, a cell whose fine counts are pure noise is spread evenly."""
    rng = np.random.default_rng(0)
    est = np.full((4, 4), 100.0)
    fine = rng.laplace(0.0, 2.0, (16, 16))
    fine[1, 2] += 100.0  # all of coarse cell (0, 0)'s mass in one fine cell
    out = refine_to_fine(est, fine, fine_var=8.0)
    np.testing.assert_allclose(block_sum(out, 4), est, rtol=1e-12)
    assert (out >= 0).all()
    assert out[1, 2] > 0.8 * 100.0
    noise_only = out[12:16, 12:16]
    assert noise_only.max() < 3 * noise_only.mean()  # no structure learned from noise alone
    with pytest.raises(PyramidError, match="power of two"):
        refine_to_fine(est, np.zeros((12, 12)), 1.0)


def test_joining_the_fine_level_lowers_the_finest_levels_variance_by_inverse_variance():
    rng = np.random.default_rng(1)
    levels = {2: rng.normal(size=(2, 2)), 8: rng.normal(size=(8, 8))}
    var = {2: 4.0, 8: 1.0}
    fine = rng.normal(size=(32, 32))
    joined, jvar = join_fine_level(levels, var, fine, 0.5)
    agg_var = 0.5 * 16  # a 4×4 block sum of the fine level
    assert jvar[8] == pytest.approx(1.0 * agg_var / (1.0 + agg_var))
    w = agg_var / (agg_var + 1.0)
    np.testing.assert_allclose(joined[8], w * levels[8] + (1 - w) * block_sum(fine, 4))
    assert jvar[2] == var[2] and joined[2] is levels[2]  # coarser levels untouched
    assert levels[8] is not joined[8]  # the caller's levels are not modified


def test_fine_level_blend_answers_small_squares_from_the_grid():
    assert blend_nets_weights(5000.0, True, fine=True)[0] == 0.0
    assert blend_nets_weights(5000.0, True, fine=False)[0] == 0.5
    assert blend_nets_weights(5000.0, True, fine=True)[1] == blend_nets_weights(5000.0, True)[1]


@pytest.mark.skipif(not DEFAULT_DENOISER_PATH.exists(), reason="the shipped denoiser is not installed")
def test_fine_level_release_spends_exactly_epsilon_and_answers_from_a_finer_grid(tmp_path):
    """fine_factor=4: levels 8/32/128 and a 512 level, the fine level takes fine_share of ε, all of ε is
    spent, the synopsis is a non-negative 512² grid whose 4×4 blocks are the denoised 128² grid's, and a
    saved release loads with the same answers."""
    from dpcore.synopsis.base import load_synopsis

    x, y, user = dataset_points({"name": "d", "city": "boston", "source": "synthetic", "seed": 3,
                                 "n_users": 400, "n_hotspots": 8})
    data = FitInput(x, y, city_region("boston"), "record", None, user=user)
    syn = get_mechanism("snh", fine_factor=4, fine_share=0.3, **TINY).fit(data, 0.2, NoiseSource.seeded(5))
    charges = {c["name"]: c["epsilon"] for c in syn.privacy.charges}
    assert list(charges) == ["pyramid_8", "pyramid_32", "pyramid_128", "pyramid_512"]
    assert sum(charges.values()) == pytest.approx(0.2, rel=1e-12)
    assert charges["pyramid_512"] == pytest.approx(0.3 * 0.2, rel=1e-9)
    assert syn.config["grid_size"] == 128 and syn.config["fine_grid"] == 512 and syn.noisy.shape == (512, 512)
    assert (syn.noisy >= 0).all() and syn.config["nets_weights"][0] == 0.0
    boxes = np.array([[-2000.0, -2000.0, -1950.0, -1940.0], [0.0, 0.0, 800.0, 600.0]])
    # Squares under 100 m from the fine grid, larger ones from its 4×4 block sums (the denoised grid).
    grid_rule = get_mechanism("snh", fine_factor=4, answer="grid", **TINY).fit(data, 0.2, NoiseSource.seeded(5))
    bounds = grid_rule.region.bounds_m
    fine_ans = answer_boxes(prefix_sums(grid_rule.noisy), bounds, boxes)
    coarse_ans = answer_boxes(prefix_sums(block_sum(grid_rule.noisy, 4)), bounds, boxes)
    np.testing.assert_allclose(grid_rule.answer(boxes), [fine_ans[0], coarse_ans[1]])
    assert fine_ans[0] != pytest.approx(coarse_ans[0])
    syn.save(tmp_path / "fine")
    np.testing.assert_array_equal(load_synopsis(tmp_path / "fine").answer(boxes), syn.answer(boxes))
    default = get_mechanism("snh", **TINY).fit(data, 0.2, NoiseSource.seeded(5))
    assert default.config["grid_size"] == 128 and default.config["fine_grid"] is None


def test_fine_level_refines_the_plain_pyramid_too():
    """Without a denoiser (denoiser='none', or a city the shipped one learned from) the fine level lies
    below the plain pyramid's finest level G from ParamSelect's ρ, with the same ledger rule."""
    x, y, user = dataset_points({"name": "d", "city": "boston", "source": "synthetic", "seed": 3,
                                 "n_users": 400, "n_hotspots": 8})
    data = FitInput(x, y, city_region("boston"), "record", None, user=user, public_total=int(x.size))
    syn = get_mechanism("snh", denoiser="none", cell_width_m=None, fine_factor=2, **TINY).fit(
        data, 0.2, NoiseSource.seeded(2))
    G = syn.config["grid_size"]
    assert syn.config["fine_grid"] == 2 * G and syn.noisy.shape == (2 * G, 2 * G)
    names = [c["name"] for c in syn.privacy.charges]
    assert names[-1] == f"pyramid_{2 * G}" and f"pyramid_{G}" in names
    assert sum(c["epsilon"] for c in syn.privacy.charges) == pytest.approx(0.2, rel=1e-12)


@pytest.mark.parametrize("params", [
    {"fine_factor": 2, "cell_width_m": 100.0},
    {"fine_factor": 4, "data_collection": "grid"},
])
def test_fine_level_needs_the_pyramid(params):
    with pytest.raises(MechanismError, match="fine_factor"):
        get_mechanism("snh", **params).check_params()


@pytest.mark.parametrize("params", [{"fine_factor": 3}, {"fine_share": 0.0}, {"fine_share": 1.0}])
def test_fine_level_parameters_are_checked(params):
    with pytest.raises(MechanismError):
        get_mechanism("snh", **params).check_params()
