"""A committed manifest is checked against its own hash and against the ledger entry it names: one
without its hash, or edited with the hash recomputed, is a one-line integrity error on every reader,
never an accepted smaller ε or a KeyError."""

import json

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.store import MANIFEST_HASH, manifest_hash
from tests.cli_runner import run_geodp
from tests.test_store_faults import one_line_error

BOX = ("--box", "40.70,-74.02,40.72,-74.00")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    data = d / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(data)
    store = d / "s"
    run_geodp("release", data, "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
              "--param", "cell_width_m=2000", "--out", store)
    (version,) = store.glob("releases/small/new-york/all/v1")
    return store, version


def _readers(store, version):
    return [("releases", "list", store, "--json"), ("query", str(version), *BOX), ("releases", "show", str(version))]


@pytest.mark.parametrize("edit", ["hash removed", "hash recomputed", "minimal"])
def test_an_edited_manifest_is_an_integrity_error_on_every_reader(edit, released):
    store, version = released
    path = version / "_MANIFEST.json"
    original = path.read_text()
    body = json.loads(original)
    if edit == "hash removed":
        body = {k: v for k, v in body.items() if k != MANIFEST_HASH} | {"epsilon": 0.01}
    elif edit == "hash recomputed":  # a smaller ε claimed, the manifest's own hash made to fit
        body = {k: v for k, v in body.items() if k != MANIFEST_HASH} | {"epsilon": 0.01}
        body[MANIFEST_HASH] = manifest_hash(body)
    else:
        body = {"files": [], "release_key": body["release_key"]}
    try:
        path.write_text(json.dumps(body))
        for args in _readers(store, version):
            line = one_line_error(run_geodp(*args, ok=False))
            assert "ε=0.01" not in line or "ledger" in line, line
    finally:
        path.write_text(original)
    assert json.loads(run_geodp("releases", "list", store, "--json").stdout)[0]["epsilon"] == 0.1
