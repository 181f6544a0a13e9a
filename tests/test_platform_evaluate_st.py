"""The `evaluate` flow's spatio-temporal part and training curves, on a real Prefect server (session
harness) and the session's one-worker Dask LocalCluster (tests/conftest.py: dask_cluster;
tests/test_platform_serve.py runs the evaluate flow on a cluster of its own): rows per city × mechanism × ε, operator artifacts read
back from the Prefect API (released vs true slots, forecast plots, SNH training curves), images in output_dir."""

import base64
import json
import re
import uuid

import numpy as np
import pandas as pd
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from flows.release_summary import artifact_key as _artifact_key
from tasks.config import ConfigError, EvaluateParams, STEvaluateOptions

DASK_WORKERS = 1  # the session's one-worker cluster (tests/conftest.py): these flows need no second worker
CITIES = ["new-york", "boston"]
SMALL_VDR = {"grid_size": 32, "steps": 25, "batch_size": 4, "crop": 32, "hidden": 8, "n_codes": 16}
PNG_URI = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


@pytest.fixture(scope="module")
def two_city_file(tmp_path_factory):
    """Synthetic check-ins in two catalog cities (disjoint users), 8 days."""
    frames = []
    for i, city in enumerate(CITIES):
        df = generate_checkins(city_region(city), n_users=300, start="2024-01-01", days=8, seed=11 + i)
        df["user_id"] = df["user_id"] + i * 1_000_000
        frames.append(df)
    p = tmp_path_factory.mktemp("data") / "two_cities.parquet"
    pd.concat(frames, ignore_index=True).to_parquet(p)
    return p


def _artifacts(flow_run_id: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[uuid.UUID(flow_run_id)])))


def _pngs(markdown: str) -> list[bytes]:
    out = [base64.b64decode(m) for m in PNG_URI.findall(markdown)]
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in out)
    return out


