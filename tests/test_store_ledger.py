"""Release store and ledger: create-only writes, caps, parallel writers, exactly-once, crash windows,
integrity on read; against a local folder and against a real S3 endpoint (moto's server over HTTP)."""


import numpy as np
import pytest

from dpcore.data.points import LoadResult, Points, ValidationReport
from dpcore.privacy.accounting import BudgetRefused
from dpcore.synopsis.base import load_synopsis
from tasks.config import parse_period
from tasks.ledger_tasks import PolicyRequest, charge_ledger, resolve_policy
from tasks.persist_tasks import persist_release
from tasks.release_city_plan import make_plans
from tasks.release_tasks import privatize, read_bound_count
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import IntegrityError, ReleaseRef, ReleaseStore, StoreError, fetch_to_temp


def test_create_only_never_overwrites(store_url):
    store = ReleaseStore(store_url)
    store.create("x/a.json", b"first")
    with pytest.raises(FileExistsError):
        store.create("x/a.json", b"second")
    assert ReleaseStore(store_url).read("x/a.json") == b"first"
    assert store.listdir("x") == ["a.json"]


def _points(n_users=60, per_user=30, seed=0):
    rng = np.random.default_rng(seed)
    n = n_users * per_user
    user = np.repeat(np.arange(n_users), per_user)
    lat = 30.2672 + rng.normal(0, 0.02, n)
    lon = -97.7431 + rng.normal(0, 0.02, n)
    ts = np.full(n, 1272758400) + rng.integers(0, 86400, n)  # 2010-05-02 UTC
    return Points(user.astype(np.int64), ts.astype(np.int64), lat, lon)


def _counted(plan, seed):
    loaded = LoadResult(_points(), ValidationReport(), "synthetic", "v0")
    return read_bound_count.fn(loaded, [plan], seed=seed).cities


def _plan(store_url, epsilon=0.5, cities=("austin",), seed=1):
    return make_plans(dataset="synthetic", cities=list(cities), center=None, side_km=None,
                      period=parse_period("2010-05-02"), mechanism="identity", params={"cell_width_m": 1000},
                      epsilon=epsilon, privacy_unit="user", max_points_per_user=5, seed=seed, data_version="v0")


def _charge(store_url, plans, budget=1.0):
    resolved = resolve_policy(store_url, plans[0].dataset, PolicyRequest("user", 5, budget))
    return charge_ledger.fn(store_url, plans, resolved, "/data/synthetic.parquet")


def test_crash_between_data_and_manifest_then_rerun_commits_the_same_noise(store_url, monkeypatch):
    store = ReleaseStore(store_url)
    (plan,) = _plan(store_url)
    entries = _charge(store_url, [plan])
    inputs = _counted(plan, seed=1)
    syn = privatize.fn(plan, inputs["austin"])
    # the storage dies right at the commit point
    real_commit = ReleaseStore.commit

    def dying_commit(self, ref, manifest):
        raise StoreError("simulated storage failure before the manifest")

    monkeypatch.setattr(ReleaseStore, "commit", dying_commit)
    with pytest.raises(StoreError):
        persist_release.fn(store_url, plan, syn, None, entries["austin"], "test")
    monkeypatch.setattr(ReleaseStore, "commit", real_commit)
    assert store.list_releases() == []  # nothing visible
    # the re-run is not charged again (the staged noise was paid for) and publishes that noise
    entries2 = _charge(store_url, [plan])
    assert entries2["austin"].seq is None
    other = privatize.fn(plan, _counted(plan, seed=2)["austin"])
    m = persist_release.fn(store_url, plan, other, None, entries2["austin"], "test")
    assert m.resumed_staged_attempt is True and m.version == 1
    assert len(DatasetLedger(store, "synthetic").entries()) == 1
    assert m.ledger.seq == entries["austin"].seq  # the manifest names the charge that paid
    _, d = fetch_to_temp(m.url)
    np.testing.assert_array_equal(load_synopsis(d).values, syn.values)
    # and a third run is a no-op returning the same version
    m3 = persist_release.fn(store_url, plan, other, None, entries2["austin"], "test")
    assert m3.version == 1 and m3.attempt == m.attempt
    assert len(store.list_releases()) == 1


def test_incomplete_attempt_is_left_aside_and_invisible(store_url):
    store = ReleaseStore(store_url)
    (plan,) = _plan(store_url)
    entries = _charge(store_url, [plan])
    version, _ = store.claim_version(plan.dataset, plan.city, plan.period.label, plan.release_key)
    ref = ReleaseRef(plan.dataset, plan.city, plan.period.label, version)
    store.create(f"{ref.rel}/a-crashed/grid.npz", b"half a file")  # died mid-upload: no _STAGED.json
    assert store.list_releases() == []
    syn = privatize.fn(plan, _counted(plan, seed=1)["austin"])
    m = persist_release.fn(store_url, plan, syn, None, entries["austin"], "test")
    assert m.resumed_staged_attempt is False and m.version == version
    # the crashed upload is never deleted (it could be another run's upload in flight), never committed
    assert m.attempt != "a-crashed" and all(not f.path.startswith("a-crashed/") for f in m.files)
    _, d = fetch_to_temp(m.url)
    np.testing.assert_array_equal(load_synopsis(d).values, syn.values)


