"""The per-person ledger: one policy per dataset, charges by UTC day, w-event windows, parallel and
sequential composition, zCDP, record-level multipliers, void on failure, and nothing private in what
is published. Through the CLI where a user meets it, on a local store and on S3 (moto's server)."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from dpcore.privacy.accounting import (
    EVERY_DAY,
    BudgetRefused,
    LedgerCharge,
    PolicyError,
    PrivacyPolicy,
    check_within_budget,
    day_number,
    worst_case_loss,
    zcdp_epsilon,
    zcdp_rho_for,
)
from flows.cli import main
from tasks.storage.ledger import DatasetLedger, SourceTaken
from tasks.storage.store import ReleaseStore
from tests.cli_runner import run_geodp
from tests.conftest import new_s3_store

NYC = city_region("new-york").bbox_latlon()
CHICAGO = city_region("chicago").bbox_latlon()
D0 = day_number("2024-01-01")


def _charge(key, draw, first, last, eps=1.0, bbox=NYC, per_day=False, rho=None, m=1):
    return LedgerCharge(key, draw, eps, rho, first, last, per_day, bbox, m)


# -- accounting (pure) ---------------------------------------------------------------------------
def test_every_label_of_one_day_draws_on_that_day():
    """A day, the month holding it, a two-day range and a whole-file release all touch 2024-01-01."""
    policy = PrivacyPolicy("user", 1.0, 20, window_days=1)
    spent = [_charge("a", "d1", D0, D0)]
    for first, last in [(D0, D0 + 30), (D0 - 1, D0), EVERY_DAY]:
        with pytest.raises(BudgetRefused, match="already spent"):
            check_within_budget(policy, spent, [_charge("b", "d2", first, last)])
    # a day the first release does not touch is free under a one-day window
    assert check_within_budget(policy, spent, [_charge("b", "d2", D0 + 1, D0 + 1)])["window"] == 1.0


def test_w_event_window_and_lifetime():
    """Daily releases of ε=0.25 with k per UTC day: any 7 days cost 1.75, a year 91.25."""
    policy = PrivacyPolicy("user", 2.0, 20, bound_window="day", window_days=7)
    year = [_charge(f"k{i}", f"d{i}", D0 + i, D0 + i, 0.25, per_day=True) for i in range(365)]
    loss = worst_case_loss(policy, year)
    assert loss["window"] == pytest.approx(1.75) and loss["lifetime"] == pytest.approx(91.25)
    # a one-week release bounded per day costs its ε on each day it covers
    week = [_charge("w", "dw", D0, D0 + 6, 0.25, per_day=True)]
    assert worst_case_loss(policy, week)["window"] == pytest.approx(1.75)
    # the same week bounded once for the whole release costs its ε once
    assert worst_case_loss(PrivacyPolicy("user", 2.0, 20, window_days=7),
                           [_charge("w", "dw", D0, D0 + 6, 0.25)])["window"] == pytest.approx(0.25)
    with pytest.raises(BudgetRefused):
        check_within_budget(policy, year[:7], [_charge("x", "dx", D0 + 3, D0 + 3, 0.3, per_day=True)])


def test_parallel_composition_only_for_disjoint_regions_of_one_draw():
    policy = PrivacyPolicy("user", 10.0, 20)
    overlapping = (NYC[0] + 0.05, NYC[1] + 0.05, NYC[2] + 0.05, NYC[3] + 0.05)
    one_draw_disjoint = [_charge("a", "d1", D0, D0), _charge("b", "d1", D0, D0, bbox=CHICAGO)]
    one_draw_overlap = [_charge("a", "d1", D0, D0), _charge("b", "d1", D0, D0, bbox=overlapping)]
    two_draws = [_charge("a", "d1", D0, D0), _charge("b", "d2", D0, D0, bbox=CHICAGO)]
    assert worst_case_loss(policy, one_draw_disjoint)["window"] == pytest.approx(1.0)
    assert worst_case_loss(policy, one_draw_overlap)["window"] == pytest.approx(2.0)
    assert worst_case_loss(policy, two_draws)["window"] == pytest.approx(2.0)
    # three regions where only two share a point: the deepest point counts 2, not 3
    chain = [_charge("a", "d", D0, D0), _charge("b", "d", D0, D0, bbox=overlapping),
             _charge("c", "d", D0, D0, bbox=CHICAGO)]
    assert worst_case_loss(policy, chain)["window"] == pytest.approx(2.0)


def test_zcdp_composes_a_year_of_days_tighter_than_pure():
    """At the same (ε, δ) over a year, zCDP's daily noise is about five times smaller than pure ε's."""
    delta, total_eps, days = 1e-6, 10.0, 365
    rho = zcdp_rho_for(total_eps, delta)
    assert zcdp_epsilon(rho, delta) == pytest.approx(total_eps)
    policy = PrivacyPolicy("user", rho, 20, bound_window="day", accounting="zcdp", delta=delta)
    daily = [_charge(f"k{i}", f"d{i}", D0 + i, D0 + i, None, per_day=True, rho=rho / days) for i in range(days)]
    assert worst_case_loss(policy, daily)["lifetime_epsilon"] == pytest.approx(total_eps)
    k = 20
    gaussian_sd = k / np.sqrt(2 * rho / days)
    laplace_sd = np.sqrt(2) * k / (total_eps / days)
    assert 4 < laplace_sd / gaussian_sd < 6
    # a pure-ε release is charged ε²/2 in ρ; a ρ-only release has no pure cost
    assert _charge("p", "d", D0, D0, 0.2).cost("zcdp") == pytest.approx(0.02)
    with pytest.raises(PolicyError):
        _charge("g", "d", D0, D0, None, rho=0.1).cost("pure")


def test_record_level_multiplier_and_policy_validation():
    policy = PrivacyPolicy("user", 5.0, 20, max_records_per_person=3)
    assert worst_case_loss(policy, [_charge("r", "d", D0, D0, 1.0, m=3)])["window"] == pytest.approx(3.0)
    for bad in [dict(budget=0), dict(budget=float("inf")), dict(max_points_per_user=0),
                dict(window_days=0), dict(accounting="renyi"), dict(horizon=("2024-02-01", "2024-01-01"))]:
        with pytest.raises(PolicyError):
            PrivacyPolicy(**{"privacy_unit": "user", "budget": 1.0, **bad})


# -- the store's ledger --------------------------------------------------------------------------
def test_parallel_writers_cannot_overspend(store_url):
    """16 writers race for a budget that fits 5 one-day charges: exactly 5 succeed."""
    ledger = DatasetLedger(ReleaseStore(store_url), "ds")
    policy = ledger.create_policy(PrivacyPolicy("user", 1.0, 20), "test")

    def writer(i):
        try:
            DatasetLedger(ReleaseStore(store_url), "ds").charge([_charge(f"k{i}", f"d{i}", D0, D0, 0.2)], policy)
            return True
        except BudgetRefused:
            return False

    with ThreadPoolExecutor(8) as pool:
        ok = list(pool.map(writer, range(16)))
    entries = ledger.entries()
    assert sum(ok) == 5 == len(entries) and [e["seq"] for e in entries] == list(range(5))
    assert ledger.loss()["lifetime"] == pytest.approx(1.0)
    # a void gives a charge back, and then one more fits
    ledger.void(0, [entries[0]["charges"][0]["key"]], "test")
    ledger.charge([_charge("late", "dl", D0, D0, 0.2)], policy)
    with pytest.raises(BudgetRefused):
        ledger.charge([_charge("later", "dx", D0, D0, 0.2)], policy)


def test_one_source_one_dataset_and_first_policy_wins(store_url):
    store = ReleaseStore(store_url)
    a, b = DatasetLedger(store, "a"), DatasetLedger(store, "b")
    a.bind_source("/data/x.parquet")
    a.bind_source("/data/x.parquet")  # the same dataset again is fine
    with pytest.raises(SourceTaken, match="'a'"):
        b.bind_source("/data/x.parquet")
    first = a.create_policy(PrivacyPolicy("user", 1.0, 20), "first")
    assert a.create_policy(PrivacyPolicy("user", 9.0, 20), "second") == first
    a.change_policy(PrivacyPolicy("user", 2.0, 20, window_days=7), "weekly budget")
    log = a.policy_log()
    assert [e["reason"] for e in log] == ["first", "weekly budget"] and a.policy().window_days == 7


# -- through the CLI -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkins(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, days=4, seed=5).to_parquet(p)
    return p


def _release(capsys, data, store, *extra, out=True):
    # no --publish-anyway: the usefulness plan must not refuse these releases on the earlier release's
    # noise (its verdict holds without the profile's top bucket and bounds the bands that noise hides)
    argv = ["release", str(data), "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
            "--param", "cell_width_m=1000", *extra]
    argv += ["--out", str(store)] if out else ["--store", str(store), "--no-prefect"]
    rc = main(argv)
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("where", ["local", "s3"])
def test_seven_releases_of_one_day_end_with_one(where, checkins, tmp_path, capsys, request):
    """The scenario of the issue: ε=1 spent on 2024-01-01 under a budget of 1; the same day released
    again as a month, a range, the whole file, with a bigger --budget-cap, under another dataset name
    and at record level — every one refused, nothing charged, one committed release."""
    local = where == "local"
    store = str(tmp_path / "s") if local else new_s3_store(request.getfixturevalue("moto_s3"))
    rc, _ = _release(capsys, checkins, store, "--period", "2024-01-01", "--budget-cap", "1", out=local)
    assert rc == 0
    attempts = [("--period", "2024-01"), ("--period", "2024-01-01..2024-01-02"), (),
                ("--period", "2024-01-01", "--budget-cap", "5"),
                ("--period", "2024-01-01", "--dataset", "other-name"),
                ("--period", "2024-01-01", "--privacy-unit", "record")]
    for extra in attempts:
        rc, err = _release(capsys, checkins, store, *extra, out=local)
        assert rc == 2, extra
        assert err.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in err
    s = ReleaseStore(store)
    assert len(s.list_releases()) == 1
    ledger = DatasetLedger(s, "checkins")
    # the first release's two entries: its contribution profile, charged alone, and the rest of its ε
    assert len(ledger.entries()) == 2 and ledger.loss()["lifetime"] == pytest.approx(1.0)
    assert s.listdir("datasets") == ["checkins"]  # the refused second name left no policy behind


def test_a_failed_fit_gives_its_charge_back(tmp_path, capsys):
    """A fit that fails after the charge (the shipped denoiser refuses the city it was trained on)
    voids its charge: the budget is whole again and the next release fits."""
    from dpcore.models.pyramid_denoiser import DEFAULT_DENOISER_PATH

    data = tmp_path / "austin.parquet"
    generate_checkins(city_region("austin"), n_users=150, days=3, seed=2).to_parquet(data)
    store = tmp_path / "s"
    argv = ["release", str(data), "--city", "austin", "--epsilon", "1", "--privacy-unit", "record",
            "--budget-cap", "1", "--out", str(store)]
    assert main([*argv, "--mechanism", "snh", "--param", f"denoiser={DEFAULT_DENOISER_PATH}"]) == 2
    assert "error: denoiser" in capsys.readouterr().err
    ledger = DatasetLedger(ReleaseStore(str(store)), "austin")
    kinds = [e["kind"] for e in ledger.entries()]
    assert kinds == ["charge", "void"] and ledger.loss()["lifetime"] == 0.0
    assert main([*argv, "--mechanism", "identity"]) == 0  # the whole budget is still there
    assert ledger.loss()["lifetime"] == pytest.approx(1.0)


def test_overlapping_regions_are_charged_per_region(checkins, tmp_path, capsys):
    """Two custom regions that overlap in one run cost 2ε per person; the catalog's disjoint cities ε."""
    store = tmp_path / "s"
    base = ["release", str(checkins), "--epsilon", "0.5", "--mechanism", "identity", "--param",
            "cell_width_m=1000", "--period", "2024-01-02", "--store", str(store), "--no-prefect"]
    assert main([*base, "--cities", "new-york,chicago"]) == 0
    ledger = DatasetLedger(ReleaseStore(str(store)), "checkins")
    assert ledger.loss()["lifetime"] == pytest.approx(0.5)
    policy = ledger.policy()
    charges = [h.charge for h in ledger.held()]
    near = city_region("new-york")
    shifted = (near.bbox_latlon()[0] + 0.05, near.bbox_latlon()[1], near.bbox_latlon()[2] + 0.05,
               near.bbox_latlon()[3])
    overlap = [LedgerCharge("x", "dz", 0.5, None, D0, D0, False, near.bbox_latlon()),
               LedgerCharge("y", "dz", 0.5, None, D0, D0, False, shifted)]
    assert worst_case_loss(policy, charges + overlap)["lifetime"] == pytest.approx(1.5)
    capsys.readouterr()


