"""A take-over never moves a published charge (issue 42: no charge whose noise is published can be given
back or moved). Run A charges a release and stalls; run B takes A's charge over (an ``adopt`` entry) and
is accounted under its own bounding draw. A's attempt must then never complete: B seals it before the
ledger names B (tasks/storage/take_over.py), so the manifest and the ledger always name the same
run, and an earlier holder whose attempt completed first is committed as is, still holding its charge.

On the code before, B adopted first and sealed A's attempt only when it staged: A's attempt completed in
between, B committed A's noise (the manifest names A's draw) while the ledger accounted the charge under
B's draw, which B's other city shares: two disjoint cities of one draw compose in parallel, so `geodp
ledger` showed 0.5 where the published noise of two draws costs 1.0. An adopt (or one appended with the
ledger's own API) of a published charge was accepted and verified.

A Dask worker that stalls mid-upload past a take-over (stalled, not lost: tests/test_release_lost_worker.py)
and then uploads into its sealed attempt leaves no noisy file in the store."""

import threading
import time
from dataclasses import replace

import pytest

from dpcore.data.points import LoadResult, ValidationReport
from dpcore.privacy.accounting import worst_case_loss
from tasks.ledger_tasks import PolicyRequest, resolve_policy
from tasks.persist_tasks import _stage, persist_release
from tasks.release_tasks import privatize, read_bound_count
from tasks.storage.ledger import ChargeMoved, DatasetLedger
from tasks.storage.store import AttemptSealed, ReleaseRef, ReleaseStore
from tests import faults
from tests.cli_runner import run_geodp
from tests.faults import attempt_files
from tests.test_store_faults import RELEASE, one_line_error, small  # noqa: F401 - the module's data fixture
from tests.test_store_ledger import _charge, _plan, _points


def _fits(plans: list, seed: int) -> dict:
    """One run's synopses of ``plans``: its users bounded over all of them together (one bounding draw)."""
    loaded = LoadResult(_points(), ValidationReport(), "synthetic", "v0")
    counted = read_bound_count.fn(loaded, plans, seed=seed).cities
    return {p.city: privatize.fn(p, counted[p.city]) for p in plans}


def _published_loss(store_url: str, dataset: str) -> tuple[float, float]:
    """(the lifetime loss the ledger shows, the loss of the published noise: each committed release's
    charge accounted under the bounding draw whose noise its manifest publishes)."""
    store = ReleaseStore(store_url)
    ledger = DatasetLedger(store, dataset)
    held = {(h.seq, h.charge.key): h.charge for h in ledger.held()}
    published = [replace(held[(m.ledger.seq, m.release_key)], draw=m.ledger.draw) for m in store.list_releases()]
    return ledger.loss()["lifetime"], worst_case_loss(ledger.policy(), published)["lifetime"]


@pytest.mark.parametrize("a_completes", ["after the take-over", "while B seals it"])
def test_a_stalled_runs_noise_is_never_published_under_the_run_that_took_its_charge_over(a_completes, store_url,
                                                                                         monkeypatch):
    austin, sf = _plan(store_url, cities=("austin", "san-francisco"))
    a = _charge(store_url, [austin])["austin"]  # run A charges austin, then stalls before its upload
    store = ReleaseStore(store_url)
    version, _ = store.claim_version(austin.dataset, "austin", austin.period.label, austin.release_key)
    ref = ReleaseRef(austin.dataset, "austin", austin.period.label, version)
    a_attempt = f"a-{a.seq}-{a.draw}"
    a_noise = _fits([austin], seed=1)["austin"]

    def a_wakes_up():
        try:
            _stage(store, ref, austin, a_noise, None, a)
        except AttemptSealed:
            pass  # sealed before it completed: its files are deleted, its noise never published

    real_seal = ReleaseStore.seal_attempt

    def a_completes_first(self, r, attempt):
        if attempt == a_attempt:  # A's upload finishes right before B's seal of its attempt
            monkeypatch.setattr(ReleaseStore, "seal_attempt", real_seal)
            a_wakes_up()
        return real_seal(self, r, attempt)

    if a_completes == "while B seals it":
        monkeypatch.setattr(ReleaseStore, "seal_attempt", a_completes_first)
    # run B: austin (A's charge taken over) and san-francisco, its users bounded over both (one draw)
    b = _charge(store_url, [austin, sf])
    if a_completes == "after the take-over":
        a_wakes_up()
    b_noise = _fits([austin, sf], seed=2)
    for p in (austin, sf):
        persist_release.fn(store_url, p, b_noise[p.city], None, b[p.city], "test")
    assert store.exists(f"{ref.rel}/{a_attempt}/_STAGED.json")  # A's attempt was sealed, or completed

    ledger = DatasetLedger(store, austin.dataset)
    ledger.verify()
    manifests = {m.city: m for m in store.list_releases()}
    held = {(h.seq, h.charge.key): h.charge.draw for h in ledger.held()}
    # the manifest publishes the noise of the run the ledger accounts the charge under
    for m in manifests.values():
        assert held[(m.ledger.seq, m.release_key)] == m.ledger.draw, (m.city, m.attempt)
    assert manifests["austin"].ledger.seq == a.seq and len(held) == 2
    shown, lost = _published_loss(store_url, austin.dataset)
    assert shown == pytest.approx(lost)
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)


