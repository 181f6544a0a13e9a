"""The data-centred grid-size rule (dpcore.grid.size_rule): shipped constants, monotone in the signal,
public inputs only, recorded in the release, used by ug(size_rule="data") and by auto's grid choices,
and the bench script's fit recovers a known power law."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from dpcore.geo import Region
from dpcore.grid.size_rule import BANDS, RULE_PATH, SizeRuleError, band_constants, data_grid_size, load_rule
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource

ROOT = Path(__file__).resolve().parents[1]
REGION = Region("test", 40.7, -74.0, side_km=20.0)


def points(n: int, seed: int, spread_m: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.clip(rng.normal(0, spread_m, n), -REGION.half_m + 1, REGION.half_m - 1)
    y = np.clip(rng.normal(0, spread_m, n), -REGION.half_m + 1, REGION.half_m - 1)
    return x, y


def test_shipped_rule_names_its_command_and_bands() -> None:
    rule = json.loads(RULE_PATH.read_text())
    assert set(rule["bands"]) == set(BANDS)
    assert "bench/fit_grid_rule.py" in rule["command"]
    assert (ROOT / "bench" / "fit_grid_rule.py").exists()
    # the held-out test sets are not among the training sets
    assert not any("nyc" in t or "cabs" in t or t.endswith("/new-york") for t in rule["training_sets"])
    for name, band in rule["bands"].items():
        for unit in ("record", "user"):
            assert band_constants(BANDS[name], unit) == pytest.approx((band[unit]["a"], band[unit]["b"]))


@pytest.mark.parametrize("unit", ["record", "user"])
@pytest.mark.parametrize("band", list(BANDS.values()) + [(50.0, 500.0), (3000.0, 8000.0)])
def test_monotone_in_signal_and_clipped(band: tuple[float, float], unit: str) -> None:
    signals = np.geomspace(1, 1e7, 60)
    ms = [data_grid_size(s, 1.0, 1.0, band, unit) for s in signals]
    assert all(b >= a for a, b in zip(ms, ms[1:], strict=False))
    assert ms[-1] > ms[0]
    assert min(ms) >= 8 and max(ms) <= 2048
    # n·ε/k is what counts: the same signal from a different n, ε, k gives the same size
    assert data_grid_size(40_000, 0.5, 10, band, unit) == data_grid_size(2_000, 1.0, 1, band, unit)


def test_smaller_queries_get_finer_grids_at_the_same_signal() -> None:
    small, mid, large = (data_grid_size(20_000, 1.0, 1.0, b) for b in BANDS.values())
    assert small >= mid >= large and small > large


def test_bad_inputs_fail() -> None:
    with pytest.raises(SizeRuleError):
        data_grid_size(1000, 0.0, 1.0, (25, 100))
    with pytest.raises(SizeRuleError):
        band_constants((100, 25))
    with pytest.raises(SizeRuleError):
        band_constants((25, 100), "household")


def test_ug_data_rule_reads_only_public_quantities() -> None:
    """Same n̂ (public_total), ε and k, different private points → the same m; another n̂ → another m."""
    sizes = []
    for seed, spread in ((0, 300.0), (1, 3000.0)):
        x, y = points(5_000, seed, spread)
        data = FitInput(x, y, REGION, "record", None, public_total=50_000.0)
        syn = get_mechanism("ug", size_rule="data", query_sides_m=(25.0, 100.0)).fit(data, 0.2, NoiseSource.seeded(seed))
        sizes.append(syn.extra_meta()["grid_size"])
        assert [c["name"] for c in syn.privacy.charges] == ["cell_counts"]
    assert sizes[0] == sizes[1] == data_grid_size(50_000, 0.2, 1, (25.0, 100.0))
    x, y = points(5_000, 0, 300.0)
    other = get_mechanism("ug", size_rule="data", query_sides_m=(25.0, 100.0)).fit(
        FitInput(x, y, REGION, "record", None, public_total=500.0), 0.2, NoiseSource.seeded(0))
    assert other.extra_meta()["grid_size"] < sizes[0]


def test_ug_data_rule_pays_for_n_like_the_icde_rule_and_records_the_rule() -> None:
    x, y = points(20_000, 2, 1000.0)
    data = FitInput(x, y, REGION, "user", 5)
    old = get_mechanism("ug").fit(data, 0.7, NoiseSource.seeded(3))
    new = get_mechanism("ug", size_rule="data", query_sides_m=(100.0, 1000.0)).fit(data, 0.7, NoiseSource.seeded(3))
    assert [(c["name"], c["epsilon"], c["sensitivity"]) for c in new.privacy.charges] == \
        [(c["name"], c["epsilon"], c["sensitivity"]) for c in old.privacy.charges]
    assert new.privacy.params["size_rule"] == "data"
    rec = new.privacy.params["size_rule_constants"]
    shipped = load_rule()["bands"]["100-1000"]["user"]
    assert rec["privacy_unit"] == "user"
    assert (rec["a"], rec["b"]) == pytest.approx((shipped["a"], shipped["b"]))
    assert "bench/fit_grid_rule.py" in rec["fitted_by"]
    assert "size_rule_constants" not in old.privacy.params
    # the paid N is the only private input: the m follows from the noisy count the ledger shows
    assert new.extra_meta()["grid_size"] != old.extra_meta()["grid_size"]


def test_ug_data_rule_is_fitted_per_band_in_evaluations() -> None:
    assert get_mechanism("ug", size_rule="data").tuned_band_parameter() == "query_sides_m"
    assert get_mechanism("ug").tuned_band_parameter() is None
    with pytest.raises(ValueError):
        get_mechanism("ug", size_rule="nope").check_params()


def test_auto_sizes_its_grid_with_the_rule_from_public_n_only() -> None:
    sizes = []
    for seed, spread in ((0, 300.0), (1, 3000.0)):
        x, y = points(5_000, seed, spread)
        data = FitInput(x, y, REGION, "record", None, public_total=80_000.0)
        syn = get_mechanism("auto", mechanisms="identity", query_sides_m=(25.0, 100.0)).fit(
            data, 0.1, NoiseSource.seeded(seed))
        rec = syn.privacy.params["grid_size_rule"]
        assert rec["grid_size"] == syn.extra_meta()["grid_size"]
        assert rec["grid_size"] == data_grid_size(80_000, 0.1, 1, (25.0, 100.0))
        assert "bench/fit_grid_rule.py" in rec["fitted_by"]
        sizes.append(rec["grid_size"])
    assert sizes[0] == sizes[1]


def test_fit_recovers_a_known_power_law() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from fit_grid_rule import fit_band

    ms = np.array([8 * 2 ** (i / 2) for i in range(17)])
    cases = []
    for s in np.geomspace(50, 2e5, 12):
        best = 3.0 * s ** 0.45
        cases.append((float(s), ms, 0.1 * (1 + (np.log(ms) - math.log(best)) ** 2)))
    out = fit_band(cases)
    assert out["b"] == pytest.approx(0.45, abs=0.03)
    assert out["a"] == pytest.approx(3.0, rel=0.25)
    assert out["mean_regret"] < 1.01


def test_band_rule_picks_by_band_from_the_candidates() -> None:
    from dpcore.mechanisms.auto_rule import band_choice, band_params

    every = ("identity", "snh", "ug", "ag", "privtree")
    assert band_choice((25.0, 100.0), every) == "ug"
    assert band_choice((100.0, 1000.0), every) == "ag"
    assert band_choice((1000.0, 5000.0), every) == "ag"
    assert band_choice((25.0, 100.0), ("identity", "privtree")) == "identity"
    assert band_choice((100.0, 1000.0), ("ug", "privtree")) is None
    assert band_choice((1000.0, 5000.0), ("ug", "privtree")) is None
    # the 100-1000 m AG keeps level-1 cells at most 625 m on any region; the 1-5 km one keeps AG's floor
    mid = band_params((100.0, 1000.0), "ag", 20_000.0)
    assert mid == {"alpha": 0.2, "c": 5.0, "min_m1": 32}
    assert band_params((100.0, 1000.0), "ag", 5_000.0)["min_m1"] == 8
    assert band_params((1000.0, 5000.0), "ag", 20_000.0) == {"alpha": 0.3, "c": 5.0}
    assert band_params((25.0, 100.0), "ag", 20_000.0) == {}  # not the band's pick: no band parameters


def test_auto_band_rule_runs_the_rule_sized_grid_or_ag_and_says_so() -> None:
    x, y = points(20_000, 4, 800.0)
    data = FitInput(x, y, REGION, "record", None, public_total=20_000.0)
    small = get_mechanism("auto", query_sides_m=(25.0, 100.0)).fit(data, 0.2, NoiseSource.seeded(1))
    p = small.privacy.params
    assert (p["chosen"]["mechanism"], p["chosen_by"]) == ("ug", "band")
    assert small.extra_meta()["grid_size"] == p["grid_size_rule"]["grid_size"] == \
        data_grid_size(20_000, 0.2, 1, (25.0, 100.0))
    assert [c["name"] for c in small.privacy.charges] == ["ug/cell_counts"]
    for band, params in (((1000.0, 5000.0), {"alpha": 0.3, "c": 5.0}),
                         ((100.0, 1000.0), {"alpha": 0.2, "c": 5.0, "min_m1": 32})):
        large = get_mechanism("auto", query_sides_m=band).fit(data, 0.2, NoiseSource.seeded(1))
        assert large.privacy.params["chosen"] == {**large.privacy.params["chosen"], "mechanism": "ag", "params": params}
        assert "grid_size_rule" not in large.privacy.params
        # the band's AG is what ran: its level-1 split and floor are in the charges and the synopsis
        l1 = next(c for c in large.privacy.charges if c["name"] == "ag/level1_counts")
        assert l1["epsilon"] == pytest.approx(params["alpha"] * 0.2)
        m_ug = math.sqrt(20_000 * 0.2 / params["c"])
        assert large.extra_meta()["m1"] == max(min(params.get("min_m1", 10), math.ceil(m_ug)), math.ceil(m_ug / 4))
    model = get_mechanism("auto", mechanisms="ug,ag,privtree", query_sides_m=(25.0, 100.0), choose="model").fit(data, 0.2, NoiseSource.seeded(1))
    assert model.privacy.params["chosen_by"] == "model"
    with pytest.raises(ValueError):
        get_mechanism("auto", choose="guess").check_params()
