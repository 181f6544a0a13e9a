"""Runs of one release key that lose the race to its commit, replayed step by step: each gives back
its own charge and deletes its own noise, whatever the order in which the winner settles strays.

tests/test_store_concurrency.py races real processes; these interleavings are the ones it hit only
under load (three runs of a key, or two on a busy machine), made deterministic here."""

import uuid
from dataclasses import replace

import pytest

from tasks.ledger_tasks import (
    PolicyRequest,
    charge_for,
    give_back,
    resolve_policy,
    settle_strays,
)
from tasks.persist_tasks import _stage, persist_release
from tasks.release_tasks import privatize
from tasks.storage.held_charge import HeldCharge
from tasks.storage.ledger import ENTRY_HASH, DatasetLedger
from tasks.storage.store import ReleaseRef, ReleaseStore
from tests.faults import attempt_files
from tests.test_store_ledger import _charge, _counted, _plan


def _second_charge(store_url: str, plan, first: HeldCharge) -> HeldCharge:
    """A charge of the same key made by a run that read the ledger before the first run charged it
    (so it did not take that charge over): its own entry and bounding draw."""
    resolved = resolve_policy(store_url, plan.dataset, PolicyRequest("user", 5, 1.0))
    ledger = DatasetLedger(ReleaseStore(store_url), plan.dataset)
    draw = uuid.uuid4().hex[:16]
    entry, _ = ledger.charge([charge_for(plan, resolved, draw)], resolved.policy)
    return replace(first, seq=entry["seq"], draw=draw, entry_sha256=entry[ENTRY_HASH], holders=())


def _committed_with_a_stray(store_url: str):
    """A release committed by one run, and the charge of a second run of the same key that read the
    ledger too early to take the first one over: (store, plan, committed manifest, the second charge)."""
    (plan,) = _plan(store_url)
    winner = _charge(store_url, [plan])["austin"]
    stray = _second_charge(store_url, plan, winner)
    committed = persist_release.fn(store_url, plan, privatize.fn(plan, _counted(plan, 1)["austin"]), None,
                                   winner, "test")
    return ReleaseStore(store_url), plan, committed, stray


def _ref(store: ReleaseStore, plan) -> ReleaseRef:
    version, _ = store.claim_version(plan.dataset, plan.city, plan.period.label, plan.release_key)
    return ReleaseRef(plan.dataset, plan.city, plan.period.label, version)


def _held_seqs(store_url: str, plan) -> list[int]:
    return [h.seq for h in DatasetLedger(ReleaseStore(store_url), plan.dataset).held()]


def test_a_loser_whose_attempt_completed_after_the_commit_deletes_it_and_gives_its_charge_back(store_url):
    store, plan, committed, loser = _committed_with_a_stray(store_url)
    # the loser had passed its "already committed?" check and finishes staging its own noise
    _stage(store, _ref(store, plan), plan, privatize.fn(plan, _counted(plan, 2)["austin"]), None, loser)
    assert any(attempt_files(store_url).values())

    assert give_back(store, plan.dataset, loser, "another attempt was committed") is True
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)
    assert _held_seqs(store_url, plan) == [committed.ledger.seq]


def test_a_stray_taken_over_while_the_winner_settles_it_is_left_to_its_new_holder(store_url, monkeypatch):
    store, plan, committed, stray = _committed_with_a_stray(store_url)
    ledger = DatasetLedger(store, plan.dataset)
    resolved = resolve_policy(store_url, plan.dataset, PolicyRequest("user", 5, 1.0))
    newer = replace(stray, draw=uuid.uuid4().hex[:16], holders=(stray.draw,))
    real_seal = ReleaseStore.seal_attempt

    def seal_while_a_new_run_takes_the_stray_over(self, ref, attempt):
        # between the winner's read of the ledger and its void, a new run of the key takes the stray over
        if newer.draw not in ledger.holders(stray.seq, plan.release_key):
            ledger.adopt(stray.seq, plan.release_key, newer.draw, resolved.policy, "test: a new run")
        return real_seal(self, ref, attempt)

    monkeypatch.setattr(ReleaseStore, "seal_attempt", seal_while_a_new_run_takes_the_stray_over)
    assert settle_strays(store, plan.dataset, [committed]) == 0
    monkeypatch.setattr(ReleaseStore, "seal_attempt", real_seal)
    # the winner did not void a charge whose new holder is about to stage noise under it
    assert sorted(_held_seqs(store_url, plan)) == sorted([committed.ledger.seq, stray.seq])
    _stage(store, _ref(store, plan), plan, privatize.fn(plan, _counted(plan, 3)["austin"]), None, newer)
    # the new holder sees the commit and settles its own attempt
    assert give_back(store, plan.dataset, newer, "another attempt was committed") is True
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)
    assert _held_seqs(store_url, plan) == [committed.ledger.seq]


