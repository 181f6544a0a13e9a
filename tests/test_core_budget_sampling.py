"""Budget accounting and user-level contribution bounding."""

import numpy as np
import pytest
from scipy import stats

from dpcore.privacy.bounding import SamplingError, bound_contributions, count_sensitivity
from dpcore.privacy.budget import (
    Accountant,
    BudgetError,
    BudgetExceeded,
    split_epsilon,
)


def test_accountant_records_and_refuses_overspend():
    acct = Accountant(1.0)
    acct.spend_fraction("a", 0.3, sensitivity=5)
    acct.spend("b", 0.5, sensitivity=5)
    with pytest.raises(BudgetExceeded, match="only 0.2"):
        acct.spend("c", 0.25, sensitivity=5)
    acct.spend_rest("c", sensitivity=5)
    assert acct.spent == pytest.approx(1.0)
    assert [c.name for c in acct.charges] == ["a", "b", "c"]
    with pytest.raises(BudgetExceeded):
        acct.spend("d", 1e-6, sensitivity=1)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "x"])
def test_bad_epsilon_rejected(bad):
    with pytest.raises(BudgetError):
        Accountant(bad)


def test_split_adds_up():
    parts = split_epsilon(0.7, {"tree": 1, "leaves": 3, "n": 0.2})
    assert sum(parts.values()) == pytest.approx(0.7, rel=1e-12)
    assert parts["leaves"] == pytest.approx(3 * parts["tree"])


def test_sensitivity_by_privacy_unit():
    assert count_sensitivity("user", 7) == 7
    assert count_sensitivity("record", None) == 1
    with pytest.raises(SamplingError):
        count_sensitivity("user", None)
    with pytest.raises(SamplingError):
        count_sensitivity("household", 3)


def test_bounding_caps_every_user_and_keeps_light_users():
    rng = np.random.default_rng(0)
    user = np.repeat(np.arange(500), rng.integers(1, 60, 500))
    res = bound_contributions(user, 10, rng)
    kept = np.bincount(user[res.keep], minlength=500)
    orig = np.bincount(user, minlength=500)
    assert kept.max() <= 10
    assert np.array_equal(kept, np.minimum(orig, 10))
    assert np.all(np.diff(res.keep) > 0)
    assert res.n_users == 500 and res.n_users_truncated == int((orig > 10).sum())


def test_bounding_is_uniform_within_a_user():
    # One user with 12 records, k = 3: each record must be kept with probability 1/4.
    user = np.zeros(12, dtype=np.int64)
    rng = np.random.default_rng(1)
    hits = np.zeros(12)
    for _ in range(4000):
        hits[bound_contributions(user, 3, rng).keep] += 1
    assert stats.chisquare(hits).pvalue > 1e-4
    assert hits.sum() == 3 * 4000


@pytest.mark.parametrize("n,k", [(7, 2), (6, 4)])
def test_bounding_draws_every_k_subset_equally_often(n, k):
    """Every k-subset of a person's rows is equally likely, whether the person keeps its k smallest
    keys (n ≥ 2k) or drops its n − k smallest (n < 2k), with a second person's rows in between."""
    import itertools

    rng = np.random.default_rng(4)
    user = np.r_[np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)][rng.permutation(2 * n)]
    rows = np.flatnonzero(user == 0)
    index = {s: i for i, s in enumerate(itertools.combinations(rows.tolist(), k))}
    hits = np.zeros(len(index))
    for _ in range(3000):
        keep = bound_contributions(user, k, rng).keep
        assert (user[keep] == 1).sum() == k
        hits[index[tuple(keep[user[keep] == 0].tolist())]] += 1
    assert stats.chisquare(hits).pvalue > 1e-4


