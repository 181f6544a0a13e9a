"""The typed release manifest (tasks/storage/manifest.py): `geodp release show` on committed releases,
in text and JSON, manifests of the first format, and manifests that are not release manifests."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.manifest import Manifest
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """One ledgered (secure noise) release committed through the CLI; returns (store dir, version dir)."""
    base = tmp_path_factory.mktemp("manifest")
    data = base / "checkins.parquet"
    generate_checkins(city_region("austin"), n_users=200, days=3, seed=5).to_parquet(data)
    os.utime(data, (1_710_000_000, 1_710_000_000))
    out = base / "rel"
    run_geodp("release", data, "--city", "austin", "--epsilon", "0.5", "--mechanism", "ug",
              "--max-points-per-user", "4", "--out", out)
    (version,) = out.glob("releases/*/austin/all/v1")
    return out, version


def test_release_show_prints_a_committed_release(committed):
    _, version = committed
    stored = json.loads((version / "_MANIFEST.json").read_text())
    r = run_geodp("release", "show", version)
    assert f"{stored['dataset']}/austin/all v1 (committed {stored['committed_at']})" in r.stdout
    assert f"paid by ledger entry #{stored['ledger']['seq']} of dataset {stored['dataset']}" in r.stdout
    assert f"privacy unit user, k={stored['max_points_per_user']}" in r.stdout
    for c in stored["privacy"]["charges"]:
        assert f"charge {c['name']}: " in r.stdout
    for f in stored["files"]:
        assert f"{f['name']}\t{f['size']} bytes\tsha256 {f['sha256'][:16]}… ok" in r.stdout


def test_release_show_json_is_the_committed_body(committed):
    out, version = committed
    stored = json.loads((version / "_MANIFEST.json").read_text())
    shown = json.loads(run_geodp("release", "show", version, "--json").stdout)
    assert shown.pop("url") == str(version)
    assert shown == stored
    # the legacy spelling and a store holding one release show the same
    assert json.loads(run_geodp("releases", "show", out, "--json").stdout) == {**stored, "url": str(version)}


def test_release_list_json_keys_are_stable(committed):
    out, version = committed
    (row,) = json.loads(run_geodp("releases", "list", out, "--json").stdout)
    stored = json.loads((version / "_MANIFEST.json").read_text())
    assert row.pop("verdict").startswith("verdict: ")  # the release's verdict per band (issue 43 item 5)
    assert row == {"dataset": stored["dataset"], "city": "austin", "period": "all", "version": 1,
                   "epsilon": 0.5, "rho": None, "mechanism": "ug", "url": str(version)}


def _as_first_format(body: dict) -> dict:
    """What the first manifest format wrote: the charge under ``ledger_entry``, no rho, quality, hash."""
    old = {k: v for k, v in body.items() if k not in ("rho", "quality", "manifest_sha256", "ledger", "format")}
    old["ledger_entry"] = {"seq": body["ledger"]["seq"], "created_at": "2026-11-22T10:00:00.000000Z"}
    return old


def test_a_manifest_of_the_first_format_still_loads(committed, tmp_path):
    _, version = committed
    body = json.loads((version / "_MANIFEST.json").read_text())
    old_version = tmp_path / "old" / "releases" / body["dataset"] / "austin" / "all" / "v1"
    shutil.copytree(version, old_version)
    (old_version / "_MANIFEST.json").unlink()
    (old_version / "_MANIFEST.json").write_text(json.dumps(_as_first_format(body)))
    (m,) = ReleaseStore(str(tmp_path / "old")).list_releases()
    assert isinstance(m, Manifest) and m.ledger.seq == body["ledger"]["seq"] and m.rho is None
    r = run_geodp("release", "show", old_version)
    assert f"paid by ledger entry #{body['ledger']['seq']}" in r.stdout
    q = run_geodp("query", old_version, "--box", "30.25,-97.76,30.28,-97.73", "--json")
    assert set(json.loads(q.stdout)[0]) >= {"box", "estimate", "lower", "upper"}


def test_a_manifest_missing_a_required_field_is_one_line(committed, tmp_path):
    _, version = committed
    body = json.loads((version / "_MANIFEST.json").read_text())
    bad_version = tmp_path / "bad" / "releases" / body["dataset"] / "austin" / "all" / "v1"
    shutil.copytree(version, bad_version)
    (bad_version / "_MANIFEST.json").unlink()
    (bad_version / "_MANIFEST.json").write_text(json.dumps(
        {k: v for k, v in body.items() if k not in ("mechanism", "manifest_sha256")}))
    r = run_geodp("release", "show", bad_version, ok=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "KeyError" not in r.stderr
    assert "is not a release manifest: mechanism: Field required" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
