"""Weighted user-level bounding: every point weighs min(1, k/n_u), a person's weights add up to ≤ k, the
weighted histogram keeps sensitivity k (statistical e^ε test) and is scaled to full counts."""

import math

import numpy as np
import pytest

import dpcore.mechanisms.inputs as inputs
from dpcore.evaluation.range import EvalConfig
from dpcore.geo import Region
from dpcore.grid.histogram import grid_counts
from dpcore.mechanisms import FitInput, MechanismError, get_mechanism
from dpcore.privacy.bounding import (
    WEIGHT_QUANTUM,
    SamplingError,
    bound_contributions,
    contribution_weights,
)
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.scaling import fit_scaled

REGION = Region("t", 40.0, -74.0, 1.0)  # bounds ±500 m


def heavy_users(n_users=100, per_user=100, seed=0):
    """n_users people with per_user points each, spread over the region."""
    rng = np.random.default_rng(seed)
    n = n_users * per_user
    return rng.uniform(-500, 500, n), rng.uniform(-500, 500, n), np.repeat(np.arange(n_users), per_user)


def test_weights_are_min_one_k_over_n_on_the_lattice_and_keep_every_point():
    user = np.array([7] * 3 + [2] * 10 + [5] * 7 + [9])  # n_u = 3, 10, 7, 1
    w = contribution_weights(user, 4)
    expected = np.array([1.0] * 3 + [0.4] * 10 + [4 / 7] * 7 + [1.0])
    assert np.all(w > 0) and np.all(w <= expected) and np.all(expected - w < WEIGHT_QUANTUM)
    assert np.array_equal(np.floor(w / WEIGHT_QUANTUM) * WEIGHT_QUANTUM, w)
    sums = {u: w[user == u].sum() for u in np.unique(user)}
    assert sums[2] <= 4 and sums[5] <= 4 and sums[7] == 3 and sums[9] == 1
    with pytest.raises(SamplingError):
        contribution_weights(user, 0)
    assert contribution_weights(np.array(["a", "b", "a"]), 1).tolist() == [0.5, 1.0, 0.5]


def test_weighted_counts_are_the_expected_k_sample_counts():
    """A point is in a uniform k-subset with probability min(1, k/n_u): the weighted grid is the mean of
    the k-sampled grids, without their sampling noise."""
    rng = np.random.default_rng(3)
    n_u = rng.integers(1, 60, 50)
    user = np.repeat(np.arange(50), n_u)
    x, y = rng.uniform(-500, 500, user.size), rng.uniform(-500, 500, user.size)
    k = 5
    weighted = grid_counts(x, y, REGION.bounds_m, 4, weights=contribution_weights(user, k))
    draws = np.stack([grid_counts(x[keep], y[keep], REGION.bounds_m, 4)
                      for keep in (bound_contributions(user, k, rng).keep for _ in range(400))])
    sd = draws.std(axis=0) / math.sqrt(400)
    assert np.all(np.abs(draws.mean(axis=0) - weighted) <= 5 * sd + 1e-9)
    assert weighted.sum() == pytest.approx(np.minimum(n_u, k).sum(), abs=1e-3)


def test_fit_input_refuses_weights_that_break_the_bound():
    x, y, user = heavy_users(3, 10)
    k = 4
    ok = contribution_weights(user, k)
    FitInput(x, y, REGION, "user", k, user=user, weights=ok)
    with pytest.raises(SamplingError, match="add up to"):
        FitInput(x, y, REGION, "user", k, user=user, weights=np.ones_like(x))
    with pytest.raises(SamplingError, match="multiples"):
        FitInput(x, y, REGION, "user", k, user=user, weights=np.full_like(x, 0.3))  # sums 3 ≤ k, but off-lattice
    with pytest.raises(SamplingError):
        FitInput(x, y, REGION, "user", k, user=None, weights=ok)
    with pytest.raises(MechanismError, match="user-level"):
        FitInput(x, y, REGION, "record", None, user=user, weights=ok)
    with pytest.raises(SamplingError):
        EvalConfig(mechanisms=["ug"], epsilons=[1.0], privacy_unit="record", bounding="weight")


def test_lattice_noise_stays_on_the_lattice_with_the_count_noise_scale():
    counts = np.arange(20000, dtype=np.float64) * WEIGHT_QUANTUM * 3
    out = NoiseSource.seeded(0).add_lattice_laplace(counts, 2.0, 0.5, WEIGHT_QUANTUM)
    assert np.array_equal(np.rint(out / WEIGHT_QUANTUM) * WEIGHT_QUANTUM, out)
    # discrete Laplace of scale 2/0.5 = 4 in count units: variance ≈ 2·4² = 32
    assert np.var(out - counts) == pytest.approx(32.0, rel=0.05)
    with pytest.raises(ValueError, match="lattice"):
        NoiseSource.seeded(0).add_lattice_laplace(np.array([0.3]), 2.0, 0.5, WEIGHT_QUANTUM)


