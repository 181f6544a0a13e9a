"""Release store and ledger: create-only writes, caps, parallel writers, exactly-once, crash windows,
integrity on read; against a local folder and against a real S3 endpoint (moto's server over HTTP)."""

import json
import multiprocessing as mp
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dpcore.data import Points
from dpcore.synopsis import load_synopsis
from flows.store import IntegrityError, LedgerRefused, ReleaseRef, ReleaseStore, StoreError, fetch_to_temp
from tasks.config import parse_period
from tasks.release_tasks import bound_and_split, charge_ledger, make_plans, persist_release, privatize


def _s3_store(moto_s3) -> str:
    import boto3

    bucket = "geodp-" + uuid.uuid4().hex[:10]
    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/prefix"


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return _s3_store(request.getfixturevalue("moto_s3"))


def test_create_only_never_overwrites(store_url):
    store = ReleaseStore(store_url)
    store.create("x/a.json", b"first")
    with pytest.raises(FileExistsError):
        store.create("x/a.json", b"second")
    assert ReleaseStore(store_url).read("x/a.json") == b"first"
    assert store.listdir("x") == ["a.json"]


def test_ledger_cap_refusal_says_what_is_left(store_url):
    store = ReleaseStore(store_url)
    kw = dict(dataset="ds", period="2010-05-01", cap=1.0, config_hash="c")
    e, created = store.charge(city="austin", epsilon=0.4, release_key="k1", **kw)
    assert created and e["seq"] == 0
    # the same release key is charged once: a retry reuses the entry
    e2, created2 = store.charge(city="austin", epsilon=0.4, release_key="k1", **kw)
    assert not created2 and e2 == e
    store.charge(city="boston", epsilon=0.4, release_key="k2", **kw)
    with pytest.raises(LedgerRefused, match=r"left ε=0\.2") as info:
        store.charge(city="chicago", epsilon=0.3, release_key="k3", **kw)
    assert "needs ε=0.3" in str(info.value)
    assert [x["release_key"] for x in store.ledger_entries("ds", "2010-05-01")] == ["k1", "k2"]
    assert store.spent("ds", "2010-05-01") == pytest.approx(0.8)
    # other periods have their own cap
    store.charge(dataset="ds", period="2010-05-02", city="chicago", epsilon=0.9, cap=1.0, release_key="k3",
                 config_hash="c")
    summary = {(s["dataset"], s["period"]): s for s in store.budget_summary()}
    assert summary[("ds", "2010-05-01")]["left"] == pytest.approx(0.2)
    assert summary[("ds", "2010-05-02")]["entries"] == 1


def test_parallel_writers_cannot_overspend(store_url):
    """16 writers race for a cap that fits 5 charges: exactly 5 succeed, the log is contiguous."""
    def writer(i):
        try:
            ReleaseStore(store_url).charge(dataset="ds", period="p", city=f"c{i}", epsilon=0.2, cap=1.0,
                                           release_key=f"key{i}", config_hash="h")
            return True
        except LedgerRefused:
            return False

    with ThreadPoolExecutor(8) as pool:
        ok = list(pool.map(writer, range(16)))
    entries = ReleaseStore(store_url).ledger_entries("ds", "p")
    assert sum(ok) == 5 == len(entries)
    assert [e["seq"] for e in entries] == list(range(5))
    assert sum(e["epsilon"] for e in entries) <= 1.0 + 1e-9


def _proc_charge(args):
    url, i, key = args
    try:
        e, created = ReleaseStore(url).charge(dataset="ds", period="p", city="c", epsilon=0.3, cap=1.0,
                                              release_key=key, config_hash="h")
        return created
    except LedgerRefused:
        return None


def test_parallel_processes_same_and_different_keys(tmp_path):
    """Separate processes: the same key is charged once; different keys stop at the cap."""
    url = str(tmp_path / "store")
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        same = pool.map(_proc_charge, [(url, i, "same") for i in range(6)])
        diff = pool.map(_proc_charge, [(url, i, f"k{i}") for i in range(6)])
    assert same.count(True) == 1 and same.count(False) == 5
    assert diff.count(True) == 2  # 0.3 (same) + 2 × 0.3 = 0.9 ≤ 1.0 < 1.2
    assert ReleaseStore(url).spent("ds", "p") == pytest.approx(0.9)


def _points(n_users=60, per_user=30, seed=0):
    rng = np.random.default_rng(seed)
    n = n_users * per_user
    user = np.repeat(np.arange(n_users), per_user)
    lat = 30.2672 + rng.normal(0, 0.02, n)
    lon = -97.7431 + rng.normal(0, 0.02, n)
    ts = np.full(n, 1272758400) + rng.integers(0, 86400, n)  # 2010-05-02 UTC
    return Points(user.astype(np.int64), ts.astype(np.int64), lat, lon)


def _plan(store_url, epsilon=0.5, cities=("austin",), seed=1):
    return make_plans(dataset="synthetic", cities=list(cities), center=None, side_km=None,
                      period=parse_period("2010-05-02"), mechanism="identity", params={"cell_width_m": 1000},
                      epsilon=epsilon, privacy_unit="user", max_points_per_user=5, seed=seed, data_version="v0")


