"""Release and backfill flows on a real Prefect server (session harness) and a real Dask LocalCluster,
on real public check-ins (the Gowalla sample: Austin, San Francisco, New York)."""

import pytest

from flows.backfill import run_backfill
from flows.release import run_release
from flows.store import LedgerRefused, ReleaseStore
from tasks.config import BackfillParams, ReleaseParams

pytestmark = pytest.mark.shared_data
CITIES = ["austin", "san-francisco", "new-york"]


def test_backfill_7_days_3_cities_commits_21_then_nothing(prefect_harness, gowalla_sample_path, tmp_path):
    store_url = str(tmp_path / "store")
    rp = ReleaseParams(data=str(gowalla_sample_path), cities=CITIES, epsilon=0.5, store=store_url,
                       max_points_per_user=10, n_workers=2, budget_cap=2.0)
    bp = BackfillParams(release=rp, start="2010-05-01", end="2010-05-07")
    first = run_backfill(bp)
    store = ReleaseStore(store_url)
    releases = store.list_releases()
    assert first["committed"] == 21 and first["skipped"] == 0
    assert len(releases) == 21
    assert {(r["city"], r["period"]) for r in releases} == {(c, f"2010-05-0{d}") for c in CITIES for d in range(1, 8)}
    entries = store.ledger_entries()
    assert len(entries) == 21 and len({e["release_key"] for e in entries}) == 21
    for day in range(1, 8):
        assert store.spent(gowalla_sample_path.name.split(".")[0], f"2010-05-0{day}") == pytest.approx(1.5)
    # every user kept ≤ k points over all three cities of a day: the manifest says how bounding ran
    assert all("once over all regions" in r["bounding"] for r in releases)
    again = run_backfill(bp)
    assert again["committed"] == 0 and again["skipped"] == 21
    assert len(store.list_releases()) == 21 and len(store.ledger_entries()) == 21


def test_release_flow_two_cities_then_over_budget(prefect_harness, gowalla_sample_path, tmp_path):
    store_url = str(tmp_path / "store")
    rp = ReleaseParams(data=str(gowalla_sample_path), cities=["austin", "new-york"], period="2010-05",
                       epsilon=0.4, store=store_url, max_points_per_user=20, n_workers=2, budget_cap=1.0)
    summary = run_release(rp)
    assert [r["status"] for r in summary["releases"]] == ["committed", "committed"]
    assert summary["spent"] == pytest.approx(0.8)
    # a different config for the same period would need 2 × 0.4 > 0.2 left: refused, nothing noised
    with pytest.raises(LedgerRefused, match=r"left ε=0\.2"):
        run_release(rp.model_copy(update={"mechanism_params": {"cell_width_m": 500}}))
    store = ReleaseStore(store_url)
    assert len(store.ledger_entries()) == 2 and len(store.list_releases()) == 2


def test_a_store_made_again_at_the_same_url_gets_a_real_release(prefect_harness, gowalla_sample_path, tmp_path):
    # Regression: the persist task's Prefect cache once keyed on the store URL as typed, so a deleted
    # and re-made store (or another checkout's same relative path) got the old cached manifest and
    # nothing was written.
    import shutil

    store_url = str(tmp_path / "store")
    rp = ReleaseParams(data=str(gowalla_sample_path), cities=["austin"], period="2010-05-02", epsilon=0.3,
                       store=store_url, max_points_per_user=10, n_workers=1)
    run_release(rp)
    first_id = ReleaseStore(store_url).instance_id()
    shutil.rmtree(store_url)
    summary = run_release(rp)
    store = ReleaseStore(store_url)
    assert store.instance_id() != first_id
    assert [r["status"] for r in summary["releases"]] == ["committed"]
    assert len(store.list_releases()) == 1 and len(store.ledger_entries()) == 1
