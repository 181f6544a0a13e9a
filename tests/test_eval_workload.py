"""The evaluation's query workloads (data-centred by default, uniform, public file) and its two
references (answering 0, the hindsight grid)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpcore.data.points import Points
from dpcore.evaluation.range import (
    HINDSIGHT_GRID_SIZES,
    EvalConfig,
    evaluate,
    protocol_workloads,
    region_data,
)
from dpcore.geo import Region
from dpcore.grid.histogram import grid_counts
from dpcore.queries.range import QueryError, parse_workload, true_counts

REGION = Region("t", 40.0, -74.0, 4.0)  # 4 km square, bounds ±2000 m


def clustered_points(n_dense=3000, n_sparse=1000, seed=0, users=300) -> Points:
    """Most points in one 400 m square (the south-west corner), the rest spread over the region."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.uniform(-2000, -1600, n_dense), rng.uniform(-2000, 2000, n_sparse)])
    y = np.concatenate([rng.uniform(-2000, -1600, n_dense), rng.uniform(-2000, 2000, n_sparse)])
    lat, lon = REGION.unproject(x, y)
    user = rng.integers(0, users, x.size)
    return Points(user.astype(np.int64), np.zeros(x.size, dtype=np.int64), lat, lon, np.arange(users))


def centres(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2


def chi2_against(cx, cy, px, py) -> float:
    """p-value of the centres' 4 × 4 cell counts against the cell shares of the points px, py."""
    obs = grid_counts(cx, cy, REGION.bounds_m, 4).ravel()
    share = grid_counts(px, py, REGION.bounds_m, 4).ravel() / px.size
    keep = share > 0
    if obs[~keep].sum() > 0:
        return 0.0
    return float(stats.chisquare(obs[keep], share[keep] * obs.sum()).pvalue)


def test_data_centres_follow_the_data_and_uniform_centres_do_not():
    data = region_data(clustered_points(), REGION)
    (_, boxes, truth), = protocol_workloads(data, [(25.0, 100.0)], 4000, seed=3)
    cx, cy = centres(boxes)
    # every centre is a data point, and the dense corner (75% of the points, 1% of the area) gets
    # its share of the queries: a binomial 75% ± 4σ
    pts = set(zip(data.x.round(6), data.y.round(6), strict=True))
    assert all((a, b) in pts for a, b in zip(cx.round(6), cy.round(6), strict=True))
    dense = np.mean((cx < -1600) & (cy < -1600))
    assert abs(dense - 0.75) < 4 * np.sqrt(0.75 * 0.25 / 4000)
    assert chi2_against(cx, cy, data.x, data.y) > 1e-3
    assert truth.min() >= 1  # a square centred on a point holds that point
    (_, ub, _), = protocol_workloads(data, [(25.0, 100.0)], 4000, seed=3, workload="uniform")
    ux, uy = centres(ub)
    assert np.mean((ux < -1600) & (uy < -1600)) < 0.03
    assert chi2_against(ux, uy, data.x, data.y) < 1e-6


def test_public_centres_come_from_the_public_file_only(tmp_path, monkeypatch):
    import dpcore.data.points

    rng = np.random.default_rng(1)
    # public points: a cluster in the north-east, plus points outside the region that must be ignored
    px = np.concatenate([rng.uniform(1000, 1500, 400), rng.uniform(3000, 5000, 100)])
    py = np.concatenate([rng.uniform(1000, 1500, 400), rng.uniform(3000, 5000, 100)])
    lat, lon = REGION.unproject(px, py)
    path = tmp_path / "public.csv"
    pd.DataFrame({"user_id": np.arange(px.size), "timestamp": "2024-01-01T00:00:00Z", "lat": lat,
                  "lon": lon}).to_csv(path, index=False)
    read = []
    real = dpcore.data.points.load_points
    monkeypatch.setattr(dpcore.data.points, "load_points", lambda p, *a, **k: (read.append(str(p)), real(p, *a, **k))[1])
    data = region_data(clustered_points(), REGION)
    (_, boxes, _), = protocol_workloads(data, [(100.0, 200.0)], 1000, seed=0, workload=f"public:{path}")
    cx, cy = centres(boxes)
    assert read == [str(path)]
    assert np.all((cx >= 999) & (cx <= 1501) & (cy >= 999) & (cy <= 1501))  # inside-region public points only
    assert not np.any((cx < -1600) & (cy < -1600))  # nothing from the private data's dense corner
    # a public file with no point in the region cannot centre anything
    far = tmp_path / "far.csv"
    flat, flon = REGION.unproject(np.full(5, 9000.0), np.full(5, 9000.0))
    pd.DataFrame({"user_id": range(5), "timestamp": "2024-01-01T00:00:00Z", "lat": flat, "lon": flon}).to_csv(far)
    with pytest.raises(QueryError, match="no points inside"):
        protocol_workloads(data, [(100.0, 200.0)], 10, seed=0, workload=f"public:{far}")


@pytest.mark.parametrize("bad", ["", "public:", "gaussian", "public"])
def test_bad_workload_names_are_refused(bad):
    with pytest.raises(QueryError):
        parse_workload(bad)


def test_uniform_workload_is_the_previous_protocol():
    """--workload uniform keeps the old draws: side, then x, then y, uniform over the region."""
    data = region_data(clustered_points(), REGION)
    (_, boxes, _), = protocol_workloads(data, [(100.0, 1000.0)], 50, seed=7, workload="uniform")
    rng = np.random.default_rng([7, 0xB0C5])
    side = rng.uniform(100, 1000, 50)
    cx, cy = rng.uniform(-2000, 2000, 50), rng.uniform(-2000, 2000, 50)
    assert np.allclose(boxes, np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1))