# -- the e^ε test -----------------------------------------------------------------------------------
EPS, K, HEAVY = 1.0, 2, 20


def _outputs(with_heavy: bool, weights_fn, n: int, seed0: int) -> np.ndarray:
    """Released count of the south-west cell of a 2 × 2 identity grid, over n seeded fits."""
    x = [-300.0, 300.0, 300.0, 300.0]  # person 0 in the SW cell, person 1 (3 points) in the NE cell
    user = [0, 1, 1, 1]
    if with_heavy:  # neighbour: plus one heavy person with HEAVY points in the SW cell
        x += [-300.0] * HEAVY
        user += [2] * HEAVY
    x, user = np.array(x), np.array(user)
    data = FitInput(x, x.copy(), REGION, "user", K, user=user, weights=weights_fn(user, K))
    mech = get_mechanism("identity", grid_size=2)
    return np.array([mech.fit(data, EPS, NoiseSource.seeded(seed0 + s)).values[0, 0] for s in range(n)])


def worst_ratio(weights_fn, n: int = 10_000) -> float:
    """max over events {out ≥ t}, {out ≤ t} whose frequency is ≥ 5% under both neighbours of the ratio of
    their frequencies; an ε-DP mechanism has ≤ e^ε (up to sampling error, ~7% at 500 counts)."""
    a, b = _outputs(False, weights_fn, n, 0), _outputs(True, weights_fn, n, 10**6)
    t = np.unique(np.concatenate([a, b]).round(6))
    sa, sb = np.sort(a), np.sort(b)
    # the frequencies of {out ≥ t} and {out ≤ t} at every t at once, from the sorted outputs
    at_least = ((a.size - np.searchsorted(sa, t, "left")) / a.size, (b.size - np.searchsorted(sb, t, "left")) / b.size)
    at_most = (np.searchsorted(sa, t, "right") / a.size, np.searchsorted(sb, t, "right") / b.size)
    worst = 1.0
    for pa, pb in (at_least, at_most):
        seen = np.minimum(pa, pb) >= 0.05
        if seen.any():
            worst = max(worst, float(np.max(pa[seen] / pb[seen])), float(np.max(pb[seen] / pa[seen])))
    return worst


def test_weighted_identity_grid_passes_the_e_eps_test_and_unbounded_weights_fail_it(monkeypatch):
    bound = math.exp(EPS) * 1.3
    assert worst_ratio(contribution_weights) <= bound
    # negative control: without the k/n_u factor every point weighs 1 and the heavy person's 20 points
    # move the cell by 20 = 10·k; FitInput would refuse such weights, so its check is switched off here
    monkeypatch.setattr(inputs, "check_weights", lambda *a: None)
    assert worst_ratio(lambda user, k: np.ones(user.size)) > 2 * bound
    # and a milder break, weights doubled (a person's sum up to 2k), fails it too
    assert worst_ratio(lambda user, k: np.minimum(1.0, 2 * contribution_weights(user, k))) > bound


# -- mechanisms and scaling ---------------------------------------------------------------------------
@pytest.mark.parametrize("mech,params", [("identity", {"grid_size": 16}), ("ug", {}), ("ag", {}), ("hb", {}),
                                         ("privtree", {})])
def test_grid_mechanisms_count_weight_not_points(mech, params):
    x, y, user = heavy_users()
    k = 5
    w = contribution_weights(user, k)  # Σw = 500 of 10,000 points
    data = FitInput(x, y, REGION, "user", k, user=user, weights=w)
    syn = get_mechanism(mech, **params).fit(data, 20.0, NoiseSource.seeded(1))
    total = syn.answer(np.array([[-500, -500, 500, 500]]))[0]
    assert total == pytest.approx(w.sum(), rel=0.1)
    assert any("weighted bounding" in note for note in syn.privacy.notes)
    assert sum(c["epsilon"] for c in syn.privacy.charges) == pytest.approx(20.0)
    assert all(c["sensitivity"] == k for c in syn.privacy.charges)
    # every discrete Laplace step names the lattice its noise lies on; the same fit on points names none
    laplace = [c for c in syn.privacy.charges if c["noise"] == "discrete_laplace"]
    assert laplace and all(c["quantum"] == WEIGHT_QUANTUM for c in laplace)
    plain = get_mechanism(mech, **params).fit(FitInput(x, y, REGION, "user", k, user=user), 20.0,
                                              NoiseSource.seeded(1))
    assert all("quantum" not in c for c in plain.privacy.charges)