@pytest.mark.parametrize("store_url", ["local"], indirect=True)
def test_a_published_charge_cannot_be_taken_over_nor_handed_to_another_run(small, store_url):  # noqa: F811
    """An adopt refused, then one appended with the ledger's own API: the ledger's logic whatever the
    backend (the take-overs above run on S3 too), so a local store only."""
    args = ("release", small, *RELEASE, "--store", store_url, "--no-prefect")
    run_geodp(*args)
    store = ReleaseStore(store_url)
    ledger = DatasetLedger(store, "small")
    # the release's own charge (its contribution profile is charged alone, before it)
    (published,) = [h for h in ledger.held() if not h.charge.key.endswith("/profile")]
    policy = resolve_policy(store_url, "small", PolicyRequest("user")).policy
    with pytest.raises(ChargeMoved, match="published"):
        ledger.adopt(published.seq, published.charge.key, "f" * 16, policy, "an operator moves a published charge")
    # appended with the ledger's own append (a valid chain, nothing rewritten), past adopt's refusal
    ledger._append(ledger._ledger_dir, lambda log: {
        "kind": "adopt", "adopts": [{"seq": published.seq, "key": published.charge.key, "draw": "f" * 16}],
        "reason": "an operator moves a published charge"})
    before = sorted(store.fs.find(store.root))
    one_line_error(run_geodp("ledger", store_url, ok=False), "hands that charge to run ffff")
    later = [a if a != "2024-01-01" else "2024-01-02" for a in args]
    one_line_error(run_geodp(*later, ok=False), "hands that charge")
    assert sorted(ReleaseStore(store_url).fs.find(store.root)) == before  # nothing charged or written


@pytest.mark.slow
def test_a_dask_worker_stalled_mid_upload_past_a_take_over_leaves_no_noisy_file(dask_cluster, small, tmp_path):  # noqa: F811
    """Issue 42 item 1 with a stalled Dask worker: run A's persist task stalls on its worker right before
    its first noisy file; run B takes the charge over, seals A's attempt and commits; the worker then
    uploads its noisy grid into the sealed attempt and is killed before it looks at its seal. A's task
    runs again on the other worker and returns B's release, and A's run deletes the late file (the sweep
    of sealed attempts of committed versions, 1f9509f: with ReleaseStore.sweep_committed doing nothing
    the grid stays in the store, a second noisy copy under one charge). 37 CPU-s here, the module's
    cluster start and its workers' first imports included."""
    from distributed import Client

    store, mark = str(tmp_path / "store"), tmp_path / "stalled"
    with Client(dask_cluster, timeout=60) as c:
        c.wait_for_workers(2, timeout=60)
        # the first worker to upload a noisy file (after its charge reference) stalls there; once let go it
        # uploads the file and is killed before it can look at its seal (as the writer died)
        workers = set(c.run(faults.stall_at_write, "inner/grid.npz", str(mark), True).values())
    args = ("release", small, *RELEASE, "--store", store)
    done: list = []
    a = threading.Thread(target=lambda: done.append(run_geodp(*args, "--dask-address", dask_cluster, ok=False)))
    a.start()
    try:
        deadline = time.monotonic() + 300
        while not mark.exists():  # run A's persist task is on a worker, its charge reference written
            assert a.is_alive() and time.monotonic() < deadline, done and done[0].stderr[-3000:]
            time.sleep(0.05)
        pid, stalled = mark.read_text().split()
        assert int(pid) in workers
        run_geodp(*args, "--no-prefect")  # run B takes A's charge over, seals A's attempt and commits
    finally:
        mark.unlink(missing_ok=True)  # the worker uploads its noisy grid into its sealed attempt
        a.join(timeout=300)
        with Client(dask_cluster, timeout=60) as c:
            c.run(faults.restore_create)
    assert done[0].returncode == 0, done[0].stderr[-3000:]  # A returns B's release
    st = ReleaseStore(store)
    (committed,) = st.list_releases()
    version, attempt, *_ = stalled.rsplit("/", 3)  # …/v1, A's attempt, inner, grid.npz
    objects = sorted(p[len(st.root) + 1:] for p in st.fs.find(st.path("releases")))
    # every object under the release: its claim, its manifest, the committed attempt's files, and the
    # stalled attempt's charge reference and seal; no noisy file of A, nor a temporary file of its upload
    assert [o for o in objects if not o.startswith(f"{version}/{committed.attempt}/")] == \
        [f"{version}/{n}" for n in ("_CLAIM.json", "_MANIFEST.json", f"{attempt}/_STAGED.json", f"{attempt}/charge.json")]
    assert committed.attempt != attempt and st.read_json(f"{version}/{attempt}/_STAGED.json").get("sealed")
    ledger = DatasetLedger(st, "small")
    # one charge of the release (A's contribution profile, recorded before its stall, is B's too)
    assert [h.seq for h in ledger.held() if not h.charge.key.endswith("/profile")] == [committed.ledger.seq]
    assert ledger.loss()["lifetime"] == pytest.approx(committed.epsilon) == pytest.approx(0.1)