@pytest.mark.parametrize("forced", ["few candidates", "tied keys"])
def test_bounding_stays_uniform_where_units_draw_again(monkeypatch, forced):
    """The rare paths of the k-sample, forced: units with fewer candidates than they choose, and units
    whose keys tie at the cut, draw again, and every k-subset stays equally likely (a redraw that kept a
    tied cut's row order, or a partial draw, would favour some rows)."""
    import itertools

    import dpcore.privacy.bounding as bounding

    redraws = []
    if forced == "few candidates":
        monkeypatch.setattr(bounding, "CANDIDATE_SDS", -3.0)
    else:  # every row a candidate with its key's top bits 0, then 4 random bits: ties at most cuts
        monkeypatch.setattr(bounding, "_random_u8", lambda rng, n: np.zeros(n, dtype=np.uint8))
        monkeypatch.setattr(bounding, "_random_u32",
                            lambda rng, n: rng.integers(0, 4, n).astype(np.uint32) << np.uint32(30))
    draw = bounding._random_u32
    monkeypatch.setattr(bounding, "_random_u32", lambda rng, n: redraws.append(n) or draw(rng, n))
    rng = np.random.default_rng(5)
    sizes = np.array([2, 5, 7, 30])
    user = np.repeat(np.arange(sizes.size), sizes)[rng.permutation(sizes.sum())]
    rows = np.flatnonzero(user == 2)  # 7 rows, k = 3: keeps its 3 smallest keys
    index = {s: i for i, s in enumerate(itertools.combinations(rows.tolist(), 3))}
    hits, per_row = np.zeros(len(index)), np.zeros(user.size)
    draws = 1500
    for _ in range(draws):
        keep = bounding.sample_per_unit([user[:20], user[20:]], np.bincount(user), 3, rng)
        assert np.array_equal(np.bincount(user[keep], minlength=sizes.size), np.minimum(sizes, 3))
        hits[index[tuple(np.flatnonzero(keep & (user == 2)).tolist())]] += 1
        per_row[keep] += 1
    assert len(redraws) > 3 * draws  # two blocks and the edge sort per draw, and more: units drew again
    assert stats.chisquare(hits).pvalue > 1e-4
    for u in (1, 3):
        assert stats.chisquare(per_row[user == u]).pvalue > 1e-4


def test_bounding_spans_the_whole_release_not_each_city():
    """A user with 100 points in each of three cities keeps at most k points over the three city-releases
    of one run together, not k per city (the release step that splits by city bounds first)."""
    from dpcore.data.points import LoadResult, Points, ValidationReport
    from dpcore.geo import city_region
    from tasks.config import parse_period
    from tasks.dask_path import release_frame
    from tasks.release_city_plan import make_plans
    from tasks.release_tasks import grid_specs, read_bound_count

    cities = ["new-york", "chicago", "austin"]
    rng = np.random.default_rng(2)
    lat = np.concatenate([city_region(c).center_lat + rng.normal(0, 0.01, 100) for c in cities])
    lon = np.concatenate([city_region(c).center_lon + rng.normal(0, 0.01, 100) for c in cities])
    user = np.r_[np.zeros(300, dtype=np.int64), np.arange(1, 31, dtype=np.int64)]
    lat = np.r_[lat, np.full(30, city_region("austin").center_lat)]
    lon = np.r_[lon, np.full(30, city_region("austin").center_lon)]
    pts = Points(user, np.full(user.size, 1_700_000_000, dtype=np.int64), lat, lon)
    plans = make_plans(dataset="d", cities=cities, center=None, side_km=None, period=parse_period(None),
                       mechanism="identity", params={}, epsilon=1.0, privacy_unit="user", max_points_per_user=5,
                       seed=0, data_version="v")
    loaded = LoadResult(pts, ValidationReport(), "d", "v")
    for seed in range(5):
        frame, _, _ = release_frame(loaded, grid_specs(plans), (None, None), max_points_per_user=5, seed=seed)
        kept = frame.compute(scheduler="sync")
        assert int((kept.user == 0).sum()) == 5
        assert int((kept.user > 0).sum()) == 30  # users with one point keep it
        counted = read_bound_count.fn(loaded, plans, seed).cities
        assert sum(int(counted[c].fine.sum()) for c in cities) == 35  # and the counts are of that sample


def test_bounding_accepts_string_ids_and_rejects_bad_k():
    rng = np.random.default_rng(3)
    res = bound_contributions(np.array(["a", "b", "a", "a"]), 2, rng)
    assert res.keep.size == 3
    with pytest.raises(SamplingError):
        bound_contributions(np.zeros(3, dtype=np.int64), 0, rng)
