"""`geodp dataset void` through the CLI, on a local store and on S3: it deletes the files of the charge's
unpublished attempts before it gives the charge back, and refuses while the noise is (or will be)
published."""

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.faults import attempt_files, kill_at_write_env, ledger_and_committed

RELEASE = ("--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity", "--param", "cell_width_m=2000",
           "--period", "2024-01-01")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(p)
    return p


@pytest.fixture(scope="module")
def write_order(small, tmp_path_factory) -> list[str]:
    """The objects a clean release into a new store writes, in order (counted, not killed)."""
    tmp = tmp_path_factory.mktemp("count")
    run_geodp("release", small, *RELEASE, "--out", tmp / "s", env=kill_at_write_env(10_000, tmp / "w.log"))
    return [ln.split()[3] for ln in (tmp / "w.log").read_text().splitlines()]


def _killed_at_write(small, store, name, write_order, tmp_path) -> None:
    """A release into a new ``store`` killed right before it writes the object ``name`` of its attempt."""
    n = next(i for i, w in enumerate(write_order, 1) if w.endswith("/" + name))
    r = run_geodp("release", small, *RELEASE, "--out", store, ok=False,
                  env=kill_at_write_env(n, tmp_path / "kill.log"))
    assert r.returncode == -9


def test_void_deletes_the_dead_attempts_noise_first(small, store_url, write_order, tmp_path):
    """Killed mid-upload (the noisy grid is in the store): the void deletes it, then gives the charge
    back; the contribution profile, paid alone before it (entry #0), stays charged and a re-run reuses it:
    the re-run is charged once, the release costs its ε in all."""
    _killed_at_write(small, store_url, "synopsis.json", write_order, tmp_path)
    (files,) = attempt_files(store_url).values()
    assert any(f.endswith("grid.npz") for f in files), files  # noise reached the store under the charge
    r = run_geodp("dataset", "void", store_url, "small", "--seq", "1", "--reason", "killed mid-upload")
    assert f"deleted {len(files)} unpublished file" in r.stdout
    assert all(f == [] for f in attempt_files(store_url).values()), attempt_files(store_url)
    (profile,) = DatasetLedger(ReleaseStore(store_url), "small").held()
    assert profile.seq == 0 and profile.charge.key.endswith("/profile") and profile.charge.epsilon == pytest.approx(0.01)
    run_geodp("release", small, *RELEASE, "--out", store_url)
    charged, committed = ledger_and_committed(store_url)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["local"], indirect=True)
def test_void_refuses_published_or_staged_noise(small, store_url, write_order, tmp_path):
    """A refusal reads the ledger, the manifest and the staged mark, as the deletion above does on both
    backends (S3 there): it runs on a local store only."""
    # killed right before the manifest: the attempt is complete; a re-run commits it, so no void
    _killed_at_write(small, store_url, "_MANIFEST.json", write_order, tmp_path)
    r = run_geodp("dataset", "void", store_url, "small", "--seq", "1", "--reason", "x", ok=False)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "staged" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    run_geodp("release", small, *RELEASE, "--out", store_url)
    # committed: the charge paid for published noise
    r = run_geodp("dataset", "void", store_url, "small", "--seq", "1", "--reason", "x", ok=False)
    assert r.returncode == 2 and "published" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # the recorded contribution profile decided the verdict: its charge (entry #0) stays too
    r = run_geodp("dataset", "void", store_url, "small", "--seq", "0", "--reason", "x", ok=False)
    assert r.returncode == 2 and "contribution profile" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    charged, committed = ledger_and_committed(store_url)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)
    r = run_geodp("dataset", "void", store_url, "small", "--seq", "7", "--reason", "x", ok=False)
    assert r.returncode == 2 and "no charge entry #7" in r.stderr
