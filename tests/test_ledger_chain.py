"""The ledger cannot shrink unnoticed: its entries form a hash chain and every committed release names
the entry that paid for it, so a deleted (the newest included), replaced or reordered entry is a
one-line integrity error on `geodp ledger` and before any new charge. Through the CLI, on a local
store and on S3 (moto's server)."""

import json
from pathlib import Path

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.ledger import ENTRY_HASH, GENESIS, PREV_HASH, DatasetLedger, _entry_hash
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store

LEDGER = "datasets/checkins/ledger"


@pytest.fixture(scope="module")
def checkins(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=60, days=3, seed=5).to_parquet(p)
    return p


def _release(data, store: str, day: str):
    return run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
                     "--param", "cell_width_m=2000", "--period", day, "--budget-cap", "10",
                     "--store", store, "--no-prefect", ok=False)


class _Files:
    """Read, write and delete the store's objects behind geodp's back, as an operator or attacker can."""

    def __init__(self, store: str):
        self.store = ReleaseStore(store)

    def names(self, rel: str) -> list[str]:
        return self.store.listdir(rel)

    def read(self, rel: str) -> dict:
        return json.loads(self.store.read(rel, cache=False))

    def write(self, rel: str, body: dict) -> None:
        if self.store.local:
            Path(self.store.path(rel)).parent.mkdir(parents=True, exist_ok=True)
        self.store.fs.pipe_file(self.store.path(rel), json.dumps(body).encode())

    def delete(self, rel: str) -> None:
        self.store.fs.rm(self.store.path(rel))
        self.store.fs.invalidate_cache()


def _store(where: str, tmp_path, request) -> str:
    return str(tmp_path / "store") if where == "local" else new_s3_store(request.getfixturevalue("moto_s3"))


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith("error: ")
    return lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_deleting_the_newest_entry_is_caught_by_ledger_and_before_the_next_charge(where, checkins, tmp_path,
                                                                                     request):
    store = _store(where, tmp_path, request)
    for day in ("2024-01-01", "2024-01-02"):
        assert _release(checkins, store, day).returncode == 0
    files = _Files(store)
    log = files.names(LEDGER)
    assert len(log) == 4  # per release its contribution profile's charge, then the release's own
    proc = run_geodp("ledger", store)
    assert "chain verified: 4 entries" in proc.stdout
    # every committed release names its entry by number and hash
    for m in ReleaseStore(store).list_releases("checkins"):
        entry = files.read(f"{LEDGER}/{m.ledger.seq:08d}.json")
        assert m.ledger.entry_sha256 == entry[ENTRY_HASH] and entry["kind"] == "charge"

    files.delete(f"{LEDGER}/{log[-1]}")  # the newest charge: its ε would silently come back
    line = _one_error_line(run_geodp("ledger", store, ok=False))
    assert "does not verify" in line and "entry #3" in line
    line = _one_error_line(_release(checkins, store, "2024-01-03"))
    assert "does not verify" in line
    assert files.names(LEDGER) == log[:3]  # nothing was charged
    assert len(ReleaseStore(store).list_releases("checkins")) == 2


def test_a_deleted_middle_entry_or_a_recomputed_reorder_is_an_integrity_error(checkins, tmp_path):
    store = str(tmp_path / "store")
    for day in ("2024-01-01", "2024-01-02"):
        assert _release(checkins, store, day).returncode == 0
    files = _Files(store)
    first, second = (files.read(f"{LEDGER}/{n}") for n in files.names(LEDGER)[:2])

    # swap the first two charges (the first release's profile and its own), renumbered and with their own hashes recomputed: only the chain shows it
    for seq, body in ((0, second), (1, first)):
        moved = {**body, "seq": seq}
        moved[ENTRY_HASH] = _entry_hash(moved)
        files.write(f"{LEDGER}/{seq:08d}.json", moved)
    line = _one_error_line(run_geodp("ledger", store, ok=False))
    assert "does not follow entry" in line

    files.write(f"{LEDGER}/00000000.json", first)
    files.write(f"{LEDGER}/00000001.json", second)
    assert run_geodp("ledger", store).returncode == 0  # restored: it verifies again
    files.delete(f"{LEDGER}/00000000.json")
    line = _one_error_line(run_geodp("ledger", store, "--json", ok=False))
    assert "entry #0 is missing" in line


def test_a_ledger_from_before_the_chain_is_read_and_the_chain_starts_after_it(checkins, tmp_path):
    """Entries written before the chain existed (no prev_sha256) still verify on their own hashes and
    numbers; the first new entry names the last of them, and the chain runs from there."""
    from dpcore.privacy.accounting import LedgerCharge, day_number

    store = str(tmp_path / "store")
    run_geodp("dataset", "create", store, "checkins", "--source", checkins, "--budget", "10")
    files = _Files(store)
    old_charge = LedgerCharge("k-old", "d-old", 1.0, None, day_number("2023-12-31"), day_number("2023-12-31"),
                              False, city_region("new-york").bbox_latlon(), 1, city="new-york", period="2023-12-31")
    for rel, body in (("datasets/checkins/policy/00000000.json", files.read("datasets/checkins/policy/00000000.json")),
                      (f"{LEDGER}/00000000.json", {"seq": 0, "dataset": "checkins", "created_at": "2026-01-01",
                                                   "kind": "charge", "charges": [old_charge.to_dict()]})):
        body.pop(PREV_HASH, None)  # written by the code of before the chain
        body[ENTRY_HASH] = _entry_hash(body)
        files.write(rel, body)
    assert "chain verified: 1 entry" in run_geodp("ledger", store).stdout
    assert _release(checkins, store, "2024-01-02").returncode == 0
    entries = DatasetLedger(ReleaseStore(store), "checkins").verify()
    assert PREV_HASH not in entries[0] and entries[1][PREV_HASH] == entries[0][ENTRY_HASH] != GENESIS
    files.delete(f"{LEDGER}/00000000.json")  # the legacy entry is covered by the chain after it
    assert "entry #0 is missing" in _one_error_line(run_geodp("ledger", store, ok=False))
