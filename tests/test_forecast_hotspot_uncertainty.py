"""Issue 43 item 3 through the CLI: a forecast's interval comes from the model's own error on the released
history plus the noise; a release whose slots were merged, or that has fewer slots than the model needs,
refuses in one line naming the slot width it has; a hotspot carries the interval of the count that
qualified it."""

import json

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

BOX = "40.60,-74.10,40.80,-73.90"
ST = ["--city", "new-york", "--epsilon", "1", "--mechanism", "identity3d", "--slot", "1d",
      "--max-points-per-user", "20", "--no-prefect"]


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fc")
    data = tmp / "c.parquet"
    generate_checkins(city_region("new-york"), n_users=400, start="2024-01-01", days=14, seed=3).to_parquet(data)
    out = {"daily": tmp / "daily", "short": tmp / "short"}
    run_geodp("release", data, "--period", "2024-01-01..2024-01-14", *ST, "--param", "grid_size=16",
              "--out", out["daily"])
    run_geodp("release", data, "--period", "2024-01-01..2024-01-05", *ST, "--param", "grid_size=16",
              "--out", out["short"])
    return out


def test_a_forecast_over_merged_slots_is_refused_naming_its_slot_width():
    """Bug: a release whose slots were merged into one forecast a flat line with a zero-width 95% interval.
    Releases no longer merge slots (decision 0015, 2026-11-28); releases made before still carry
    ``resolution.slot_factor`` and are refused by the same check the CLI runs."""
    from dpcore.queries.forecast import check_forecastable
    from dpcore.queries.spatiotemporal import STQueryError

    with pytest.raises(STQueryError, match="has 1 slot of 28 days: its 28 requested slots of 1 day were merged 28"):
        check_forecastable(28, 86400, slot_factor=28)


def test_a_forecast_from_too_few_slots_is_refused(releases):
    """Bug: five daily slots were forecast with an interval the model could not judge."""
    bad = run_geodp("query", "forecast", releases["short"], "--box", BOX, "--horizon", "2", ok=False)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "5 slots of 1 day" in bad.stderr and "at least 8" in bad.stderr


def test_a_forecast_interval_is_its_backtest_error_plus_the_noise(releases):
    """Bug: the interval was ThetaModel's own, which ignores the release's noise and was zero-width on a
    flat series."""
    out = json.loads(run_geodp("query", "forecast", releases["daily"], "--box", BOX, "--horizon", "3",
                               "--json").stdout)
    assert "backtest" in out["interval_method"] and "noise" in out["interval_method"]
    fc, lo, hi = (np.array(out[k]) for k in ("forecast", "lower", "upper"))
    # one slot's own 95% interval for the box: the forecast's band is at least as wide (noise plus model error)
    day = json.loads(run_geodp("query", "range", releases["daily"], "--box", BOX, "--period",
                               "2024-01-03..2024-01-03", "--json").stdout)[0]
    assert np.all(hi - lo >= 0.999 * (day["upper"] - day["lower"]))
    history = np.array(out["history"])
    assert np.all(hi - lo > 0) and np.all(hi - lo > np.std(history))


def test_a_hotspot_carries_the_interval_of_the_count_that_qualified_it(releases):
    """Bug: a hotspot answered with its released count alone, as if that count were exact."""
    rows = json.loads(run_geodp("query", "hotspot", releases["daily"], "--at", "40.713,-74.006", "--at",
                                "40.75,-73.99", "--threshold", "5", "--extent-km", "5", "--json").stdout)
    assert [r["found"] for r in rows] == [True, True]
    for r in rows:
        assert r["count_lower"] < r["released_count"] < r["count_upper"]
        assert r["qualifies"] == ("surely" if r["count_lower"] >= 5 else "maybe")
        assert r["interval"] == "95%" and r["interval_method"]
    text = run_geodp("query", "hotspot", releases["daily"], "--at", "40.713,-74.006", "--threshold", "5",
                     "--extent-km", "5").stdout
    assert "95% [" in text


def test_a_forecast_band_widens_by_students_t_for_the_few_errors_it_is_judged_on():
    """Bug: the band was z·√(e² + σ²) with e the root mean square of as few as 4 backtest errors: on SF cabs'
    14 daily slots it covered 0.92 of the next week's true counts (bench/bench_forecast_coverage.py)."""
    from scipy.stats import t as student_t

    from dpcore.queries.forecast import backtest_errors, forecast_interval

    rng = np.random.default_rng(4)
    series = 200 + 30 * np.sin(np.arange(14) * 2 * np.pi / 7) + rng.normal(0, 15, 14)
    fc, lo, hi, method = forecast_interval(series, 7, 7, noise_sd=5.0)
    errs = backtest_errors(series, 7, 7)
    for j, e in enumerate(errs):
        scale = np.sqrt(np.mean(e ** 2) + 25.0)
        assert (hi[j] - fc[j]) / scale == pytest.approx(student_t.ppf(0.975, e.size), rel=1e-9)
        assert (hi[j] - fc[j]) / scale > 1.96 * (1 + 0.05)  # wider than the normal quantile by 5% at least
    assert "Student's t" in method
