"""The noun-verb CLI: every verb answers --help, the older command forms run the same code, bad input is
one `error:` line with exit status 2 and writes nothing, and SIGTERM leaves no local Prefect server."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from flows.cli import main
from flows.cli.common import CLIError, params_by_mechanism, parse_window
from tests.cli_runner import ROOT, answers, local_prefect_api, run_geodp

VERBS = ["release run", "release backfill", "release list", "release show", "query range", "query hotspot",
         "query forecast", "eval range", "eval st", "eval heatmap", "eval sparse1d", "paramselect predict",
         "paramselect train", "denoiser train", "ledger", "dataset create", "dataset show", "dataset policy",
         "dataset void", "data check", "cities", "synth", "serve"]
OLD_NAMES = ["evaluate", "evaluate-st", "evaluate-heatmap", "sparse1d", "hotspot", "forecast", "backfill",
             "releases list", "releases show", "paramselect train-denoiser"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, start="2024-01-01", days=4, seed=4).to_parquet(p)
    return p


@pytest.mark.parametrize("path", VERBS + OLD_NAMES)
def test_every_verb_answers_help(path, capsys):
    assert main([*path.split(), "--help"]) == 0
    assert f"Usage: geodp {path}" in capsys.readouterr().out


def test_the_older_names_are_hidden_from_the_overview(capsys):
    assert main(["--help"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.split("Commands:")[1].splitlines() if line.strip()}
    assert {"release", "query", "eval", "ledger", "dataset", "paramselect", "denoiser"} <= listed
    assert not listed & {"evaluate", "evaluate-st", "hotspot", "forecast", "backfill", "releases", "sparse1d"}


def test_verb_and_verbless_forms_make_and_read_the_same_release(data_file, tmp_path, capsys):
    """`release run` and `release DATA` are one command: the second run of the same release is a no-op;
    `query range` and `query RELEASE --box` answer alike; `--json PATH` writes what `--json` prints."""
    args = [str(data_file), "--city", "new-york", "--epsilon", "1", "--param", "identity.cell_width_m=1000",
            "--period", "2024-01-01..2024-01-02", "--out", str(tmp_path / "store")]
    assert main(["release", "run", *args]) == 0
    assert "release written to" in capsys.readouterr().out
    assert main(["release", *args]) == 0
    assert "already committed" in capsys.readouterr().out
    box = ["--box", "40.70,-74.02,40.72,-74.00"]
    assert main(["query", str(tmp_path / "store"), *box, "--json"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert main(["query", "range", str(tmp_path / "store"), *box, "--json", str(tmp_path / "q.json")]) == 0
    assert json.loads((tmp_path / "q.json").read_text()) == old and old[0]["estimate"] is not None
    assert main(["releases", "list", str(tmp_path / "store"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert main(["release", "list", str(tmp_path / "store"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == listed
    assert [(r["period"], r["version"], r["mechanism"]) for r in listed] == [("2024-01-01_2024-01-02", 1, "identity")]


def test_param_targets_every_mechanism_or_one():
    both = params_by_mechanism(["seed_x=1", "ug.cell_width_m=500"], ["identity", "ug"])
    assert both == {"identity": {"seed_x": 1}, "ug": {"seed_x": 1, "cell_width_m": 500}}
    with pytest.raises(CLIError, match="does not run"):
        params_by_mechanism(["ag.c=10"], ["identity"])


def test_one_window_syntax_with_the_older_one_read_alike():
    days = parse_window("2024-01-01..2024-01-14")  # days, inclusive
    assert days == parse_window("2024-01-01/2024-01-15")  # the older START/END, END exclusive
    assert days[1] - days[0] == 14 * 86400
    assert parse_window("2024-01-01T06:00..2024-01-01T09:00")[1] - parse_window("2024-01-01T06:00..2024-01-01T09:00")[0] == 3 * 3600
    with pytest.raises(CLIError, match="ends before it starts"):
        parse_window("2024-01-05..2024-01-01")


BAD = {
    "list-valued parameter": (["release", "{data}", "--city", "new-york", "--epsilon", "1", "--param",
                               "cell_width_m=[1,2]", "--out", "{out}"], "cell_width_m"),
    "text for a number parameter": (["release", "{data}", "--city", "new-york", "--epsilon", "1", "--mechanism",
                                     "ag", "--param", "c=ten", "--out", "{out}"], "c=\"ten\""),
    "epsilon zero": (["release", "run", "{data}", "--city", "new-york", "--epsilon", "0", "--out", "{out}"],
                     "epsilon must be > 0"),
    "epsilon negative": (["release", "{data}", "--cities", "new-york", "--epsilon", "-1", "--store", "{out}"],
                         "epsilon must be > 0"),
    "epsilon not a number": (["release", "{data}", "--city", "new-york", "--epsilon", "ten", "--out", "{out}"],
                             "--epsilon"),
    "unknown city": (["release", "{data}", "--city", "atlantis", "--epsilon", "1", "--out", "{out}"],
                     "unknown city"),
    "malformed box": (["query", "{out}", "--box", "40.7,-74.0,40.71"], "--box must have 4 numbers"),
    "box of words": (["query", "range", "{out}", "--box", "north,south,east,west"], "--box must be"),
    "typo store": (["releases", "list", "{out}"], "no release store"),
    "typo store, new verb": (["release", "list", "{out}", "--json"], "no release store"),
    "inverted release period": (["release", "{data}", "--city", "new-york", "--epsilon", "1", "--period",
                                 "2024-01-04..2024-01-01", "--out", "{out}"], "ends before it starts"),
    "inverted query period": (["query", "{out}", "--box", "40.70,-74.02,40.72,-74.00", "--period",
                               "2024-01-04..2024-01-01"], "ends before it starts"),
    "inverted evaluation window": (["eval", "st", "{data}", "--city", "new-york", "--period",
                                    "2024-01-04..2024-01-01"], "ends before it starts"),
    "wrong-type parameter in an evaluation": (["evaluate", "{data}", "--city", "new-york", "--mechanisms",
                                               "identity,ug", "--param", "ug.cell_width_m=[1,2]"], "cell_width_m"),
    "unknown option": (["release", "{data}", "--city", "new-york", "--epsilon", "1", "--bogus", "--out", "{out}"],
                       "No such option"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_error_line_and_writes_nothing(case, data_file, tmp_path):
    argv, message = BAD[case]
    out = tmp_path / "typo-store"
    r = run_geodp(*[a.format(data=data_file, out=out) for a in argv], ok=False)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert r.stdout == "" and not out.exists()


def _cmdline(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def test_sigterm_stops_the_local_prefect_server_and_cluster(data_file, tmp_path):
    """`kill PID` on a release through Prefect: the command stops the API server it serves and its Dask
    cluster before it exits, instead of hanging on them or leaving any process it started running."""
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    cmd = [sys.executable, "-m", "flows.cli", "release", str(data_file), "--cities", "new-york", "--epsilon", "1",
           "--mechanism", "vdr", "--period", "2024-01-01..2024-01-04", "--store", str(tmp_path / "store"),
           "--workers", "1"]
    # the session's own Prefect server (a uvicorn child of this process) is not this test's to stop
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    api = None
    try:
        deadline = time.monotonic() + 180
        while api is None and proc.poll() is None and time.monotonic() < deadline:
            api = local_prefect_api(proc.pid)
            time.sleep(0.5)
        assert api, "the command never served its local Prefect API"
        time.sleep(3)  # the flow is under way: the server answers and the cluster starts
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [(p.pid, _cmdline(p)) for p in alive]
        assert not answers(api), f"the command's Prefect API at {api} outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in psutil.Process().children(recursive=True):  # nothing this test started may outlive it
            if p.pid != proc.pid and p.pid not in before and any("flows.cli" in a or "uvicorn" in a
                                                                   for a in _cmdline(p)):
                p.kill()