def test_answer_zero_is_truth_over_max_truth_psi():
    pts = clustered_points()
    cfg = EvalConfig(mechanisms=["ug"], epsilons=[1.0], privacy_unit="record", query_sides_m=[(25.0, 100.0),
                     (1000.0, 2000.0)], n_queries=500, trials=1, hindsight=False)
    for workload in ("data", "uniform"):
        report = evaluate(pts, REGION, EvalConfig(**{**cfg.__dict__, "workload": workload}))
        data = region_data(pts, REGION)
        psi = report["psi"]
        assert psi == pytest.approx(0.001 * data.n_points)
        work = protocol_workloads(data, cfg.query_sides_m, 500, 0, workload=workload)
        for ref, (sides, boxes, _) in zip(report["reference_answer_zero"], work, strict=True):
            t = true_counts(data.x, data.y, boxes).astype(float)
            assert ref["query_sides_m"] == list(sides)
            assert ref["mean_relative_error"] == pytest.approx(np.mean(t / np.maximum(t, psi)))
        row = report["results"][0]
        assert row["ratio_to_answer_zero"] == pytest.approx(
            row["mean_relative_error"] / report["reference_answer_zero"][0]["mean_relative_error"])
    # uniform 25–100 m squares are mostly empty, so answering 0 looks good (the last run above); centred
    # on points they are not, and 1–2 km squares on points all hold ≥ ψ = 4: answering 0 is 100% wrong
    assert report["reference_answer_zero"][0]["mean_relative_error"] < 0.2
    data_rep = evaluate(pts, REGION, cfg)
    assert data_rep["reference_answer_zero"][0]["mean_relative_error"] > 0.6
    assert data_rep["reference_answer_zero"][1]["mean_relative_error"] == 1.0


