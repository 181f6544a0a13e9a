"""What an operator with write access to the store can do to the ledger, through the CLI, on a local
folder and on S3 (moto): a void appended with the ledger's own API that gives back a published charge,
deleted source bindings, a deleted dataset folder or policy, a hard link to the input. Each is one
`error:` line, exit 2, on `geodp ledger` and on the next release, with nothing charged or written;
the ledger is compared to the committed releases after each scenario. An appended void is the ledger's
own logic whatever the backend (one create-only entry, then verify), so it runs on a local store only;
a deletion runs on both, as an S3 "folder" that is gone lists differently from a local one."""

import json
import os
import shutil

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store
from tests.test_store_faults import one_line_error

RELEASE = ("--city", "new-york", "--epsilon", "0.4", "--mechanism", "identity", "--param", "cell_width_m=2000",
           "--no-prefect")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=40, days=3, seed=4).to_parquet(p)
    return p


def _release(data, store, period: str, *extra, ok: bool = True):
    return run_geodp("release", data, *RELEASE, "--period", period, "--store", store, *extra, ok=ok)


@pytest.fixture(scope="module")
def released(small, tmp_path_factory, request):
    """Per store kind, one store made once for the module: two committed releases of dataset `small`,
    ε = 0.4 each (the ledger shows 0.8). Each test tampers with a copy (:func:`_two_releases`): a self-homed
    store names no URL of its own (its ledger record says "."), so a copy is the same store elsewhere."""
    made: dict[str, str] = {}

    def pristine(kind: str) -> str:
        if kind not in made:
            store = str(tmp_path_factory.mktemp("pristine") / "s") if kind == "local" else \
                new_s3_store(request.getfixturevalue("moto_s3"))
            for day in ("2024-01-01", "2024-01-02"):
                _release(small, store, day)
            made[kind] = store
        return made[kind]

    return pristine


def _two_releases(released, store: str) -> DatasetLedger:
    """``store`` (new, local or S3) made a copy of the module's two-release store of its kind."""
    import boto3

    if not store.startswith("s3://"):
        shutil.copytree(released("local"), store)
    else:
        source, target = (u.split("/")[2] for u in (released("s3"), store))
        s3 = boto3.client("s3", endpoint_url=os.environ["GEODP_S3_ENDPOINT_URL"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=source):
            for obj in page.get("Contents", []):
                s3.copy_object(Bucket=target, Key=obj["Key"], CopySource={"Bucket": source, "Key": obj["Key"]})
    ledger = DatasetLedger(ReleaseStore(store), "small")
    assert ledger.loss()["lifetime"] == pytest.approx(0.8) and len(ReleaseStore(store).list_releases()) == 2
    return ledger


def _committed_epsilon(store: str) -> float:
    return sum(r["epsilon"] for r in json.loads(run_geodp("releases", "list", store, "--json").stdout))


def _refused_everywhere(data, store: str, *words: str) -> None:
    """`geodp ledger` and the next release (of the same dataset, and of the same file under another
    name) are one-line errors naming ``words``; nothing is charged, committed or created by them."""
    st = ReleaseStore(store)
    before = sorted(st.fs.find(st.root))
    one_line_error(run_geodp("ledger", store, ok=False), *words)
    one_line_error(_release(data, store, "2024-01-03", ok=False), *words)
    one_line_error(_release(data, store, "2024-01-03", "--dataset", "other", ok=False))
    assert sorted(ReleaseStore(store).fs.find(st.root)) == before
    assert _committed_epsilon(store) == pytest.approx(0.8)


@pytest.mark.parametrize("store_url", ["local"], indirect=True)
def test_an_appended_void_of_a_recorded_profiles_charge_is_an_integrity_error(small, released, store_url):
    """The first release's contribution profile, charged alone and recorded under profiles/ before its
    verdict: its noise is in the store, so its charge is never given back. Before: `geodp ledger` verified
    and the ledger showed 0.01 less than was spent."""
    ledger = _two_releases(released, store_url)
    profile = next(h for h in ledger.held() if h.charge.extra.get("profile_of"))
    ledger.void(profile.seq, [profile.charge.key], "an operator gives a recorded profile's charge back")
    _refused_everywhere(small, store_url, "gives that charge back")


def _rm(store: str, rel: str) -> None:
    st = ReleaseStore(store)
    st.fs.rm(st.path(rel), recursive=True)


@pytest.mark.parametrize("store_url", ["local"], indirect=True)
def test_an_appended_void_of_a_published_charge_is_an_integrity_error(small, released, store_url):
    ledger = _two_releases(released, store_url)
    # the first release's own charge (its contribution profile, charged alone before it, is another entry)
    first = next(h for h in ledger.held() if not h.charge.extra.get("profile_of"))
    # a valid chain, nothing rewritten: one void entry appended with the ledger's own API
    ledger.void(first.seq, [first.charge.key], "an operator gives a published charge back")
    _refused_everywhere(small, store_url, "gives that charge back")


def test_deleted_source_bindings_are_an_integrity_error_and_free_no_budget(small, released, store_url):
    _two_releases(released, store_url)
    _rm(store_url, "sources")
    _refused_everywhere(small, store_url, "source binding")


def test_a_deleted_dataset_folder_is_an_integrity_error_not_an_empty_ledger(small, released, store_url):
    _two_releases(released, store_url)
    _rm(store_url, "datasets/small")
    r = run_geodp("ledger", store_url, ok=False)
    assert "empty" not in r.stderr
    _refused_everywhere(small, store_url, "policy is missing")


def test_a_deleted_policy_is_an_integrity_error_and_no_new_policy_is_written(small, released, store_url):
    _two_releases(released, store_url)
    _rm(store_url, "datasets/small/policy/00000000.json")
    _refused_everywhere(small, store_url, "policy is missing")
    assert ReleaseStore(store_url).listdir("datasets/small/policy") == []


def test_a_hard_link_to_the_input_is_the_same_source(small, released, tmp_path):
    store = str(tmp_path / "s")
    _two_releases(released, store)
    link = tmp_path / "renamed.parquet"
    os.link(small, link)
    line = one_line_error(_release(link, store, "2024-01-03", "--dataset", "renamed", ok=False), "already the source")
    assert "small" in line
    assert _committed_epsilon(store) == pytest.approx(0.8)
    ledger = json.loads(run_geodp("ledger", store, "--json").stdout)
    assert [row["dataset"] for row in ledger] == ["small"] and ledger[0]["loss"]["lifetime"] == pytest.approx(0.8)
