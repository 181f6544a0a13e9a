"""VDR: γ against brute force, the denoiser on a moving hotspot, the mechanism end to end."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.geo import Region
from dpcore.grid.histogram import grid_counts_3d
from dpcore.mechanisms import get_mechanism
from dpcore.mechanisms.base import FitInput, MechanismError
from dpcore.mechanisms.vdr import gamma_factor
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance
from dpcore.synopsis.base import load_synopsis

torch = pytest.importorskip("torch")

REGION = Region("toy", 37.76, -122.43, 4.0)


def test_gamma_matches_brute_force_minimisation():
    rng = np.random.default_rng(0)
    m, n, total, k, eps = 12, 400, 2000.0, 20.0, 0.8
    mu = rng.dirichlet(np.full(m, 0.7))
    trials = 40000
    sample = rng.multinomial(n, mu, size=trials).astype(float)
    noisy = sample + rng.laplace(0.0, k / eps, size=sample.shape)  # test-only float noise
    target = total * mu
    grid = np.linspace(0.5, 8.0, 1501)
    # E Σ_c (γ·H̄_c − N·μ_c)² as a quadratic in γ, averaged over the simulated draws
    a = (noisy ** 2).sum(axis=1).mean()
    b = (noisy * target).sum(axis=1).mean()
    mse = grid ** 2 * a - 2 * grid * b + (target ** 2).sum()
    best = grid[np.argmin(mse)]
    c = float((mu ** 2).sum())
    assert gamma_factor(n, total, c, m, k, eps) == pytest.approx(best, rel=0.01)
    # and the formula is not trivially N/n here: the noise term shrinks it
    assert gamma_factor(n, total, c, m, k, eps) < 0.9 * total / n


def _moving_hotspot(m: int, t: int, n_per_slot: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    xs, ys, ss = [], [], []
    for s in range(t):
        cx = -1200 + 400 * s
        xs.append(rng.normal(cx, 250, n_per_slot))
        ys.append(rng.normal(300 - 150 * s, 250, n_per_slot))
        ss.append(np.full(n_per_slot, s))
    x, y, slot = (np.concatenate(v) for v in (xs, ys, ss))
    return grid_counts_3d(x, y, slot, REGION.bounds_m, m, m, t).astype(float)


def test_denoiser_learns_moving_hotspot():
    from dpcore.models.vqvae import DenoiserConfig, SliceDenoiser

    truth = _moving_hotspot(32, 6, 3000)
    scale = 20.0  # noise std ≈ 28 per cell against a peak of ≈ 120: structure is buried cell by cell
    noisy = NoiseSource.seeded(0).add_discrete_laplace(truth, 1, 1 / scale).astype(float)
    sd = float(np.sqrt(discrete_laplace_variance(scale)))
    mse_noisy = np.mean((noisy - truth) ** 2)
    config = DenoiserConfig(steps=80, batch_size=8, crop=32, hidden=16, residual_window=0)
    den = SliceDenoiser(config, "cpu")
    report = den.fit(noisy, sd)
    assert report.steps == 80 and report.codes_used > 1
    vq_only = np.maximum(den.denoise(noisy, sd), 0.0)
    assert vq_only.shape == truth.shape
    assert np.mean((vq_only - truth) ** 2) < 0.5 * mse_noisy  # the VQ-VAE alone removes most noise
    den.config.residual_window = 5  # add back the structure the bottleneck missed (same trained model)
    out = np.maximum(den.denoise(noisy, sd), 0.0)
    assert np.mean((out - truth) ** 2) < 0.15 * mse_noisy
    # the hotspot is tracked: the densest 3×3 area of every denoised slice is near the true one
    from scipy.ndimage import uniform_filter

    for s in range(truth.shape[2]):
        pt = np.unravel_index(np.argmax(uniform_filter(truth[:, :, s], 3)), truth.shape[:2])
        po = np.unravel_index(np.argmax(uniform_filter(out[:, :, s], 3)), truth.shape[:2])
        assert np.hypot(pt[0] - po[0], pt[1] - po[1]) <= 2


def test_denoiser_is_fully_convolutional():
    from dpcore.models.vqvae import VQVAE

    model = VQVAE(in_channels=3, hidden=8, code_dim=4, n_codes=8)
    for shape in [(30, 30), (17, 41), (64, 8)]:
        out = model(torch.zeros(2, 3, *shape))[0]
        assert out.shape == (2, 1, *shape)


def _fit_input(public_total=None):
    rng = np.random.default_rng(3)
    t = 6
    n = 6000
    slot = rng.integers(0, t, n)
    x = rng.normal(-1000 + 300 * slot, 300).clip(-1999, 1999)
    y = rng.normal(0, 400, n).clip(-1999, 1999)
    return FitInput(x, y, REGION, "user", 5, user=np.arange(n) % 600, slot=slot, n_slots=t, slot_seconds=86400,
                    window_start_s=1_210_000_000, public_total=public_total)


def test_vdr_end_to_end_budget_nonnegative_and_saved(tmp_path):
    data = _fit_input(public_total=12000.0)
    mech = get_mechanism("vdr", grid_size=32, steps=40, batch_size=4, crop=32, hidden=8, code_dim=4, n_codes=16)
    seen = []
    mech.progress = lambda done, total, msg: seen.append(done)
    syn = mech.fit(data, 1.0, NoiseSource.seeded(1))
    charges = syn.privacy.charges
    assert [c["name"] for c in charges] == ["cell_counts"]  # mass refinement to a public N needs no n̂
    assert sum(c["epsilon"] for c in charges) == pytest.approx(1.0)
    assert all(c["sensitivity"] == 5 for c in charges)
    assert syn.values.min() >= 0
    assert syn.values.sum() == pytest.approx(12000.0, rel=1e-6)  # mass refinement to the public total
    assert seen, "training progress was reported"
    syn.save(tmp_path)
    back = load_synopsis(tmp_path)
    np.testing.assert_allclose(back.values, syn.values, rtol=1e-5)
    assert any(k.startswith("vqvae.") for k in back.attachments)
    boxes = np.array([[-2000, -2000, 0, 2000]])
    assert back.answer_st(boxes, np.array([[0, 2]]))[0] == pytest.approx(syn.answer_st(boxes, np.array([[0, 2]]))[0],
                                                                         rel=1e-4)


def test_vdr_gamma_refinement_and_bad_params():
    data = _fit_input()
    syn = get_mechanism("vdr", grid_size=16, steps=10, batch_size=2, crop=16, hidden=8, code_dim=4, n_codes=8,
                        refinement="gamma").fit(data, 0.5, NoiseSource.seeded(2))
    g = syn.extra_meta()["gamma"]
    assert g is not None and 0 < g
    charges = syn.privacy.charges
    assert [c["name"] for c in charges] == ["sample_size", "cell_counts"]
    assert sum(c["epsilon"] for c in charges) == pytest.approx(0.5)
    with pytest.raises(MechanismError):
        get_mechanism("vdr", refinement="magic").fit(data, 1.0, NoiseSource.seeded(0))
    with pytest.raises(MechanismError, match="slot"):
        get_mechanism("vdr", grid_size=8).fit(FitInput(data.x, data.y, REGION, "user", 5), 1.0, NoiseSource.seeded(0))


def test_nonnegative_projection_keeps_tile_totals():
    from dpcore.models.st_statistics import nonnegative_keep_block_mass

    rng = np.random.default_rng(0)
    v = rng.normal(2.0, 3.0, (10, 12, 3))  # sizes not multiples of the tile: padded tiles
    out = nonnegative_keep_block_mass(v, 4)
    assert out.min() >= 0
    pad = np.pad(v, ((0, 2), (0, 0), (0, 0)))
    pad_out = np.pad(out, ((0, 2), (0, 0), (0, 0)))
    tiles = pad.reshape(3, 4, 3, 4, 3).sum(axis=(1, 3))
    tiles_out = pad_out.reshape(3, 4, 3, 4, 3).sum(axis=(1, 3))
    np.testing.assert_allclose(tiles_out, np.maximum(tiles, 0), atol=1e-9)
    assert np.maximum(v, 0).sum() > out.sum()  # plain clamping would have added mass


def test_multiscale_shrink_keeps_coarse_structure_and_flattens_noise():
    from dpcore.models.st_statistics import multiscale_shrink

    rng = np.random.default_rng(1)
    sigma = 40.0
    truth = np.full((32, 32, 6), 1.0)
    truth[:8, :8] += 20.0  # a heavy coarse block, invisible cell by cell (20 ≪ 40)
    noisy = truth + rng.normal(0.0, sigma, truth.shape)
    out = multiscale_shrink(noisy, sigma ** 2, kappa=2.0)
    assert out.min() >= 0
    assert out.sum() == pytest.approx(noisy.sum())  # no level adds or removes mass
    block = out[:8, :8].mean()
    rest = out[8:, 8:].mean()
    assert block > 4 * rest  # the heavy block is found and its mass pushed down to its cells
    # pure noise: a strict κ gives back the even spread (κ = 2 still lets some noise peaks through)
    pure = rng.normal(0.0, sigma, truth.shape) + 5.0
    flat = multiscale_shrink(pure, sigma ** 2, kappa=16.0)
    assert flat.max() < 1.5 * flat.mean()
    assert multiscale_shrink(pure, sigma ** 2, kappa=2.0).max() > flat.max()
    # non-power-of-two shapes and a negative total (floored)
    neg = rng.normal(0.0, sigma, (8, 8, 3))
    neg -= neg.mean() + 1.0
    assert multiscale_shrink(neg, sigma ** 2, total_floor=50.0).sum() == pytest.approx(50.0)
    odd = multiscale_shrink(rng.normal(1.0, sigma, (10, 7, 3)), sigma ** 2)
    assert odd.shape == (10, 7, 3) and odd.min() >= 0


def test_multiscale_consistency_removes_planted_large_scale_bias():
    from dpcore.grid.histogram import block_sum
    from dpcore.models.st_statistics import multiscale_consistency

    rng = np.random.default_rng(4)
    sigma = 2.0
    truth = rng.gamma(2.0, 3.0, (32, 32, 4))
    truth[:16] *= 3.0  # a heavy left half
    noisy = truth + rng.laplace(0.0, sigma / np.sqrt(2.0), truth.shape)  # test-only float noise
    # a denoiser-like estimate with the right total but 25% of the left half's mass moved to the right
    biased = truth.copy()
    moved = 0.25 * truth[:16].sum()
    biased[:16] *= 0.75
    biased[16:] += moved / biased[16:].size
    out = multiscale_consistency(biased, noisy, sigma ** 2, kappa=2.0)
    assert out.min() >= 0
    assert out.sum() == pytest.approx(biased.sum())  # mass-preserving: the estimate's total is kept
    halves_truth = block_sum(truth, 16).sum(axis=(1, 2))
    halves_out = block_sum(out, 16).sum(axis=(1, 2))
    halves_biased = block_sum(biased, 16).sum(axis=(1, 2))
    noise_sd = sigma * np.sqrt(16 * 32 * 4)  # noise of a half's noisy sum
    assert abs(halves_biased[0] - halves_truth[0]) > 50 * noise_sd  # the planted bias is large
    np.testing.assert_allclose(halves_out, halves_truth, atol=4 * noise_sd)  # and it is gone
    # with the universal threshold too: a large, strong bias is still far above 2·ln n noise levels
    univ = multiscale_consistency(biased, noisy, sigma ** 2, kappa=2.0, universal=True)
    np.testing.assert_allclose(block_sum(univ, 16).sum(axis=(1, 2)), halves_truth, atol=4 * noise_sd)
    # per-slot 8×8 block sums end closer to the truth than the biased estimate's
    err_out = np.abs(block_sum(out, 8) - block_sum(truth, 8)).mean()
    err_biased = np.abs(block_sum(biased, 8) - block_sum(truth, 8)).mean()
    assert err_out < 0.3 * err_biased
    # stopping at 8×8 blocks: their totals are corrected, inside them the estimate's shape is kept
    coarse = multiscale_consistency(biased, noisy, sigma ** 2, kappa=2.0, min_block=8)
    np.testing.assert_allclose(block_sum(coarse, 16).sum(axis=(1, 2)), halves_truth, atol=4 * noise_sd)
    ratio = coarse[:8, :8] / biased[:8, :8]
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[:1, :1], ratio.shape), rtol=1e-9)


def test_multiscale_consistency_keeps_estimate_where_noise_dominates():
    from dpcore.models.st_statistics import multiscale_consistency

    rng = np.random.default_rng(5)
    sigma = 30.0
    flat = np.full((32, 32, 6), 2.0)  # pure-noise region: nothing but an even spread to find
    noisy = flat + rng.laplace(0.0, sigma / np.sqrt(2.0), flat.shape)
    out = multiscale_consistency(flat, noisy, sigma ** 2, kappa=2.0)
    assert out.min() >= 0 and out.sum() == pytest.approx(flat.sum())
    # the noise is mostly not put back: the output stays near flat while H̄ is ±30 per cell (κ = 2
    # lets the odd noise node through, partly; a stricter κ lets fewer)
    assert np.abs(out - flat).mean() < 0.15 * np.abs(noisy - flat).mean()
    strict = multiscale_consistency(flat, noisy, sigma ** 2, kappa=8.0)
    assert np.abs(strict - flat).mean() < np.abs(out - flat).mean()
    # the universal threshold (2·ln of the nodes per level) lets almost no noise node through
    univ = multiscale_consistency(flat, noisy, sigma ** 2, kappa=2.0, universal=True)
    assert np.abs(univ - flat).mean() < 0.2 * np.abs(out - flat).mean()
    # a structured estimate at low SNR keeps its shape (the block sums' differences look like noise)
    shaped = np.zeros((32, 32, 6))
    shaped[4:12, 4:12] = 5.0
    noisy2 = shaped + rng.laplace(0.0, sigma / np.sqrt(2.0), shaped.shape)
    out2 = multiscale_consistency(shaped, noisy2, sigma ** 2, kappa=2.0)
    assert np.abs(out2 - shaped).mean() < 0.05 * np.abs(noisy2 - shaped).mean()
    assert out2[4:12, 4:12].sum() > 0.5 * shaped.sum()
    with pytest.raises(ValueError):
        multiscale_consistency(flat, noisy[:, :, :3], sigma ** 2)


def test_slot_totals_of_pure_noise_stay_flat_but_real_slot_structure_passes():
    """The root's T slot-total tests use a Bonferroni-level threshold (slot_kappa): with 21 slots of
    pure noise neither quadtree stage should put a whole-region spike into one slot (it did with
    2·ln T), while a slot pattern far above its noise still comes through."""
    from dpcore.models.st_statistics import multiscale_consistency, multiscale_shrink, slot_kappa

    nt, side, sigma = 21, 16, 50.0
    assert slot_kappa(4.0, nt) > 2.0 * np.log(nt) > 4.0
    rng = np.random.default_rng(11)
    flat = np.full((side, side, nt), 5.0)
    spiky_runs = 0
    for _ in range(40):
        noisy = flat + rng.normal(0.0, sigma, flat.shape)
        for out in (multiscale_shrink(noisy, sigma ** 2, kappa=2.0),
                    multiscale_consistency(flat, noisy, sigma ** 2, kappa=4.0, universal=True)):
            totals = out.sum(axis=(0, 1))
            spiky_runs += int(np.ptp(totals) > 1e-6 * totals.mean())
    # ≤ α = 5% per stage and run in expectation (80 stage runs): allow a few, not a quarter
    assert spiky_runs <= 8
    # a real weekly pattern, ±40 σ of a slot total, survives both stages
    slot_sd = sigma * side
    pattern = np.where(np.arange(nt) % 7 < 5, 1.0, -1.0) * 40 * slot_sd / side ** 2
    truth = flat * 200 + pattern[None, None, :]
    noisy = truth + rng.normal(0.0, sigma, truth.shape)
    for out in (multiscale_shrink(noisy, sigma ** 2, kappa=2.0),
                multiscale_consistency(np.full_like(truth, truth.mean()), noisy, sigma ** 2, kappa=4.0,
                                       universal=True)):
        totals = out.sum(axis=(0, 1))
        weekday, weekend = totals[np.arange(nt) % 7 < 5].mean(), totals[np.arange(nt) % 7 >= 5].mean()
        assert weekday - weekend > 0.8 * 2 * 40 * slot_sd
