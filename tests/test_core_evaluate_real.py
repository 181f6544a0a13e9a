"""The evaluation harness on real public check-ins (Gowalla NYC): sensible, budget-monotone errors."""

import numpy as np
import pytest

from dpcore.data.points import load_points
from dpcore.evaluation.range import EvalConfig, evaluate
from dpcore.geo import city_region


@pytest.fixture(scope="module")
def nyc_points(gowalla_nyc_path):
    return load_points(gowalla_nyc_path).points


@pytest.mark.parametrize("privacy_unit", ["record", "user"])
def test_identity_and_ug_on_gowalla_nyc(nyc_points, privacy_unit):
    cfg = EvalConfig(mechanisms=["identity", "ug"], epsilons=[0.1, 1.6], privacy_unit=privacy_unit,
                     max_points_per_user=20, query_sides_m=[(1000.0, 5000.0)], n_queries=400, trials=2, seed=1,
                     mechanism_params={"identity": {"cell_width_m": 400.0}})
    report = evaluate(nyc_points, city_region("new-york"), cfg)
    assert 110_000 < report["n_points"] < 120_000 and report["privacy_unit"] == privacy_unit
    err = {(r["mechanism"], r["epsilon"]): r["mean_relative_error"] for r in report["results"]}
    for mech in ("identity", "ug"):
        assert np.isfinite(err[(mech, 0.1)]) and np.isfinite(err[(mech, 1.6)])
        assert err[(mech, 1.6)] < err[(mech, 0.1)]
    # Large queries on 115k check-ins at ε = 1.6 must be accurate to within tens of percent.
    assert err[("ug", 1.6)] < (0.2 if privacy_unit == "record" else 0.6)
    if privacy_unit == "user":
        assert report["total_points_source"].startswith("public input")
    # The answer-0 reference: t / max(t, ψ) per query, so in (0, 1]; a good release must beat it.
    (ref,) = report["reference_answer_zero"]
    assert ref["query_sides_m"] == [1000.0, 5000.0] and 0 < ref["mean_relative_error"] <= 1
    assert err[("ug", 1.6)] < ref["mean_relative_error"]
