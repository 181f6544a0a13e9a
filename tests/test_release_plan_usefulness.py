"""`geodp release plan` and the same check at the start of every release: a release expected to be worse
than a blank map at every band is refused before anything is charged, with what would make it useful;
--publish-anyway publishes it and the manifest records that (tasks/release_usefulness.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.profile import noisy_profile, profile_counts
from dpcore.synopsis.expected_error import PlanInputs, expected_errors, useless, what_would_help
from tests.cli_runner import run_geodp

OPTS = ["--city", "new-york", "--mechanism", "identity", "--param", "cell_width_m=100", "--max-points-per-user", "20"]


def _loss(store) -> tuple[float, int]:
    (row,) = json.loads(run_geodp("ledger", store, "--json").stdout)
    return row["loss"]["lifetime"], row["charges"]


@pytest.mark.slow
def test_a_hopeless_release_is_refused_before_its_charge_and_published_anyway_on_request(gowalla_nyc_path, tmp_path):
    store = tmp_path / "store"
    run_geodp("release", "run", gowalla_nyc_path, *OPTS, "--epsilon", "1", "--out", store)  # the public basis
    before = _loss(store)

    good = run_geodp("release", "plan", gowalla_nyc_path, *OPTS, "--epsilon", "2", "--out", store, "--json")
    (row,) = json.loads(good.stdout)
    assert row["bands"] and not row["useless"] and "v1" in row["basis"]
    bad = run_geodp("release", "plan", gowalla_nyc_path, *OPTS, "--epsilon", "0.02", "--out", store, ok=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "would help: ε" in bad.stderr

    refused = run_geodp("release", "run", gowalla_nyc_path, *OPTS, "--epsilon", "0.02", "--out", store, ok=False)
    assert refused.returncode == 2 and refused.stderr.startswith("error:") and refused.stderr.count("\n") == 1
    assert "blank map" in refused.stderr and "would help" in refused.stderr
    assert _loss(store) == before  # nothing charged

    run_geodp("release", "run", gowalla_nyc_path, *OPTS, "--epsilon", "0.02", "--out", store, "--publish-anyway")
    assert _loss(store)[0] > before[0]
    manifest = json.loads(next(store.rglob("v2/_MANIFEST.json")).read_text())
    plan = manifest["quality"]["plan"]
    known = [b for b in plan["bands"] if b["typical_count"] is not None]  # a band the basis's noise hides: none
    assert plan["published_anyway"] is True and known and all(b["worse_than_blank_map"] for b in known)


def test_what_would_help_makes_the_expected_error_beat_a_blank_map() -> None:
    rng = np.random.default_rng(0)
    n = np.minimum(np.floor(rng.pareto(1.2, 5000) * 3 + 1), 3000).astype(np.int64)
    profile = noisy_profile(profile_counts(n), 0.1, NoiseSource.seeded(1))
    typical = np.array([5.0, 150.0, 2000.0])
    hopeless = PlanInputs(epsilon=0.01, k=20, cell_width_m=100.0)
    rows = expected_errors(hopeless, typical, profile)
    assert useless(rows)
    helps = what_would_help(hopeless, typical, profile)
    eps = [float(h.split()[2]) for h in helps if h.startswith("ε ≥")]
    assert eps and not useless(expected_errors(PlanInputs(epsilon=eps[0], k=20, cell_width_m=100.0), typical, profile))
    assert useless(expected_errors(PlanInputs(epsilon=eps[0] / 2, k=20, cell_width_m=100.0), typical, profile))


def test_slots_the_paid_n_hat_shows_mostly_noise_are_stated_on_the_terminal_and_in_the_summary(gowalla_nyc_path,
                                                                                               tmp_path):
    """identity3d's resolution rule merged 21 daily slots into one silently (the manifest's notes only); it
    now keeps them, and says on the terminal and in the summary when its paid n̂ shows them mostly noise."""
    args = ["release", "run", gowalla_nyc_path, "--city", "new-york", "--epsilon", "0.2", "--mechanism", "identity3d",
            "--param", "resolution=rule", "--period", "2010-05-01..2010-05-21", "--slot", "1d",
            "--max-points-per-user", "20", "--seed", "1"]
    text = run_geodp(*args, "--out", tmp_path / "a").stdout
    assert "warning: slots kept as asked, but the paid n̂ carries about" in text
    (row,) = json.loads(run_geodp(*args, "--out", tmp_path / "b", "--json").stdout)["releases"]
    assert row["slot_warnings"] and "of the 21 (per-slot signal" in row["slot_warnings"][0]
