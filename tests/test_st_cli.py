"""The spatio-temporal CLI as a user types it: evaluate-st, release + query --time, hotspot, forecast."""

import json

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp
from tests.test_store_faults import one_line_error

SMALL_VDR = ["--param", "vdr.grid_size=32", "--param", "vdr.steps=20", "--param", "vdr.batch_size=4",
             "--param", "vdr.crop=32", "--param", "vdr.hidden=8", "--param", "vdr.n_codes=16",
             "--param", "identity3d.grid_size=32"]


def geodp(*args, ok=True):
    return run_geodp(*args, ok=ok)


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=600, start="2024-01-01", days=14, seed=5).to_parquet(p)
    return p


def test_evaluate_st_json_schema(synth_file, tmp_path):
    out = tmp_path / "st.json"
    r = geodp("evaluate-st", synth_file, "--city", "new-york", "--window", "2024-01-01/2024-01-15", "--slot", "1d",
              "--epsilon", "0.5,1", "--mechanisms", "identity3d,vdr", "--queries", "100", "--hotspot-queries", "40",
              "--forecast-queries", "4", "--hotspot-extent-km", "3", "--json", out, *SMALL_VDR)
    assert "identity3d" in r.stdout and "vdr" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["window"]["n_slots"] == 14 and rep["window"]["slot_seconds"] == 86400
    assert rep["psi"] == pytest.approx(max(1.0, 0.001 * rep["n_points"]))
    assert rep["workloads"]["range"]["query_sides_m"] == [[100.0, 1000.0], [1000.0, 5000.0]]
    assert rep["workloads"]["hotspot"]["thresholds"] == [10.0, 20.0, 40.0]
    assert rep["workloads"]["forecast"]["horizon"] == 3  # 14 daily slots < 3 weeks: T // 4
    assert {(r["mechanism"], r["epsilon"]) for r in rep["results"]} == {
        ("identity3d", 0.5), ("identity3d", 1.0), ("vdr", 0.5), ("vdr", 1.0)}
    for res in rep["results"]:
        for key in ("mean_relative_error", "hotspot_distance_error", "hotspot_regret", "forecast_smape"):
            assert np.isfinite(res[key]) and res[key] >= 0, key
        assert [h["threshold"] for h in res["hotspot"]] == [10.0, 20.0, 40.0]
        assert 0 <= res["forecast_smape"] <= 2


def test_evaluate_st_rejects_bad_input(synth_file, tmp_path):
    bad = geodp("evaluate-st", synth_file, "--city", "new-york", "--window", "2024-01-05/2024-01-01",
                "--json", tmp_path / "x.json", ok=False)
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr
    bad = geodp("evaluate-st", synth_file, "--city", "new-york", "--window", "2024-01-01/2024-01-05",
                "--mechanisms", "identity", "--json", tmp_path / "x.json", ok=False)
    assert bad.returncode == 2 and "not spatio-temporal" in bad.stderr


def test_release_then_query_time_hotspot_forecast(synth_file, tmp_path):
    out = tmp_path / "rel"
    geodp("release", synth_file, "--city", "new-york", "--period", "2024-01-01..2024-01-14", "--epsilon", "1",
          "--mechanism", "identity3d", "--param", "grid_size=32", "--param", "clamp_negative=true",
          "--slot", "1d", "--max-points-per-user", "20", "--out", out, "--no-prefect")
    q = geodp("query", out, "--box", "40.60,-74.10,40.80,-73.90", "--time", "2024-01-03/2024-01-05", "--json")
    row = json.loads(q.stdout)[0]
    assert np.isfinite(row["estimate"])
    # clamped cells are not linear in the noise: no interval, and the answer says why
    assert row["lower"] is None and "clamped" in q.stderr
    h = geodp("hotspot", out, "--at", "40.713,-74.006", "--at", "40.75,-73.99", "--threshold", "5",
              "--extent-km", "5", "--json")
    rows = json.loads(h.stdout)
    # Both points lie in the synthetic city's dense core: a 5-point cell is within 5 km of each.
    assert [row["found"] for row in rows] == [True, True]
    for row in rows:
        assert row["released_count"] >= 5 and row["distance_m"] <= 5000
    # A threshold above the whole release's count is never met: the answer says so instead of a cell.
    never = geodp("hotspot", out, "--at", "40.713,-74.006", "--threshold", "1e12", "--extent-km", "5", "--json")
    assert [row["found"] for row in json.loads(never.stdout)] == [False]
    f = geodp("forecast", out, "--box", "40.60,-74.10,40.80,-73.90", "--horizon", "3", "--json")
    fc = json.loads(f.stdout)
    assert len(fc["forecast"]) == 3 and len(fc["history"]) == 14 and all(np.isfinite(fc["forecast"]))
    bad = geodp("hotspot", out, "--at", "nowhere", "--threshold", "5", ok=False)
    assert bad.returncode == 2 and "--at" in bad.stderr


