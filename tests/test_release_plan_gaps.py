"""The plan where it used to say nothing (tasks/release_usefulness.py): a ρ-zCDP release's discrete
Gaussian noise gets its expected error per band and the same refusal as an ε release; a first release,
a heatmap and a spatio-temporal release get no verdict, and say why on the terminal and in the
manifest's quality.plan."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from dpcore.privacy.noise import discrete_gaussian_variance
from dpcore.synopsis.expected_error import HALF_NORMAL
from tests.cli_runner import run_geodp

RHO = ["--city", "new-york", "--mechanism", "identity", "--param", "cell_width_m=1000", "--max-points-per-user", "20"]


@pytest.fixture(scope="module")
def checkins(tmp_path_factory):
    path = tmp_path_factory.mktemp("gaps") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=3000, days=4, seed=5).to_parquet(path)
    return path


def _plan(store, period: str) -> dict:
    return json.loads(next(store.rglob(f"{period}/v1/_MANIFEST.json")).read_text())["quality"]["plan"]


def test_a_rho_release_is_planned_from_its_gaussian_noise_and_refused_when_hopeless(checkins, tmp_path):
    store = tmp_path / "s"
    run_geodp("dataset", "create", store, "checkins", "--source", checkins, "--accounting", "zcdp", "--budget", "5",
              "--max-points-per-user", "20")
    first = run_geodp("release", "run", checkins, *RHO, "--rho", "0.5", "--period", "2024-01-01", "--out", store)
    assert "plan: no verdict: no release of checkins/new-york at user level is published yet" in first.stdout
    assert _plan(store, "2024-01-01")["statement"].startswith("no verdict: no release")

    (row,) = json.loads(run_geodp("release", "plan", checkins, *RHO, "--rho", "0.5", "--period", "2024-01-02",
                                  "--out", store, "--json").stdout)
    assert row["bands"] and "2024-01-01/v1" in row["basis"]
    # k = 20, ρ = 0.5: σ² = k²/(2ρ) per 1 km cell; a 1–5 km square spans ~3 cells a side; a ρ release
    # answers bounded counts, so nothing else is added
    (wide,) = [b for b in row["bands"] if b["query_sides_m"] == [1000.0, 5000.0]]
    assert wide["expected_abs_error"] == pytest.approx(HALF_NORMAL * np.sqrt(discrete_gaussian_variance(400.0)) * 3)

    ledger = json.loads(run_geodp("ledger", store, "--json").stdout)[0]["loss"]["lifetime"]
    refused = run_geodp("release", "run", checkins, *RHO, "--rho", "1e-5", "--period", "2024-01-02", "--out", store,
                        ok=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "would help: ρ" in refused.stderr
    assert json.loads(run_geodp("ledger", store, "--json").stdout)[0]["loss"]["lifetime"] == ledger


@pytest.mark.parametrize(("mechanism", "extra", "why"), [
    ("dpheatmap", [], "no verdict: a heatmap releases each person's mass"),
    ("identity3d", ["--param", "resolution=rule", "--period", "2024-01-01..2024-01-04", "--slot", "1d"],
     "no verdict: the plan predicts 2-D counts per band; a spatio-temporal release"),
])
def test_heatmaps_and_spatio_temporal_releases_say_the_plan_has_no_verdict(checkins, tmp_path, mechanism, extra, why):
    store = tmp_path / "s"
    text = run_geodp("release", "run", checkins, "--city", "new-york", "--epsilon", "1", "--mechanism", mechanism,
                     *extra, "--max-points-per-user", "20", "--seed", "1", "--out", store).stdout
    assert f"plan: {why}" in text
    plan = json.loads(next(store.rglob("v1/_MANIFEST.json")).read_text())["quality"]["plan"]
    assert plan["statement"].startswith(why) and plan["bands"] == []


def test_a_noise_made_heavy_bucket_in_the_profile_neither_scales_the_answers_nor_refuses_the_next_release(
        tmp_path):
    """300 people: with --seed 115 the first release's profile shows a bucket of 2^15 points per person
    that noise alone lifted over the visibility threshold (1/κ̂ ≈ 1,260: answers ×1,000 the truth), and
    the next release was refused as 27 times worse than a blank map. The buckets just below it look
    empty, so the estimates leave it out (ContributionProfile.visible_top): the answers are full counts
    and the next release gets a verdict."""
    data = tmp_path / "small.parquet"
    points = generate_checkins(city_region("new-york"), n_users=300, days=4, seed=5)
    points.to_parquet(data)
    args = ["--city", "new-york", "--epsilon", "1", "--mechanism", "identity", "--param", "cell_width_m=1000",
            "--max-points-per-user", "20", "--seed", "115", "--out", tmp_path / "s"]
    run_geodp("release", "run", data, *args)
    basis = json.loads(next((tmp_path / "s").rglob("all/v1/*/synopsis.json")).read_text())
    assert basis["extra"]["profile"]["noisy_counts"][15] > 50  # the profile this test is about
    box = (points.lat.min(), points.lon.min(), points.lat.max(), points.lon.max())
    release = next((tmp_path / "s").rglob("all/v1/_MANIFEST.json")).parent
    (row,) = json.loads(run_geodp("query", "range", release, "--box", ",".join(f"{v:.6f}" for v in box),
                                  "--json").stdout)
    assert 0.5 * len(points) < row["estimate"] < 2 * len(points)
    text = run_geodp("release", "run", data, *args, "--period", "2024-01-02").stdout
    assert "release written" in text
    plan = _plan(tmp_path / "s", "2024-01-02")
    assert not plan["published_anyway"] and plan["bands"]
    assert not any(b.get("verdict_open") for b in plan["bands"]) and not all(b["hopeless"] for b in plan["bands"])
