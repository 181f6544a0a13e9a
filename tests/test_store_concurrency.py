"""Same-key releases racing each other and processes killed at every store write: readers only ever
see whole releases, and every committed release reads back, on a local store and on S3."""

import json
import multiprocessing as mp
import os

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import IntegrityError, ReleaseStore, fetch_to_temp
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store
from tests.faults import kill_at_write_env


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(p)
    return p


def _release(args):
    data, store, env = args
    os.environ.update(env)
    from flows.cli import main

    return main(["release", data, "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
                 "--param", "cell_width_m=2000", "--period", "2024-01-01", "--store", store, "--no-prefect"])


def _readable_releases(store_url: str) -> list[dict]:
    out = []
    for m in ReleaseStore(store_url).list_releases():
        manifest, _ = fetch_to_temp(m.url)  # every file verified
        out.append(manifest)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("where,rounds", [("local", 20), ("s3", 6)])
def test_the_same_release_twice_in_parallel_leaves_one_readable_release(where, rounds, small, tmp_path, request):
    env = {}
    if where == "s3":
        moto = request.getfixturevalue("moto_s3")
        env = {k: os.environ[k] for k in ("GEODP_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_DEFAULT_REGION")}
    with mp.get_context("spawn").Pool(2) as pool:
        for i in range(rounds):
            store = str(tmp_path / f"s{i}") if where == "local" else new_s3_store(moto)
            codes = pool.map(_release, [(str(small), store, env)] * 2)
            assert codes == [0, 0]
            found = _readable_releases(store)
            assert len(found) == 1, [(m.version, m.period, m.release_key) for m in found]
            (manifest,) = found
            # the charge that paid for the committed noise is held; the other run gave its own back
            ledger = DatasetLedger(ReleaseStore(store), "small")
            held = ledger.held()
            assert [h.seq for h in held] == [manifest.ledger.seq]
            assert ledger.loss()["lifetime"] == pytest.approx(0.1)


@pytest.mark.slow
def test_a_kill_at_any_store_write_never_shows_a_partial_release(small, tmp_path):
    """kill -9 right before the N-th store write, for every N until a run completes: after each kill,
    readers see nothing or a whole release; a clean re-run then commits exactly one readable release."""
    store = str(tmp_path / "s")
    n = 0
    while True:
        n += 1
        log = tmp_path / f"writes-{n}.log"
        r = run_geodp("release", small, "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
                      "--param", "cell_width_m=2000", "--period", "2024-01-01", "--out", store, ok=False,
                      env=kill_at_write_env(n, log))
        # the hook ran in the CLI process: it counted that process's writes (and fired at the n-th)
        lines = log.read_text().splitlines() if log.exists() else []
        counted = [ln for ln in lines if ln.split()[1] == "write"]
        assert len({ln.split()[0] for ln in lines}) <= 1, lines
        if r.returncode == 0:
            assert 0 < len(counted) < n and not any("kill" in ln for ln in lines), lines
            break
        assert r.returncode == -9, r.stderr[-2000:]
        assert len(counted) == n and lines[-1].endswith(f"kill at write {n}"), lines
        assert len(_readable_releases(store)) <= 1
        assert n < 40, "the release never completed"
    assert n > 8  # the kills really hit the ledger, the claim, the files and the manifest
    again = run_geodp("release", small, "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
                      "--param", "cell_width_m=2000", "--period", "2024-01-01", "--out", store)
    assert "already committed" in again.stdout
    (manifest,) = _readable_releases(store)
    q = run_geodp("query", manifest_url(store), "--box", "40.70,-74.02,40.72,-74.00", "--json")
    assert len(json.loads(q.stdout)) == 1


def manifest_url(store: str) -> str:
    (m,) = ReleaseStore(store).list_releases()
    return m.url


def test_altered_or_missing_files_are_one_line_errors(small, tmp_path):
    store = tmp_path / "s"
    run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--mechanism", "identity",
              "--param", "cell_width_m=2000", "--out", store)
    (version,) = store.glob("releases/small/new-york/all/v1")
    manifest_path = version / "_MANIFEST.json"
    body = json.loads(manifest_path.read_text())
    # an altered manifest (a bigger ε claimed after the fact) is detected on read
    os.chmod(manifest_path, 0o644)
    manifest_path.write_text(json.dumps({**body, "epsilon": 0.01}))
    r = run_geodp("query", store, "--box", "40.70,-74.02,40.72,-74.00", ok=False)
    assert r.returncode == 2 and "altered" in r.stderr and "Traceback" not in r.stderr
    manifest_path.write_text(json.dumps(body))
    # a file the manifest lists is gone
    grid = next(version.glob("*/grid.npz"))
    grid.unlink()
    r = run_geodp("releases", "show", str(version), ok=False)
    assert r.returncode == 2 and "missing" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(IntegrityError):
        fetch_to_temp(str(version))


def test_seeded_noise_never_enters_a_ledgered_store(small, tmp_path):
    store = tmp_path / "s"
    run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--out", store)
    r = run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--period", "2024-01-01",
                  "--seed", "3", "--out", store, ok=False)
    assert r.returncode == 2 and "seeded" in r.stderr
    assert len(ReleaseStore(str(store)).list_releases()) == 1
    lab = tmp_path / "lab"
    run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--seed", "3", "--out", lab)
    assert not (lab / "datasets").exists()  # an experiment is not charged to anyone's budget
    r = run_geodp("release", small, "--city", "new-york", "--epsilon", "0.5", "--period", "2024-01-01",
                  "--out", lab, ok=False)
    assert r.returncode == 2 and "experiments" in r.stderr