def test_policy_is_stored_once_and_changed_only_explicitly(checkins, tmp_path, capsys):
    store = tmp_path / "s"
    assert _release(capsys, checkins, store, "--period", "2024-01-01", "--max-points-per-user", "5",
                    "--budget-cap", "3")[0] == 0
    rc, err = _release(capsys, checkins, store, "--period", "2024-01-02", "--max-points-per-user", "7")
    assert rc == 2 and "k=5" in err
    assert _release(capsys, checkins, store, "--period", "2024-01-02")[0] == 0  # k comes from the policy
    manifests = ReleaseStore(str(store)).list_releases()
    assert sorted(m.max_points_per_user for m in manifests) == [5, 5]
    # record level is refused until the policy declares m records per person; then charged m·ε
    rc, err = _release(capsys, checkins, store, "--period", "2024-01-03", "--privacy-unit", "record")
    assert rc == 2 and "records per person" in err
    assert main(["dataset", "policy", str(store), "checkins", "--max-records-per-person", "1",
                 "--reason", "the source keeps one check-in per person per venue"]) == 0
    assert _release(capsys, checkins, store, "--period", "2024-01-03", "--privacy-unit", "record")[0] == 0
    capsys.readouterr()
    assert main(["ledger", str(store), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    # two user-level releases (each its contribution profile, charged alone, and the rest) and one record-level
    assert row["loss"]["lifetime"] == pytest.approx(3.0) and row["charges"] == 5
    assert row["policy"]["max_records_per_person"] == 1
    rc, err = _release(capsys, checkins, store, "--period", "2024-01-04")
    assert rc == 2 and "budget exceeded" in err


def test_daily_policy_bounds_each_day_and_refuses_the_eighth_day(checkins, tmp_path, capsys):
    store = tmp_path / "s"
    assert main(["dataset", "create", str(store), "checkins", "--source", str(checkins), "--budget", "1.5",
                 "--window-days", "3", "--bound-window", "day", "--max-points-per-user", "2"]) == 0
    capsys.readouterr()
    for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
        assert _release(capsys, checkins, store, "--period", day, "--epsilon", "0.5")[0] == 0
    rc, err = _release(capsys, checkins, store, "--period", "2024-01-03..2024-01-04")
    assert rc == 2 and "budget exceeded" in err
    # a 4-day release bounded per day costs 4·ε in its window, and needs a period
    rc, err = _release(capsys, checkins, store)
    assert rc == 2 and "period" in err


def test_per_day_bounding_keeps_k_per_person_per_day():
    from dpcore.data.points import LoadResult, Points, ValidationReport
    from tasks.config import parse_period
    from tasks.dask_path import release_frame
    from tasks.release_city_plan import make_plans
    from tasks.release_tasks import grid_specs, read_bound_count

    rng = np.random.default_rng(0)
    n = 3000
    user = rng.integers(0, 20, n)
    ts = day_number("2024-01-01") * 86400 + rng.integers(0, 3 * 86400, n)
    region = city_region("new-york")
    lat = region.center_lat + rng.normal(0, 0.01, n)
    lon = region.center_lon + rng.normal(0, 0.01, n)
    pts = Points(user.astype(np.int64), ts.astype(np.int64), lat, lon)
    (plan,) = make_plans(dataset="d", cities=["new-york"], center=None, side_km=None,
                         period=parse_period("2024-01-01..2024-01-03"), mechanism="identity",
                         params={"cell_width_m": 1000}, epsilon=1.0, privacy_unit="user", max_points_per_user=4,
                         seed=1, data_version="v", bound_per_day=True)
    loaded = LoadResult(pts, ValidationReport(), "d", "v")
    window = (plan.period.start_s, plan.period.end_s)

    def kept(per_day: bool) -> pd.DataFrame:
        frame, _, _ = release_frame(loaded, grid_specs([plan]), window, max_points_per_user=4, per_day=per_day,
                                    seed=1)
        return frame.compute(scheduler="sync")

    per_day = kept(True)
    assert per_day.groupby([per_day.user, per_day.day]).size().max() == 4
    assert per_day.groupby("user").size().max() == 12  # 4 per day over 3 days
    assert kept(False).groupby("user").size().max() == 4
    # and the release's counts are those of the per-day sample
    counted = read_bound_count.fn(loaded, [plan], seed=1, per_day=True).cities["new-york"]
    assert counted.fine.sum() == len(per_day)


def test_nothing_published_tells_neighbours_apart(tmp_path, capsys):
    """Release D twice (two stores), then D minus one user's rows from the same path: every published
    field that is the same for both releases of D is also the same for the neighbour. The file keeps
    its modification time (public metadata, not content)."""
    df = generate_checkins(city_region("new-york"), n_users=200, days=3, seed=9)
    data = tmp_path / "checkins.parquet"

    def publish(frame, store):
        frame.to_parquet(data)
        os.utime(data, (1_700_000_000, 1_700_000_000))
        argv = ["release", str(data), "--city", "new-york", "--epsilon", "1", "--mechanism", "identity",
                "--param", "cell_width_m=2000", "--out", str(store)]
        assert main(argv) == 0
        (m,) = ReleaseStore(str(store)).list_releases()
        return {**m.body(), "url": m.url}

    m1, m2 = publish(df, tmp_path / "s1"), publish(df, tmp_path / "s2")
    neighbour = publish(df[df["user_id"] != df["user_id"].iloc[0]], tmp_path / "s3")
    capsys.readouterr()
    noisy = {"url", "committed_at", "attempt", "files", "privacy", "ledger", "quality", "manifest_sha256"}

    def flat(obj, prefix=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from flat(v, f"{prefix}.{k}")
        else:
            yield prefix, json.dumps(obj, sort_keys=True)

    def fields(m):
        return dict(flat({k: v for k, v in m.items() if k not in noisy}))

    f1, f2, fn = fields(m1), fields(m2), fields(neighbour)
    same = {k for k in f1 if f2.get(k) == f1[k]}
    assert {".release_key", ".config_hash", ".input.data_version", ".dataset"} <= same
    assert {k for k in same if fn.get(k) != f1[k]} == set()


def test_ledger_command_on_a_missing_store_is_a_clean_error(tmp_path):
    r = run_geodp("ledger", tmp_path / "typo", ok=False)
    assert r.returncode == 2 and r.stderr.startswith("error: no release store") and not (tmp_path / "typo").exists()


def test_zcdp_dataset_takes_rho_releases_with_gaussian_noise(checkins, tmp_path, capsys):
    store = tmp_path / "s"
    assert main(["dataset", "create", str(store), "checkins", "--source", str(checkins), "--accounting", "zcdp",
                 "--budget", "0.5", "--delta", "1e-6"]) == 0
    argv = ["release", str(checkins), "--city", "new-york", "--mechanism", "identity", "--param",
            "cell_width_m=1000", "--out", str(store)]
    assert main([*argv, "--period", "2024-01-01", "--rho", "0.2"]) == 0
    assert main([*argv, "--period", "2024-01-02", "--epsilon", "0.5"]) == 0  # charged ε²/2 = 0.125 in ρ
    capsys.readouterr()
    assert main([*argv, "--period", "2024-01-03", "--rho", "0.2"]) == 2  # 0.5025 > 0.5
    assert "budget exceeded" in capsys.readouterr().err
    # the ε release is two: its contribution profile (ε 0.05) charged alone, then ε 0.45; in ρ
    # 0.05²/2 + 0.45²/2 = 0.1025, less than 0.5²/2 (pure-ε releases compose in ρ by their squares)
    loss = DatasetLedger(ReleaseStore(str(store)), "checkins").loss()
    assert loss["lifetime"] == pytest.approx(0.3025)
    assert loss["lifetime_epsilon"] == pytest.approx(zcdp_epsilon(0.3025, 1e-6))
    rho_release = next(m for m in ReleaseStore(str(store)).list_releases() if m.period == "2024-01-01")
    assert rho_release.rho == 0.2 and rho_release.epsilon is None
    assert rho_release.privacy.charges[0].noise == "discrete_gaussian"
    # a ρ release into a dataset accounted in pure ε, or by a mechanism without ρ, is refused
    assert main([*argv[:-1], str(tmp_path / "pure"), "--period", "2024-01-01", "--rho", "0.1"]) == 2
    assert "accounted in ρ" in capsys.readouterr().err
    assert main(["release", str(checkins), "--city", "new-york", "--mechanism", "privtree", "--rho", "0.1",
                 "--period", "2024-01-04", "--out", str(store)]) == 2
    assert "pure ε only" in capsys.readouterr().err


def test_gaussian_identity_noise_has_the_zcdp_variance():
    from dpcore.mechanisms import FitInput, get_mechanism
    from dpcore.privacy.noise import NoiseSource

    region = city_region("new-york")
    empty = FitInput(np.empty(0), np.empty(0), region, "user", 10)
    syn = get_mechanism("identity", grid_size=200).fit_zcdp(empty, 0.05, NoiseSource.seeded(3))
    sigma2 = 10**2 / (2 * 0.05)
    assert np.var(syn.values) == pytest.approx(sigma2, rel=0.03)
    assert syn.privacy.to_dict()["rho_spent"] == pytest.approx(0.05)
    assert np.all(syn.values == np.rint(syn.values))  # integer noise only


def test_source_version_is_metadata_not_content(tmp_path):
    from dpcore.data.inputs import source_version

    f = tmp_path / "x.csv"
    f.write_text("user_id,timestamp,lat,lon\na,2024-01-01,40.7,-74.0\n")
    os.utime(f, (1_700_000_000, 1_700_000_000))
    before = source_version(f)
    f.write_text("user_id,timestamp,lat,lon\nb,2024-01-02,40.8,-74.1\n")  # other content, same time
    os.utime(f, (1_700_000_000, 1_700_000_000))
    assert source_version(f) == before
    os.utime(f, (1_700_000_100, 1_700_000_100))  # touched: a new version
    assert source_version(f) != before


def test_an_altered_ledger_entry_is_a_clean_integrity_error(checkins, tmp_path, capsys):
    store = tmp_path / "s"
    assert _release(capsys, checkins, store, "--period", "2024-01-01", "--budget-cap", "1")[0] == 0
    # entry 0 is the contribution profile's, charged alone; entry 1 the rest of the release's ε
    _, entry = sorted((store / "datasets" / "checkins" / "ledger").glob("*.json"))
    body = json.loads(entry.read_text())
    body["charges"][0]["epsilon"] = 0.01  # someone shrinks a charge to free budget
    entry.write_text(json.dumps(body))
    rc, err = _release(capsys, checkins, store, "--period", "2024-01-02")
    assert rc == 2 and "altered" in err and "Traceback" not in err
    assert main(["ledger", str(store)]) == 2


def test_relative_periods_count_from_the_given_start():
    from datetime import UTC, datetime

    from tasks.config import parse_period

    start = datetime(2010, 5, 4, 2, 30, tzinfo=UTC)
    assert parse_period("yesterday", now=start).label == "2010-05-03"
    assert parse_period("today", now=start).label == "2010-05-04"