def test_manifest_contents_and_integrity_on_read(store_url):
    (plan,) = _plan(store_url)
    entries = _charge(store_url, [plan])
    syn = privatize.fn(plan, _counted(plan, seed=1)["austin"])
    m = persist_release.fn(store_url, plan, syn, b"png", entries["austin"], "test")
    for key in ("mechanism", "params", "epsilon", "max_points_per_user", "privacy_unit", "noise_source",
                "code_version", "config_hash", "ledger", "files", "privacy", "release_key"):
        assert getattr(m, key) is not None
    assert m.max_points_per_user == 5 and m.privacy.charges[0].sensitivity == 5
    assert {f.name for f in m.files} == {"grid.npz", "synopsis.json", "preview.png", "charge.json"}
    assert all(len(f.sha256) == 64 and f.size > 0 for f in m.files)
    listed = ReleaseStore(store_url).list_releases()
    assert [(r.city, r.version) for r in listed] == [("austin", 1)]
    # tamper with a data file behind the manifest's back: reading fails loudly
    store = ReleaseStore(store_url)
    f = m.file("grid.npz")
    rel = f"releases/synthetic/austin/2010-05-02/v1/{f.path}"
    if store.local:
        with open(store.path(rel), "ab") as fh:
            fh.write(b"x")
    else:
        store.fs.pipe_file(store.path(rel), store.read(rel) + b"x")
    with pytest.raises(IntegrityError, match="integrity check failed"):
        fetch_to_temp(m.url)


def _points_csv(path, points):
    """Write points as the CSV a release reads (user_id, ISO timestamp, lat, lon)."""
    import pandas as pd

    pd.DataFrame({"user_id": [f"u{u}" for u in points.user],
                  "timestamp": pd.to_datetime(points.ts, unit="s", utc=True).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "lat": points.lat, "lon": points.lon}).to_csv(path, index=False)
    return path


def test_over_budget_release_is_refused_before_noise(tmp_path, monkeypatch):
    """The release pipeline itself (in-process form) refuses a run over the cap before any city is
    privatized: no noise is drawn, nothing is staged or listed, and the ledger holds no charge."""
    import flows.release as release
    import flows.release_executors as executors
    from dpcore.privacy.noise import NoiseSource
    from tasks.config import ReleaseParams

    url = str(tmp_path / "store")
    data = _points_csv(tmp_path / "synthetic.csv", _points())
    fits = []
    real_fit = executors.fit_city  # the privatize step's fit, as the in-process form calls it
    monkeypatch.setattr(executors, "fit_city", lambda *a, **k: fits.append(a) or real_fit(*a, **k))
    params = ReleaseParams(data=str(data), cities=["austin", "new-york"], period="2010-05-02", epsilon=0.3,
                           mechanism="identity", mechanism_params={"cell_width_m": 1000}, store=url,
                           max_points_per_user=5, budget_cap=0.5)
    first = release.release_cities(params, in_process=True)
    assert [r["status"] for r in first["releases"]] == ["committed", "committed"] and len(fits) == 2
    store = ReleaseStore(url)
    before = sorted(store.listdir(f"releases/{first['dataset']}/austin/2010-05-02"))

    def no_noise(*a, **k):
        raise AssertionError("noise drawn for a refused release")

    for method in ("discrete_laplace", "add_discrete_laplace", "add_lattice_laplace", "add_discrete_gaussian"):
        monkeypatch.setattr(NoiseSource, method, no_noise)
    fits.clear()
    # Another configuration for the same day takes a person to 0.6 > 0.5: the whole run is refused.
    with pytest.raises(BudgetRefused, match=r"0\.2 left"):
        release.release_cities(params.model_copy(update={"mechanism_params": {"cell_width_m": 500}}),
                               in_process=True)
    assert fits == []
    assert len(store.list_releases()) == 2
    assert sorted(store.listdir(f"releases/{first['dataset']}/austin/2010-05-02")) == before  # no version claimed
    ledger = DatasetLedger(store, first["dataset"])
    # the first run's two entries (its contribution profile, paid alone, then the rest of its ε), no more
    assert len(ledger.entries()) == 2 and ledger.loss()["lifetime"] == pytest.approx(0.3)


def test_unsafe_names_and_missing_release(tmp_path):
    with pytest.raises(StoreError):
        DatasetLedger(ReleaseStore(str(tmp_path / "s")), "../x")
    with pytest.raises(StoreError, match="no committed release"):
        fetch_to_temp(str(tmp_path / "s" / "releases" / "d" / "c" / "p" / "v1"))
