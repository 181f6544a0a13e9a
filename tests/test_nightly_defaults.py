"""The shipped nightly (deploy/geodp.toml) as it is served: its [nightly.policy] becomes the policy of
the dataset the nightly creates (a stored policy that differs is refused in one line), its rolling
period releases the last 7 days, and its options beat a blank map on data-centred 1–5 km squares of
real check-ins (Gowalla NYC, one week)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dpcore.privacy.accounting import PolicyError
from flows.cli import main
from flows.release import release_cities
from flows.serve import build_deployments
from tasks.config import ReleaseParams
from tasks.settings import load_settings
from tasks.storage.ledger import DatasetLedger
from tasks.storage.store import ReleaseStore
from tests.blank_map import error_against_blank_map, gowalla_days
from tests.cli_runner import run_geodp

SHIPPED = Path(__file__).resolve().parents[1] / "deploy" / "geodp.toml"


def _served_nightly(tmp_path, monkeypatch) -> tuple[ReleaseParams, str, Path]:
    """The nightly deployment's parameters from the shipped file, its input moved to synthetic check-ins
    of the last 7 days (same dataset name) and its store to a temporary folder, through the environment
    overrides an operator would use."""
    data = tmp_path / "in" / "checkins.parquet"
    start = (datetime.now(UTC).date() - timedelta(days=7)).isoformat()
    assert main(["synth", str(data), "--users", "80", "--days", "7", "--start", start]) == 0
    store = str(tmp_path / "store")
    monkeypatch.setenv("GEODP_NIGHTLY__RELEASE__DATA", str(data))
    monkeypatch.setenv("GEODP_STORE", store)
    monkeypatch.setenv("GEODP_NIGHTLY__RELEASE__CITIES", '["new-york"]')  # one city keeps it fast
    (nightly,) = [d for d in build_deployments(load_settings(SHIPPED), SHIPPED) if d.name == "nightly"]
    return ReleaseParams(**nightly.parameters["params"]), store, data


def test_served_nightly_creates_its_dataset_with_the_configured_policy(tmp_path, monkeypatch):
    params, store, _ = _served_nightly(tmp_path, monkeypatch)
    declared = load_settings(SHIPPED).nightly.policy.policy()
    release_cities(params, str(SHIPPED), in_process=True, artifacts=False)
    stored = DatasetLedger(ReleaseStore(store), "checkins").policy()
    assert stored == declared
    assert (stored.window_days, stored.bound_window, stored.budget) == (7, "release", 6.5)
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    week = f"{(yesterday - timedelta(days=6)).isoformat()}_{yesterday.isoformat()}"
    assert [r.period for r in ReleaseStore(store).list_releases()] == [week]
    # the w-event budget lasts: 13 nights touch one 7-day window, at ε 0.5 each that is the budget
    assert 13 * params.epsilon <= stored.budget < 14 * params.epsilon


def test_served_nightly_refuses_a_dataset_with_another_policy(tmp_path, monkeypatch):
    params, store, data = _served_nightly(tmp_path, monkeypatch)
    assert main(["dataset", "create", store, "checkins", "--source", str(data), "--budget", "10"]) == 0
    with pytest.raises(PolicyError, match=r"\[nightly\.policy\].*window_days None stored, 7 configured"):
        release_cities(params, str(SHIPPED), in_process=True, artifacts=False)
    ledger = DatasetLedger(ReleaseStore(store), "checkins")
    assert ledger.policy().window_days is None and ledger.entries() == []


@pytest.mark.slow
def test_shipped_nightly_beats_a_blank_map_on_1_to_5_km(tmp_path, gowalla_nyc_path):
    nightly = load_settings(SHIPPED).nightly
    week = gowalla_days(gowalla_nyc_path, "2010-09-01", "2010-09-08")
    data = tmp_path / "week.parquet"
    week.to_parquet(data)
    out = tmp_path / "rel"
    run_geodp(
        *["release", "run", str(data), "--cities", "new-york", "--period", "2010-09-01..2010-09-07",
         "--epsilon", str(nightly.release.epsilon), "--mechanism", nightly.release.mechanism,
         "--max-points-per-user", str(nightly.release.max_points_per_user or nightly.policy.policy().max_points_per_user), "--seed", "1", "--out", str(out)])
    import geodp

    released, blank = error_against_blank_map(geodp.open_store(str(out)).releases()[0], week)
    print(f"mean relative error on 1–5 km: release {released:.3f}, blank map {blank:.3f}")
    assert released < 0.85 * blank, (released, blank)


@pytest.mark.parametrize(("line", "key"), [("window_days = 0", "nightly.policy.window_days"),
                                           ("bound_windw = \"day\"", "nightly.policy.bound_windw"),
                                           ("max_points_per_user = 5", "nightly: release.max_points")])
def test_nightly_policy_options_are_checked_at_load(tmp_path, line, key):
    from tasks.config import ConfigError

    text = SHIPPED.read_text().replace("window_days = 7", line)
    if line.startswith("max_points"):  # the release asks another k than its policy
        text = SHIPPED.read_text().replace('mechanism = "auto"', f'mechanism = "auto"\n{line}')
    config = tmp_path / "geodp.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(config)


def test_shipped_nightly_budget_lasts_beyond_20_nights():
    """The ledger's own arithmetic on 30 consecutive nights of the shipped nightly (every city of a
    night in one bounding draw, each night's period the 7 days before it): none is refused, and the
    worst 7-day window is the 13 × ε the TOML states."""
    from dpcore.geo import city_region
    from dpcore.privacy.accounting import LedgerCharge, check_within_budget
    from tasks.config import parse_period
    from tasks.ledger_tasks import charged_days

    nightly = load_settings(SHIPPED).nightly
    policy = nightly.policy.policy()
    charges: list[LedgerCharge] = []
    for night in range(30):
        now = datetime(2024, 3, 1, 2, 30, tzinfo=UTC) + timedelta(days=night)
        first, last = charged_days(parse_period(nightly.release.period, now=now), policy)
        new = [LedgerCharge(f"{city}-{night}", f"draw-{night}", nightly.release.epsilon, None, first, last,
                            policy.bound_window == "day", city_region(city).bbox_latlon(), city=city)
               for city in nightly.release.cities]
        after = check_within_budget(policy, charges, new)  # raises BudgetRefused if a night is refused
        charges += new
    assert after["window"] == pytest.approx(13 * nightly.release.epsilon) == pytest.approx(policy.budget)
