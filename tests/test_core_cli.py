"""The CLI as a user types it: release, query, evaluate, and clean errors for bad input."""

import json
import os

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp


def geodp(*args, ok=True):
    return run_geodp(*args, ok=ok)


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=800, days=14, seed=3).to_parquet(p)
    # Seeded noise is spawned from the release key, which holds the input's version (its mtime): a
    # fixed mtime keeps seeded releases of this file the same from run to run.
    os.utime(p, (1_710_000_000, 1_710_000_000))
    return p


def test_release_then_query(synth_file, tmp_path):
    out = tmp_path / "rel"
    r = geodp("release", synth_file, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
              "--param", "cell_width_m=500", "--max-points-per-user", "10", "--out", out)
    assert "release written to" in r.stdout and "geodp query" in r.stdout
    # --out DIR is a local release store (tasks/storage/store.py): DIR/releases/<dataset>/<city>/<period>/v<N>/
    (version,) = out.glob("releases/*/new-york/all/v1")
    manifest = json.loads((version / "_MANIFEST.json").read_text())
    assert manifest["epsilon"] == 1.0 and manifest["max_points_per_user"] == 10
    assert manifest["privacy_unit"] == "user" and manifest["noise_source"].startswith("secure:aes-256-ctr")
    assert sum(c["epsilon"] for c in manifest["privacy"]["charges"]) == pytest.approx(1.0)
    # every count is bounded to k = 10 per person; the contribution profile counts each person once
    assert all(c["sensitivity"] == (1 if c["name"] == "contribution_profile" else 10)
               for c in manifest["privacy"]["charges"])
    # a release scaled to full counts keeps its bounded grid under inner/
    assert {f["name"] for f in manifest["files"]} >= {"inner/grid.npz", "synopsis.json"}
    q = geodp("query", out, "--box", "40.70,-74.02,40.72,-74.00", "--json")
    est = json.loads(q.stdout)
    assert len(est) == 1 and np.isfinite(est[0]["estimate"])
    # re-running the same release is a no-op: nothing is overwritten, nothing charged twice
    again = geodp("release", synth_file, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
                  "--param", "cell_width_m=500", "--max-points-per-user", "10", "--out", out)
    assert "already committed" in again.stdout and not (version.parent / "v2").exists()
    # tampering is detected on read
    (grid,) = version.glob("*/inner/grid.npz")
    grid.write_bytes(grid.read_bytes() + b"x")
    bad = geodp("query", out, "--box", "40.70,-74.02,40.72,-74.00", ok=False)
    assert bad.returncode == 2 and "integrity" in bad.stderr


def test_boxes_csv_batch(synth_file, tmp_path):
    out = tmp_path / "rel"
    geodp("release", synth_file, "--city", "new-york", "--epsilon", "2", "--privacy-unit", "record",
          "--seed", "1", "--out", out)
    csv = tmp_path / "boxes.csv"
    csv.write_text("min_lat,min_lon,max_lat,max_lon\n40.70,-74.02,40.72,-74.00\n40.6,-74.1,40.8,-73.9\n")
    lines = geodp("query", out, "--boxes", csv).stdout.strip().splitlines()
    assert len(lines) == 2
    (manifest,) = out.glob("releases/*/new-york/all/v1/_MANIFEST.json")
    assert "NOT FOR PUBLICATION" in json.loads(manifest.read_text())["noise_source"]