FAST_RULE_VDR = ["--param", "steps=5", "--param", "batch_size=2", "--param", "crop=16", "--param", "hidden=8",
                 "--param", "n_codes=8", "--param", "code_dim=4"]


def test_vdr_keeps_the_asked_slots_or_refuses_them_before_the_charge(synth_file, tmp_path):
    """Issue 44: a user-level vdr release folded every daily slot into one, flat in time, without asking.
    Now a public total that cannot carry the slots is refused in one line naming a width it carries, and the
    charge is given back; slots it can carry are released one by one."""
    store = tmp_path / "store"
    common = ["release", synth_file, "--city", "new-york", "--period", "2024-01-01..2024-01-14", "--epsilon", "1",
              "--mechanism", "vdr", "--max-points-per-user", "20", "--out", store, "--no-prefect", *FAST_RULE_VDR]
    bad = geodp(*common, "--slot", "1d", "--public-total", "10000", ok=False)
    one_line_error(bad)
    # 10,000·0.95/20 = 475 carries 5 slots of the 14 days: ceil(14 / 5) = 3 days each
    assert "14 requested time slots cannot be carried" in bad.stderr and "--slot 3d or longer" in bad.stderr
    entries = [json.loads(p.read_text()) for p in sorted(store.glob("datasets/*/ledger/*.json"))]
    held = {c["key"] for e in entries if e["kind"] == "charge" for c in e["charges"]}
    given_back = {v["key"] for e in entries if e["kind"] == "void" for v in e["voids"]}
    assert held == given_back  # nothing charged
    assert not list(store.glob("releases/**/_MANIFEST.json"))  # nothing published
    geodp(*common, "--slot", "1d", "--public-total", "40000")
    f = geodp("forecast", store, "--box", "40.60,-74.10,40.80,-73.90", "--horizon", "2", "--json")
    history = json.loads(f.stdout)["history"]
    assert len(history) == 14 and len({round(v, 6) for v in history}) > 1  # 14 slots of their own, not one spread


def test_slots_a_public_total_cannot_carry_are_refused_before_the_ledger(synth_file, tmp_path):
    """Review of ec8fdf7: the refusal of slots a --public-total cannot carry came from inside the fit, after
    the ledger was charged (a charge of ε 1 and its void, 'fit failed: MechanismError'), though its inputs
    are all public and the docs say it comes before any charge. It is made with the plan now: `release plan`
    and `release run` refuse in one line and the store holds no ledger entry at all."""
    store = tmp_path / "store"
    common = [synth_file, "--city", "new-york", "--period", "2024-01-01..2024-01-14", "--epsilon", "1",
              "--max-points-per-user", "20", "--out", store, "--no-prefect", "--slot", "1d", "--public-total", "10000"]
    for mechanism, extra in (("vdr", FAST_RULE_VDR), ("identity3d", ["--param", "resolution=rule"])):
        for verb in ("plan", "run"):
            bad = geodp("release", verb, *common, "--mechanism", mechanism, *extra, ok=False)
            one_line_error(bad)
            assert "14 requested time slots cannot be carried" in bad.stderr, (mechanism, verb, bad.stderr)
        assert not list(store.glob("datasets/*/ledger/*.json")), mechanism  # nothing charged, nothing given back
        assert not list(store.glob("releases/**/_MANIFEST.json"))
