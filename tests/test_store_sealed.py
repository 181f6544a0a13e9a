"""A sealed attempt stays sealed. Run A charges a release, writes its charge reference and stalls; run B
of the same release takes the charge over, seals A's attempt and commits; A then uploads noise into its
sealed attempt. That noise is a second draw under one charge: A deletes it itself when it lives on, and
when it dies first the next run of any release of the dataset, and `geodp ledger`, delete it. Local
and S3 (moto) stores; the ledger is compared to the committed releases after each scenario."""

import os
import signal
import threading
import time

import pytest

from tasks.persist_tasks import _stage
from tasks.release_tasks import privatize
from tasks.storage.store import AttemptSealed, ReleaseRef, ReleaseStore
from tests.cli_runner import run_geodp
from tests.faults import attempt_files, kill_at_write_env, ledger_and_committed, pause_at_write_env
from tests.test_store_faults import RELEASE, small  # noqa: F401 - the module's data fixture
from tests.test_store_ledger import _charge, _counted, _plan


@pytest.fixture(scope="module")
def first_noise_write(small, tmp_path_factory) -> int:  # noqa: F811
    """The number of the store write that uploads a release's first noisy file (after its charge
    reference), counted once for the module on a clean release into a scratch store."""
    tmp_path = tmp_path_factory.mktemp("count")
    log = tmp_path / "writes.log"
    run_geodp("release", small, *RELEASE, "--store", tmp_path / "count", "--no-prefect",
              env=kill_at_write_env(10_000, log))
    writes = [ln.split()[3] for ln in log.read_text().splitlines()]
    return next(i for i, w in enumerate(writes, 1) if "/a-" in w and not w.endswith("/charge.json"))


@pytest.mark.parametrize(("then", "store_url"), [("a later run", "local"), ("a later run", "s3"),
                                                  ("geodp ledger", "local")], indirect=["store_url"])
def test_noise_a_dead_writer_uploaded_into_its_sealed_attempt_is_deleted(then, small, store_url, tmp_path,  # noqa: F811
                                                                         first_noise_write):
    """The take-over and seal run on both backends; `geodp ledger` deletes with the same sweep
    (ReleaseStore.sweep_committed) as a later run, so it runs on a local store only."""
    n = first_noise_write
    mark = tmp_path / "paused"
    args = ["release", str(small), *RELEASE, "--store", store_url, "--no-prefect"]
    # A runs through the forked CLI in a thread (no fresh interpreter); the mark names its process id
    stalled = threading.Thread(target=run_geodp, args=args, kwargs={"ok": False, "env": pause_at_write_env(n, mark)})
    stalled.start()
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():  # A has charged and written its charge reference; it stalls here
            assert stalled.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        run_geodp(*args)  # B takes A's charge over, seals A's attempt and commits
    finally:
        if mark.exists():
            os.kill(int(mark.read_text().split()[0]), signal.SIGKILL)
        stalled.join()
    store = ReleaseStore(store_url)
    (city,) = store.listdir("releases/small")
    ref = ReleaseRef("small", city, "2024-01-01", 1)
    committed = store.manifest(ref)
    (sealed,) = set(store.attempts(ref)) - {committed.attempt}
    # A's upload of its noisy grid lands in its sealed attempt, and A dies before it can look
    store.create(f"{ref.rel}/{sealed}/grid.npz", b"a second noisy grid of the same data")
    assert attempt_files(store_url)[f"{ref.rel}/{sealed}"] == ["grid.npz"]

    if then == "a later run":
        run_geodp(*args)  # a re-run: nothing to release, but it clears what no release will publish
    else:
        assert "deleted 1 file" in run_geodp("ledger", store_url).stderr
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)
    charged, published = ledger_and_committed(store_url)
    assert charged == pytest.approx(published) == pytest.approx(0.1)


def test_a_writer_sealed_mid_upload_deletes_its_file_before_its_next_write(store_url, monkeypatch):
    (plan,) = _plan(store_url)
    held = _charge(store_url, [plan])["austin"]
    store = ReleaseStore(store_url)
    version, _ = store.claim_version(plan.dataset, plan.city, plan.period.label, plan.release_key)
    ref = ReleaseRef(plan.dataset, plan.city, plan.period.label, version)
    attempt = f"a-{held.seq}-{held.draw}"
    real_create = ReleaseStore.create
    noisy_writes = []

    def create(self, rel, data):
        if rel.startswith(f"{ref.rel}/{attempt}/") and not rel.endswith(("charge.json", "_STAGED.json")):
            noisy_writes.append(rel)
            if len(noisy_writes) == 1:  # a newer run seals the attempt while this file goes up
                self.seal_attempt(ref, attempt)
            else:
                raise SystemExit("the writer dies at its next upload")
        return real_create(self, rel, data)

    monkeypatch.setattr(ReleaseStore, "create", create)
    with pytest.raises(AttemptSealed):
        _stage(store, ref, plan, privatize.fn(plan, _counted(plan, 1)["austin"]), None, held)
    monkeypatch.setattr(ReleaseStore, "create", real_create)
    assert len(noisy_writes) == 1  # it looked right after its first file, before writing another
    assert store.attempt_data(ref, attempt) == []