@pytest.mark.parametrize("args,message", [
    (["--city", "atlantis", "--epsilon", "1"], "unknown city"),
    (["--city", "new-york", "--epsilon", "0"], "epsilon must be"),
    (["--city", "new-york", "--epsilon", "-2"], "epsilon must be"),
    (["--center", "123,5", "--epsilon", "1"], "latitude"),
    (["--city", "new-york", "--epsilon", "1", "--mechanism", "magic"], "unknown mechanism"),
])
def test_bad_release_arguments_give_clean_errors(synth_file, tmp_path, args, message):
    r = geodp("release", synth_file, *args, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("mechanism", "param", "name"), [
    ("snh", "loss=huber", "loss"),
    ("identity", "cell_width_m=[1,2]", "cell_width_m"),  # a list where a number is needed
    ("ug", "c=ten", "c"),  # a word where a number is needed
    ("hb", "levels=2.5", "levels"),  # a fraction where a whole number is needed
])
def test_bad_parameter_value_fails_before_the_ledger_is_charged(synth_file, tmp_path, mechanism, param, name):
    """A value the mechanism refuses (its declared constraints, or check_params) is refused while planning:
    one error line naming the parameter and the value, and nothing (no ledger entry, no staged noise) is
    written into the store folder."""
    out = tmp_path / "o"
    r = geodp("release", synth_file, "--city", "new-york", "--epsilon", "1", "--mechanism", mechanism,
              "--param", param, "--out", out, ok=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert f"{name}=" in line and param.split("=", 1)[1].strip("[]").split(",")[0] in line
    assert not any(out.rglob("*"))


def test_a_fit_the_mechanism_refuses_inside_the_flow_gives_its_own_error(prefect_harness, tmp_path):
    """A refusal only the fit can make (it needs the region: the shipped denoiser learned from Austin)
    fails the privatize task on Dask. The CLI reports that task's error, not the "not ready" of the
    persist task after it, and nothing is committed. The run reports to the session's Prefect server
    (without one each run starts its own, ~11 CPU-s) on a one-worker cluster."""
    from dpcore.models.pyramid_denoiser import DEFAULT_DENOISER_PATH

    data = tmp_path / "austin.parquet"
    generate_checkins(city_region("austin"), n_users=200, days=7, seed=1).to_parquet(data)
    out = tmp_path / "o"
    r = geodp("release", data, "--city", "austin", "--epsilon", "1", "--privacy-unit", "record", "--mechanism",
              "snh", "--param", f"denoiser={DEFAULT_DENOISER_PATH}", "--store", out, "--workers", "1", ok=False)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: denoiser ") and "trained on data of austin" in last
    assert "UnfinishedRun" not in r.stderr
    assert not list(out.glob("releases/*/austin/*/v1"))


def test_malformed_rows_and_strict(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("user_id,timestamp,lat,lon\na,2024-01-01T00:00:00Z,40.71,-74.0\nb,2024-01-01,oops,-74\n")
    # one valid row: a release the verdict refuses, published anyway to show the malformed row is skipped
    r = geodp("release", p, "--city", "new-york", "--epsilon", "1", "--out", tmp_path / "o", "--publish-anyway")
    assert "dropped 1" in r.stderr
    r = geodp("release", p, "--city", "new-york", "--epsilon", "1", "--strict", "--out", tmp_path / "o2", ok=False)
    assert r.returncode == 2 and "row 2 is invalid" in r.stderr and "Traceback" not in r.stderr
    r = geodp("release", tmp_path / "missing.csv", "--city", "new-york", "--epsilon", "1", "--out",
              tmp_path / "o3", ok=False)
    assert r.returncode == 2 and "not found" in r.stderr


def test_evaluate_json_schema(synth_file, tmp_path):
    out = tmp_path / "ev.json"
    r = geodp("evaluate", synth_file, "--city", "new-york", "--mechanisms", "identity", "--epsilon", "0.5,2",
              "--queries", "300", "--trials", "2", "--query-sides-m", "100:1000,1000:5000", "--json", out)
    assert "mean rel.err" in r.stdout
    report = json.loads(out.read_text())
    assert {"n_points", "n_users", "privacy_unit", "results"} <= set(report)
    keys = {"mechanism", "epsilon", "query_sides_m", "max_points_per_user", "mean_relative_error",
            "median_relative_error", "trials", "queries", "fit_seconds", "answer_seconds"}
    assert len(report["results"]) == 4 and all(keys <= set(x) for x in report["results"])
    by_eps = {(x["epsilon"], tuple(x["query_sides_m"])): x["mean_relative_error"] for x in report["results"]}
    # more budget, less error
    assert by_eps[(2.0, (1000.0, 5000.0))] < by_eps[(0.5, (1000.0, 5000.0))]


def test_evaluate_workload_bounding_and_references(synth_file, tmp_path):
    """--workload / --bounding reach the report; every row has its ratios to both references; bad values are
    one error line."""
    out = tmp_path / "ev.json"
    r = geodp("evaluate", synth_file, "--city", "new-york", "--mechanisms", "identity,ag", "--epsilon", "1",
              "--queries", "200", "--trials", "1", "--query-sides-m", "100:1000", "--bounding", "weight",
              "--max-points-per-user", "5", "--json", out)
    report = json.loads(out.read_text())
    assert report["workload"]["centres"] == "data" and report["bounding"] == "weight"
    (grid,) = report["reference_hindsight_grid"]
    (zero,) = report["reference_answer_zero"]
    for row in report["results"]:
        assert row["ratio_to_hindsight_grid"] == pytest.approx(row["mean_relative_error"] / grid["mean_relative_error"])
        assert row["ratio_to_answer_zero"] == pytest.approx(row["mean_relative_error"] / zero["mean_relative_error"])
    assert f"{grid['grid_size']}x{grid['grid_size']} grid picked with the true answers" in r.stdout
    for bad, msg in ((["--bounding", "weight", "--mechanisms", "snh"], "does not support"),
                     (["--bounding", "weight", "--privacy-unit", "record"], "needs --privacy-unit user"),
                     (["--workload", "public:" + str(tmp_path / "none.csv")], "not found"),
                     (["--workload", "everywhere"], "workload must be")):
        r = geodp("evaluate", synth_file, "--city", "new-york", *bad, ok=False)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_evaluate_flow_refuses_a_bad_parameter_value_before_starting_prefect(synth_file, tmp_path):
    """`evaluate --flow` and `evaluate-st --flow` check every mechanism's values up front, so a bad one is
    one clear error line instead of a failure in each worker task."""
    r = geodp("evaluate", synth_file, "--city", "new-york", "--mechanisms", "snh", "--param", "snh.loss=huber",
              "--flow", "--json", tmp_path / "ev.json", ok=False)
    assert r.returncode == 2 and "loss=\"huber\"" in r.stderr
    assert "Flow run" not in r.stderr  # refused before a flow (and its workers) started
    r = geodp("evaluate-st", synth_file, "--city", "new-york", "--window", "2024-01-01/2024-01-08",
              "--mechanisms", "vdr", "--param", "vdr.refinement=magic", "--flow", "--json", tmp_path / "st.json",
              ok=False)
    assert r.returncode == 2 and "refinement=\"magic\"" in r.stderr and "Flow run" not in r.stderr
    assert not (tmp_path / "ev.json").exists() and not (tmp_path / "st.json").exists()


def test_cities_lists_catalog():
    cities = json.loads(geodp("cities", "--json").stdout)
    assert {"new-york", "san-francisco", "kansas-city", "salt-lake-city"} <= {c["city"] for c in cities}


def test_sigterm_runs_cleanup(tmp_path):
    """`kill PID` on a geodp command unwinds like Ctrl-C: finally blocks (which stop the local Prefect
    server and Dask cluster) run instead of leaving them orphaned."""
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "cleaned"
    code = ("import sys, time\nfrom flows.cli import exit_on_sigterm\nexit_on_sigterm()\n"
            f"try:\n    print('ready', flush=True)\n    time.sleep(60)\nfinally:\n    open({str(marker)!r}, 'w').write('x')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()


def test_query_of_a_release_whose_denoiser_cap_dropped_mass_says_so(synth_file, tmp_path):
    """A user-level snh release at small ε drops much of its mass at the denoiser's cap (the manifest says
    how much); `geodp query` then warns on stderr that its counts are low, and the answer is unchanged."""
    import re

    out = tmp_path / "rel"
    tiny = ["n_sizes=2", "hidden=8", "depth=1", "max_epochs=2", "samples_per_epoch=1024"]
    geodp("release", synth_file, "--city", "new-york", "--epsilon", "0.05", "--mechanism", "snh",
          "--max-points-per-user", "5", "--seed", "2", "--out", out, *[a for p in tiny for a in ("--param", p)])
    (manifest,) = out.glob("releases/*/new-york/all/v1/_MANIFEST.json")
    notes = " ".join(json.loads(manifest.read_text())["privacy"]["notes"])
    dropped = float(re.search(r"\(([\d.]+)% of the mass dropped\)", notes).group(1))
    assert dropped >= 10, notes  # this configuration is meant to exercise the warning
    q = geodp("query", out, "--box", "40.70,-74.02,40.72,-74.00", "--json")
    assert f"cap dropped {dropped:.0f}% of this release's mass" in q.stderr and "denoiser=none" in q.stderr
    assert np.isfinite(json.loads(q.stdout)[0]["estimate"])


def test_an_auto_release_says_what_it_chose(synth_file, tmp_path):
    out = tmp_path / "rel"
    r = geodp("release", synth_file, "--city", "new-york", "--epsilon", "1", "--privacy-unit", "record",
              "--mechanism", "auto", "--param", "mechanisms=ug,ag", "--seed", "2", "--out", out)
    (manifest,) = out.glob("releases/*/new-york/all/v1/_MANIFEST.json")
    params = json.loads(manifest.read_text())["params"]
    assert params["chosen"]["mechanism"] in ("ug", "ag")
    assert f"(auto chose {params['chosen']['mechanism']})" in r.stdout
    assert sorted(c["mechanism"] for c in params["candidates"]) == ["ag", "ug"]
