"""SNH's public denoiser: shape of its output, training, save/load, the no-own-city rule, accounting."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpcore.evaluation.metrics import relative_error
from dpcore.geo import city_region
from dpcore.grid.histogram import answer_boxes, prefix_sums
from dpcore.mechanisms import FitInput, PrivacyUnit, get_mechanism
from dpcore.mechanisms.base import MechanismError
from dpcore.models.pyramid_denoiser import (
    DENOISER_GRID,
    DenoiserTrainConfig,
    PublicDataset,
    PyramidDenoiser,
    box_answers,
    denoise,
    load_denoiser,
    region_record,
    regions_overlap,
    save_denoiser,
    simulate_release,
    train_denoiser,
    usable_for,
)
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.scaling import ScaledSynopsis
from tasks.paramselect_tasks import dataset_points

DASK_WORKERS = 1  # the session's one-worker cluster (tests/conftest.py): these flows need no second worker


def synthetic_public(city: str, seed: int, n_users: int = 800) -> PublicDataset:
    spec = {"name": f"synthetic-{city}-{seed}", "city": city, "source": "synthetic", "seed": seed,
            "n_users": n_users, "n_hotspots": 12}
    x, y, user = dataset_points(spec)
    return PublicDataset.from_points(spec["name"], x, y, user, city_region(city), ks=(5,), versions=1, seed=seed)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small denoiser trained on two synthetic public cities (seeded; ~20 s on 2 cores)."""
    datasets = [synthetic_public("tulsa", 1), synthetic_public("fargo", 2)]
    cfg = DenoiserTrainConfig(steps=60, batch_size=3, queries_per_sample=256, channels=8, lr=3e-3, seed=0)
    losses = []
    model, report = train_denoiser(datasets, cfg, progress=lambda step, loss: losses.append(loss))
    path = tmp_path_factory.mktemp("denoiser") / "den.npz"
    save_denoiser(path, model, {"training_regions": [region_record(d.region) for d in datasets], "report": report})
    return model, path, report, losses


