"""Failures a user can cause or meet, through the CLI (issue 45 item 4): each is one `error:` line and
exit status 2 (130 for Ctrl-C), before any work and with nothing charged. Each case names what the
code before this test did instead."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp
from tests.faults import ledger_and_committed, pause_at_write_env
from tests.test_store_faults import one_line_error

RELEASE = ("--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity", "--param", "cell_width_m=2000")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(p)
    return p


# (arguments after DATA, words of the error line, what the code before did)
BEFORE_ANY_WORK = [
    (("release", "run", "{data}", *RELEASE, "--period", "1000-01-01..9999-12-31", "--out", "{tmp}/o"),
     "outside the days", "OverflowError traceback, exit 1"),
    (("release", "backfill", "{data}", "--cities", "new-york", "--epsilon", "0.1", "--store", "{tmp}/s",
      "--period", "1000-01-01..9999-12-31"), "outside the days", "OverflowError traceback, exit 1"),
    (("eval", "range", "{data}", "--city", "new-york", "--epsilon", "1e-300"), "epsilon must be",
     "ValueError traceback from the discrete Laplace scale, exit 1"),
    (("eval", "range", "{data}", "--city", "new-york", "--trials", "0"), "--trials",
     "'need at least one array to concatenate' after the whole evaluation, exit 1"),
    (("eval", "heatmap", "{data}", "--city", "new-york", "--resolution", "1048576"), "resolution",
     "an 8 TiB allocation failing after the data was read, exit 1"),
    (("eval", "heatmap", "{data}", "--city", "new-york", "--render", "{tmp}/X.parquet"), "--render",
     "the whole evaluation ran before matplotlib refused the suffix"),
    (("release", "run", "{data}", "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
      "--param", "cell_width_m=inf", "--out", "{tmp}/o"), "finite", "an infinite cell width was accepted"),
    (("release", "run", "{data}", *RELEASE, "--budget-cap", "inf", "--out", "{tmp}/o"), "finite",
     "an infinite budget cap was accepted"),
]


@pytest.mark.parametrize(("args", "words", "before"), BEFORE_ANY_WORK, ids=[" ".join(c[0][:2]) + f" {i}"
                                                                          for i, c in enumerate(BEFORE_ANY_WORK)])
def test_bad_options_are_one_line_before_any_work(args, words, before, small, tmp_path):
    filled = [str(a).format(data=small, tmp=tmp_path) for a in args]
    r = run_geodp(*filled, ok=False, timeout=120)
    one_line_error(r, words)
    assert r.stderr.count("\n") == 1, f"{before}; now: {r.stderr[-2000:]}"  # nothing read or drawn first
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_down() -> dict[str, str]:
    """The environment of an S3 endpoint that is down: a closed loopback port, dummy credentials."""
    return {"GEODP_S3_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}", "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _nothing_but_the_error_line(r: subprocess.CompletedProcess) -> None:
    """stderr is the error line alone: no asyncio "Task exception was never retrieved" or "Unclosed client
    session" from s3fs's event loop before it (issue 45 saw one in 3 of 6 S3 outages; flows/cli's
    _NoOrphanedTaskErrors drops them; without it these cases print none on today's s3fs either)."""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr[-3000:]


def test_an_s3_input_whose_endpoint_is_down_is_one_line_in_data_check_and_release_out(s3_down, tmp_path):
    """Before: a 126-line botocore traceback and exit 1 in both."""
    data = "s3://geodp-input/checkins.parquet"
    r = run_geodp("data", "check", data, ok=False, env=s3_down)
    one_line_error(r, "cannot list", data)
    _nothing_but_the_error_line(r)
    r = run_geodp("release", "run", data, *RELEASE, "--out", tmp_path / "out", ok=False, env=s3_down)
    one_line_error(r, "cannot list", data)
    _nothing_but_the_error_line(r)
    assert not (tmp_path / "out" / "datasets").exists() or ledger_and_committed(tmp_path / "out") == (0.0, 0.0)


def test_an_s3_input_whose_endpoint_is_down_is_one_line_in_the_prefect_form(prefect_harness, s3_down, tmp_path):
    """Before: a traceback and exit 1."""
    data = "s3://geodp-input/checkins.parquet"
    r = run_geodp("release", "run", data, "--cities", "new-york", "--epsilon", "0.1", "--store", tmp_path / "s",
                  "--workers", "1", ok=False, env=s3_down)
    one_line_error(r, "cannot list", data)
    _nothing_but_the_error_line(r)
    assert not (tmp_path / "s" / "datasets").exists() or ledger_and_committed(tmp_path / "s") == (0.0, 0.0)


def _interrupted(args: list, mark, at: int | str = 1, in_worker: bool = False) -> subprocess.CompletedProcess:
    """Run `geodp ARGS` paused right before its store write ``at`` (a number or a name, tests/faults.py),
    send it SIGINT by PID (as Ctrl-C does; the pause mark names the process, or with ``in_worker`` a Dask
    worker whose parent is the command), and wait for it. The command runs through the forked CLI in a
    thread, not in a fresh interpreter."""
    import psutil

    done: list = []
    # a Dask worker of its own: the flow's LocalCluster made of processes (by default its workers are threads)
    env = {**pause_at_write_env(at, mark), **({"GEODP_DASK_WORKERS": "processes"} if in_worker else {})}
    run = threading.Thread(target=lambda: done.append(run_geodp(*args, ok=False, timeout=300, env=env)))
    run.start()
    deadline = time.monotonic() + 180
    while not mark.exists():
        assert run.is_alive() and time.monotonic() < deadline, done
        time.sleep(0.05)
    pid = int(mark.read_text().split()[0])
    os.kill(psutil.Process(pid).ppid() if in_worker else pid, signal.SIGINT)
    run.join(timeout=300)
    return done[0]


