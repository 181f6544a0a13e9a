"""Release and backfill flows on a real Prefect server (session harness) and the session's Dask LocalCluster,
on real public check-ins (the Gowalla sample: Austin, San Francisco, New York)."""

import pytest

from dpcore.privacy.accounting import BudgetRefused
from flows.backfill import run_backfill
from flows.release import run_release
from tasks.config import BackfillParams, ReleaseParams
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore

pytestmark = pytest.mark.shared_data
CITIES = ["austin", "san-francisco", "new-york"]
DASK_WORKERS = 1  # the session's one-worker cluster (tests/conftest.py): these flows need no second worker


@pytest.mark.slow
def test_backfill_3_days_3_cities_commits_9_then_nothing(prefect_harness, dask_cluster, gowalla_sample_path, tmp_path):
    # three days take every path seven did (first day, middle day, last day of the range) at 9 releases, not 21
    store_url = str(tmp_path / "store")
    # published anyway: one day of the sample at ε 0.5 with 100 m cells is a release the verdict refuses
    rp = ReleaseParams(data=str(gowalla_sample_path), cities=CITIES, epsilon=0.5, store=store_url,
                       max_points_per_user=10, dask_address=dask_cluster, budget_cap=5.0, publish_anyway=True)
    bp = BackfillParams(release=rp, start="2010-05-01", end="2010-05-03")
    first = run_backfill(bp)
    store = ReleaseStore(store_url)
    releases = store.list_releases()
    assert first["committed"] == 9 and first["skipped"] == 0
    assert len(releases) == 9
    assert {(r.city, r.period) for r in releases} == {(c, f"2010-05-0{d}") for c in CITIES for d in range(1, 4)}
    ledger = DatasetLedger(store, gowalla_sample_path.name.split(".")[0])
    held = ledger.held()
    # per day: the contribution profile's entry (charged alone, first), then the rest of the ε
    assert len(ledger.entries()) == 6 and len({h.charge.key for h in held}) == 18
    # one run per day bounds each user over the three (disjoint) cities together: ε per day, not 3ε
    assert ledger.loss()["lifetime"] == pytest.approx(1.5)
    again = run_backfill(bp)
    assert again["committed"] == 0 and again["skipped"] == 9
    assert len(store.list_releases()) == 9 and len(ledger.entries()) == 6


def test_release_flow_two_cities_then_over_budget(prefect_harness, dask_cluster, gowalla_sample_path, tmp_path, monkeypatch):
    home = tmp_path / "ledger"
    monkeypatch.setenv("GEODP_LEDGER", str(home))  # the configured ledger home, outside the store
    store_url = str(tmp_path / "store")
    rp = ReleaseParams(data=str(gowalla_sample_path), cities=["austin", "new-york"], period="2010-05",
                       epsilon=0.4, store=store_url, max_points_per_user=20, dask_address=dask_cluster, budget_cap=0.6,
                       publish_anyway=True)
    summary = run_release(rp)
    assert [r["status"] for r in summary["releases"]] == ["committed", "committed"]
    assert summary["loss"]["lifetime"] == pytest.approx(0.4)  # disjoint cities, one bounding draw
    assert summary["ledger"] == str(home.resolve())
    # a different config for the same period, or the same release into another store, would take a
    # person to 0.8 > 0.6: refused, nothing noised
    for other in (rp.model_copy(update={"mechanism_params": {"cell_width_m": 500}}),
                  rp.model_copy(update={"store": str(tmp_path / "other-store")})):
        with pytest.raises(BudgetRefused, match=r"0\.2 left"):
            run_release(other)
    store = ReleaseStore(store_url)
    assert len(DatasetLedger(ReleaseStore(str(home)), summary["dataset"]).held()) == 4  # profiles and fits
    assert len(store.list_releases()) == 2 and not (tmp_path / "store" / "datasets").exists()


def test_a_store_made_again_at_the_same_url_gets_a_real_release(prefect_harness, dask_cluster, gowalla_sample_path, tmp_path):
    # Regression: the persist task's Prefect cache once keyed on the store URL as typed, so a deleted
    # and re-made store (or another checkout's same relative path) got the old cached manifest and
    # nothing was written.
    import shutil

    store_url = str(tmp_path / "store")
    rp = ReleaseParams(data=str(gowalla_sample_path), cities=["austin"], period="2010-05-02", epsilon=0.3,
                       store=store_url, max_points_per_user=10, dask_address=dask_cluster, publish_anyway=True)
    run_release(rp)
    first_id = ReleaseStore(store_url).instance_id()
    shutil.rmtree(store_url)
    summary = run_release(rp)
    store = ReleaseStore(store_url)
    assert store.instance_id() != first_id
    assert [r["status"] for r in summary["releases"]] == ["committed"]
    assert len(store.list_releases()) == 1 and len(DatasetLedger(store, summary["dataset"]).held()) == 2


def test_backfill_of_a_day_partitioned_input_reads_each_day_on_the_workers(prefect_harness, dask_cluster, tmp_path, monkeypatch):
    """A hive folder of days: the backfill opens no file in its own process (each day's release reads its
    own partition on the workers), and a partition outside the backfill's days is never opened, even an
    unreadable one."""
    import flows.backfill
    from tests.cli_runner import run_geodp

    data = tmp_path / "days"
    run_geodp("synth", data, "--city", "new-york", "--users", "300", "--days", "4", "--start", "2024-03-01",
              "--partitions", "day")
    stray = data / "date=2024-02-01"
    stray.mkdir()
    (stray / "part-0.parquet").write_bytes(b"not a parquet file")

    def no_preload(*args, **kwargs):
        raise AssertionError("the backfill loaded a day-partitioned input in the flow process")

    monkeypatch.setattr(flows.backfill, "load_and_validate", no_preload)
    store_url = str(tmp_path / "store")
    rp = ReleaseParams(data=str(data), cities=["new-york"], epsilon=0.5, store=store_url,
                       max_points_per_user=10, dask_address=dask_cluster, budget_cap=5.0, publish_anyway=True)
    result = run_backfill(BackfillParams(release=rp, start="2024-03-02", end="2024-03-03"))
    assert result["committed"] == 2
    assert {r.period for r in ReleaseStore(store_url).list_releases()} == {"2024-03-02", "2024-03-03"}
