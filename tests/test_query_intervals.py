"""95% intervals of range answers: they cover the noise-free answer at their rate, through the CLI."""

import json

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import Region, city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.uncertainty import query_intervals
from tests.cli_runner import run_geodp


def test_intervals_of_a_linear_release_cover_the_noise_free_answer_95_percent_of_the_time():
    region = Region("r", 40.0, -74.0, 2.0)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1000, 1000, (2, 3000))
    data = FitInput(x, y, region, "user", 5)
    boxes = np.array([[-430, -270, 130, 310], [-990, -990, 990, 990], [205, -615, 515, -5],
                      [-120, 60, 40, 230], [-800, 300, -100, 900]], dtype=np.float64)
    exact = get_mechanism("identity", grid_size=20).fit(data, 1e9, NoiseSource.seeded(1))  # ~noise-free
    truth = exact.answer(boxes)
    hits, n = 0, 0
    for s in range(300):
        syn = get_mechanism("identity", grid_size=20).fit(data, 0.5, NoiseSource.seeded(100 + s))
        lo, hi, method = query_intervals(syn, boxes, draws=2000, seed=s)
        hits += int(np.sum((lo <= truth) & (truth <= hi)))
        n += len(boxes)
    assert "exact noise law" in method
    assert 0.93 <= hits / n <= 0.97, hits / n
    # the interval's width follows the noise: ten times the ε, about a tenth of the width
    wide = query_intervals(get_mechanism("identity", grid_size=20).fit(data, 0.5, NoiseSource.seeded(7)), boxes)
    narrow = query_intervals(get_mechanism("identity", grid_size=20).fit(data, 5.0, NoiseSource.seeded(7)), boxes)
    ratio = np.median((wide[1] - wide[0]) / (narrow[1] - narrow[0]))
    assert 8 < ratio < 12


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("d") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, days=4, seed=2).to_parquet(p)
    return p


def test_query_json_carries_intervals_and_never_bare_nan(data_file, tmp_path):
    out = tmp_path / "rel"
    run_geodp("release", data_file, "--city", "new-york", "--epsilon", "1", "--param", "cell_width_m=500",
              "--out", out)
    r = run_geodp("query", out, "--box", "40.70,-74.02,40.72,-74.00", "--json")
    (row,) = json.loads(r.stdout)
    assert row["lower"] <= row["estimate"] <= row["upper"] and row["interval"] == "95%"
    tree = tmp_path / "tree"
    run_geodp("release", data_file, "--city", "new-york", "--epsilon", "1", "--mechanism", "privtree",
              "--out", tree)
    r = run_geodp("query", tree, "--box", "40.72,-74.00,40.70,-74.02", "--json")  # typed inverted
    assert "NaN" not in r.stdout and "min above max" in r.stderr
    (row,) = json.loads(r.stdout)
    assert row["lower"] is None and row["interval_method"].startswith("none")
    r = run_geodp("query", tree, "--box", "41.5,-74.02,41.6,-74.00")
    assert "outside the released region" in r.stderr


def test_release_quality_follows_the_noise_law_and_says_when_a_map_is_blank():
    from dpcore.privacy.noise import discrete_laplace_variance
    from dpcore.synopsis.uncertainty import release_quality

    region = Region("r", 40.0, -74.0, 4.0)
    rng = np.random.default_rng(1)
    x, y = rng.normal(0, 300, (2, 20000))
    data = FitInput(x, y, region, "user", 10)
    empty = FitInput(np.empty(0), np.empty(0), region, "user", 10)
    q = release_quality(get_mechanism("identity", grid_size=100).fit(empty, 0.5, NoiseSource.seeded(2)))
    assert q["noise_sd_per_cell"] == pytest.approx(np.sqrt(discrete_laplace_variance(20.0)))
    noise_only = get_mechanism("identity", grid_size=100).fit(empty, 0.5, NoiseSource.seeded(2))
    assert np.std(noise_only.values) == pytest.approx(q["noise_sd_per_cell"], rel=0.03)
    tiny = release_quality(get_mechanism("identity", grid_size=100).fit(data, 0.01, NoiseSource.seeded(3)))
    large = release_quality(get_mechanism("identity", grid_size=100).fit(data, 50.0, NoiseSource.seeded(3)))
    assert all(b["worse_than_blank_map"] for b in tiny["bands"]) and "worse than a blank map" in tiny["statement"]
    assert not any(b["worse_than_blank_map"] for b in large["bands"])
    # a post-processed release says it has no noise-law summary rather than a wrong one
    assert release_quality(get_mechanism("privtree").fit(data, 1.0, NoiseSource.seeded(4)))["bands"] == []


