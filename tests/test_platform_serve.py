"""Served deployments: typed parameters, the nightly cron from the config file, and the evaluate flow."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.serve import build_deployments
from tasks.config import ConfigError, ReleaseParams, parse_period
from tasks.settings import CONFIG_ENV, load_settings, packaged_config

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY = ('[nightly]\ncron = "15 3 * * *"\n[nightly.release]\ndata = "x.parquet"\ncities = ["boston"]\n'
           'period = "yesterday"\nepsilon = 0.3\nstore = "s3://b/p"\n')


def test_deployments_have_typed_parameters_and_nightly_cron(tmp_path):
    cfg = tmp_path / "geodp.toml"
    cfg.write_text(NIGHTLY)
    deps = {d.name: d for d in build_deployments(load_settings(cfg), cfg)}
    assert set(deps) == {"release", "nightly", "backfill", "evaluate"}
    assert [s.schedule.cron for s in deps["nightly"].schedules] == ["15 3 * * *"]
    assert deps["nightly"].parameters["params"]["epsilon"] == 0.3
    # every release and backfill run gets the file the serving process was started with
    for name in ("release", "nightly", "backfill"):
        assert deps[name].parameters["config_path"] == str(cfg.resolve())
    schema = deps["release"]._parameter_openapi_schema
    props = schema.definitions["ReleaseParams"]["properties"]
    # ε and ρ are optional alternatives in the form; each refuses values ≤ 0
    for budget in ("epsilon", "rho"):
        (number,) = [t for t in props[budget]["anyOf"] if t.get("type") == "number"]
        assert number["exclusiveMinimum"] == 0
    assert "store" in props
    assert not deps["release"].schedules


def _serve_exit(cfg: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "GEODP_"))}
    return subprocess.run([sys.executable, "-m", "flows.cli", "serve", "--config", str(cfg)], cwd=ROOT,
                          env={**clean, "PREFECT_HOME": str(tmp_path / "ph"), **env}, capture_output=True,
                          text=True, timeout=120)


def test_misspelled_key_is_a_one_line_error_at_start_up(tmp_path):
    cfg = tmp_path / "typo.toml"
    cfg.write_text(NIGHTLY.replace("cities =", "citys ="))
    with pytest.raises(ConfigError, match=r"nightly\.release\.citys: unknown key"):
        load_settings(cfg)
    cfg2 = tmp_path / "typo2.toml"
    cfg2.write_text("[budgets]\ndefault_cap = 1.0\n")
    with pytest.raises(ConfigError, match=r"budgets: unknown key"):
        load_settings(cfg2)
    done = _serve_exit(cfg, tmp_path, PREFECT_API_URL="http://127.0.0.1:9/api")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "citys" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("old", "new", "where"), [
    ("epsilon = 0.3", "epsilon = -1", "nightly.release.epsilon"),
    ('cron = "15 3 * * *"', 'cron = "every night"', "nightly.cron"),
    ("[nightly]", "[budget]\ndefault_cap = \"lots\"\n[nightly]", "budget.default_cap"),
])
def test_bad_value_is_a_one_line_error_at_start_up(tmp_path, old, new, where):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(NIGHTLY.replace(old, new))
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load_settings(cfg)
    done = _serve_exit(cfg, tmp_path, PREFECT_API_URL="http://127.0.0.1:9/api")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and where in done.stderr
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml")


def test_environment_overrides_and_config_discovery(tmp_path, monkeypatch):
    cfg = tmp_path / "geodp.toml"
    cfg.write_text(NIGHTLY + "[budget.caps]\ncheckins = 4.0\n")
    monkeypatch.setenv("GEODP_BUDGET__CAPS__CHECKINS", "2.5")
    monkeypatch.setenv("GEODP_NIGHTLY__RELEASE__STORE", "s3://other/prefix")
    monkeypatch.setenv("GEODP_BUDGET__DEFAULT_CAP", "3")
    s = load_settings(cfg)
    assert s.budget_cap_for("checkins") == 2.5 and s.budget_cap_for("new") == 3.0
    assert s.nightly.release.store == "s3://other/prefix" and s.nightly.release.epsilon == 0.3  # the rest stays
    # a misspelled nested environment key is refused like one in the file
    monkeypatch.setenv("GEODP_NIGHTLY__RELEASE__EPSILO", "1")
    with pytest.raises(ConfigError, match="epsilo"):
        load_settings(cfg)
    monkeypatch.delenv("GEODP_NIGHTLY__RELEASE__EPSILO")
    # no --config: GEODP_CONFIG, else the default packaged inside the `tasks` package
    monkeypatch.setenv(CONFIG_ENV, str(cfg))
    assert load_settings().nightly.release.cities == ["boston"]
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.delenv("GEODP_NIGHTLY__RELEASE__STORE")  # alone it would be a nightly without data
    assert packaged_config().parent == Path(__import__("tasks").__file__).parent
    assert load_settings().nightly is None


def test_serve_without_a_prefect_server_refuses_at_once(tmp_path):
    cfg = tmp_path / "geodp.toml"
    cfg.write_text(NIGHTLY)
    done = _serve_exit(cfg, tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "PREFECT_API_URL" in done.stderr and "prefect server start" in done.stderr


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