def test_hindsight_grid_picks_the_size_with_the_least_error():
    pts = clustered_points(n_dense=20_000, n_sparse=4_000)
    cfg = EvalConfig(mechanisms=["identity"], epsilons=[50.0, 0.02], privacy_unit="record",
                     query_sides_m=[(25.0, 60.0), (1000.0, 2000.0)], n_queries=400, trials=2,
                     mechanism_params={"identity": {"grid_size": 64}})
    report = evaluate(pts, REGION, cfg)
    refs = {(r["epsilon"], tuple(r["query_sides_m"])): r for r in report["reference_hindsight_grid"]}
    assert len(refs) == 4
    for r in refs.values():
        errs = {int(m): v for m, v in r["errors_by_grid_size"].items()}
        assert sorted(errs) == list(HINDSIGHT_GRID_SIZES) and r["dp"] is False
        assert r["grid_size"] == min(errs, key=errs.get)
        assert r["mean_relative_error"] == errs[r["grid_size"]]
        assert r["cell_width_m"] == pytest.approx(4000.0 / r["grid_size"])
    # nearly no noise: the finest grid answers small squares best; heavy noise on big squares: the coarsest
    assert refs[(50.0, (25.0, 60.0))]["grid_size"] == 1024
    assert refs[(0.02, (1000.0, 2000.0))]["grid_size"] == 32
    # the hindsight grid at its size is the identity grid at that size run through the same protocol:
    # identity at 64 cannot beat the best size's error by more than the trials' noise
    for row in report["results"]:
        ref = refs[(row["epsilon"], tuple(row["query_sides_m"]))]
        assert row["ratio_to_hindsight_grid"] == pytest.approx(row["mean_relative_error"] / ref["mean_relative_error"])
        assert row["mean_relative_error"] >= 0.8 * ref["errors_by_grid_size"]["64"]


def test_the_text_table_labels_the_references():
    from dpcore.evaluation.range import format_table

    cfg = EvalConfig(mechanisms=["ug"], epsilons=[0.5], privacy_unit="record", query_sides_m=[(100.0, 400.0)],
                     n_queries=100, trials=1)
    text = format_table(evaluate(clustered_points(), REGION, cfg))
    ref_line = next(line for line in text.splitlines() if line.startswith("hindsight"))
    grid = evaluate(clustered_points(), REGION, cfg)["reference_hindsight_grid"][0]["grid_size"]
    assert "NOT DP" in ref_line and f"{grid}x{grid}" in ref_line
    assert "query centres: data" in text.splitlines()[0]


def test_evaluate_st_asks_hotspots_where_and_when_people_are():
    """With the data workload a hotspot query sits on a drawn point in that point's own slot, so at
    threshold 1 a true hotspot always exists and the baseline that reports nothing has regret exactly 1;
    uniform locations and slots on sparse data often have none."""
    from dpcore.data.points import validate_frame
    from dpcore.data.synthetic import generate_checkins
    from dpcore.evaluation.spatiotemporal import STEvalConfig, evaluate_st, format_st_table
    from dpcore.geo import city_region

    region = city_region("boston")
    pts, _ = validate_frame(generate_checkins(region, n_users=150, start="2024-01-01", days=6, seed=5))
    start = int(pd.Timestamp("2024-01-01", tz="UTC").timestamp())
    reports = {}
    for workload in ("data", "uniform"):
        reports[workload] = evaluate_st(pts, region, STEvalConfig(
            mechanisms=["identity3d"], epsilons=[1.0], window_start_s=start, window_end_s=start + 6 * 86400,
            slot_seconds=86400, n_queries=50, hotspot_queries=200, hotspot_grid=64, hotspot_thresholds=(1.0,),
            hotspot_extent_m=1000.0, forecast_queries=3, mechanism_params={"identity3d": {"grid_size": 32}},
            workload=workload))
    data, uniform = reports["data"]["reference_report_nothing"], reports["uniform"]["reference_report_nothing"]
    assert data["hotspot_regret"] == 1.0 and data["hotspot_distance_error"] == 1000.0
    assert uniform["hotspot_regret"] < 0.9
    assert reports["data"]["workload"]["centres"] == "data"
    assert len(reports["data"]["reference_answer_zero"]) == 2
    assert "report no hotspot" in format_st_table(reports["data"])
