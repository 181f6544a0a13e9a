"""One ledger wherever a source is released from: the platform setting `ledger` (GEODP_LEDGER) names
the one ledger home that every release store charges, so the same source released into a second
store draws on the same budget; a store keeps the home it first charged (a release configured with
another is refused: one line, exit 2, nothing charged), the home's verification finds the
releases of every store that charges it, and `geodp dataset void` gives a killed run's charge back in
the home after deleting its files in the store. Through the CLI, on local stores and on S3 (moto)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from tasks.storage.ledger import DatasetLedger
from tasks.storage.ledger_home import canonical_url
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store
from tests.faults import attempt_files, kill_at_write_env

DAY = "2024-01-01"


def _data(tmp_path: Path) -> str:
    region = city_region("new-york")
    rng = np.random.default_rng(5)
    x, y = rng.uniform(-0.3, 0.3, (2, 200)) * region.side_m
    lat, lon = region.unproject(x, y)
    path = tmp_path / "checkins.parquet"
    pd.DataFrame({"user_id": np.arange(200) % 40,
                  "timestamp": pd.Timestamp(f"{DAY}T01:00Z") + pd.to_timedelta(np.arange(200) * 6, "min"),
                  "lat": lat, "lon": lon}).to_parquet(path)
    return str(path)


def _release(data: str, store: str, epsilon: str, *extra: str, ledger: str | None = None, env: dict | None = None):
    env = {**(env or {}), **({"GEODP_LEDGER": ledger} if ledger else {})}
    return run_geodp("release", data, "--city", "new-york", "--epsilon", epsilon, "--mechanism", "identity",
                     "--param", "cell_width_m=2000", "--period", DAY, "--store", store, "--no-prefect",
                     "--publish-anyway", *extra, ok=False, env=env)


def _ledger_json(store: str, ledger: str | None = None) -> list[dict]:
    proc = run_geodp("ledger", store, "--json", env={"GEODP_LEDGER": ledger} if ledger else None)
    return json.loads(proc.stdout)


def _refused(proc, words: str) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and words in last, last
    return last


def _entries(home: str) -> int:
    return len(DatasetLedger(ReleaseStore(home), "checkins").entries())


@pytest.mark.slow
def test_two_stores_with_one_ledger_home_charge_one_ledger(tmp_path):
    data = _data(tmp_path)
    a, b, home = (str(tmp_path / n) for n in ("store-a", "store-b", "ledger"))
    assert _release(data, a, "1", "--budget-cap", "1.5", ledger=home).returncode == 0
    # the same release into a second store is a second release of the same people: 1 + 1 > 1.5
    _refused(_release(data, b, "1", ledger=home), "budget exceeded")
    assert _entries(home) == 2 and ReleaseStore(b).list_releases() == []
    assert _release(data, b, "0.5", ledger=home).returncode == 0
    # one ledger: both stores' charges, seen from either store, whatever the environment says now
    for store in (a, b, home):
        (row,) = _ledger_json(store)
        assert row["charges"] == 4 and abs(row["loss"]["lifetime"] - 1.5) < 1e-9, row
    assert not (Path(a) / "datasets").exists() and not (Path(b) / "datasets").exists()
    (released,) = ReleaseStore(b).list_releases()
    assert released.ledger.home == canonical_url(ReleaseStore(home)) and released.ledger.seq == 3
    # the home's verification finds store B's release: deleting the entry that paid for it is an error
    (Path(home) / "datasets" / "checkins" / "ledger" / "00000001.json").unlink()
    _refused(run_geodp("ledger", a, ok=False), "does not verify")
    _refused(_release(data, a, "0.1", ledger=home), "does not verify")


@pytest.mark.slow
def test_a_store_keeps_the_ledger_it_first_charged(tmp_path):
    data = _data(tmp_path)
    own, bound = str(tmp_path / "own"), str(tmp_path / "bound")
    home, other = str(tmp_path / "ledger"), str(tmp_path / "other-ledger")
    assert _release(data, own, "0.5").returncode == 0  # no setting: the store is its own home
    # a store with its own ledger is not charged in another home (its charges would be forgotten)
    _refused(_release(data, own, "0.25", ledger=home), "one ledger")
    assert _release(data, bound, "0.5", ledger=home).returncode == 0
    _refused(_release(data, bound, "0.25", ledger=other), "one ledger")
    assert _entries(home) == 2 and not Path(other, "datasets").exists()
    # without the setting, a store charges the home it recorded, never a fresh ledger of its own
    assert _release(data, bound, "0.25").returncode == 0
    assert _entries(home) == 4 and not (Path(bound) / "datasets").exists()
    (row,) = _ledger_json(bound)
    assert abs(row["loss"]["lifetime"] - 0.75) < 1e-9


def test_void_gives_back_in_the_home_what_a_killed_run_charged_for_another_store(tmp_path):
    data = _data(tmp_path)
    log = tmp_path / "writes.log"
    _release(data, str(tmp_path / "count-store"), "0.5", ledger=str(tmp_path / "count-ledger"),
             env=kill_at_write_env(10_000, log))
    order = [ln.split()[3] for ln in log.read_text().splitlines()]
    n = next(i for i, w in enumerate(order, 1) if w.endswith("/synopsis.json"))
    store, home = str(tmp_path / "store"), str(tmp_path / "ledger")
    assert _release(data, store, "0.5", ledger=home, env=kill_at_write_env(n, tmp_path / "kill.log")).returncode == -9
    (files,) = attempt_files(store).values()
    assert files  # noise reached the store under the charge held in the home
    # entry #0 is the contribution profile, paid alone and recorded: it stays; #1 paid the noisy grid
    r = run_geodp("dataset", "void", store, "checkins", "--seq", "1", "--reason", "killed", env={"GEODP_LEDGER": home})
    assert f"deleted {len(files)} unpublished file" in r.stdout
    assert all(f == [] for f in attempt_files(store).values())
    assert [e["kind"] for e in DatasetLedger(ReleaseStore(home), "checkins").entries()] == ["charge", "charge", "void"]
    assert not (Path(store) / "datasets").exists()


def test_an_s3_ledger_home_is_charged_by_a_local_and_an_s3_store(tmp_path, moto_s3):
    data = _data(tmp_path)
    home, a = new_s3_store(moto_s3), new_s3_store(moto_s3)
    b = str(tmp_path / "store-b")
    assert _release(data, a, "1", "--budget-cap", "1.5", ledger=home).returncode == 0
    _refused(_release(data, b, "1", ledger=home), "budget exceeded")
    assert _release(data, b, "0.5", ledger=home).returncode == 0
    (row,) = _ledger_json(b)
    # each release: its contribution profile, charged alone, and the rest of its ε
    assert row["charges"] == 4 and abs(row["loss"]["lifetime"] - 1.5) < 1e-9
    assert ReleaseStore(a).listdir("datasets") == [] and _entries(home) == 4


def test_the_plan_takes_its_ledger_from_the_configuration(tmp_path, monkeypatch):
    from tasks.config import ReleaseParams
    from tasks.release_plan import plan_release

    data = _data(tmp_path)
    home = tmp_path / "configured-ledger"
    cfg = tmp_path / "geodp.toml"
    cfg.write_text(f'store = "{tmp_path / "store"}"\nledger = "{home}"\n')
    params = ReleaseParams(data=data, cities=["new-york"], epsilon=0.5, period=DAY)
    assert plan_release(params, str(cfg), check_useful=False).home.url == str(home.resolve())
    monkeypatch.setenv("GEODP_LEDGER", str(tmp_path / "from-env"))
    assert plan_release(params, str(cfg), check_useful=False).home.url == str((tmp_path / "from-env").resolve())


def test_the_ledger_commands_take_the_ledger_home_from_config(tmp_path):
    store, home = str(tmp_path / "store"), str(tmp_path / "ledger")
    config = tmp_path / "geodp.toml"
    config.write_text(f'ledger = "{home}"\n')
    run_geodp("dataset", "create", store, "checkins", "--source", str(tmp_path / "checkins.parquet"),
              "--budget", "2", "--config", str(config))
    # the policy lives in the configured home, which the store now names; the store holds no ledger
    assert DatasetLedger(ReleaseStore(home), "checkins").policy().budget == 2
    assert not (Path(store) / "datasets").exists()
    for where in (["--config", str(config)], []):
        (row,) = json.loads(run_geodp("ledger", store, "--json", *where).stdout)
        assert row["dataset"] == "checkins" and row["policy"]["budget"] == 2, row
    _refused(run_geodp("ledger", store, "--config", str(tmp_path / "missing.toml"), ok=False), "missing.toml")