def _coverage(mechanism: str, params: dict, data: FitInput, boxes: np.ndarray, truth: np.ndarray, releases: int):
    hits, methods = 0, set()
    for s in range(releases):
        syn = get_mechanism(mechanism, **params).fit(data, 1.0, NoiseSource.seeded(500 + s))
        lo, hi, method = query_intervals(syn, boxes, seed=s)
        methods.add(method.split(",")[0])
        hits += int(np.sum((lo <= truth) & (truth <= hi)))
    return hits / (releases * len(boxes)), methods


def test_bootstrap_intervals_of_hb_cover_the_noise_free_answer_95_percent_of_the_time():
    region = Region("r", 40.0, -74.0, 2.0)
    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 400, (2, 4000))
    data = FitInput(x, y, region, "user", 5)
    params = {"levels": 2, "branching": 4}  # public: the same 16 × 16 leaves in every release
    boxes = np.array([[-430, -270, 130, 310], [-990, -990, 990, 990], [205, -615, 515, -5],
                      [-120, 60, 40, 230], [-800, 300, -100, 900]], dtype=np.float64)
    from dpcore.grid.histogram import answer_boxes, prefix_sums

    # the noise-free release: the true 16 × 16 leaf counts (consistency leaves exact counts unchanged)
    truth = answer_boxes(prefix_sums(data.grid_counts(16, 16).astype(float)), region.bounds_m, boxes)
    rate, methods = _coverage("hb", params, data, boxes, truth, releases=150)
    assert methods == {"parametric bootstrap: fresh level noise through HB's least-squares consistency"}
    # consistency shrinks a large box's noise a lot: re-noising the leaves alone would over-cover
    assert 0.93 <= rate <= 0.97, rate


def test_bootstrap_intervals_of_ag_cover_the_noise_free_answer_95_percent_of_the_time():
    region = Region("r", 40.0, -74.0, 2.0)
    rng = np.random.default_rng(4)
    x, y = rng.normal(0, 350, (2, 4000))
    data = FitInput(x, y, region, "user", 5, public_total=4000.0)  # a public total: the same level-1 grid
    probe = get_mechanism("ag").fit(data, 1.0, NoiseSource.seeded(0))
    m1 = probe.extra_meta()["m1"]
    edges = np.linspace(-1000, 1000, m1 + 1)
    # boxes made of whole level-1 cells: their noise-free answer is the true count, whatever the leaves
    cells = [(0, 0, m1, m1), (2, 1, 5, 6), (m1 // 2, m1 // 2, m1 // 2 + 1, m1 // 2 + 1), (1, 3, 4, 4)]
    boxes = np.array([[edges[a], edges[b], edges[c], edges[d]] for a, b, c, d in cells])
    truth = np.array([np.sum((x >= x0) & (x < x1) & (y >= y0) & (y < y1)) for x0, y0, x1, y1 in boxes], float)
    rate, methods = _coverage("ag", {}, data, boxes, truth, releases=150)
    assert methods == {"parametric bootstrap: fresh level noise through AG's constrained inference"}
    assert 0.93 <= rate <= 0.97, rate


def test_intervals_follow_autos_choice_and_stay_null_where_the_release_lacks_what_they_need():
    region = Region("r", 40.0, -74.0, 2.0)
    rng = np.random.default_rng(5)
    x, y = rng.normal(0, 400, (2, 3000))
    data = FitInput(x, y, region, "user", 5)
    box = np.array([[-300.0, -300.0, 300.0, 300.0]])
    auto = get_mechanism("auto", mechanisms=["ag"]).fit(data, 1.0, NoiseSource.seeded(2))
    lo, hi, method = query_intervals(auto, box)
    assert method.startswith("parametric bootstrap") and lo[0] <= auto.answer(box)[0] <= hi[0]
    tree = get_mechanism("privtree").fit(data, 1.0, NoiseSource.seeded(2))
    clamped = get_mechanism("ag", clamp_negative=True).fit(data, 1.0, NoiseSource.seeded(2))
    for syn, word in ((tree, "raster"), (clamped, "clamped")):
        lo, hi, method = query_intervals(syn, box)
        assert np.isnan(lo).all() and np.isnan(hi).all() and method.startswith("none") and word in method