@pytest.mark.slow
def test_spatio_temporal_evaluation_two_cities_rows_and_artifacts(prefect_harness, dask_cluster, two_city_file,
                                                                  tmp_path):
    from flows.evaluate_flow import run_evaluate

    st = STEvaluateOptions(window="2024-01-01/2024-01-09", slot="1d", mechanisms=["identity3d", "vdr"],
                           epsilons=[0.5, 2.0], max_points_per_user=20, queries=100, hotspot_queries=40,
                           hotspot_extent_km=3, hotspot_grid=32, forecast_queries=4, image_slots=3, forecast_plots=2)
    out_dir = tmp_path / "eval-out"
    out = run_evaluate(EvaluateParams(
        data=str(two_city_file), cities=CITIES, mechanisms=[], spatio_temporal=st, dask_address=dask_cluster,
        mechanism_params={"vdr": SMALL_VDR, "identity3d": {"grid_size": 32}}, output_dir=str(out_dir)))
    rep = out["spatio_temporal"]
    assert set(rep["cities"]) == set(CITIES) and rep["drawn_epsilon"] == 0.5
    for city in CITIES:
        c = rep["cities"][city]
        assert c["window"]["n_slots"] == 8 and c["n_points"] > 0
        assert {(r["mechanism"], r["epsilon"]) for r in c["results"]} == {
            (m, e) for m in ("identity3d", "vdr") for e in (0.5, 2.0)}
        for r in c["results"]:  # dpcore.evaluation.spatiotemporal's key names
            for key in ("mean_relative_error", "hotspot_distance_error", "hotspot_regret", "forecast_smape"):
                assert np.isfinite(r[key]) and r[key] >= 0, key
        # vdr reports its VQ-VAE loss every 25 steps while training: a curve per (mechanism, ε) fit
        assert {(t["mechanism"], t["epsilon"]) for t in c["training"]} == {("vdr", 0.5), ("vdr", 2.0)}
        assert all(t["steps"] == [25] and all(np.isfinite(t["losses"])) for t in c["training"])
    # the two cities differ: the rows are not one city's copied
    assert rep["cities"]["new-york"]["n_points"] != rep["cities"]["boston"]["n_points"]

    arts = {a.key: a for a in _artifacts(out["flow_run_id"])}
    for city in CITIES:
        md = arts[_artifact_key(f"evaluate-st-{city}-{out['data_version']}-images")]
        assert md.type == "markdown" and "OPERATOR ONLY" in md.data and "TRUE counts" in md.data
        # per mechanism at the drawn ε: one slot image set and one forecast plot; plus the vdr curve
        assert md.data.count("true vs released slots") == 2 and md.data.count("forecasts](") == 2
        assert len(_pngs(md.data)) == 5
        table = arts[_artifact_key(f"evaluate-st-{city}-{out['data_version']}")]
        assert table.type == "table" and "hotspot regret" in table.data
    written = {p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*.png")}
    assert written == {f"{c}/{m}-eps0.5-{kind}.png" for c in CITIES for m in ("identity3d", "vdr")
                       for kind in ("slots", "forecast")} | {f"{c}/st-training.png" for c in CITIES}
    assert (out_dir / "evaluate.json").exists()


def test_snh_evaluation_has_a_training_curve_artifact(prefect_harness, dask_cluster, two_city_file):
    from flows.evaluate_flow import run_evaluate

    snh = {"cell_width_m": 1000, "hidden": 8, "depth": 2, "max_epochs": 4, "patience": 10,
           "samples_per_epoch": 2048, "n_sizes": 2}
    out = run_evaluate(EvaluateParams(data=str(two_city_file), cities=["new-york"], mechanisms=["identity", "snh"],
                                      epsilons=[0.5, 2.0], queries=100, trials=1, query_sides_m=[(1000, 5000)],
                                      mechanism_params={"snh": snh}, dask_address=dask_cluster))
    assert {(r["mechanism"], r["epsilon"]) for r in out["results"]} == {
        (m, e) for m in ("identity", "snh") for e in (0.5, 2.0)}
    # user-level: the SNH synopsis is wrapped by the N/n̂ scaling and its losses still come through
    curves = out["training"]
    assert {(c["mechanism"], c["epsilon"]) for c in curves} == {("snh", 0.5), ("snh", 2.0)}
    assert all(1 <= len(c["losses"]) <= 4 and all(np.isfinite(c["losses"])) for c in curves)
    arts = {a.key: a for a in _artifacts(out["flow_run_id"])}
    md = arts[_artifact_key(f"evaluate-training-{out['data_version']}")]
    assert "## new-york · snh" in md.data and "· identity" not in md.data  # identity trains nothing
    assert len(_pngs(md.data)) == 1
    # The answer-0 reference is in the table artifact once per band, with the value the summary carries.
    table = json.loads(arts[_artifact_key(f"evaluate-{out['data_version']}")].data)
    refs = [r for r in table if r["mechanism"] == "answer 0 (reference)"]
    (expected,) = out["cities"]["new-york"]["reference_answer_zero"]
    assert len(refs) == 1 and refs[0]["query sides (m)"] == "1000-5000"
    assert refs[0]["mean rel. error"] == pytest.approx(expected["mean_relative_error"], abs=1e-4)
    # the hindsight grid: one row per (ε, band), the same in every task, with the summary's values
    grids = [r for r in table if r["mechanism"].startswith("hindsight grid")]
    expected_grids = out["cities"]["new-york"]["reference_hindsight_grid"]
    assert [(r["ε"], r["mean rel. error"]) for r in grids] == [
        (g["epsilon"], round(g["mean_relative_error"], 4)) for g in expected_grids]
    assert [g["epsilon"] for g in expected_grids] == [0.5, 2.0] and all("NOT DP" in r["mechanism"] for r in grids)
    assert len(table) == len(out["results"]) + 1 + 2
    summary_md = arts[_artifact_key(f"evaluate-summary-{out['data_version']}")].data
    assert "answering 0 to every query" in summary_md and len(_pngs(summary_md)) == 1


def test_params_validation_and_store_refusal(tmp_path):
    from flows.evaluate_flow import check_output_dir
    from tasks.storage.store import ReleaseStore

    with pytest.raises(ValueError, match="nothing to evaluate"):
        EvaluateParams(data="x", cities=["boston"], mechanisms=[])
    with pytest.raises(ValueError, match="window"):
        STEvaluateOptions(window="2024-01-09/2024-01-01")
    assert STEvaluateOptions(window="2024-01-01/2024-01-09", epsilons=[1, 0.2]).drawn_epsilon() == 0.2
    store = ReleaseStore(str(tmp_path / "store"))
    store.instance_id()  # a store marks its root once it is used
    with pytest.raises(ConfigError, match="release store"):
        check_output_dir(str(tmp_path / "store" / "images"))
    assert check_output_dir(str(tmp_path / "images")) == (tmp_path / "images").resolve()


@pytest.mark.slow
def test_cli_flow_forms(prefect_harness, dask_cluster, two_city_file, tmp_path):
    """`geodp evaluate-st --flow` and `geodp evaluate --flow` as a user types them (the subprocess
    reports to the session's Prefect server through PREFECT_API_URL)."""

    from tests.cli_runner import run_geodp

    out, images = tmp_path / "st.json", tmp_path / "images"
    r = run_geodp("evaluate-st", two_city_file, "--city", "new-york,boston", "--window", "2024-01-01/2024-01-09",
                  "--slot", "1d", "--epsilon", "1", "--mechanisms", "identity3d", "--queries", "50",
                  "--hotspot-queries", "20", "--forecast-queries", "2", "--max-points-per-user", "20",
                  "--param", "identity3d.grid_size=32", "--flow", "--dask-address", dask_cluster, "--artifacts-dir",
                  images,
                  "--json", out)
    assert "== new-york" in r.stdout and "== boston" in r.stdout
    rep = json.loads(out.read_text())
    assert {(row["city"], row["mechanism"], row["epsilon"]) for row in rep["results"]} == {
        ("new-york", "identity3d", 1.0), ("boston", "identity3d", 1.0)}
    assert rep["window"]["n_slots"] == 8 and set(rep["cities"]) == {"new-york", "boston"}
    assert sorted(p.name for p in images.rglob("*.png")) == ["identity3d-eps1-forecast.png"] * 2 + [
        "identity3d-eps1-slots.png"] * 2

    out2 = tmp_path / "eval.json"
    r = run_geodp("evaluate", two_city_file, "--city", "boston", "--mechanisms", "identity", "--epsilon", "1",
                  "--queries", "50", "--trials", "1", "--query-sides-m", "1000:5000", "--flow", "--dask-address",
                  dask_cluster,
                  "--json", out2)
    assert "== boston" in r.stdout and "identity" in r.stdout
    assert [(row["city"], row["mechanism"]) for row in json.loads(out2.read_text())["results"]] == [
        ("boston", "identity")]

    bad = run_geodp("evaluate-st", two_city_file, "--center", "40.7,-74.0", "--window", "2024-01-01/2024-01-09",
                    "--mechanisms", "identity3d", "--flow", "--json", tmp_path / "x.json", ok=False)
    assert bad.returncode == 2 and "--flow needs catalog cities" in bad.stderr
    bad = run_geodp("evaluate-st", two_city_file, "--city", "boston", "--window", "2024-01-01/2024-01-09",
                    "--mechanisms", "vdr", "--param", "vdr.bogus=1", "--flow", "--json", tmp_path / "x.json", ok=False)
    assert bad.returncode == 2 and "bogus" in bad.stderr and "Traceback" not in bad.stderr


def test_served_evaluate_deployment_takes_the_spatio_temporal_form():
    from flows.serve import build_deployments
    from tasks.settings import PlatformSettings

    deps = {d.name: d for d in build_deployments(PlatformSettings())}
    schema = deps["evaluate"]._parameter_openapi_schema
    props = schema.definitions["EvaluateParams"]["properties"]
    assert {"spatio_temporal", "mechanism_params", "output_dir"} <= set(props)
    st = schema.definitions["STEvaluateOptions"]
    assert "window" in st["required"] and st["properties"]["slot"]["default"] == "1d"


def test_on_fit_hooks_see_every_fit_and_consistent_truth():
    """The dpcore hooks: called once per (mechanism, ε, trial) with the released synopsis; the
    spatio-temporal diagnostics' truth agrees with itself (grid vs whole-region series) and with n."""
    from dpcore.data.points import validate_frame
    from dpcore.evaluation.range import EvalConfig, evaluate
    from dpcore.evaluation.spatiotemporal import STEvalConfig, evaluate_st

    region = city_region("boston")
    df = generate_checkins(region, n_users=200, start="2024-01-01", days=6, seed=3)
    pts, _ = validate_frame(df)
    seen = []
    evaluate(pts, region, EvalConfig(mechanisms=["identity"], epsilons=[0.5, 1.0], trials=2, n_queries=20,
                                     query_sides_m=[(1000, 2000)]),
             on_fit=lambda m, e, t, syn: seen.append((m, e, t, float(syn.answer(np.array([region.bounds_m]))[0]))))
    assert [s[:3] for s in seen] == [("identity", e, t) for e in (0.5, 1.0) for t in (0, 1)]
    diags = []
    start = int(pd.Timestamp("2024-01-01", tz="UTC").timestamp())
    rep = evaluate_st(pts, region, STEvalConfig(mechanisms=["identity3d"], epsilons=[1.0], window_start_s=start,
                                                window_end_s=start + 6 * 86400, slot_seconds=86400, n_queries=20,
                                                hotspot_queries=10, hotspot_grid=16, forecast_queries=3,
                                                mechanism_params={"identity3d": {"grid_size": 16}}),
                      on_fit=diags.append)
    (d,) = diags
    assert d.mechanism == "identity3d" and d.true_grid.shape == d.released_grid.shape == (16, 16, 6)
    assert d.true_grid.sum() == rep["n_points"]
    np.testing.assert_allclose(d.forecast_truth[0], d.true_grid.sum(axis=(0, 1)))
    assert d.forecast.shape == (3, d.horizon) and d.forecast_released.shape == (3, 6)


def test_image_blocks_keep_every_count():
    from tasks.evaluate_tasks import block_sum_xy

    g = np.random.default_rng(0).integers(0, 9, (10, 7, 3)).astype(float)
    b = block_sum_xy(g, 4)  # factor 3: 10 → 4 blocks (zero-padded), 7 → 3
    assert b.shape == (4, 3, 3)
    brute = np.array([[[g[3 * i:3 * i + 3, 3 * j:3 * j + 3, s].sum() for s in range(3)] for j in range(3)]
                      for i in range(4)])
    np.testing.assert_array_equal(b, brute)
    np.testing.assert_array_equal(block_sum_xy(g, 16), g)


def test_image_epsilon_must_be_evaluated():
    assert STEvaluateOptions(window="2024-01-01/2024-01-09", epsilons=[0.5, 1], image_epsilon=1).drawn_epsilon() == 1
    with pytest.raises(ValueError, match="image_epsilon"):
        STEvaluateOptions(window="2024-01-01/2024-01-09", epsilons=[0.5, 1], image_epsilon=0.2)


def test_forward_logs_restores_the_library_logger():
    import logging

    from tasks.evaluate_tasks import forward_logs

    got = []

    class Target:
        def log(self, level, msg):
            got.append((level, msg))

    lib = logging.getLogger("dpcore.test_forward")
    before = (lib.level, lib.propagate, list(lib.handlers))
    with forward_logs("dpcore.test_forward", Target()):
        lib.info("epoch %d", 3)
    lib.info("after")
    assert got == [(logging.INFO, "epoch 3")]
    assert (lib.level, lib.propagate, list(lib.handlers)) == before