def _one_interrupted_line(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "interrupted" in errors[0] and r.stderr.rstrip().endswith(errors[0]), r.stderr
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


def test_ctrl_c_in_process_prints_one_line_and_gives_the_charge_back(small, tmp_path):
    """Interrupted after the charge, right before its claim: the charge is given back. Before: exit 130
    with no message at all, and the charge stayed held until a rerun took it over."""
    store = tmp_path / "out"
    r = _interrupted(["release", "run", small, *RELEASE, "--out", store], tmp_path / "mark", at="_CLAIM.json")
    charged, committed = ledger_and_committed(store)
    # nothing published; only the contribution profile, paid alone before the rest (ε 0.01), stays spent
    assert committed == 0.0 and charged == pytest.approx(0.01)
    _one_interrupted_line(r, "the charge of new-york was given back",
                          "the contribution profile of new-york (ε 0.01) stays charged")
    run_geodp("release", "run", small, *RELEASE, "--out", store)  # running it again finishes it
    charged, committed = ledger_and_committed(store)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)


def test_ctrl_c_in_the_prefect_form_prints_one_line_and_gives_the_charge_back(prefect_harness, small, tmp_path):
    """Ctrl-C while a Dask worker persists the city (after the charge, right before its claim): the
    charge is given back once the cluster is closed. Before: exit 130 with no message (with a local
    Prefect server, which the terminal's Ctrl-C also stopped: exit 1 after 160 s and 162 lines of
    tracebacks), then one line with the charge held (`geodp ledger`: ε=0.1 spent on nothing published)."""
    store = tmp_path / "s"
    r = _interrupted(["release", "run", small, *RELEASE, "--store", store, "--workers", "1"], tmp_path / "mark",
                     at="_CLAIM.json", in_worker=True)
    charged, committed = ledger_and_committed(store)
    # nothing published; only the contribution profile, paid alone before the rest (ε 0.01), stays spent
    assert committed == 0.0 and charged == pytest.approx(0.01)
    _one_interrupted_line(r, "the charge of new-york was given back",
                          "the contribution profile of new-york (ε 0.01) stays charged")
    # running it again finishes it, paying once: in process, as the Prefect form's own run is the one
    # interrupted here (a second cluster and flow would add ~10 CPU-s and no check)
    run_geodp("release", "run", small, *RELEASE, "--store", store, "--no-prefect")
    charged, committed = ledger_and_committed(store)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)


def _bad_columns(folder) -> list:
    """A parquet file whose lat column is boolean, and a CSV whose header names lat twice (the second
    column holding 1.0 everywhere): both were read as valid rows before."""
    df = generate_checkins(city_region("new-york"), n_users=40, days=1, seed=5)
    boolean = df.assign(lat=df["lat"] > df["lat"].median())
    boolean.to_parquet(folder / "bool_lat.parquet")
    text = df.to_csv(index=False).splitlines()
    (folder / "two_lat.csv").write_text("\n".join([text[0] + ",lat", *(row + ",1.0" for row in text[1:])]) + "\n")
    return [folder / "bool_lat.parquet", folder / "two_lat.csv"]


def test_columns_of_the_wrong_type_or_named_twice_are_one_line(tmp_path):
    for path, words in zip(_bad_columns(tmp_path), ("column lat holds bool", "two columns named 'lat'"), strict=True):
        one_line_error(run_geodp("data", "check", path, ok=False), words)
        r = run_geodp("release", "run", path, *RELEASE, "--out", tmp_path / "out", ok=False)
        one_line_error(r, words)
        assert not (tmp_path / "out").exists() or ledger_and_committed(tmp_path / "out") == (0.0, 0.0)


@pytest.mark.parametrize(("toml", "words"), [
    ("[budget]\ndefault_cap = 1e300\n", "budget.default_cap"),
    ('[nightly]\n[nightly.release]\ndata = "x.parquet"\ncities = ["atlantis"]\nepsilon = 1.0\n', "unknown city 'atlantis'"),
])
def test_a_config_is_validated_as_the_cli_validates_options(toml, words, small, tmp_path):
    """Before: `geodp serve` started with either config (a cap no `dataset create --budget` takes, a city
    the first scheduled run would refuse)."""
    config = tmp_path / "geodp.toml"
    config.write_text(toml)
    # the refusal comes before serve looks for a Prefect server: none is needed here
    one_line_error(run_geodp("serve", "--config", config, ok=False, timeout=60,
                             env={"PREFECT_API_URL": "http://127.0.0.1:9/api"}),
                   words)
    r = run_geodp("release", "run", small, *RELEASE, "--out", tmp_path / "out", "--config", config, ok=False)
    one_line_error(r, words)


def test_no_prefect_telemetry_banner_when_analytics_are_off(tmp_path):
    """Prefect's SDK prints a first-run telemetry notice on a terminal whatever
    PREFECT_SERVER_ANALYTICS_ENABLED says (it follows DO_NOT_TRACK only): before, the first command that
    imported Prefect in a fresh PREFECT_HOME showed it. `serve` imports Prefect before it reads the config."""
    from tests.test_progress import _on_a_terminal

    config = tmp_path / "geodp.toml"
    config.write_text("[budget]\ndefault_cap = 1e300\n")
    env = {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env_without = {k: v for k, v in os.environ.items() if k != "DO_NOT_TRACK"}
    status, shown = _on_a_terminal(["serve", "--config", config], env={**env_without, **env}, clear=True)
    assert status == 2 and "budget.default_cap" in shown, shown
    assert "anonymous usage data" not in shown and "DO_NOT_TRACK" not in shown, shown
