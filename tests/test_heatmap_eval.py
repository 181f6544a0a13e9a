"""The heatmap evaluation harness and the `geodp evaluate-heatmap` / `geodp sparse1d` commands."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dpcore.data.points import validate_frame
from dpcore.data.synthetic import generate_checkins
from dpcore.evaluation.heatmap import (
    HeatmapEvalConfig,
    HeatmapEvalError,
    evaluate_heatmap,
    parse_mechanism_spec,
)
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

REGION = city_region("new-york")
KEYS = {"mechanism", "epsilon", "resolution", "users", "emd", "kl", "pearson", "trials"}


@pytest.fixture(scope="module")
def synth_frame() -> pd.DataFrame:
    return generate_checkins(REGION, n_users=400, days=7, seed=11)


def test_mechanism_spec_parsing():
    assert parse_mechanism_spec("laplace-top:top_percent=0.05") == ("laplace-top:top_percent=0.05", "laplace-top",
                                                                   {"top_percent": 0.05})
    assert parse_mechanism_spec("dpheatmap:w=50:level_split=uniform")[2] == {"w": 50, "level_split": "uniform"}
    with pytest.raises(HeatmapEvalError):
        parse_mechanism_spec("laplace-top:oops")


def test_harness_sweeps_and_dpheatmap_beats_laplace(synth_frame):
    pts, _ = validate_frame(synth_frame)
    cfg = HeatmapEvalConfig(mechanisms=["dpheatmap", "laplace", "laplace-top:top_percent=1"], epsilons=[1.0],
                            resolutions=[32, 64], users=[150], trials=2, seed=0)
    seen = []
    report = evaluate_heatmap(pts, REGION, cfg, progress=lambda d, t, w: seen.append((d, t)))
    assert seen[-1] == (12, 12)
    res = report["results"]
    assert len(res) == 3 * 2
    assert all(KEYS <= set(r) and r["trials"] == 2 and r["users"] == 150 for r in res)
    by = {(r["mechanism"], r["resolution"]): r for r in res}
    for d in (32, 64):
        assert by[("dpheatmap", d)]["emd"] < by[("laplace", d)]["emd"]
        assert -1 <= by[("dpheatmap", d)]["pearson"] <= 1 and by[("dpheatmap", d)]["kl"] >= 0


def test_harness_refuses_more_users_than_the_region_has(synth_frame):
    pts, _ = validate_frame(synth_frame)
    with pytest.raises(HeatmapEvalError, match="only"):
        evaluate_heatmap(pts, REGION, HeatmapEvalConfig(users=[10_000], resolutions=[16], epsilons=[1.0], trials=1))


def geodp(*args):
    return run_geodp(*args, ok=False)


def test_cli_evaluate_heatmap_writes_the_json_schema_and_a_png(synth_frame, tmp_path):
    data = tmp_path / "c.parquet"
    synth_frame.to_parquet(data)
    out, png = tmp_path / "h.json", tmp_path / "h.png"
    proc = geodp("evaluate-heatmap", data, "--city", "new-york", "--resolution", "32", "--epsilon", "1,5",
                 "--users", "50", "--mechanisms", "dpheatmap,laplace,laplace-top", "--trials", "1",
                 "--json", out, "--render", png)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert len(report["results"]) == 6 and all(KEYS <= set(r) for r in report["results"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "dpheatmap" in proc.stdout
    bad = geodp("evaluate-heatmap", data, "--city", "new-york", "--resolution", "30", "--epsilon", "1",
                "--users", "50", "--mechanisms", "dpheatmap", "--trials", "1", "--json", tmp_path / "x.json")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error:")
    assert "Traceback" not in bad.stderr


def test_cli_sparse1d_thresholding_beats_laplace(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    venues = rng.zipf(1.6, n) % 50_000
    pd.DataFrame({"user_id": rng.integers(0, 600, n), "location_id": venues}).to_csv(tmp_path / "v.csv", index=False)
    out = tmp_path / "s.json"
    proc = geodp("sparse1d", tmp_path / "v.csv", "--domain-size", 50_000, "--epsilon", "1", "--trials", "1",
                 "--max-points-per-user", 5, "--json", out)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["results"][0]
    assert row["threshold"] < row["laplace"] / 5