def test_mechanisms_without_weight_support_refuse_it():
    x, y, user = heavy_users(5, 10)
    data = FitInput(x, y, REGION, "user", 3, user=user, weights=contribution_weights(user, 3))
    st = FitInput(x, y, REGION, "user", 3, user=user, weights=contribution_weights(user, 3),
                  slot=np.zeros(x.size, dtype=np.int64), n_slots=1, slot_seconds=3600, window_start_s=0)
    with pytest.raises(MechanismError, match="weighted"):
        get_mechanism("identity3d", grid_size=4).fit(st, 1.0, NoiseSource.seeded(0))
    with pytest.raises(MechanismError, match="weighted"):
        get_mechanism("auto", mechanisms="snh").fit(data, 1.0, NoiseSource.seeded(0))


def test_auto_under_weights_picks_among_weighted_mechanisms():
    x, y, user = heavy_users()
    data = FitInput(x, y, REGION, "user", 5, user=user, weights=contribution_weights(user, 5))
    syn = get_mechanism("auto", mechanisms="snh,identity", query_sides_m=(25, 100)).fit(
        data, 1.0, NoiseSource.seeded(0))
    assert syn.privacy.params["chosen"]["mechanism"] == "identity"


def test_scaling_estimates_the_weight_sum_not_the_point_count():
    x, y, user = heavy_users()
    k = 5
    w = contribution_weights(user, k)
    data = FitInput(x, y, REGION, "user", k, user=user, weights=w)
    syn = fit_scaled(get_mechanism("ug"), data, 5.0, NoiseSource.seeded(2), float(x.size), "test")
    names = [c["name"] for c in syn.privacy.charges]
    assert names[0] == "sample_total_for_scaling" and "total_count" not in names
    assert "Σ weights" in syn.privacy.charges[0]["note"]
    # n̂ ≈ Σw = 500 (noise scale k/ε_n = 10), so the factor is ≈ N/Σw = 20, and the release sums to ≈ N
    assert syn.factor == pytest.approx(x.size / w.sum(), rel=0.1)
    assert syn.answer(np.array([[-500, -500, 500, 500]]))[0] == pytest.approx(x.size, rel=0.1)
    assert "weight sum" in syn.privacy.notes[-1]
    # the k-sample keeps Σ min(n_u, k) = 500 points too: both boundings scale by the same factor
    sample = FitInput(x[bound_contributions(user, k, np.random.default_rng(0)).keep],
                      y[bound_contributions(user, k, np.random.default_rng(0)).keep], REGION, "user", k)
    assert fit_scaled(get_mechanism("ug"), sample, 5.0, NoiseSource.seeded(2), float(x.size), "t").factor == pytest.approx(
        syn.factor, rel=0.1)


def test_auto_and_scaling_keep_the_lattice_of_weighted_charges():
    """auto copies its chosen mechanism's charges, and scaling pays n̂ on the weight sum: both name the
    lattice, so intervals re-draw the noise the release added."""
    from dpcore.synopsis.uncertainty import query_intervals

    x, y, user = heavy_users()
    data = FitInput(x, y, REGION, "user", 5, user=user, weights=contribution_weights(user, 5))
    syn = get_mechanism("auto", mechanisms="identity", query_sides_m=(25, 100)).fit(data, 1.0, NoiseSource.seeded(0))
    assert [c["quantum"] for c in syn.privacy.charges] == [WEIGHT_QUANTUM] * len(syn.privacy.charges)
    scaled = fit_scaled(get_mechanism("identity", grid_size=8), data, 5.0, NoiseSource.seeded(2), float(x.size), "test")
    assert all(c["quantum"] == WEIGHT_QUANTUM for c in scaled.privacy.charges)
    _, _, method = query_intervals(syn, np.array([[-100.0, -100.0, 100.0, 100.0]]))
    assert "2^-20 lattice" in method


def test_interval_redraws_follow_the_recorded_lattice():
    """The bootstrap's noise is quantum × DLap(scale/quantum): on the lattice, with that law's variance,
    not the integer law's (the two differ clearly when the quantum is near the scale)."""
    from dpcore.privacy.noise import discrete_laplace_variance
    from dpcore.synopsis.noise import NoiseLaw, draw_noise

    scale, quantum = 4.0, 8.0
    law = NoiseLaw("laplace", scale, quantum)
    draws = draw_noise(np.random.default_rng(0), law, 200_000)
    assert law.variance == pytest.approx(quantum ** 2 * discrete_laplace_variance(scale / quantum))
    assert np.array_equal(draws, np.round(draws / quantum) * quantum)
    lattice_var = quantum ** 2 * discrete_laplace_variance(scale / quantum)  # ≈ 23.2; the integer law's ≈ 31.5
    assert draws.var() == pytest.approx(lattice_var, rel=0.03)
    assert abs(draws.var() - discrete_laplace_variance(scale)) > 0.2 * lattice_var
