"""Classic mechanisms (ug, ag, hb, privtree): sizes, budget splits, inference, and a statistical
privacy check that must catch a sensitivity of 1 under user-level privacy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from dpcore.geo import Region
from dpcore.mechanisms import FitInput, Mechanism, get_mechanism
from dpcore.mechanisms.ag import constrained_inference
from dpcore.mechanisms.hb import block_sum, hierarchy_consistency, level_budgets
from dpcore.mechanisms.privtree import privtree_parameters
from dpcore.mechanisms.ug import rasterise_rectangles
from dpcore.privacy.budget import Accountant, BudgetExceeded
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import GridSynopsis

REGION = Region("test", 40.7, -74.0, side_km=4.0)
CLASSIC = ["ug", "ag", "hb", "privtree"]


def skewed_points(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Half the points in a tight cluster, half uniform over the 4 km region."""
    rng = np.random.default_rng(seed)
    h = REGION.half_m
    x = np.concatenate([rng.normal(500, 80, n // 2), rng.uniform(-h, h, n - n // 2)])
    y = np.concatenate([rng.normal(-300, 80, n // 2), rng.uniform(-h, h, n - n // 2)])
    keep = (np.abs(x) < h) & (np.abs(y) < h)
    return x[keep], y[keep]


@pytest.fixture(scope="module")
def user_data() -> FitInput:
    x, y = skewed_points(20_000)
    return FitInput(x, y, REGION, "user", 5)


@pytest.mark.parametrize("name", CLASSIC)
def test_charges_add_up_and_use_sensitivity_k(name: str, user_data: FitInput) -> None:
    syn = get_mechanism(name).fit(user_data, 0.7, NoiseSource.seeded(3))
    charges = syn.privacy.charges
    assert math.isclose(sum(c["epsilon"] for c in charges), 0.7, rel_tol=1e-9)
    assert all(c["sensitivity"] == 5 for c in charges)
    assert isinstance(syn, GridSynopsis)
    # privtree needs no N; the others pay for it unless it is public.
    assert ("total_count" in {c["name"] for c in charges}) == (name != "privtree")


@pytest.mark.parametrize("name", ["ug", "ag", "hb"])
def test_public_total_is_free_and_recorded(name: str, user_data: FitInput) -> None:
    data = FitInput(user_data.x, user_data.y, REGION, "user", 5, public_total=float(user_data.n))
    syn = get_mechanism(name).fit(data, 0.7, NoiseSource.seeded(3))
    assert "total_count" not in {c["name"] for c in syn.privacy.charges}
    assert any("public_total" in note for note in syn.privacy.notes)


@pytest.mark.parametrize("name", CLASSIC)
def test_estimates_are_close_at_large_epsilon(name: str, user_data: FitInput) -> None:
    """With little noise, mid-size range counts must be close to the truth (a broken mechanism is not)."""
    syn = get_mechanism(name).fit(user_data, 50.0, NoiseSource.seeded(4))
    rng = np.random.default_rng(1)
    c = rng.uniform(-1500, 1500, (300, 2))
    s = rng.uniform(300, 1000, 300)
    boxes = np.c_[c - s[:, None] / 2, c + s[:, None] / 2]
    x, y = user_data.x, user_data.y
    truth = np.array([np.count_nonzero((x >= b[0]) & (x < b[2]) & (y >= b[1]) & (y < b[3])) for b in boxes])
    err = np.abs(syn.answer(boxes) - truth) / np.maximum(truth, 0.001 * user_data.n)
    assert np.median(err) < 0.1, np.median(err)
    assert abs(syn.values.sum() - user_data.n) < 0.05 * user_data.n


def test_ug_grid_follows_the_size_rule(user_data: FitInput) -> None:
    n = float(user_data.n)
    for unit, k in (("record", 1), ("user", 5)):
        data = FitInput(user_data.x, user_data.y, REGION, unit, k if unit == "user" else None, public_total=n)
        for eps in (0.1, 1.0):
            syn = get_mechanism("ug").fit(data, eps, NoiseSource.seeded(0))
            assert syn.shape[0] == math.ceil(math.sqrt(n * eps / (10 * k)))


def test_ag_level1_size_rule(user_data: FitInput) -> None:
    n = float(user_data.n)
    for eps in (0.05, 2.0):
        data = FitInput(user_data.x, user_data.y, REGION, "record", None, public_total=n)
        syn = get_mechanism("ag").fit(data, eps, NoiseSource.seeded(0))
        assert syn.extra_meta()["m1"] == max(10, math.ceil(math.sqrt(n * eps / 10) / 4))
    # Tiny N·ε/k: the floor of 10 drops to the UG size, never finer than UG.
    data = FitInput(user_data.x, user_data.y, REGION, "user", 5, public_total=n)
    syn = get_mechanism("ag").fit(data, 0.05, NoiseSource.seeded(0))
    assert syn.extra_meta()["m1"] == math.ceil(math.sqrt(n * 0.05 / (10 * 5))) < 10


def test_ag_fixed_level1_side_replaces_the_rule(user_data: FitInput) -> None:
    n = float(user_data.n)
    data = FitInput(user_data.x, user_data.y, REGION, "record", None, public_total=n)
    syn = get_mechanism("ag", m1=37).fit(data, 0.05, NoiseSource.seeded(0))
    assert syn.extra_meta()["m1"] == 37 != max(10, math.ceil(math.sqrt(n * 0.05 / 10) / 4))
    assert len(syn.extra_meta()["m2"]) == 37 * 37
    with pytest.raises(ValueError):
        get_mechanism("ag", m1=0).check_params()


def test_ag_adapts_level2_to_density(user_data: FitInput) -> None:
    syn = get_mechanism("ag").fit(user_data, 2.0, NoiseSource.seeded(0))
    meta = syn.extra_meta()
    assert meta["m2_max"] > 3 * meta["m2_min"]  # the dense cluster gets a finer sub-grid


def test_constrained_inference_matches_weighted_average() -> None:
    v = np.array([10.0, 50.0])
    n_children = np.array([4, 1])
    u = np.array([1.0, 2.0, 3.0, 0.0, 40.0])
    eps1, eps2 = 0.3, 0.7
    out = constrained_inference(v, u, n_children, eps1, eps2)
    # Cell 0: inverse-variance average of v=10 (var ∝ 1/ε1²) and Σu=6 (var ∝ 4/ε2²).
    expected0 = (10 / (1 / eps1**2) + 6 / (4 / eps2**2)) / (eps1**2 + eps2**2 / 4)
    assert out[:4].sum() == pytest.approx(expected0)
    assert np.allclose(np.diff(out[:4] - u[:4]), 0)  # the correction is spread equally
    expected1 = (50 * eps1**2 + 40 * eps2**2) / (eps1**2 + eps2**2)
    assert out[4] == pytest.approx(expected1)


def _tree_design(b: int, h: int) -> np.ndarray:
    """Design matrix mapping leaf counts to every node of every level (for an explicit OLS)."""
    leaf = b ** h
    rows = []
    for lvl in range(1, h + 1):
        side = b ** lvl
        f = leaf // side
        for i in range(side):
            for j in range(side):
                m = np.zeros((leaf, leaf))
                m[i * f:(i + 1) * f, j * f:(j + 1) * f] = 1
                rows.append(m.ravel())
    return np.array(rows)


@pytest.mark.parametrize("var_ratio", [1.0, 4.0])
def test_hierarchy_consistency_is_least_squares(var_ratio: float) -> None:
    b, h = 2, 3
    rng = np.random.default_rng(0)
    noisy = [rng.normal(20, 5, (b ** lvl, b ** lvl)) for lvl in range(1, h + 1)]
    variances = [1.0, var_ratio, var_ratio**2]
    got = hierarchy_consistency(noisy, variances, b)
    for parent, child in zip(got[:-1], got[1:], strict=True):
        assert np.allclose(parent, block_sum(child, b))
    # Weighted least squares over all nodes, solved explicitly.
    a = _tree_design(b, h)
    w = np.concatenate([np.full(n.size, 1 / v) for n, v in zip(noisy, variances, strict=True)])
    yv = np.concatenate([n.ravel() for n in noisy])
    sw = np.sqrt(w)
    sol = np.linalg.lstsq(a * sw[:, None], yv * sw, rcond=None)[0]
    assert np.allclose(got[-1].ravel(), sol, atol=1e-8)


def test_hb_consistency_reduces_error_of_large_queries(user_data: FitInput) -> None:
    """Large boxes summed from hb's consistent leaves beat the same leaves measured alone (same ε)."""
    data = FitInput(user_data.x, user_data.y, REGION, "record", None, public_total=float(user_data.n))
    boxes = np.array([[-2000, -2000, 0, 0], [0, 0, 2000, 2000], [-1000, -2000, 1000, 0]], dtype=float)
    truth = np.array([np.count_nonzero((data.x >= b[0]) & (data.x < b[2]) & (data.y >= b[1]) & (data.y < b[3]))
                      for b in boxes])
    hb_err, flat_err = [], []
    for seed in range(30):
        hb = get_mechanism("hb", levels=3).fit(data, 0.3, NoiseSource.seeded(seed))
        flat = get_mechanism("ug", grid_size=64).fit(data, 0.3 / 3, NoiseSource.seeded(seed))
        hb_err.append((hb.answer(boxes) - truth) ** 2)
        flat_err.append((flat.answer(boxes) - truth) ** 2)
    assert np.mean(hb_err) < 0.5 * np.mean(flat_err)


def test_hb_level_budgets_add_up(user_data: FitInput) -> None:
    assert level_budgets(0.9, 3, 4, "uniform") == pytest.approx([0.3, 0.3, 0.3])
    geo = level_budgets(0.9, 3, 4, "geometric")
    assert sum(geo) == pytest.approx(0.9)
    # 16 children per node: ratio 16^(1/6) between levels; a quadtree (b = 2) gets Cormode's 2^(1/3).
    assert geo[2] / geo[1] == pytest.approx(16 ** (1 / 6)) and geo[1] / geo[0] == pytest.approx(16 ** (1 / 6))
    quad = level_budgets(1.0, 4, 2, "geometric")
    assert quad[3] / quad[2] == pytest.approx(2 ** (1 / 3))
    syn = get_mechanism("hb", level_split="geometric", levels=3).fit(user_data, 0.9, NoiseSource.seeded(0))
    eps = [c["epsilon"] for c in syn.privacy.charges]
    assert eps == pytest.approx(geo)


def test_privtree_parameters_and_user_scaling() -> None:
    lam, delta = privtree_parameters(0.5, 1)
    assert lam == pytest.approx(7 / (3 * 0.5))
    assert delta == pytest.approx(lam * math.log(4))
    lam_k, delta_k = privtree_parameters(0.5, 5)
    assert lam_k == pytest.approx(5 * lam) and delta_k == pytest.approx(5 * delta)


def test_privtree_refines_dense_areas_only(user_data: FitInput) -> None:
    syn = get_mechanism("privtree").fit(user_data, 5.0, NoiseSource.seeded(2))
    meta = syn.extra_meta()
    assert meta["max_depth"] == round(math.log2(4000 / 10))
    v = syn.values
    # Leaves are uniform blocks: the raster's number of distinct values per 16×16 block is 1 where
    # the tree stopped early (sparse uniform part) and larger in the cluster.
    n = v.shape[0]
    cx, cy = int((500 + 2000) / 4000 * n), int((-300 + 2000) / 4000 * n)
    cluster = v[cx - 8:cx + 8, cy - 8:cy + 8]
    corner = v[:16, -16:]
    assert np.unique(cluster).size > 8 * np.unique(corner).size


def test_privtree_empty_data_stays_shallow() -> None:
    data = FitInput(np.array([]), np.array([]), REGION, "user", 5)
    syn = get_mechanism("privtree").fit(data, 1.0, NoiseSource.seeded(0))
    # With no data each node splits with probability P[Lap(λ) > δ] = 1/(2β) = 1/8 → few leaves.
    assert syn.extra_meta()["n_leaves"] < 200


def test_rasterise_rectangles_preserves_mass_and_place() -> None:
    x0 = np.array([-2000.0, 100.0])
    y0 = np.array([-2000.0, 100.0])
    x1 = np.array([2000.0, 137.0])
    y1 = np.array([2000.0, 151.0])
    r = rasterise_rectangles(x0, y0, x1, y1, np.array([40.0, 7.0]), REGION, 64)
    assert r.sum() == pytest.approx(47.0)
    cell = 4000 / 64
    # The small rectangle lies in cells [33, 34] (x) × [33, 34] (y) only; the big one is uniform.
    small = r - 40.0 / 64**2
    assert small.sum() == pytest.approx(7.0)
    nz = np.argwhere(np.abs(small) > 1e-9)
    assert nz.min() >= int((100 + 2000) // cell) and nz.max() <= int((151 + 2000) // cell)


# -- budget refusal -------------------------------------------------------------------------------

class _Overspender(Mechanism):
    """A deliberately wrong mechanism whose parts add up to 1.2·ε."""

    name = "overspender"

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitInput, acct: Accountant, noise: NoiseSource) -> GridSynopsis:
        acct.spend_fraction("a", 0.6, data.sensitivity)
        acct.spend_fraction("b", 0.6, data.sensitivity)
        raise AssertionError("unreachable: the second step must be refused")


def test_budget_split_over_epsilon_is_refused(user_data: FitInput) -> None:
    with pytest.raises(BudgetExceeded):
        _Overspender().fit(user_data, 1.0, NoiseSource.seeded(0))
    acct = Accountant(1.0)
    acct.spend("x", 0.7, 1)
    with pytest.raises(BudgetExceeded):
        acct.spend("y", 0.31, 1)


# -- statistical privacy check --------------------------------------------------------------------

K = 5
EPS = 0.5
RUNS = 1500
N_BASE = 1200  # ug sizes its grid from a noisy N: 4 × 4 at user level (k = 5), 8 × 8 at record level
TARGET = np.array([[-2000.0, -2000.0, -1000.0, -1000.0]])  # one cell of 4 × 4, four cells of 8 × 8
ALPHA = 1e-3


def _neighbours() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """D and D' = D plus one user with K points, all in the target box."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-2000, 2000, N_BASE)
    y = rng.uniform(-2000, 2000, N_BASE)
    extra = np.full(K, -1500.0)
    return x, y, np.concatenate([x, extra]), np.concatenate([y, extra])


def _answers(name: str, params: dict, x: np.ndarray, y: np.ndarray, unit: str, seed0: int) -> np.ndarray:
    data = FitInput(x, y, REGION, unit, K if unit == "user" else None)
    mech = get_mechanism(name, **params)
    return np.array([mech.fit(data, EPS, NoiseSource.seeded(seed0 + s)).answer(TARGET)[0] for s in range(RUNS)])


def _max_ratio_lower_bound(out_d: np.ndarray, out_d2: np.ndarray, thresholds: np.ndarray) -> float:
    """Largest lower confidence bound, over events {answer ≥ t}, of P_D'[event] / P_D[event].

    Clopper–Pearson bounds at level ALPHA per side and per threshold (Bonferroni), so a correct
    ε-DP mechanism exceeds e^ε here with probability ≤ 2·ALPHA·len(thresholds).
    """
    a = ALPHA / len(thresholds)
    best = 0.0
    for t in thresholds:
        hi, lo = int(np.count_nonzero(out_d2 >= t)), int(np.count_nonzero(out_d >= t))
        p_hi_low = beta_dist.ppf(a, hi, RUNS - hi + 1) if hi else 0.0
        p_lo_high = beta_dist.ppf(1 - a, lo + 1, RUNS - lo) if lo < RUNS else 1.0
        best = max(best, p_hi_low / p_lo_high)
    return best


@pytest.mark.parametrize(("name", "params"), [("identity", {"grid_size": 4}), ("ug", {}),
                                              ("hb", {"levels": 2, "branching": 2})])
def test_output_probability_ratio_within_e_eps(name: str, params: dict) -> None:
    """P[answer on the target box ≥ t] on D' vs D must stay ≤ e^ε up to sampling error, and the
    same check must expose the mechanism calibrated to sensitivity 1 under user-level privacy."""
    x, y, x2, y2 = _neighbours()
    base = np.count_nonzero((x < -1000) & (y < -1000))
    thresholds = base + np.array([0.0, K / 2, K, 1.5 * K, 2 * K])
    out_d = _answers(name, params, x, y, "user", 0)
    out_d2 = _answers(name, params, x2, y2, "user", 10_000)
    assert out_d2.mean() > out_d.mean()  # the event is informative: the extra user shows on average
    assert _max_ratio_lower_bound(out_d, out_d2, thresholds) <= math.exp(EPS)

    # Mis-calibrated: the same neighbouring datasets (one user, K points), noise for sensitivity 1.
    bad_d = _answers(name, params, x, y, "record", 20_000)
    bad_d2 = _answers(name, params, x2, y2, "record", 30_000)
    assert _max_ratio_lower_bound(bad_d, bad_d2, thresholds) > math.exp(EPS)


def test_ug_matches_independent_reference(user_data: FitInput) -> None:
    """dpcore's ug is within 10% of bench/independent_ug.py (written separately from the paper)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "independent_ug.py"
    spec = importlib.util.spec_from_file_location("independent_ug", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    rows = ref.compare(user_data.x[::4], user_data.y[::4], REGION, [0.2, 1.0], [(100.0, 1000.0)], sensitivity=1,
                       n_queries=300, trials=15, seed=0, public_total=False)
    for r in rows:
        assert abs(r["ratio"] - 1) <= 0.10, r


@pytest.mark.shared_data
def test_ag_and_privtree_beat_ug_on_skewed_real_data_at_small_epsilon(gowalla_nyc_path) -> None:
    """The papers' claim, in their setting (record level): Gowalla NYC, ε ∈ {0.05, 0.1}."""
    from dpcore.data.points import clip_to_region, load_points
    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.geo import city_region
    from dpcore.queries.range import square_workload, true_counts

    region = city_region("new-york")
    _, x, y = clip_to_region(load_points(gowalla_nyc_path).points, region)
    data = FitInput(x, y, region, "record", None)
    rng = np.random.default_rng(0)
    workloads = [square_workload(region, 1000, a, b, rng) for a, b in ((100, 1000), (1000, 5000))]
    truths = [true_counts(x, y, w) for w in workloads]
    psi = psi_for(x.size)
    for eps in (0.05, 0.1):
        err = {}
        for name in ("ug", "ag", "privtree"):
            per_trial = []
            for trial in range(3):
                syn = get_mechanism(name).fit(data, eps, NoiseSource.seeded(100 + trial))
                per_trial.append([relative_error(syn.answer(w), t, psi).mean() for w, t in zip(workloads, truths,
                                                                                               strict=True)])
            err[name] = np.mean(per_trial, axis=0)
        assert np.all(err["ag"] < err["ug"]), (eps, err)
        assert np.all(err["privtree"] < err["ug"]), (eps, err)


def test_privtree_split_decisions_are_user_level_private() -> None:
    """PrivTree's tree shape at user level: one user with k points in an empty quadrant must change
    the probability that the quadrant is split by ≤ e^ε_tree; λ, δ calibrated to sensitivity 1
    instead of k must be caught by the same check."""
    k, eps, runs = 20, 0.5, 2000  # ε_tree = ε/2
    rng = np.random.default_rng(3)
    # 2,000 points in the three other quadrants: the root always splits.
    x = rng.uniform(0, 2000, 2000)
    y = rng.uniform(-2000, 2000, 2000)
    x2, y2 = np.r_[x, np.full(k, -1000.0)], np.r_[y, np.full(k, -1000.0)]  # + one user in quadrant (−, −)

    def split_rate(xs: np.ndarray, ys: np.ndarray, unit: str, seed0: int) -> int:
        data = FitInput(xs, ys, REGION, unit, k if unit == "user" else None)
        mech = get_mechanism("privtree", min_leaf_m=1000.0)  # depth ≤ 2: a 4 × 4 raster
        hits = 0
        for s in range(runs):
            quadrant = mech.fit(data, eps, NoiseSource.seeded(seed0 + s)).values[:2, :2]
            hits += quadrant.max() != quadrant.min()  # a leaf is uniform; split children differ
        return hits

    def ratio_lower_bound(hi: int, lo: int, alpha: float = 1e-3) -> float:
        return beta_dist.ppf(alpha, hi, runs - hi + 1) / beta_dist.ppf(1 - alpha, lo + 1, runs - lo)

    lo, hi = split_rate(x, y, "user", 0), split_rate(x2, y2, "user", 50_000)
    assert 150 < lo < 350  # P[Lap(λ) > δ] = 1/(2β) = 1/8 for an empty node
    assert ratio_lower_bound(hi, lo) <= math.exp(eps / 2)
    bad_lo, bad_hi = split_rate(x, y, "record", 100_000), split_rate(x2, y2, "record", 150_000)
    assert ratio_lower_bound(bad_hi, bad_lo) > math.exp(eps / 2)