@pytest.mark.parametrize("store_url", ["local"], indirect=True)
def test_a_stray_whose_writer_is_still_uploading_is_sealed_not_voided(store_url, monkeypatch):
    store, plan, committed, stray = _committed_with_a_stray(store_url)
    ref = _ref(store, plan)
    attempt = f"a-{stray.seq}-{stray.draw}"
    real_listing = ReleaseStore.attempt_data
    listings = []

    def listing_while_the_writer_adds_a_file(self, r, name):
        if name == attempt:
            listings.append(name)
            if len(listings) == 2:  # the delete's look after deleting: the writer's next file has landed
                self.create(f"{r.rel}/{name}/late.npz", b"noise uploaded right after the delete")
        return real_listing(self, r, name)

    monkeypatch.setattr(ReleaseStore, "attempt_data", listing_while_the_writer_adds_a_file)
    assert settle_strays(store, plan.dataset, [committed]) == 0  # no error: the writer's file is its own
    monkeypatch.setattr(ReleaseStore, "attempt_data", real_listing)
    assert len(listings) == 2  # the attempt was listed to delete it, then to see what is left
    # its charge still covers the file; the writer, sealed, deletes it and gives the charge back
    assert stray.seq in _held_seqs(store_url, plan)
    assert store.exists(f"{ref.rel}/{attempt}/late.npz")
    assert give_back(store, plan.dataset, stray, "sealed by the run that committed") is True
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)
    assert _held_seqs(store_url, plan) == [committed.ledger.seq]


def test_a_run_whose_attempt_the_winner_deleted_as_a_stray_returns_the_winners_release(store_url, monkeypatch):
    import tasks.persist_tasks as persist_tasks

    (plan,) = _plan(store_url)
    loser = _charge(store_url, [plan])["austin"]
    winner = _second_charge(store_url, plan, loser)
    real_stage = persist_tasks._stage
    won = {}

    def stage_then_lose_the_race(store, ref, plan_, synopsis, preview, held):
        staged = real_stage(store, ref, plan_, synopsis, preview, held)
        # before the loser reads its staged files back, the winner commits and settles the loser's charge
        monkeypatch.setattr(persist_tasks, "_stage", real_stage)
        with monkeypatch.context() as m:
            m.setattr(ReleaseStore, "staged_attempt", lambda self, ref: None)  # it looked before ours was whole
            won["manifest"] = persist_release.fn(store_url, plan, privatize.fn(plan, _counted(plan, 2)["austin"]),
                                                 None, winner, "test")
        settle_strays(ReleaseStore(store_url), plan.dataset, [won["manifest"]])
        return staged

    monkeypatch.setattr(persist_tasks, "_stage", stage_then_lose_the_race)
    got = persist_release.fn(store_url, plan, privatize.fn(plan, _counted(plan, 1)["austin"]), None, loser, "test")
    assert got.attempt == won["manifest"].attempt and got.ledger.seq == winner.seq
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)
    assert _held_seqs(store_url, plan) == [winner.seq]


def test_two_holders_of_one_charge_that_both_staged_leave_only_the_committed_noise(store_url, monkeypatch):
    store = ReleaseStore(store_url)
    (plan,) = _plan(store_url)
    first = _charge(store_url, [plan])["austin"]  # its run died before staging anything
    resolved = resolve_policy(store_url, plan.dataset, PolicyRequest("user", 5, 1.0))
    ledger = DatasetLedger(store, plan.dataset)
    # two new runs of the key take the charge over, each having read the ledger before the other's takeover
    late, early = (replace(first, draw=uuid.uuid4().hex[:16], holders=(first.draw,)) for _ in range(2))
    for run in (late, early):
        ledger.adopt(first.seq, plan.release_key, run.draw, resolved.policy, "test: a new run")
    real_commit = ReleaseStore.commit

    def commit_after_the_other_holder(self, ref, manifest):
        # the other holder looked for a staged attempt before this one was whole, then staged and committed
        monkeypatch.setattr(ReleaseStore, "commit", real_commit)
        with monkeypatch.context() as m:
            m.setattr(ReleaseStore, "staged_attempt", lambda self, ref: None)
            persist_release.fn(store_url, plan, privatize.fn(plan, _counted(plan, 2)["austin"]), None, early, "test")
        return real_commit(self, ref, manifest)

    monkeypatch.setattr(ReleaseStore, "commit", commit_after_the_other_holder)
    got = persist_release.fn(store_url, plan, privatize.fn(plan, _counted(plan, 1)["austin"]), None, late, "test")
    assert got.attempt == f"a-{first.seq}-{early.draw}"
    # one charge, one published noise; the other holder's complete attempt is gone
    assert all(files == [] for files in attempt_files(store_url).values()), attempt_files(store_url)
    assert _held_seqs(store_url, plan) == [first.seq]
