"""Storage faults through the CLI: a full disk, an S3 outage mid-release, a missing bucket, an
unreachable endpoint, a typo'd local path. Each is one `error:` line and exit status 2, no traceback;
a read never creates a store; and after a re-run `geodp ledger` equals the ε of the committed releases."""

import shutil
import subprocess
import threading
import time

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store
from tests.faults import (
    CuttableProxy,
    attempt_files,
    kill_at_write_env,
    ledger_and_committed,
    pause_at_write_env,
)

RELEASE = ("--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity", "--param", "cell_width_m=2000",
           "--period", "2024-01-01")
BOX = ("--box", "40.70,-74.02,40.72,-74.00")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(p)
    return p


def one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    """The command failed with exit status 2 and exactly one `error:` line (the last), no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr[-3000:]
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): the disk-full test needs one")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def _resize(mnt, kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={kib}k", str(mnt)], check=True, capture_output=True)


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_costs_nothing(small, tmpfs):
    """A release into a tmpfs of a few KiB: the writes fail at different points (policy, ledger, claim,
    files, manifest). Each is one line and leaves no noisy file; once the disk has room, the re-run pays
    once: `geodp ledger` equals the committed ε."""
    failed = 0
    # one size per point of failure: the policy (before any charge), the claim (charged, no noise yet), the
    # first noisy file, the preview with the noise staged (its charge stays held) and the preview after the
    # fit's void (the charge given back); 4 KiB (the source binding) failed before any charge as 12 does
    for kib in (12, 20, 28, 40, 56):
        store = tmpfs / f"s{kib}"
        _resize(tmpfs, kib)
        r = run_geodp("release", small, *RELEASE, "--out", store, ok=False)
        if r.returncode == 0:
            break
        failed += 1
        one_line_error(r, "No space left on device")
        _resize(tmpfs, 4096)
        # `geodp ledger` answers; a charge whose void did not fit on the full disk is still held (no
        # noise of it is in the store), and the re-run takes it over instead of paying again. The
        # contribution profile, charged alone first (0.01), stays charged once drawn; the re-run reuses it
        charged, committed = ledger_and_committed(store) if store.exists() else (0.0, 0.0)
        assert committed == 0.0 and charged in (0.0, pytest.approx(0.01), pytest.approx(0.1)), kib
        noisy = [f for f in attempt_files(str(store)).values() if f] if store.exists() else []
        assert not noisy or charged == pytest.approx(0.1), (kib, noisy)  # staged noise keeps its charge
        run_geodp("release", small, *RELEASE, "--out", store)
        charged, committed = ledger_and_committed(store)
        assert charged == pytest.approx(committed) == pytest.approx(0.1), kib
        assert all(f == [] for f in attempt_files(str(store)).values())
        shutil.rmtree(store)
    assert failed >= 4


@pytest.fixture(scope="module")
def write_order(small, tmp_path_factory) -> list[str]:
    """The objects a clean release into a new store writes, in order (counted, never killed at write 10000)."""
    tmp = tmp_path_factory.mktemp("count")
    run_geodp("release", small, *RELEASE, "--out", tmp / "s", env=kill_at_write_env(10_000, tmp / "w.log"))
    return [ln.split()[3] for ln in (tmp / "w.log").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["_CLAIM.json", "grid.npz"])
def test_an_s3_outage_mid_release_is_one_line_and_the_rerun_pays_once(what, small, moto_s3, tmp_path, write_order):
    """S3 goes down (a proxy in front of moto is cut) right before the release writes its claim or its
    first noisy file: one line, exit 2. With S3 back, the re-run takes the charge over."""
    proxy = CuttableProxy(("127.0.0.1", int(moto_s3.rsplit(":", 1)[1])))
    env = {"GEODP_S3_ENDPOINT_URL": proxy.url}
    n = next(i for i, w in enumerate(write_order, 1) if w.endswith("/" + what))
    store = new_s3_store(moto_s3)
    mark = tmp_path / "paused"
    # the paused release runs in a thread through the forked CLI (no fresh interpreter to import)
    done: list = []
    run = threading.Thread(target=lambda: done.append(run_geodp("release", small, *RELEASE, "--store", store,
                                                                "--no-prefect", ok=False,
                                                                env={**env, **pause_at_write_env(n, mark)})))
    run.start()
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert run.is_alive() and time.monotonic() < deadline, done
        time.sleep(0.05)
    proxy.cut()
    mark.unlink()
    run.join(timeout=300)
    one_line_error(done[0], "cannot")
    proxy.restore()
    run_geodp("release", small, *RELEASE, "--store", store, "--no-prefect", env=env)
    charged, committed = ledger_and_committed(store, env)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)
    assert all(f == [] for f in attempt_files(store).values())


def test_a_missing_bucket_or_store_is_an_error_and_a_read_creates_nothing(moto_s3, tmp_path):
    missing = "s3://geodp-no-such-bucket/prefix"
    for args in (("releases", "list", missing), ("ledger", missing),
                 ("query", f"{missing}/releases/d/c/all/v1", *BOX)):
        one_line_error(run_geodp(*args, ok=False), "no bucket")
    typo = tmp_path / "no-such-store"
    for args in (("releases", "list", typo), ("ledger", typo), ("query", f"{typo}/releases/d/c/all/v1", *BOX),
                 ("query", typo, *BOX)):
        one_line_error(run_geodp(*args, ok=False))
        assert not typo.exists(), args


@pytest.mark.slow
def test_an_unreachable_endpoint_is_one_line(tmp_path):
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there
    env = {"GEODP_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}
    for args in (("releases", "list", "s3://bucket/p"), ("query", "s3://bucket/p/releases/d/c/all/v1", *BOX)):
        one_line_error(run_geodp(*args, ok=False, env=env), "cannot reach")


@pytest.mark.slow
def test_a_worker_lost_at_every_upload_is_one_line_and_the_rerun_pays_once(small, tmp_path, prefect_harness):
    """The Dask form on a LocalCluster whose worker processes die (SIGKILL) at their first store write,
    inside persist_release, and a scheduler that gives a task up after one lost worker: KilledWorker
    is the command's one `error:` line, the charge for noise that never reached the store is not held,
    and the re-run pays once: `geodp ledger` equals the committed ε. The flow reports to the session's
    Prefect server (without one the Prefect form starts a server of its own for the run)."""
    store = tmp_path / "s"
    log = tmp_path / "kills.log"
    env = {**kill_at_write_env(1, log, workers_only=True), "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    r = run_geodp("release", small, *RELEASE, "--store", store, "--workers", "1", ok=False, env=env)
    line = one_line_error(r, "KilledWorker", "nothing was committed")
    assert "kill at write 1" in log.read_text(), line  # a worker died inside the upload, not before it
    charged, committed = ledger_and_committed(store)
    # only the contribution profile, paid alone before the fit, stays charged; the re-run reuses it
    assert committed == 0.0 and charged == pytest.approx(0.01)
    assert all(f == [] for f in attempt_files(str(store)).values())
    run_geodp("release", small, *RELEASE, "--store", store, "--no-prefect")
    charged, committed = ledger_and_committed(store)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)
