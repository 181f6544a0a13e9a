"""Spatial Neural Histograms: augmentation, training, answering, save/load, privacy accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpcore.geo import Region
from dpcore.grid.histogram import grid_counts
from dpcore.grid.pyramid import PyramidError
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.mechanisms.base import MechanismError
from dpcore.mechanisms.snh import (
    SNHSynopsis,
    augment,
    cap_to_levels,
    known_total,
    normalise_xy,
    pyramid_estimate,
    pyramid_size,
    pyramid_upward,
    query_sides,
    train_snh,
    workload_overlaps,
)
from dpcore.models.snh_net import BatchedSineSwishMLP, pick_device, predict_grouped
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import load_synopsis

# Small, fast configuration for tests (the defaults are sized for 20 × 20 km releases).
TINY = dict(n_sizes=3, hidden=16, depth=2, max_epochs=6, samples_per_epoch=2048, batch_size=512, device="cpu")


def small_region(side_km: float = 2.0) -> Region:
    return Region("test", 40.0, -74.0, side_km)


def brute_force_label(noisy: np.ndarray, bounds, box) -> float:
    """Sum over cells of value × (overlap area / cell area), one cell at a time."""
    xmin, ymin, xmax, ymax = bounds
    nx, ny = noisy.shape
    cw, ch = (xmax - xmin) / nx, (ymax - ymin) / ny
    total = 0.0
    for i in range(nx):
        for j in range(ny):
            ox = max(0.0, min(box[2], xmin + (i + 1) * cw) - max(box[0], xmin + i * cw))
            oy = max(0.0, min(box[3], ymin + (j + 1) * ch) - max(box[1], ymin + j * ch))
            total += noisy[i, j] * ox * oy / (cw * ch)
    return total


@pytest.mark.parametrize("side_m", [130.0, 200.0, 370.0])
def test_augmentation_labels_equal_brute_force(side_m):
    region = small_region(1.0)  # 10 × 10 grid of 100 m cells
    rng = np.random.default_rng(3)
    noisy = rng.integers(-5, 30, size=(10, 10)).astype(np.float64)
    centres, labels = augment(noisy, region, side_m)
    xmin, ymin, xmax, ymax = region.bounds_m
    # Every square's bottom-left corner is a cell corner and the square stays inside the region.
    x0 = centres[:, 0] - side_m / 2
    y0 = centres[:, 1] - side_m / 2
    assert np.allclose(np.mod(x0 - xmin + 1e-6, 100.0), 1e-6, atol=1e-4)
    assert (x0 + side_m <= xmax + 1e-6).all() and (y0 + side_m <= ymax + 1e-6).all()
    expected_positions = (int((1000 - side_m) // 100) + 1) ** 2
    assert labels.shape == (expected_positions,)
    for k in range(labels.size):
        box = (x0[k], y0[k], x0[k] + side_m, y0[k] + side_m)
        assert labels[k] == pytest.approx(brute_force_label(noisy, region.bounds_m, box), rel=1e-9, abs=1e-9)


def test_query_sides_follow_the_paper_spacing():
    r = query_sides(25.0, 105.0, 4)
    assert np.allclose(r, [35.0, 55.0, 75.0, 95.0])
    with pytest.raises(MechanismError):
        query_sides(100.0, 10.0, 4)


def test_batched_model_matches_per_model_evaluation():
    gen = torch.Generator().manual_seed(0)
    net = BatchedSineSwishMLP(3, 2, 8, 2, 5.0, generator=gen)
    x = torch.rand(3, 7, 2, generator=gen) * 2 - 1
    batched = net(x)
    for i in range(3):
        assert torch.allclose(batched[i], net.forward_one(i, x[i]), atol=1e-6)
    which = np.array([0, 2, 1, 2, 0, 1, 1])
    flat = x[which, np.arange(7)].numpy()
    got = predict_grouped(net, flat, which, torch.device("cpu"))
    want = batched[which, np.arange(7)].detach().numpy()
    assert np.allclose(got, want, atol=1e-6)


def test_pick_device_prefers_cuda_only_when_present():
    assert pick_device("cpu").type == "cpu"
    assert pick_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")


def _structured_points(region: Region, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth known structure: two broad Gaussian bumps plus a uniform floor."""
    rng = np.random.default_rng(seed)
    h = region.half_m
    parts = [rng.normal([-0.3 * h, -0.2 * h], 0.35 * h, size=(n // 2, 2)),
             rng.normal([0.4 * h, 0.35 * h], 0.25 * h, size=(n // 4, 2)),
             rng.uniform(-h, h, size=(n - n // 2 - n // 4, 2))]
    xy = np.concatenate(parts)
    xy = xy[(np.abs(xy) < h).all(axis=1)]
    return xy[:, 0], xy[:, 1]


def test_trained_model_beats_noisy_grid_on_structured_data():
    """Over four noise draws, the nets' answers beat the noisy grid they were trained on by ≥ 10%
    (one draw alone can go either way by a few percent)."""
    region = small_region(2.0)
    x, y = _structured_points(region, 40_000, seed=1)
    data = FitInput(x, y, region, "record", None)
    eps = 0.05  # noise scale 20 per 50 m cell: the grid is noise-dominated, the nets can smooth it out
    params = dict(cell_width_m=50.0, query_sides_m=(150.0, 450.0), n_sizes=3, hidden=32, depth=2, omega0=8.0,
                  max_epochs=25, samples_per_epoch=4096, batch_size=512, device="cpu", data_collection="grid")
    rng = np.random.default_rng(11)
    side = rng.uniform(150, 450, 1500)
    c = rng.uniform(-region.half_m + 250, region.half_m - 250, size=(1500, 2))
    boxes = np.stack([c[:, 0] - side / 2, c[:, 1] - side / 2, c[:, 0] + side / 2, c[:, 1] + side / 2], axis=1)
    inside = (x[None, :] >= boxes[:, :1]) & (x[None, :] < boxes[:, 2:3]) & (y[None, :] >= boxes[:, 1:2]) \
        & (y[None, :] < boxes[:, 3:4])
    truth = inside.sum(axis=1)
    err_snh = err_grid = 0.0
    for seed in range(1, 5):
        snh = get_mechanism("snh", **params).fit(data, eps, NoiseSource.seeded(seed))
        grid = get_mechanism("identity", cell_width_m=50.0).fit(data, eps, NoiseSource.seeded(seed))
        assert np.array_equal(grid.values, snh.noisy)  # same seed → same noisy grid: a fair comparison
        err_snh += np.abs(snh.answer(boxes) - truth).mean()
        err_grid += np.abs(grid.answer(boxes) - truth).mean()
    assert err_snh < 0.9 * err_grid, (err_snh, err_grid)


def test_save_load_round_trip_gives_identical_answers(tmp_path):
    region = small_region(2.0)
    x, y = _structured_points(region, 5000, seed=2)
    syn = get_mechanism("snh", cell_width_m=100.0, query_sides_m=(50.0, 400.0), **TINY).fit(
        FitInput(x, y, region, "record", None), 0.5, NoiseSource.seeded(1))
    rng = np.random.default_rng(0)
    c = rng.uniform(-900, 900, size=(300, 2))
    side = rng.uniform(20, 900, 300)  # spans nets and the large-query grid fallback
    boxes = np.stack([c[:, 0] - side / 2, c[:, 1] - side / 2, c[:, 0] + side / 2, c[:, 1] + side / 2], axis=1)
    files = syn.save(tmp_path / "rel")
    assert "snh_weights.npz" in files and "synopsis.json" in files
    loaded = load_synopsis(tmp_path / "rel")
    assert isinstance(loaded, SNHSynopsis)
    assert np.array_equal(loaded.answer(boxes), syn.answer(boxes))
    assert np.array_equal(loaded.density(16), syn.density(16))
    assert loaded.privacy.to_dict() == syn.privacy.to_dict()


def test_large_queries_use_grid_and_scaling_uses_nearest_side():
    region = small_region(2.0)
    x, y = _structured_points(region, 5000, seed=4)
    syn = get_mechanism("snh", cell_width_m=100.0, query_sides_m=(100.0, 300.0), **TINY).fit(
        FitInput(x, y, region, "record", None), 1.0, NoiseSource.seeded(2))
    big = np.array([[-800.0, -800.0, 0.0, 0.0]])
    grid_answer = get_mechanism("identity", cell_width_m=100.0).fit(
        FitInput(x, y, region, "record", None), 1.0, NoiseSource.seeded(2)).answer(big)
    assert syn.answer(big) == pytest.approx(grid_answer)
    # A query of side r_i/2 at the same centre as one of side r_i gets exactly a quarter of its answer.
    r0 = syn.sides[0]
    q_full = np.array([[-r0 / 2, -r0 / 2, r0 / 2, r0 / 2]])
    q_half = q_full / 2
    assert syn.answer(q_half)[0] == pytest.approx(syn.answer(q_full)[0] / 4, rel=1e-6)


def test_user_level_charges_sensitivity_k_and_spends_exactly_epsilon():
    region = small_region(2.0)
    x, y = _structured_points(region, 3000, seed=5)
    data = FitInput(x, y, region, "user", 7, user=np.arange(x.size) % 500)
    syn = get_mechanism("snh", cell_width_m=200.0, **TINY).fit(data, 0.3, NoiseSource.seeded(0))
    charges = syn.privacy.charges
    assert [c["sensitivity"] for c in charges] == [7.0]
    assert sum(c["epsilon"] for c in charges) == pytest.approx(0.3)
    assert syn.privacy.sensitivity == 7.0


def test_noisy_grid_is_the_only_data_dependent_input_of_training():
    """Two datasets with the same grid counts give identical synopses under the same seed."""
    region = small_region(1.0)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-500, 500, (2, 2000))
    # Move every point within its own 100 m cell: counts unchanged, raw coordinates changed.
    cell = 100.0
    x2 = np.floor((x + 500) / cell) * cell - 500 + rng.uniform(0, cell, x.size)
    y2 = np.floor((y + 500) / cell) * cell - 500 + rng.uniform(0, cell, y.size)
    assert np.array_equal(grid_counts(x, y, region.bounds_m, 10), grid_counts(x2, y2, region.bounds_m, 10))
    mech = get_mechanism("snh", cell_width_m=cell, query_sides_m=(50.0, 300.0), data_collection="grid", **TINY)
    a = mech.fit(FitInput(x, y, region, "record", None), 1.0, NoiseSource.seeded(3))
    b = mech.fit(FitInput(x2, y2, region, "record", None), 1.0, NoiseSource.seeded(3))
    boxes = np.array([[-100.0, -100.0, 50.0, 60.0], [0.0, 0.0, 250.0, 250.0]])
    assert np.array_equal(a.answer(boxes), b.answer(boxes))


def test_bad_cell_width_is_a_clear_error():
    region = small_region(1.0)
    with pytest.raises(MechanismError):
        get_mechanism("snh", cell_width_m=-5.0, **TINY).fit(
            FitInput(np.zeros(3), np.zeros(3), region, "record", None), 1.0, NoiseSource.seeded(0))


# -- public workload weights ---------------------------------------------------------------------
@pytest.mark.parametrize("side_m", [130.0, 400.0])
def test_workload_overlaps_equal_brute_force_counts(side_m):
    region = small_region(1.0)
    noisy = np.zeros((10, 10))
    rng = np.random.default_rng(4)
    lo = rng.uniform(-600, 500, (40, 2))
    boxes = np.concatenate([lo, lo + rng.uniform(0, 300, (40, 2))], axis=1)
    boxes[0] = [-500.0, -500.0, -500.0 + 100.0, -400.0]  # shares only an edge with some squares
    w = workload_overlaps(noisy.shape, region, side_m, boxes)
    centres, _ = augment(noisy, region, side_m)
    sq = np.concatenate([centres - side_m / 2, centres + side_m / 2], axis=1)
    brute = [sum(1 for b in boxes if b[0] < s[2] and b[2] > s[0] and b[1] < s[3] and b[3] > s[1]) for s in sq]
    assert w.tolist() == brute and max(brute) > 0


def _fit_error_in(net, scales, region, noisy, sides, area_box):
    """Weighted-free MSE of each net against its labels on the squares inside area_box."""
    errs = []
    for i, r in enumerate(sides):
        centres, labels = augment(noisy, region, float(r))
        inside = (centres[:, 0] > area_box[0]) & (centres[:, 0] < area_box[2]) & \
                 (centres[:, 1] > area_box[1]) & (centres[:, 1] < area_box[3])
        pred = predict_grouped(net, normalise_xy(centres[inside], region).astype(np.float32),
                               np.full(int(inside.sum()), i), torch.device("cpu")) * scales[i]
        errs.append(np.mean((pred - labels[inside]) ** 2))
    return float(np.mean(errs))


def test_concentrated_public_workload_weights_its_area_and_training_fits_it_better():
    region = small_region(2.0)
    x, y = _structured_points(region, 20_000, seed=6)
    noisy = NoiseSource.seeded(0).add_discrete_laplace(grid_counts(x, y, region.bounds_m, 20), 1, 0.5).astype(float)
    rng = np.random.default_rng(1)
    west = np.concatenate([rng.uniform([-1000, -1000], [-500, 900], (200, 2))] * 2, axis=1)
    west[:, 2:] += 100.0
    east = west.copy()
    east[:, [0, 2]] += 1400.0  # the same boxes moved to the east side
    sides = query_sides(100.0, 300.0, 2)
    w_west = workload_overlaps(noisy.shape, region, float(sides[0]), west)
    centres, _ = augment(noisy, region, float(sides[0]))
    assert w_west[centres[:, 0] < -500].mean() > 10 * max(w_west[centres[:, 0] > 500].mean(), 1e-9)
    psi = 1e-3 * noisy.sum()
    kw = dict(hidden=32, depth=2, omega0=6.0, max_epochs=15, samples_per_epoch=4096, batch_size=512,
              device=torch.device("cpu"))
    area = (-1000.0, -1000.0, -450.0, 1000.0)
    errs = {}
    for name, wl in (("west", west), ("east", east)):
        net, scales, info = train_snh(noisy, region, sides, psi, generator=torch.Generator().manual_seed(0),
                                      workload=wl, **kw)
        assert info["weighted_by_workload"] and min(info["zero_weight_samples"]) > 0
        errs[name] = _fit_error_in(net, scales, region, noisy, sides, area)
    # Trained with the workload in the west, the nets fit the western labels far better.
    assert errs["west"] < 0.5 * errs["east"], errs


def test_public_workload_file_sets_the_weights_of_a_release(tmp_path):
    region = small_region(2.0)
    x, y = _structured_points(region, 5000, seed=8)
    lat0, lon0, lat1, lon1 = region.bbox_latlon()
    csv = tmp_path / "workload.csv"
    csv.write_text("min_lat,min_lon,max_lat,max_lon\n"
                   f"{lat0},{lon0},{(lat0 + lat1) / 2},{(lon0 + lon1) / 2}\n")
    mech = get_mechanism("snh", cell_width_m=200.0, query_sides_m=(100.0, 300.0), public_workload=str(csv), **TINY)
    syn = mech.fit(FitInput(x, y, region, "record", None), 0.5, NoiseSource.seeded(0))
    tr = syn.config["training"]
    assert tr["weighted_by_workload"] and min(tr["zero_weight_samples"]) > 0  # the other quadrants weigh 0
    assert any("1 public workload queries" in n for n in syn.privacy.notes)
    assert [c["name"] for c in syn.privacy.charges] == ["cell_counts"]  # the workload costs no budget
    default = get_mechanism("snh", cell_width_m=200.0, query_sides_m=(100.0, 300.0), **TINY).fit(
        FitInput(x, y, region, "record", None), 0.5, NoiseSource.seeded(0))
    assert not default.config["training"]["weighted_by_workload"]
    assert default.config["training"]["zero_weight_samples"] == [0, 0, 0]
    boxes = np.array([[-500.0, -500.0, -300.0, -300.0]])
    assert not np.array_equal(syn.answer(boxes), default.answer(boxes))  # same noisy grid, other weights
    with pytest.raises(MechanismError):
        get_mechanism("snh", cell_width_m=200.0, public_workload_boxes=[[5e5, 5e5, 6e5, 6e5]], **TINY).fit(
            FitInput(x, y, region, "record", None), 0.5, NoiseSource.seeded(0))


# -- pyramid data collection ---------------------------------------------------------------------
def _levels_of(counts: np.ndarray, gs: tuple[int, ...]) -> dict[int, np.ndarray]:
    G = counts.shape[0]
    return {g: counts.reshape(g, G // g, g, G // g).sum(axis=(1, 3)).astype(float) for g in gs}


def test_pyramid_estimate_is_exact_without_noise_and_never_adds_mass():
    rng = np.random.default_rng(0)
    counts = rng.poisson(rng.gamma(0.3, 20, (64, 64)))
    exact = pyramid_estimate(_levels_of(counts, (4, 16, 64)), {4: 1e-12, 16: 1e-12, 64: 1e-12})
    assert np.allclose(exact, counts, atol=1e-6)
    noisy = {g: v + rng.laplace(0, 5, v.shape) for g, v in _levels_of(counts, (4, 16, 64)).items()}
    est = pyramid_estimate(noisy, {g: 50.0 for g in noisy})
    assert (est >= 0).all()
    # The total is the inverse-variance combination of the levels' totals: within noise of the truth.
    assert abs(est.sum() - counts.sum()) < 5 * np.sqrt(50.0 * 16)
    with pytest.raises(PyramidError, match="powers of two"):
        pyramid_estimate({3: np.zeros((3, 3)), 12: np.zeros((12, 12))}, {3: 1.0, 12: 1.0})


def test_an_independent_total_joins_the_pyramid_root_by_inverse_variance():
    """A paid n̂ (or a public count) is one more measurement of the root: variance 0 sets the total, a
    finite variance combines with the levels' own root by inverse variance; shape comes from the levels."""
    rng = np.random.default_rng(3)
    counts = rng.poisson(rng.gamma(0.3, 20, (64, 64)))
    var = {4: 400.0, 16: 200.0, 64: 200.0}
    noisy = {g: v + rng.laplace(0, np.sqrt(var[g] / 2), v.shape) for g, v in _levels_of(counts, (4, 16, 64)).items()}
    z, v = pyramid_upward(noisy, var)
    root, root_var = float(z[1][0, 0]), float(v[1][0, 0])
    assert pyramid_estimate(noisy, var).sum() == pytest.approx(root)
    exact = pyramid_estimate(noisy, var, total=(float(counts.sum()), 0.0))
    assert exact.sum() == pytest.approx(counts.sum())
    measured = float(counts.sum()) + 500.0
    combined = pyramid_estimate(noisy, var, total=(measured, root_var / 3))  # 3× the root's weight
    assert combined.sum() == pytest.approx((root + 3 * measured) / 4)
    assert (combined >= 0).all()


def test_known_total_is_a_paid_sample_size_with_its_variance_or_a_record_level_public_count():
    region = small_region(2.0)
    x, y = np.zeros(10), np.zeros(10)
    user = FitInput(x, y, region, "user", 5, public_total=50.0, sample_size=9.0, sample_size_variance=4.0)
    assert known_total(user)[0] == (9.0, 4.0)
    # A user-level public total counts the unbounded data, not what was noised: it is not the root.
    assert known_total(FitInput(x, y, region, "user", 5, public_total=50.0))[0] is None
    assert known_total(FitInput(x, y, region, "record", None, public_total=10.0))[0] == (10.0, 0.0)
    # A paid size without its variance cannot be weighed: left out.
    assert known_total(FitInput(x, y, region, "record", None, sample_size=9.0))[0] is None


def test_cap_to_levels_drops_mass_the_coarse_counts_rule_out_and_leaves_the_rest():
    """A block holding more than its level's combined count + c·σ is scaled down to that cap (mass dropped,
    not moved); blocks under their caps are untouched."""
    rng = np.random.default_rng(4)
    counts = rng.poisson(rng.gamma(0.5, 10, (64, 64))).astype(float)
    var = {4: 4.0, 16: 4.0, 64: 4.0}
    noisy = {g: v + rng.laplace(0, np.sqrt(2.0), v.shape) for g, v in _levels_of(counts, (4, 16, 64)).items()}
    grid = counts.copy()
    grid[63, 0] += 5000.0  # a denoiser dumping mass into an empty corner cell
    capped, dropped = cap_to_levels(grid, noisy, var, 3.0)
    z, v = pyramid_upward(noisy, var)
    for g in (4, 16):
        b = 64 // g
        sums = capped.reshape(g, b, g, b).sum(axis=(1, 3))
        assert (sums <= np.maximum(z[g] + 3 * np.sqrt(v[g]), 0) + 1e-9).all()
    assert dropped == pytest.approx(1 - capped.sum() / grid.sum())
    assert capped[63, 0] < 0.05 * grid[63, 0]  # the dump is cut to its block's cap
    # Blocks of the 16×16 level away from the corner block hold what they held.
    untouched = np.ones((16, 16), dtype=bool)
    untouched[15, 0] = False
    mask = np.repeat(np.repeat(untouched, 4, 0), 4, 1)
    np.testing.assert_allclose(capped[mask], counts[mask], rtol=0.05)
    # Without the dump, an exact grid loses almost nothing at 3σ.
    assert cap_to_levels(counts, noisy, var, 3.0)[1] < 0.02


def test_pyramid_beats_a_flat_noisy_grid_on_sparse_hotspots():
    """Same total ε: the pyramid (ε split over 3 levels) must beat one flat grid of its finest cells."""
    rng = np.random.default_rng(1)
    counts = np.zeros((64, 64))
    hot = rng.integers(0, 64, (25, 2))
    counts[hot[:, 0], hot[:, 1]] = rng.integers(50, 400, 25)
    eps, noise = 0.5, NoiseSource.seeded(2)
    flat = counts + noise.add_discrete_laplace(np.zeros_like(counts, dtype=np.int64), 1, eps)
    shares = dict(zip((4, 16, 64), np.array([1.0, 2.0, 2.0]) / 5 * eps, strict=True))
    levels = {g: v + noise.add_discrete_laplace(np.zeros_like(v, dtype=np.int64), 1, e)
              for (g, v), e in zip(_levels_of(counts, (4, 16, 64)).items(), shares.values(), strict=True)}
    est = pyramid_estimate(levels, {g: 2.0 / e ** 2 for g, e in shares.items()})
    # 8 × 8-cell blocks (a mid-sized range query) and single cells.
    blocks = lambda a: a.reshape(8, 8, 8, 8).sum(axis=(1, 3))  # noqa: E731
    assert np.abs(est - counts).mean() < 0.5 * np.abs(flat - counts).mean()
    assert np.abs(blocks(est) - blocks(counts)).mean() < 0.5 * np.abs(blocks(flat) - blocks(counts)).mean()


def test_pyramid_collection_charges_every_level_and_spends_exactly_epsilon():
    region = small_region(2.0)
    x, y = _structured_points(region, 3000, seed=5)
    data = FitInput(x, y, region, "user", 7, user=np.arange(x.size) % 500)
    syn = get_mechanism("snh", cell_width_m=200.0, data_collection="pyramid", **TINY).fit(
        data, 0.3, NoiseSource.seeded(0))
    charges = syn.privacy.charges
    G = pyramid_size(region.side_m, 200.0)
    assert [c["name"] for c in charges] == [f"pyramid_{G // 16}", f"pyramid_{G // 4}", f"pyramid_{G}"]
    assert [c["sensitivity"] for c in charges] == [7.0] * 3
    assert sum(c["epsilon"] for c in charges) == pytest.approx(0.3)
    assert [c["epsilon"] for c in charges] == pytest.approx([0.06, 0.12, 0.12])
    assert syn.noisy.shape == (G, G) and (syn.noisy >= 0).all()
    assert syn.config["data_collection"] == "pyramid"


@pytest.mark.parametrize("loss, expected", [("l1", 0.0), ("mse", 1.0)])
def test_l1_loss_fits_the_median_and_mse_the_mean(loss, expected):
    """Labels that are 0 nine times in ten and 10 otherwise, at every location: the absolute loss's
    minimiser is their median (0), the squared loss's their mean (1)."""
    from dpcore.models.snh_net import TrainConfig, train_batched

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4000, 2)).astype(np.float32)
    y = np.where(rng.random(4000) < 0.1, 10.0, 0.0).astype(np.float32)
    gen = torch.Generator().manual_seed(0)
    net = BatchedSineSwishMLP(1, 2, 16, 2, omega0=1.0, generator=gen)
    cfg = TrainConfig(lr=3e-3, batch_size=500, max_epochs=30, patience=30, samples_per_epoch=4000, loss=loss)
    train_batched(net, [x], [y], [np.ones_like(y)], cfg, torch.device("cpu"), gen)
    pred = predict_grouped(net, x[:500], np.zeros(500, dtype=np.int64), torch.device("cpu"))
    assert abs(float(np.median(pred)) - expected) < 0.3


def test_unknown_loss_is_refused_before_any_budget_is_spent():
    region = small_region()
    x, y = _structured_points(region, 2000, 0)
    noise = NoiseSource.seeded(0)
    state = noise.rng.bit_generator.state
    with pytest.raises(MechanismError, match="loss"):
        get_mechanism("snh", cell_width_m=100.0, loss="huber").fit(
            FitInput(x, y, region, "record", None), 1.0, noise)
    assert noise.rng.bit_generator.state == state  # no noise was drawn
