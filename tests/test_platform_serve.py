"""Served deployments: typed parameters, the nightly cron from the config file, and the evaluate flow."""

import pytest

from flows.serve import build_deployments
from tasks.config import ConfigError, ReleaseParams, load_platform_config, parse_period


def test_deployments_have_typed_parameters_and_nightly_cron(tmp_path):
    cfg = tmp_path / "geodp.toml"
    cfg.write_text('[nightly]\ncron = "15 3 * * *"\n[nightly.release]\ndata = "x.parquet"\ncities = ["boston"]\n'
                   'period = "yesterday"\nepsilon = 0.3\nstore = "s3://b/p"\n')
    deps = {d.name: d for d in build_deployments(load_platform_config(cfg))}
    assert set(deps) == {"release", "nightly", "backfill", "evaluate"}
    assert [s.schedule.cron for s in deps["nightly"].schedules] == ["15 3 * * *"]
    assert deps["nightly"].parameters["params"]["epsilon"] == 0.3
    schema = deps["release"]._parameter_openapi_schema
    props = schema.definitions["ReleaseParams"]["properties"]
    # ε and ρ are optional alternatives in the form; each refuses values ≤ 0
    for budget in ("epsilon", "rho"):
        (number,) = [t for t in props[budget]["anyOf"] if t.get("type") == "number"]
        assert number["exclusiveMinimum"] == 0
    assert "store" in props
    assert not deps["release"].schedules


def test_bad_config_is_a_clean_error(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[nightly.release]\ndata = "x"\nepsilon = -1\n')
    with pytest.raises(ConfigError):
        build_deployments(load_platform_config(cfg))
    with pytest.raises(ConfigError):
        load_platform_config(tmp_path / "missing.toml")


def test_periods():
    assert parse_period("2010-05-01").seconds == 86400
    assert parse_period("2010-05").label == "2010-05" and parse_period("2010-02").seconds == 28 * 86400
    p = parse_period("2010-05-01..2010-05-07")
    assert p.label == "2010-05-01_2010-05-07" and p.seconds == 7 * 86400
    assert parse_period(None).start_s is None and parse_period("yesterday").seconds == 86400
    with pytest.raises(ConfigError):
        parse_period("May 1st")
    with pytest.raises(ValueError):
        ReleaseParams(data="x", epsilon=0)


@pytest.mark.shared_data
def test_evaluate_flow_one_task_per_city_mechanism_epsilon(prefect_harness, gowalla_sample_path):
    from flows.evaluate_flow import run_evaluate
    from tasks.config import EvaluateParams

    out = run_evaluate(EvaluateParams(data=str(gowalla_sample_path), cities=["austin", "san-francisco"],
                                      mechanisms=["identity", "ug"], epsilons=[0.5, 2.0], queries=200, trials=1,
                                      query_sides_m=[(1000, 5000)], n_workers=1))
    keys = {(r["city"], r["mechanism"], r["epsilon"]) for r in out["results"]}
    assert len(keys) == 8 and len(out["results"]) == 8
    assert all(r["mean_relative_error"] >= 0 for r in out["results"])
    # more budget, less error (on average over the two mechanisms and cities)
    err = {e: sum(r["mean_relative_error"] for r in out["results"] if r["epsilon"] == e) for e in (0.5, 2.0)}
    assert err[2.0] < err[0.5]
    # each city's references travel with the flow's summary; answer 0 is wrong by ≤ 100% per query, and
    # the hindsight grid (one per ε, picked on that city's truth) differs between the cities' data
    refs = {c: out["cities"][c]["reference_answer_zero"] for c in ("austin", "san-francisco")}
    assert all(r[0]["query_sides_m"] == [1000, 5000] and 0 < r[0]["mean_relative_error"] <= 1 for r in refs.values())
    grids = {c: out["cities"][c]["reference_hindsight_grid"] for c in ("austin", "san-francisco")}
    assert all([g["epsilon"] for g in v] == [0.5, 2.0] for v in grids.values())
    assert grids["austin"] != grids["san-francisco"]