def test_output_is_a_nonnegative_mass_preserving_grid():
    rng = np.random.default_rng(0)
    counts = {g: rng.poisson(3.0, (g, g)).astype(np.float64) * (DENOISER_GRID // g) ** 2
              for g in (DENOISER_GRID // 16, DENOISER_GRID // 4, DENOISER_GRID)}
    est, noisy, var = simulate_release(counts, 1.0, 0.5, rng)
    torch.manual_seed(0)
    model = PyramidDenoiser(8)
    with torch.no_grad():  # a non-trivial output layer, so the check is not about the zero init
        model.dec1[-1].weight.normal_(0, 0.1)
    out = denoise(model, est, noisy, var)
    assert out.shape == (DENOISER_GRID, DENOISER_GRID)
    assert (out >= 0).all()
    assert out.sum() == pytest.approx(est.sum(), rel=1e-9)


def test_untrained_model_keeps_the_pyramid_estimate():
    """The zero output layer makes a fresh model return the pyramid (plus a 1% per-cell floor)."""
    rng = np.random.default_rng(1)
    counts = {g: rng.poisson(50.0 / g, (g, g)).astype(np.float64) * (DENOISER_GRID // g) ** 2
              for g in (8, 32, 128)}
    est, noisy, var = simulate_release(counts, 1.0, 1.0, rng)
    out = denoise(PyramidDenoiser(8), est, noisy, var)
    mean_cell = est.sum() / DENOISER_GRID ** 2
    expected = (est + 1e-2 * mean_cell) * est.sum() / (est.sum() + 1e-2 * mean_cell * DENOISER_GRID ** 2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-6 * est.sum())


def test_box_answers_match_the_numpy_prefix_sums():
    rng = np.random.default_rng(2)
    dens = rng.random((2, 16, 16))
    boxes = np.sort(rng.uniform(-1, 17, (2, 50, 2, 2)), axis=2).transpose(0, 1, 3, 2).reshape(2, 50, 4)
    got = box_answers(torch.tensor(dens), torch.tensor(boxes)).numpy()
    for b in range(2):
        want = answer_boxes(prefix_sums(dens[b]), (0.0, 0.0, 16.0, 16.0), boxes[b])
        np.testing.assert_allclose(got[b], want, rtol=1e-9, atol=1e-9)


@pytest.mark.slow
def test_trained_denoiser_beats_the_pyramid_on_an_unseen_city(trained):
    """Trained on two synthetic cities, it lowers range-query error on a third it never saw. (The training
    loss is not compared over time: each batch draws its own ε, so its level moves with the draw.)"""
    model, _, report, losses = trained
    assert len(losses) == 60 and np.all(np.isfinite(losses))
    held_out = synthetic_public("phoenix", 5)
    rng = np.random.default_rng(7)
    region = held_out.region
    boxes_side = rng.uniform(100, 1000, 2000)
    cx, cy = rng.uniform(-region.half_m, region.half_m, (2, 2000))
    boxes = np.stack([cx - boxes_side / 2, cy - boxes_side / 2, cx + boxes_side / 2, cy + boxes_side / 2], 1)
    truth = answer_boxes(prefix_sums(held_out.truth), region.bounds_m, boxes)
    psi = max(1.0, 1e-3 * held_out.n_points)
    err_pyr, err_den = [], []
    for trial in range(3):
        est, noisy, var = simulate_release(held_out.levels[0][0], 1.0, 0.1, np.random.default_rng(100 + trial))
        err_pyr.append(relative_error(answer_boxes(prefix_sums(est), region.bounds_m, boxes), truth, psi).mean())
        den = denoise(model, est, noisy, var)
        err_den.append(relative_error(answer_boxes(prefix_sums(den), region.bounds_m, boxes), truth, psi).mean())
    assert np.mean(err_den) < 0.7 * np.mean(err_pyr)


def test_save_load_round_trip_and_training_regions(trained):
    model, path, _, _ = trained
    loaded, meta = load_denoiser(path)
    rng = np.random.default_rng(3)
    counts = synthetic_public("miami", 4, n_users=300).levels[0][0]
    est, noisy, var = simulate_release(counts, 1.0, 0.2, rng)
    np.testing.assert_array_equal(denoise(model, est, noisy, var), denoise(loaded, est, noisy, var))
    assert {r["name"] for r in meta["training_regions"]} == {"tulsa", "fargo"}
    assert not usable_for(meta, city_region("tulsa"))[0]
    assert usable_for(meta, city_region("boston"))[0]
    meta_file = json.loads(path.with_suffix(".json").read_text())
    assert meta_file["grid"] == DENOISER_GRID


def test_regions_overlap():
    nyc = region_record(city_region("new-york"))
    assert regions_overlap(nyc, nyc)
    assert regions_overlap(nyc, {**nyc, "center_lat": nyc["center_lat"] + 0.15})  # ~17 km north: overlaps
    assert not regions_overlap(nyc, {**nyc, "center_lat": nyc["center_lat"] + 0.2})  # ~22 km: does not
    assert not regions_overlap(nyc, region_record(city_region("boston")))


def _fit_input(city: str, seed: int = 9) -> FitInput:
    x, y, user = dataset_points({"name": "d", "city": city, "source": "synthetic", "seed": seed, "n_users": 400,
                                 "n_hotspots": 8})
    return FitInput(x, y, city_region(city), "record", None, user=user)


TINY = dict(n_sizes=2, hidden=8, depth=1, max_epochs=2, samples_per_epoch=1024, batch_size=512, device="cpu")


def test_snh_with_a_denoiser_spends_only_the_pyramid(trained):
    """With a denoiser the grid is fixed, so no ρ is chosen and no n is paid: the three pyramid levels
    take all of ε, and the release says the denoiser was used."""
    _, path, _, _ = trained
    syn = get_mechanism("snh", denoiser=str(path), **TINY).fit(_fit_input("boston"), 0.3, NoiseSource.seeded(1))
    charges = syn.privacy.charges
    assert [c["name"] for c in charges] == ["pyramid_8", "pyramid_32", "pyramid_128"]
    assert sum(c["epsilon"] for c in charges) == pytest.approx(0.3, rel=1e-12)
    assert syn.config["denoised"] and syn.config["grid_size"] == DENOISER_GRID
    assert any("public denoiser" in n for n in syn.privacy.notes)


def test_denoised_snh_takes_the_paid_sample_size_into_its_total_and_caps_its_grid(trained):
    """User level, scaled: the pyramid's total joins the paid n̂ (variance 0 here makes it exact), the
    denoised grid is capped by its own levels' counts and the manifest says both; without the cap
    (denoiser_cap_sigmas=None) the grid keeps the whole total."""
    import dataclasses

    _, path, _, _ = trained
    base = _fit_input("boston")
    data = dataclasses.replace(base, unit=PrivacyUnit.user(5), sample_size=float(base.n) + 40.0,
                               sample_size_variance=0.0)
    syn = get_mechanism("snh", denoiser=str(path), **TINY).fit(data, 0.3, NoiseSource.seeded(2))
    assert syn.config["estimated_total"] == pytest.approx(base.n + 40.0)
    assert syn.config["signal"] == pytest.approx((base.n + 40.0) * 0.3 / 5)
    notes = " ".join(syn.privacy.notes)
    assert "already-paid sample size" in notes and "capped at their levels' combined counts + 3σ" in notes
    assert syn.noisy.sum() <= base.n + 40.0 + 1e-6
    uncapped = get_mechanism("snh", denoiser=str(path), denoiser_cap_sigmas=None, **TINY).fit(
        data, 0.3, NoiseSource.seeded(2))
    assert uncapped.noisy.sum() == pytest.approx(base.n + 40.0)
    # The config keeps the dropped fraction; from 10% a query warns that the counts are low.
    assert syn.config["dropped_fraction"] == pytest.approx(1 - syn.noisy.sum() / (base.n + 40.0))
    assert bool(syn.caveats()) == (syn.config["dropped_fraction"] >= 0.1)
    assert uncapped.config["dropped_fraction"] == 0.0 and uncapped.caveats() == []
    # A release scaled to full counts (dpcore.privacy.scaling) passes its inner synopsis's caveats on.
    forced = get_mechanism("snh", denoiser=str(path), denoiser_cap_sigmas=0.0, **TINY).fit(
        data, 0.3, NoiseSource.seeded(2))
    assert forced.caveats() and ScaledSynopsis(forced, 2.0, 2.0 * base.n, "test").caveats() == forced.caveats()
    assert "capped" not in " ".join(uncapped.privacy.notes)
    # The plain pyramid (no denoiser) keeps its own total: ParamSelect's rows for it were measured so.
    plain = get_mechanism("snh", denoiser="none", **TINY).fit(data, 0.3, NoiseSource.seeded(2))
    assert "already-paid sample size n̂ (inverse-variance)" not in " ".join(plain.privacy.notes)
    for bad in (-1.0, "none", True, float("nan")):
        with pytest.raises(MechanismError, match="denoiser_cap_sigmas"):
            get_mechanism("snh", denoiser_cap_sigmas=bad).check_params()


def test_snh_skips_the_denoiser_where_the_signal_is_large(trained, monkeypatch):
    """At or above denoiser_max_signal the plain pyramid estimate is the grid: the denoiser is not run,
    the release says so and records it, and the answers still come from the blend. Bad thresholds are refused before any budget is spent."""
    import dpcore.mechanisms.snh as snh
    import dpcore.models.pyramid_denoiser as pyramid_denoiser

    _, path, _, _ = trained
    data = _fit_input("boston")
    signal = data.n * 0.3  # record level: s = 1, and the pyramid's total is close to n

    def refuse(*args, **kwargs):
        raise AssertionError("the denoiser ran")

    monkeypatch.setattr(pyramid_denoiser, "denoise", refuse)
    syn = get_mechanism("snh", denoiser=str(path), denoiser_max_signal=0.5 * signal, **TINY).fit(
        data, 0.3, NoiseSource.seeded(1))
    assert not syn.config["denoised"] and syn.config["grid_size"] == DENOISER_GRID
    assert syn.config["answer"] == "blend"
    # The weights are the plain pyramid's: the denoiser did not run, whatever was asked.
    assert syn.config["nets_weights"] == list(snh.blend_nets_weights(syn.config["signal"], denoised=False))
    notes = " ".join(syn.privacy.notes)
    assert "public denoiser not applied" in notes and "capped" not in notes
    assert [c["name"] for c in syn.privacy.charges] == ["pyramid_8", "pyramid_32", "pyramid_128"]
    with pytest.raises(AssertionError, match="the denoiser ran"):
        get_mechanism("snh", denoiser=str(path), denoiser_max_signal=2.0 * signal, **TINY).fit(
            data, 0.3, NoiseSource.seeded(1))
    for bad in (0.0, -5.0, "big", True, float("nan")):
        with pytest.raises(MechanismError, match="denoiser_max_signal"):
            get_mechanism("snh", denoiser_max_signal=bad).check_params()


def test_snh_applies_the_denoiser_at_a_finer_grid_when_asked(trained, tmp_path):
    """denoiser_grid=256: levels 16/64/256 take all of ε, the synopsis is a non-negative 256² grid (78 m
    cells on a 20 km region), and a saved one loads with the same answers."""
    from dpcore.synopsis.base import load_synopsis

    _, path, _, _ = trained
    syn = get_mechanism("snh", denoiser=str(path), denoiser_grid=256, **TINY).fit(
        _fit_input("boston"), 0.3, NoiseSource.seeded(1))
    assert [c["name"] for c in syn.privacy.charges] == ["pyramid_16", "pyramid_64", "pyramid_256"]
    assert sum(c["epsilon"] for c in syn.privacy.charges) == pytest.approx(0.3, rel=1e-12)
    assert syn.config["grid_size"] == 256 and syn.noisy.shape == (256, 256)
    assert syn.config["cell_width_m"] == pytest.approx(syn.region.side_m / 256)
    assert (syn.noisy >= 0).all()
    assert any("fixed at 256" in n for n in syn.privacy.notes)
    syn.save(tmp_path / "fine")
    boxes = np.array([[-2000.0, -2000.0, -1950.0, -1940.0], [0.0, 0.0, 800.0, 600.0], [-9000.0, -9000.0, 9000.0, 9000.0]])
    np.testing.assert_array_equal(load_synopsis(tmp_path / "fine").answer(boxes), syn.answer(boxes))


def _band_copy(trained, path, low: float, high: float, record_only: bool = True, regions=None) -> None:
    """The trained model saved again as a specialist for signals in [low, high)."""
    model, _, report, _ = trained
    config = {**report["config"], "signal_range": [low, high], "record_only": record_only}
    save_denoiser(path, model, {"training_regions": regions or [region_record(city_region("tulsa"))],
                                "report": {**report, "config": config}})


def test_snh_hands_releases_in_a_specialists_band_to_it(trained, tmp_path, monkeypatch):
    """By default a release whose signal and unit fall in the band the shipped specialist was trained on is
    denoised by it instead of the general model: same ledger, the band in the config and the notes. Out
    of its band, at user level for a record-level specialist, on a city it was trained on, with
    denoiser_bands=False or with an explicit denoiser file, the general model runs."""
    import dataclasses

    import dpcore.mechanisms.snh.denoisers as denoisers
    import dpcore.models.pyramid_denoiser as pyramid_denoiser
    from dpcore.models.pyramid_denoiser import trained_band

    _, general_path, _, _ = trained
    band_path = tmp_path / "band.npz"
    monkeypatch.setattr(denoisers, "DEFAULT_DENOISER_PATH", general_path)
    monkeypatch.setattr(denoisers, "BAND_DENOISER_PATH", band_path)
    ran = []
    real_denoise = pyramid_denoiser.denoise
    monkeypatch.setattr(pyramid_denoiser, "denoise", lambda model, *a: ran.append(model) or real_denoise(model, *a))
    data = _fit_input("boston")
    signal = data.n * 0.3  # record level: s = 1, and the pyramid's total is close to n

    def fit(params=None, fit_data=data):
        ran.clear()
        syn = get_mechanism("snh", **TINY, **(params or {})).fit(fit_data, 0.3, NoiseSource.seeded(4))
        assert len(ran) == 1
        band = band_path.exists() and ran[0] is denoisers._load_denoiser(str(band_path), band_path.stat().st_mtime_ns)[0]
        return syn, "band" if band else "general"

    without, which = fit()  # no specialist installed
    assert which == "general" and without.config["denoiser_band"] is None
    _band_copy(trained, band_path, 0.5 * signal, 2.0 * signal)
    assert trained_band(load_denoiser(band_path)[1]) == (0.5 * signal, 2.0 * signal, True)
    assert trained_band(load_denoiser(general_path)[1]) is None
    banded, which = fit()
    assert which == "band" and banded.config["denoiser_band"] == [0.5 * signal, 2.0 * signal]
    assert "specialist denoiser" in " ".join(banded.privacy.notes)
    assert banded.privacy.charges == without.privacy.charges  # chosen from the signal: post-processing
    assert fit({"denoiser_bands": False})[1] == "general"
    assert fit({"denoiser": str(general_path)})[1] == "general"
    user_level = dataclasses.replace(data, unit=PrivacyUnit.user(1))
    assert fit(fit_data=user_level)[1] == "general"
    _band_copy(trained, band_path, 0.5 * signal, 2.0 * signal, record_only=False)
    assert fit(fit_data=user_level)[1] == "band"
    _band_copy(trained, band_path, 2.0 * signal, 4.0 * signal)
    assert fit()[1] == "general"
    _band_copy(trained, band_path, 0.5 * signal, 2.0 * signal, regions=[region_record(city_region("boston"))])
    assert fit()[1] == "general"
    with pytest.raises(MechanismError, match="denoiser_bands"):
        get_mechanism("snh", denoiser_bands="yes").check_params()


@pytest.mark.parametrize("params, message", [
    ({"denoiser_grid": 512}, "denoiser_grid"),
    ({"denoiser_grid": 256, "denoiser": "none"}, "needs the pyramid and a denoiser"),
    ({"denoiser_grid": 256, "cell_width_m": 100.0}, "needs the pyramid and a denoiser"),
])
def test_snh_checks_the_denoiser_grid(params, message):
    with pytest.raises(MechanismError, match=message):
        get_mechanism("snh", **params).check_params()


def test_snh_refuses_a_denoiser_trained_on_the_city(trained):
    _, path, _, _ = trained
    noise = NoiseSource.seeded(2)
    state = noise.rng.bit_generator.state
    with pytest.raises(MechanismError, match="never denoised by a model trained on it"):
        get_mechanism("snh", denoiser=str(path), **TINY).fit(_fit_input("tulsa"), 0.3, noise)
    assert noise.rng.bit_generator.state == state  # refused before any noise was drawn


@pytest.mark.parametrize("params, message", [
    ({"denoiser": "/nonexistent/den.npz"}, "does not exist"),
    ({"denoiser": 3}, "denoiser"),
])
def test_snh_checks_the_denoiser_parameter(params, message):
    with pytest.raises(MechanismError, match=message):
        get_mechanism("snh", **params).check_params()


def test_snh_refuses_a_denoiser_with_a_fixed_cell_width(trained):
    _, path, _, _ = trained
    with pytest.raises(MechanismError, match="do not combine"):
        get_mechanism("snh", denoiser=str(path), cell_width_m=200.0).check_params()


def test_answer_rules_combine_nets_and_denoised_grid(trained, tmp_path):
    """"grid" answers by prefix sums of the denoised grid, "geometric" is √(nets · grid), "auto" picks the
    blend nets^a · grid^(1−a) with a denoiser, a by query side from the release's signal n̂·ε/s; the rule
    and its weights survive save/load; queries above u always use the grid."""
    from dpcore.mechanisms.snh import BLEND_SMALL_SIDE_M, blend_nets_weights
    from dpcore.synopsis.base import load_synopsis

    _, path, _, _ = trained
    syn = get_mechanism("snh", denoiser=str(path), **TINY).fit(_fit_input("boston"), 0.5, NoiseSource.seeded(4))
    assert syn.config["answer"] == "blend"
    # The signal is post-processing: the pyramid's estimated total (before the denoised grid's cap) × the
    # pyramid's ε / the sensitivity (1).
    assert syn.config["signal"] == pytest.approx(syn.config["estimated_total"] * 0.5)
    assert syn.noisy.sum() <= syn.config["estimated_total"] * (1 + 1e-9)
    small_w, large_w = blend_nets_weights(syn.config["signal"])
    assert syn.config["nets_weights"] == [small_w, large_w]
    # This small release's large squares get a = ½ (signal < 1000); the check below needs two weights.
    syn.config["nets_weights"] = [small_w, large_w] = [0.5, 0.25]
    region = syn.region
    rng = np.random.default_rng(5)
    side = rng.uniform(30, 900, 300)
    c = rng.uniform(-region.half_m / 2, region.half_m / 2, (2, 300))
    boxes = np.stack([c[0] - side / 2, c[1] - side / 2, c[0] + side / 2, c[1] + side / 2], 1)
    grid = answer_boxes(syn._prefix, region.bounds_m, boxes)
    blend = syn.answer(boxes)
    syn.config["answer"] = "nets"
    nets = syn.answer(boxes)
    syn.config["answer"] = "grid"
    np.testing.assert_allclose(syn.answer(boxes), grid, rtol=1e-12)
    a = np.where(side < BLEND_SMALL_SIDE_M, small_w, large_w)
    np.testing.assert_allclose(blend, np.maximum(nets, 0) ** a * np.maximum(grid, 0) ** (1 - a), rtol=1e-6)
    syn.config["answer"] = "geometric"
    syn.config["nets_weights"] = [0.5, 0.5]
    np.testing.assert_allclose(syn.answer(boxes), np.sqrt(np.maximum(nets, 0) * np.maximum(grid, 0)), rtol=1e-6)
    assert not np.allclose(nets, grid)  # the rules differ, so the checks above mean something
    big = np.array([[-3000.0, -3000.0, 3000.0, 3000.0]])  # side 6 km > u = 1 km
    np.testing.assert_allclose(syn.answer(big), answer_boxes(syn._prefix, region.bounds_m, big))
    syn.config["answer"] = "blend"
    syn.config["nets_weights"] = [small_w, large_w]
    syn.save(tmp_path / "rel")
    np.testing.assert_allclose(load_synopsis(tmp_path / "rel").answer(boxes), blend, rtol=1e-6)
    with pytest.raises(MechanismError, match="answer"):
        get_mechanism("snh", answer="median").check_params()


def test_blend_answers_large_squares_from_the_grid_alone_where_the_signal_is_large(trained):
    """Record level at large ε: n̂·ε/s is past the top threshold, so squares of 100 m and more get a = 0,
    the denoised grid (even where the nets say 0), and smaller ones keep the geometric mean."""
    from dpcore.mechanisms.snh import BLEND_LARGE_STEPS, BLEND_SMALL_SIDE_M, blend_nets_weights

    (top, top_weight), (mid, mid_weight) = BLEND_LARGE_STEPS
    assert blend_nets_weights(top) == (0.5, top_weight) == (0.5, 0.0)
    assert blend_nets_weights(top - 1) == blend_nets_weights(mid) == (0.5, mid_weight)
    assert blend_nets_weights(mid - 1) == (0.5, 0.5)
    _, path, _, _ = trained
    data = _fit_input("boston")
    region = data.region
    epsilon = 2 * top / data.x.size  # signal ≈ 2 × the top threshold
    syn = get_mechanism("snh", denoiser=str(path), **TINY).fit(data, epsilon, NoiseSource.seeded(6))
    assert syn.config["nets_weights"] == [0.5, 0.0]
    assert any("0 above" in n for n in syn.privacy.notes)
    rng = np.random.default_rng(7)
    side = rng.uniform(30, 900, 200)
    c = rng.uniform(-region.half_m / 2, region.half_m / 2, (2, 200))
    boxes = np.stack([c[0] - side / 2, c[1] - side / 2, c[0] + side / 2, c[1] + side / 2], 1)
    large = side >= BLEND_SMALL_SIDE_M
    grid = np.maximum(answer_boxes(syn._prefix, region.bounds_m, boxes), 0)
    np.testing.assert_allclose(syn.answer(boxes)[large], grid[large], rtol=1e-12)
    syn.config["answer"] = "geometric"
    syn.config["nets_weights"] = [0.5, 0.5]
    geometric = syn.answer(boxes)
    assert not np.allclose(geometric[large], grid[large])  # so a = 0 above is not the default
    syn.config["answer"] = "blend"
    syn.config["nets_weights"] = [0.5, 0.0]
    np.testing.assert_allclose(syn.answer(boxes)[~large], geometric[~large], rtol=1e-12)


def test_the_plain_pyramid_blends_only_from_its_own_signal_threshold():
    """Without the denoiser the nets answer alone below PLAIN_BLEND_MIN_SIGNAL and the blend's weights
    apply from it; a plain pyramid release says which; the paper's flat grid keeps the paper's nets."""
    from dpcore.mechanisms.snh import PLAIN_BLEND_MIN_SIGNAL, blend_nets_weights

    assert blend_nets_weights(PLAIN_BLEND_MIN_SIGNAL - 1, denoised=False) == (1.0, 1.0)
    assert blend_nets_weights(PLAIN_BLEND_MIN_SIGNAL - 1) != (1.0, 1.0)
    for signal in (PLAIN_BLEND_MIN_SIGNAL, 4 * PLAIN_BLEND_MIN_SIGNAL):
        assert blend_nets_weights(signal, denoised=False) == blend_nets_weights(signal)
    data = _fit_input("boston")
    for epsilon in (0.5 * PLAIN_BLEND_MIN_SIGNAL / data.n, 2.0 * PLAIN_BLEND_MIN_SIGNAL / data.n):
        syn = get_mechanism("snh", denoiser="none", cell_width_m=None, **TINY).fit(
            data, epsilon, NoiseSource.seeded(3))
        assert syn.config["answer"] == "blend" and syn.config["data_collection"] == "pyramid"
        assert syn.config["nets_weights"] == list(blend_nets_weights(syn.config["signal"], denoised=False))
    assert syn.config["signal"] >= PLAIN_BLEND_MIN_SIGNAL and syn.config["nets_weights"] != [1.0, 1.0]
    flat = get_mechanism("snh", cell_width_m=500.0, **TINY).fit(data, 1.0, NoiseSource.seeded(3))
    assert flat.config["data_collection"] == "grid" and flat.config["answer"] == "nets"


@pytest.mark.slow
def test_denoiser_train_flow_runs_on_a_real_server(prefect_harness, dask_cluster, tmp_path):
    """The `snh-denoiser-train` flow on Prefect + the session's Dask LocalCluster, two synthetic public cities and a
    few steps: it writes weights + metadata that load, list the training regions and keep excluded
    cities out. (The shipped model: 1,500 steps on 11 public datasets, ~20 min on 2 cores.)"""
    from flows.denoiser_flow import DenoiserParams, denoiser_datasets, run_denoiser_train

    params = DenoiserParams(shared_data=str(tmp_path / "none"), model_path=str(tmp_path / "den.npz"),
                            synthetic_seeds=[1, 2, 3], exclude_cities=["tulsa"], steps=3, dask_address=dask_cluster,
                            record_only=True, signal_range=[1000.0, 5000.0], channels=8)
    assert [s["city"] for s in denoiser_datasets(params)] == ["houston", "miami"]  # tulsa (seed 3) excluded
    meta = run_denoiser_train(params)
    assert [d["name"] for d in meta["training_datasets"]] == ["synthetic-houston-1", "synthetic-miami-2"]
    model, saved = load_denoiser(tmp_path / "den.npz")
    assert {r["name"] for r in saved["training_regions"]} == {"houston", "miami"}
    assert saved["report"]["steps"] == 3 and len(saved["report"]["loss_curve"]) == 1
    assert saved["report"]["config"]["record_only"] is True  # the model file says how it was trained
    assert list(saved["report"]["config"]["signal_range"]) == [1000.0, 5000.0]
    assert saved["channels"] == model.channels == 8
    assert usable_for(saved, city_region("tulsa"))[0] and not usable_for(saved, city_region("miami"))[0]


def test_training_can_be_held_to_record_level_and_a_band_of_signals(monkeypatch):
    """record_only draws only unbounded releases (sensitivity 1), and signal_range sets each release's
    ε so that its signal n·ε/s falls in the band; without them ε comes from epsilon_range and user-level
    releases are drawn too."""
    import dpcore.models.pyramid_denoiser as pdn

    dataset = synthetic_public("tulsa", 1)
    drawn: list[tuple[float, float, float]] = []

    def spy(counts, sensitivity, epsilon, rng):
        drawn.append((sensitivity, epsilon, float(counts[DENOISER_GRID].sum())))
        return simulate_release(counts, sensitivity, epsilon, rng)

    monkeypatch.setattr(pdn, "simulate_release", spy)
    banded = DenoiserTrainConfig(batch_size=40, queries_per_sample=8, record_only=True, signal_range=(3000.0, 40000.0))
    pdn._training_batch([dataset], banded, np.random.default_rng(0))
    assert {s for s, _, _ in drawn} == {1.0}
    signals = np.array([n * eps / s for s, eps, n in drawn])
    assert signals.min() >= 3000.0 * (1 - 1e-9) and signals.max() <= 40000.0 * (1 + 1e-9)
    assert signals.max() / signals.min() > 3  # spread over the band, not one value
    drawn.clear()
    pdn._training_batch([dataset], DenoiserTrainConfig(batch_size=40, queries_per_sample=8), np.random.default_rng(0))
    assert {s for s, _, _ in drawn} == {1.0, 5.0}
    assert all(0.02 <= eps <= 3.0 for _, eps, _ in drawn)
    with pytest.raises(ValueError, match="signal_range"):
        train_denoiser([dataset], DenoiserTrainConfig(steps=1, signal_range=(5000.0, 100.0)))


def test_train_denoiser_cli_refuses_bad_input(tmp_path):
    from flows.cli import main

    assert main(["paramselect", "train-denoiser", "--shared-data", str(tmp_path / "missing")]) == 2
    assert main(["paramselect", "train-denoiser", "--steps", "0"]) == 2
    assert main(["paramselect", "train-denoiser", "--channels", "0"]) == 2
    for bad in ("40000:3000", "0:100", "3000", "a:b"):
        assert main(["paramselect", "train-denoiser", "--signal-range", bad]) == 2


def test_the_turned_truth_tables_are_the_tables_of_the_turned_truth():
    """Training reads each sample's truth from one prefix table per dataset, turned (dpcore.models.
    pyramid_denoiser._turned_prefix): bit for bit the table of the turned counts, for all 8 turns."""
    import dpcore.models.pyramid_denoiser as pdn

    counts = np.random.default_rng(0).poisson(3.0, (48, 40)).astype(np.float64)
    counts[5, 7] = 1e9
    for t in range(8):
        np.testing.assert_array_equal(pdn._turned_prefix(prefix_sums(counts), t),
                                      prefix_sums(pdn._dihedral(counts, t)))
    ds = pdn.PublicDataset("d", city_region("boston"), 0, counts + 0.5)  # not whole counts: computed each time
    cache: dict = {}
    np.testing.assert_array_equal(pdn._truth_prefix(ds, 5, cache), prefix_sums(pdn._dihedral(ds.truth, 5)))
    assert cache == {id(ds): None}