def test_crash_between_data_and_manifest_then_rerun_commits_the_same_noise(store_url, monkeypatch):
    store = ReleaseStore(store_url)
    (plan,) = _plan(store_url)
    entries = charge_ledger.fn(store_url, [plan], cap=1.0)
    inputs = bound_and_split.fn(_points(), [plan], seed=1)
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
    # the re-run reuses the charge (no second entry) and publishes the noise that was staged first
    entries2 = charge_ledger.fn(store_url, [plan], cap=1.0)
    assert entries2["austin"] == entries["austin"]
    other = privatize.fn(plan, bound_and_split.fn(_points(), [plan], seed=2)["austin"])
    m = persist_release.fn(store_url, plan, other, None, entries2["austin"], "test")
    assert m["resumed_staged_attempt"] is True and m["version"] == 1
    assert len(store.ledger_entries()) == 1
    _, d = fetch_to_temp(m["url"])
    np.testing.assert_array_equal(load_synopsis(d).values, syn.values)
    # and a third run is a no-op returning the same version
    m3 = persist_release.fn(store_url, plan, other, None, entries2["austin"], "test")
    assert m3["version"] == 1 and m3["attempt"] == m["attempt"]
    assert len(store.list_releases()) == 1


def test_incomplete_attempt_is_discarded_and_invisible(store_url):
    store = ReleaseStore(store_url)
    (plan,) = _plan(store_url)
    entries = charge_ledger.fn(store_url, [plan], cap=1.0)
    version, _ = store.claim_version(plan.dataset, plan.city, plan.period.label, plan.release_key)
    ref = ReleaseRef(plan.dataset, plan.city, plan.period.label, version)
    store.create(f"{ref.rel}/a-crashed/grid.npz", b"half a file")  # died mid-upload: no _STAGED.json
    assert store.list_releases() == []
    syn = privatize.fn(plan, bound_and_split.fn(_points(), [plan], seed=1)["austin"])
    m = persist_release.fn(store_url, plan, syn, None, entries["austin"], "test")
    assert m["resumed_staged_attempt"] is False and m["version"] == version
    assert "a-crashed" not in store.listdir(ref.rel)


def test_manifest_contents_and_integrity_on_read(store_url):
    (plan,) = _plan(store_url)
    entries = charge_ledger.fn(store_url, [plan], cap=1.0)
    syn = privatize.fn(plan, bound_and_split.fn(_points(), [plan], seed=1)["austin"])
    m = persist_release.fn(store_url, plan, syn, b"png", entries["austin"], "test")
    for key in ("mechanism", "params", "epsilon", "max_points_per_user", "privacy_unit", "noise_source",
                "code_version", "config_hash", "ledger_entry", "files", "privacy", "release_key"):
        assert key in m
    assert m["max_points_per_user"] == 5 and m["privacy"]["charges"][0]["sensitivity"] == 5
    assert {f["name"] for f in m["files"]} == {"grid.npz", "synopsis.json", "preview.png"}
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in m["files"])
    listed = ReleaseStore(store_url).list_releases()
    assert [(r["city"], r["version"]) for r in listed] == [("austin", 1)]
    # tamper with a data file behind the manifest's back: reading fails loudly
    store = ReleaseStore(store_url)
    f = next(f for f in m["files"] if f["name"] == "grid.npz")
    rel = f"releases/synthetic/austin/2010-05-02/v1/{f['path']}"
    if store.local:
        with open(store.path(rel), "ab") as fh:
            fh.write(b"x")
    else:
        store.fs.pipe_file(store.path(rel), store.read(rel) + b"x")
    with pytest.raises(IntegrityError, match="integrity check failed"):
        fetch_to_temp(m["url"])


def test_over_budget_release_is_refused_before_noise(tmp_path, monkeypatch):
    url = str(tmp_path / "store")
    plans = _plan(url, epsilon=0.6, cities=("austin", "new-york"))

    def no_noise(*a, **k):
        raise AssertionError("noise drawn for a refused release")

    monkeypatch.setattr("dpcore.noise.NoiseSource.discrete_laplace", no_noise)
    with pytest.raises(LedgerRefused, match=r"left ε=1"):
        charge_ledger.fn(url, plans, cap=1.0)  # 2 × 0.6 > 1.0: the whole run is refused up front
    assert ReleaseStore(url).ledger_entries() == []


def test_unsafe_names_and_missing_release(tmp_path):
    with pytest.raises(StoreError):
        ReleaseStore(str(tmp_path / "s")).charge(dataset="../x", period="p", city="c", epsilon=1, cap=2,
                                                  release_key="k", config_hash="h")
    with pytest.raises(StoreError, match="no committed release"):
        fetch_to_temp(str(tmp_path / "s" / "releases" / "d" / "c" / "p" / "v1"))
    json.dumps({})  # keep json import used for readability of failures
