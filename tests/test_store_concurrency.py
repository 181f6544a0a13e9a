"""Same-key releases racing each other and processes killed at every store write: readers only ever
see whole releases, and every committed release reads back, on a local store and on S3."""

import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import signal
import threading
import time

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import IntegrityError, ReleaseStore, fetch_to_temp
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store
from tests.faults import attempt_files, kill_at_write_env, ledger_and_committed


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(p)
    return p


def _release(args) -> tuple[int, str]:
    """One run in a pool process: its exit code and the end of its error output (for the failure message)."""
    data, store, env = args
    os.environ.update(env)
    from flows.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["release", data, "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
                     "--param", "cell_width_m=2000", "--period", "2024-01-01", "--store", store, "--no-prefect"])
    return code, err.getvalue()[-2000:]


def _readable_releases(store_url: str) -> list[dict]:
    out = []
    for m in ReleaseStore(store_url).list_releases():
        manifest, _ = fetch_to_temp(m.url)  # every file verified
        out.append(manifest)
    return out


@pytest.fixture(scope="module")
def pool():
    """Two spawned processes that have imported the CLI, shared by the race's store kinds."""
    with mp.get_context("spawn").Pool(2) as processes:
        yield processes


@pytest.mark.slow
@pytest.mark.parametrize("where,rounds", [("local", 20), ("s3", 3)])
def test_the_same_release_twice_in_parallel_leaves_one_readable_release(where, rounds, small, tmp_path, request, pool):
    """Random interleavings of two whole runs; the loser's paths each have a fixed interleaving on S3 in
    tests/test_store_race_losers.py, so S3 takes fewer rounds here (a round there costs ~3 CPU-s, moto's
    included) than the local store."""
    env = {}
    if where == "s3":
        moto = request.getfixturevalue("moto_s3")
        env = {k: os.environ[k] for k in ("GEODP_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_DEFAULT_REGION")}
    for i in range(rounds):
        store = str(tmp_path / f"s{i}") if where == "local" else new_s3_store(moto)
        runs = pool.map(_release, [(str(small), store, env)] * 2)
        assert [code for code, _ in runs] == [0, 0], runs
        found = _readable_releases(store)
        assert len(found) == 1, [(m.version, m.period, m.release_key) for m in found]
        (manifest,) = found
        # the charge that paid for the committed noise is held; the other run gave its own back. The
        # contribution profile is paid alone first: a run that finds it charged and not yet recorded
        # takes that charge over; two that charge it at once each record theirs, and both stay charged
        ledger = DatasetLedger(ReleaseStore(store), "small")
        held = ledger.held()
        profiles = [h for h in held if h.charge.key.endswith("/profile")]
        assert [h.seq for h in held if h not in profiles] == [manifest.ledger.seq] and 1 <= len(profiles) <= 2
        assert ledger.loss()["lifetime"] == pytest.approx(0.1 + 0.01 * (len(profiles) - 1))
        # the loser deleted its noisy files before giving its charge back
        assert all(files == [] for files in attempt_files(store).values()), attempt_files(store)


RELEASE = ("release", "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
           "--param", "cell_width_m=2000", "--period", "2024-01-01")


def _killed_at(small, store, n, log, env=None):
    """A release into ``store`` killed right before its ``n``-th store write; returns the writes it made
    (None when it completed without reaching write n)."""
    r = run_geodp(RELEASE[0], small, *RELEASE[1:], "--out", store, ok=False, env={**(env or {}), **kill_at_write_env(n, log)})
    lines = log.read_text().splitlines() if log.exists() else []
    counted = [ln for ln in lines if ln.split()[1] == "write"]
    assert len({ln.split()[0] for ln in lines}) <= 1, lines  # the hook ran in the CLI process only
    if r.returncode == 0:
        assert len(counted) < n and not any("kill" in ln for ln in lines), lines
        return None
    assert r.returncode == -9, r.stderr[-2000:]
    assert len(counted) == n and lines[-1].endswith(f"kill at write {n}"), lines
    return [ln.split()[3] for ln in counted]


#: the writes the S3 variant is killed before: the claim, the charge reference, a noisy file and the seal
S3_KILL_FILES = ("_CLAIM.json", "charge.json", "grid.npz", "_STAGED.json")


def _write_numbers(small, store, log, env, names) -> list[int]:
    """The numbers a clean release's store writes of files named ``names`` get in the count the kills use
    (other writes, e.g. the contribution profile's charge and record, shift them)."""
    run_geodp(RELEASE[0], small, *RELEASE[1:], "--out", store, env={**env, **kill_at_write_env(10_000, log)})
    writes = [ln.split() for ln in log.read_text().splitlines() if ln.split()[1] == "write"]
    return [int(w[2]) for w in writes if w[3].rsplit("/", 1)[-1] in names]


