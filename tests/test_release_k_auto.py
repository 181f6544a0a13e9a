"""`--max-points-per-user auto`: the plan chooses k before the charge from the newest published release
of the region (its noisy contribution profile and map), never from the run's own data; a first release
takes the default k and says so; the manifest records the choice (tasks/release_k.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

OPTS = ["--city", "new-york", "--epsilon", "4", "--mechanism", "identity", "--param", "cell_width_m=1000"]


@pytest.fixture(scope="module")
def light_and_heavy(tmp_path_factory):
    """The same 32,000 check-ins twice: 3 points per person, and 100–400 points per person."""
    folder = tmp_path_factory.mktemp("k-auto")
    points = generate_checkins(city_region("new-york"), n_users=3000, days=4, seed=5).sample(frac=1, random_state=1)
    n = len(points)
    sizes = np.random.default_rng(0).integers(100, 400, n // 100 + 1)
    out = []
    for name, user in (("light", np.arange(n) // 3), ("heavy", np.repeat(np.arange(sizes.size), sizes)[:n])):
        path = folder / f"{name}.parquet"
        pd.DataFrame({**{c: points[c].to_numpy() for c in ("timestamp", "lat", "lon")},
                      "user_id": user.astype(str)}).to_parquet(path)
        out.append(path)
    return out


def _manifest(store, period: str) -> dict:
    return json.loads(next(store.rglob(f"{period}/v1/_MANIFEST.json")).read_text())


@pytest.fixture(scope="module")
def released(light_and_heavy, tmp_path_factory) -> dict:
    """Per data: its store, the first release's manifest, and the next day's text and manifest, both
    released with k = auto (seeded noise, so the test is deterministic; --publish-anyway: these tests are
    about k, not the plan's verdict)."""
    out = {}
    for data in light_and_heavy:
        store = tmp_path_factory.mktemp(data.stem)
        first, second = (run_geodp("release", "run", data, *OPTS, "--max-points-per-user", "auto", "--period", day,
                                   "--out", store, "--publish-anyway", "--seed", "3") for day in ("2024-01-01", "2024-01-02"))
        out[data.stem] = {"data": data, "store": store, "first_text": first.stdout,
                          "first": _manifest(store, "2024-01-01"), "text": second.stdout,
                          "second": _manifest(store, "2024-01-02")}
    return out


@pytest.mark.slow
def test_auto_k_follows_the_published_profile_and_the_manifest_records_it(released):
    for r in released.values():
        assert "k = 20, the default: nothing public to choose it from" in r["first_text"]
        assert r["first"]["quality"]["plan"]["k_choice"]["chosen_by"] == "default"
        assert r["first"]["max_points_per_user"] == 20  # the first release: the stated default
        choice = r["second"]["quality"]["plan"]["k_choice"]
        assert choice["chosen_by"] == "auto" and "2024-01-01/v1" in choice["regions"][0]["basis"]
        assert r["second"]["max_points_per_user"] == choice["k"]
        assert f"k = {choice['k']}, chosen from the release" in r["text"] and "2024-01-01/v1" in r["text"]
    k = {name: r["second"]["max_points_per_user"] for name, r in released.items()}
    # 3 points each: a small k keeps them all with little noise; 100–400 each: a small k keeps a sliver
    assert k["light"] <= 10 and k["heavy"] >= 50


def test_auto_k_reads_only_the_published_release(released):
    """The heavy file planned under the light dataset gets the light file's choice: the choice reads the
    newest published release only, never the run's own data."""
    light, heavy = released["light"], released["heavy"]
    choices = []
    for data in (light["data"], heavy["data"]):
        (row,) = json.loads(run_geodp("release", "plan", data, *OPTS, "--max-points-per-user", "auto", "--dataset",
                                      "light", "--period", "2024-01-03", "--seed", "3", "--out", light["store"],
                                      "--json").stdout)
        choices.append(row["k_choice"])
    assert choices[0] == choices[1] and choices[0]["chosen_by"] == "auto"
    assert "light/new-york/2024-01-02/v1" in choices[0]["statement"] and choices[0]["k"] <= 10


def test_auto_k_needs_a_policy_that_lets_releases_choose(light_and_heavy, tmp_path):
    light = light_and_heavy[0]
    run_geodp("dataset", "create", tmp_path, "light", "--source", light, "--budget", "10",
              "--max-points-per-user", "20")
    refused = run_geodp("release", "plan", light, *OPTS, "--max-points-per-user", "auto", "--out", tmp_path, ok=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "k = auto needs a policy" in refused.stderr
    run_geodp("dataset", "policy", tmp_path, "light", "--max-points-per-user", "auto", "--reason", "per-release k")
    (row,) = json.loads(run_geodp("release", "plan", light, *OPTS, "--max-points-per-user", "auto", "--out", tmp_path,
                                  "--json").stdout)
    assert row["k_choice"]["chosen_by"] == "default"
    over = run_geodp("release", "plan", light, *OPTS, "--max-points-per-user", "500", "--out", tmp_path, ok=False)
    assert over.returncode == 2 and "choose k up to 200" in over.stderr


def test_the_toml_says_k_auto_for_the_nightly_and_its_policy(light_and_heavy, tmp_path):
    light = light_and_heavy[0]
    config = tmp_path / "geodp.toml"
    config.write_text(f'[nightly.release]\ndata = "{light}"\ncities = ["new-york"]\nepsilon = 4\n'
                      'max_points_per_user = "auto"\n\n[nightly.policy]\nbudget = 10\nmax_points_per_user = "auto"\n')
    (row,) = json.loads(run_geodp("release", "plan", light, *OPTS, "--config", config, "--out", tmp_path / "s",
                                  "--json").stdout)  # no --max-points-per-user: the declared policy's auto
    assert row["k_choice"]["chosen_by"] == "default" and row["k_choice"]["k"] == 20