def _s3_env():
    return {k: os.environ[k] for k in ("GEODP_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                       "AWS_DEFAULT_REGION")}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_kill_at_any_store_write_then_a_rerun_holds_one_charge_per_release(where, small, tmp_path, request):
    """kill -9 right before the N-th store write of a release, then kill its re-run at its N-th write
    too (which now takes the charge over, seals and deletes), then a clean re-run: after each kill
    readers see nothing or a whole release and at most one charge is held; after the clean re-run
    `geodp ledger` equals the ε of the one committed release. N runs over every write of a release
    (local) and over the claim, the charge reference, the noisy files and the seal (S3)."""
    env = {}
    if where == "s3":
        request.getfixturevalue("moto_s3")
        env = _s3_env()
    if where == "local":
        points = range(1, 40)
    else:
        points = _write_numbers(small, new_s3_store(os.environ["GEODP_S3_ENDPOINT_URL"]), tmp_path / "clean.log",
                                env, S3_KILL_FILES)
        assert len(points) == len(S3_KILL_FILES), points
    for n in points:
        store = str(tmp_path / f"s{n}") if where == "local" else new_s3_store(os.environ["GEODP_S3_ENDPOINT_URL"])
        first = _killed_at(small, store, n, tmp_path / f"w{n}.log", env)
        if first is None:
            assert n > 9  # the kills hit the ledger, the claim, the charge reference, every file and the manifest
            break
        if not any("/ledger/" in w for w in first):  # died before its charge: nothing held, nothing to re-run
            assert DatasetLedger(ReleaseStore(store), "small").held() == [] and not _readable_releases(store)
            continue
        if n in (5, 7):  # the re-run dies too: at its adoption, its seal of the dead attempt or its upload
            _killed_at(small, store, n, tmp_path / f"w{n}b.log", env)
        assert len(_readable_releases(store)) <= 1
        # the contribution profile (charged alone, first) and at most one charge of the release
        assert len(DatasetLedger(ReleaseStore(store), "small").held()) <= 2
        run_geodp(RELEASE[0], small, *RELEASE[1:], "--out", store, env=env)
        (manifest,) = _readable_releases(store)
        ledger = DatasetLedger(ReleaseStore(store), "small")
        assert ledger.loss()["lifetime"] == pytest.approx(manifest.epsilon) == pytest.approx(0.1), (n, first)
        # no noise is left in the store outside the committed release
        assert all(files == [] for files in attempt_files(store).values()), (n, attempt_files(store))
    # what an operator sees: `geodp ledger` agrees with `geodp releases list`
    charged, committed = ledger_and_committed(store, env)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)
    q = run_geodp("query", manifest_url(store), "--box", "40.70,-74.02,40.72,-74.00", "--json", env=env)
    assert len(json.loads(q.stdout)) == 1


@pytest.mark.slow
def test_a_kill_at_random_moments_then_a_rerun_holds_one_charge_per_release(small, tmp_path):
    """SIGKILL a release at random moments after its first store write; the re-run ends with the
    ledger equal to the committed ε."""
    rng = random.Random(38)
    # the releases run through the forked CLI in a thread (no fresh interpreter to import); the log's
    # lines start with the writing process's id, the one to kill. A clean run first times the span from
    # its first store write to its end, so the kills land inside a release's writes as often as before.
    span, killed = 0.0, 0
    for i in range(4):
        store, log = tmp_path / f"r{i}", tmp_path / f"r{i}.log"
        done: list = []
        run = threading.Thread(target=lambda done=done, store=store, log=log: done.append(run_geodp(
            RELEASE[0], small, *RELEASE[1:], "--out", store, ok=False, env=kill_at_write_env(10_000, log))))
        run.start()
        deadline = time.monotonic() + 60
        while not log.exists() and run.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if i == 0:
            t0 = time.monotonic()
            run.join()
            span = time.monotonic() - t0
            assert done[0].returncode == 0, done[0].stderr[-2000:]
            continue
        time.sleep(rng.uniform(0.0, span))
        with contextlib.suppress(ProcessLookupError):
            if run.is_alive():
                os.kill(int(log.read_text().split()[0]), signal.SIGKILL)
        run.join()
        run_geodp(RELEASE[0], small, *RELEASE[1:], "--out", store)
        (manifest,) = _readable_releases(store)
        ledger = DatasetLedger(ReleaseStore(str(store)), "small")
        assert ledger.loss()["lifetime"] == pytest.approx(manifest.epsilon) == pytest.approx(0.1), i
        assert all(files == [] for files in attempt_files(store).values()), attempt_files(store)
        killed += done[0].returncode == -9
    assert killed >= 1, "no release was killed before its end"


def manifest_url(store: str) -> str:
    (m,) = ReleaseStore(str(store)).list_releases()
    return str(m.url)


def test_altered_or_missing_files_are_one_line_errors(small, tmp_path):
    store = tmp_path / "s"
    run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--mechanism", "identity",
              "--param", "cell_width_m=2000", "--out", store)
    (version,) = store.glob("releases/small/new-york/all/v1")
    manifest_path = version / "_MANIFEST.json"
    body = json.loads(manifest_path.read_text())
    # an altered manifest (a bigger ε claimed after the fact) is detected on read
    os.chmod(manifest_path, 0o644)
    manifest_path.write_text(json.dumps({**body, "epsilon": 0.01}))
    r = run_geodp("query", store, "--box", "40.70,-74.02,40.72,-74.00", ok=False)
    assert r.returncode == 2 and "altered" in r.stderr and "Traceback" not in r.stderr
    manifest_path.write_text(json.dumps(body))
    # a file the manifest lists is gone
    grid = next(version.glob("*/**/grid.npz"))
    grid.unlink()
    r = run_geodp("releases", "show", str(version), ok=False)
    assert r.returncode == 2 and "missing" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(IntegrityError):
        fetch_to_temp(str(version))


def test_seeded_noise_never_enters_a_ledgered_store(small, tmp_path):
    store = tmp_path / "s"
    run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--out", store,
              "--publish-anyway")  # 789 rows at 100 m cells: the verdict would refuse it
    r = run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--period", "2024-01-01",
                  "--seed", "3", "--out", store, ok=False)
    assert r.returncode == 2 and "seeded" in r.stderr
    assert len(ReleaseStore(str(store)).list_releases()) == 1
    lab = tmp_path / "lab"
    run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--seed", "3", "--out", lab,
              "--publish-anyway")
    assert not (lab / "datasets").exists()  # an experiment is not charged to anyone's budget
    r = run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--period", "2024-01-01",
                  "--out", lab, ok=False)
    assert r.returncode == 2 and "experiments" in r.stderr
