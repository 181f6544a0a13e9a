"""ParamSelect: public features, training table, models, leave-city-out, and never reading private data."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pandas as pd
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import Region, city_region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.sample_size import public_n_for_fit
from dpcore.paramselect import (
    BASE_FEATURES,
    DEFAULT_MODEL_PATH,
    RHO_GRID_M,
    ParamSelectError,
    ParamSelectModel,
    PublicProfile,
    best_rho_labels,
    cross_validate,
    histogram_entropy,
    kept_fractions,
    select_params,
    training_rows,
)
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import load_synopsis

RHOS = (100.0, 200.0, 400.0, 800.0, 1600.0)
EPSILONS = (0.05, 0.4, 1.6)
TRAIN_CITIES = ("phoenix", "houston", "miami")


def _synthetic(city: str, seed: int, n_users: int = 400):
    region = city_region(city)
    df = generate_checkins(region, n_users=n_users, seed=seed, days=7)
    x, y = region.project(df["lat"].to_numpy(), df["lon"].to_numpy())
    return region, x, y, df["user_id"].to_numpy()


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    rows, profiles = [], {}
    for i, city in enumerate(TRAIN_CITIES):
        region, x, y, user = _synthetic(city, seed=10 + i, n_users=300 + 300 * i)
        prof = PublicProfile.from_points(x, y, user, region, source=f"synthetic-{city}")
        profiles[city] = prof
        for unit, ks in (("record", (None,)), ("user", (5,))):
            rows += training_rows(f"syn-{city}", city, x, y, user, region, prof, epsilons=EPSILONS,
                                  privacy_unit=unit, ks=ks, mechanisms=("identity", "ug"), rhos=RHOS,
                                  bands=((100.0, 1000.0),), n_queries=200)
    table = pd.DataFrame(rows)
    model = ParamSelectModel(table, profiles, seed=0, n_estimators=30)
    path = tmp_path_factory.mktemp("ps") / "model.joblib"
    model.save(path)
    return path, table, profiles


def test_entropy_feature_bounds():
    region = Region("t", 40.0, -74.0, 2.0)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1000, 1000, (2, 2_000_000))
    assert histogram_entropy(x, y, region) == pytest.approx(np.log2(512 * 512), rel=0.03)
    assert histogram_entropy(np.zeros(50), np.zeros(50), region) == 0.0
    with pytest.raises(ParamSelectError):
        histogram_entropy(np.array([5000.0]), np.array([0.0]), region)


def test_kept_fraction_is_exact():
    user = np.array([0] * 10 + [1] * 2 + [2])  # 13 points
    kept = kept_fractions(user, (1, 2, 5))
    assert kept[1] == pytest.approx(3 / 13)
    assert kept[2] == pytest.approx(5 / 13)
    assert kept[5] == pytest.approx(8 / 13)


def test_training_table_and_labels(small_model):
    _, table, _ = small_model
    assert set(table["mechanism"]) == {"identity", "ug"}
    assert (table["error"] > 0).all()
    best = best_rho_labels(table)
    # One label per (dataset, ε, unit, k, band).
    assert len(best) == len(TRAIN_CITIES) * len(EPSILONS) * 2
    # More budget never makes the best grid coarser (averaged over datasets, in log ρ).
    mean_log_rho = best.groupby("epsilon")["best_rho"].apply(lambda r: np.log(r).mean())
    assert mean_log_rho.loc[1.6] <= mean_log_rho.loc[0.05]


def test_cross_validation_compares_with_the_best_rho(small_model):
    _, table, profiles = small_model
    cv = cross_validate(table, profiles, n_estimators=20)
    assert cv["groups"] == sorted(TRAIN_CITIES)
    assert cv["chosen_rho"]["median_error_ratio"] >= 1.0  # the best searched ρ is a lower bound
    assert 0.0 <= cv["chosen_rho"]["within_10pct"] <= 1.0
    assert cv["chosen_rho"]["cases"] + cv["skipped_useless_cases"] == len(TRAIN_CITIES) * len(EPSILONS) * 2


def test_chosen_rho_is_the_searched_width_nearest_the_regressed_one(small_model):
    """ρ is the paper's regressed ρ̂ snapped (in log) to the widths the labels were measured at."""
    _, table, profiles = small_model
    model = ParamSelectModel(table, profiles, n_estimators=20)
    grid = np.log(np.asarray(RHO_GRID_M))
    for _, row in best_rho_labels(table).iterrows():
        feats = {c: float(row[c]) for c in BASE_FEATURES}
        chosen, regressed = model.choose_rho(feats), model.predict_rho(feats)
        assert chosen in RHO_GRID_M
        assert abs(np.log(chosen) - np.log(regressed)) == pytest.approx(np.abs(grid - np.log(regressed)).min())


def test_select_params_has_no_private_data_argument():
    params = set(inspect.signature(select_params).parameters)
    assert not params & {"x", "y", "data", "points", "user"}


def test_released_city_is_left_out_of_its_own_training(small_model):
    path, _, _ = small_model
    inside = select_params(region=city_region("houston"), n=5000, epsilon=0.2, model_path=path)
    outside = select_params(region=city_region("chicago"), n=5000, epsilon=0.2, model_path=path)
    assert inside.excluded_groups == ["houston"]
    assert outside.excluded_groups == []
    assert inside.inputs["profile_source"] == "synthetic-houston"  # a public profile, not the private data
    assert RHOS[0] / 2 <= inside.cell_width_m <= RHOS[-1] * 2


def test_choose_k_and_mechanism(small_model):
    path, _, _ = small_model
    c = select_params(region=city_region("phoenix"), n=20000, epsilon=0.4, privacy_unit="user",
                      choose_k=True, mechanisms=("identity", "ug"), model_path=path)
    assert c.max_points_per_user in (1, 2, 5, 10, 20, 50)
    assert c.mechanism in ("identity", "ug")
    with pytest.raises(ParamSelectError):
        select_params(region=city_region("phoenix"), n=-3, epsilon=0.4, model_path=path)
    with pytest.raises(ParamSelectError):
        select_params(region=city_region("phoenix"), n=10, epsilon=0.4, mechanisms=("dawa",), model_path=path)


def test_model_without_profiles_says_how_to_supply_one(small_model, tmp_path):
    # A model trained on synthetic data only has no public profiles: neither the region's own nor a median.
    _, table, profiles = small_model
    path = tmp_path / "no-profiles.joblib"
    ParamSelectModel(table, {}, seed=0, n_estimators=10).save(path)
    with pytest.raises(ParamSelectError) as err:
        select_params(region=city_region("chicago"), n=5000, epsilon=0.2, model_path=path)
    msg = str(err.value)
    assert "'chicago'" in msg
    assert "profile=" in msg and "--public-data" in msg  # the caller's way out
    assert "geodp paramselect train" in msg  # the model builder's way out
    # The first hint works: the same model answers once a public profile is passed.
    c = select_params(region=city_region("chicago"), n=5000, epsilon=0.2, model_path=path,
                      profile=profiles["phoenix"])
    assert c.inputs["profile_source"] == "synthetic-phoenix"


def _two_private_datasets(region: Region):
    """Same size, very different contents: one tight cluster vs uniform spread."""
    rng = np.random.default_rng(1)
    n = 4000
    x1, y1 = rng.normal(0, 150, (2, n))
    x2, y2 = rng.uniform(-region.half_m * 0.99, region.half_m * 0.99, (2, n))
    return (x1, y1), (x2, y2)


@pytest.mark.parametrize("mechanism", ["auto", "snh", "identity"])
def test_paramselect_never_reads_the_private_dataset(small_model, mechanism):
    """With a public n, the choice must not move when the private contents change."""
    path, _, _ = small_model
    region = city_region("houston")
    (x1, y1), (x2, y2) = _two_private_datasets(region)
    # The private data would change the answer if it were read: the entropies differ by a lot.
    assert abs(histogram_entropy(x1, y1, region) - histogram_entropy(x2, y2, region)) > 3
    if mechanism == "auto":
        params = dict(model_path=str(path), mechanisms=("identity", "ug"))
    elif mechanism == "identity":
        params = dict(cell_width_m="auto", paramselect_model=str(path))
    else:
        params = dict(paramselect_model=str(path), n_sizes=2, hidden=8, depth=1, max_epochs=1,
                      samples_per_epoch=256, device="cpu")
    mech = get_mechanism(mechanism, **params)
    chosen = []
    for x, y in ((x1, y1), (x2, y2)):
        data = FitInput(x, y, region, "record", None, public_total=50_000.0)
        syn = mech.fit(data, 0.2, NoiseSource.seeded(0))
        chosen.append(syn.privacy.params["chosen"] if mechanism == "auto"
                      else syn.values.shape if mechanism == "identity" else syn.config["cell_width_m"])
        assert "total_count" not in [c["name"] for c in syn.privacy.charges]  # public n: nothing paid
    assert chosen[0] == chosen[1]


def test_auto_pays_for_a_private_n_and_spends_exactly_epsilon(small_model, tmp_path):
    path, _, _ = small_model
    region, x, y, user = _synthetic("chicago", seed=5)
    # choose="model": the cost model's own pick is what this test checks against its candidate list
    mech = get_mechanism("auto", mechanisms=("identity", "ug"), model_path=str(path), choose="model")
    syn = mech.fit(FitInput(x, y, region, "user", 5, user=user), 0.3, NoiseSource.seeded(2))
    names = [c["name"] for c in syn.privacy.charges]
    # n·ε/k is small here, so the 1% first look is too coarse and the second look is paid too.
    assert names[:2] == ["total_count", "total_count_refine"]
    chosen = syn.privacy.params["chosen"]["mechanism"]
    assert all(n.startswith(chosen + "/") for n in names[2:]) and len(names) >= 3
    # The release records what was weighed, best predicted first (no self-tuned candidate here).
    weighed = syn.privacy.params["candidates"]
    assert sorted(c["mechanism"] for c in weighed) == ["identity", "ug"] and weighed[0]["mechanism"] == chosen
    assert weighed[0]["predicted_error"] == syn.privacy.params["chosen"]["predicted_error"]
    assert sum(c["epsilon"] for c in syn.privacy.charges) == pytest.approx(0.3)
    assert all(c["sensitivity"] == 5.0 for c in syn.privacy.charges)
    assert syn.privacy.mechanism == "auto"
    syn.save(tmp_path / "auto")
    boxes = np.array([[-500.0, -500.0, 500.0, 500.0], [0.0, 0.0, 3000.0, 2000.0]])
    assert np.array_equal(load_synopsis(tmp_path / "auto").answer(boxes), syn.answer(boxes))


@pytest.mark.parametrize("n_points, sensitivity, looks", [(200_000, 1, 1), (2_000, 1, 2), (200_000, 20, 2)])
def test_n_estimate_pays_a_second_look_only_when_the_first_is_too_coarse(n_points, sensitivity, looks):
    """1% of ε first; the rest of the 5% cap only when √2·s/ε₁ > 10% of n̂₁. Charges sum with the rest to ε."""
    from dpcore.mechanisms.sample_size import public_n_for_fit
    from dpcore.privacy.budget import Accountant

    region = city_region("houston")
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-5000, 5000, (2, n_points))
    unit = "record" if sensitivity == 1 else "user"
    data = FitInput(x, y, region, unit, None if unit == "record" else sensitivity)
    eps = 0.1
    acct = Accountant(eps)
    n_hat, how, bounded, n_var = public_n_for_fit(data, acct, NoiseSource.seeded(3), 0.05)
    names = [c.name for c in acct.charges]
    assert names == ["total_count", "total_count_refine"][:looks] and bounded
    assert acct.spent == pytest.approx(eps * (0.01 if looks == 1 else 0.05))
    assert all(c.sensitivity == sensitivity for c in acct.charges)
    # The combined estimate's std is about √2·s/(0.05·ε) (two looks) or √2·s/(0.01·ε) (one).
    std = np.sqrt(2) * sensitivity / (eps * (0.01 if looks == 1 else 0.05))
    assert abs(n_hat - n_points) < 6 * std
    # The variance handed on with the estimate is the inverse-variance combination of the looks'.
    from dpcore.privacy.noise import discrete_laplace_variance

    look_vars = [discrete_laplace_variance(sensitivity / (eps * f)) for f in (0.01, 0.04)[:looks]]
    assert n_var == pytest.approx(1.0 / sum(1.0 / v for v in look_vars))
    acct.spend_rest("cells", sensitivity)
    assert acct.spent == pytest.approx(eps)


def test_shipped_model_predicts_for_every_catalog_city():
    if not DEFAULT_MODEL_PATH.exists():
        pytest.fail(f"the shipped ParamSelect model {DEFAULT_MODEL_PATH} is missing")
    for city in ("new-york", "fargo"):
        c = select_params(region=city_region(city), n=100_000, epsilon=0.1)
        assert 10 <= c.cell_width_m <= 5000
        fine = select_params(region=city_region(city), n=100_000, epsilon=1.6)
        assert fine.cell_width_m <= c.cell_width_m * 1.05  # more budget → a grid at least as fine


#: Quick SNH settings for tests that build SNH rows (the defaults are for real releases).
FAST_SNH = {"n_sizes": 2, "hidden": 8, "depth": 1, "max_epochs": 2, "samples_per_epoch": 1024, "batch_size": 256}


@pytest.fixture(scope="module")
def model_with_snh(small_model, tmp_path_factory):
    """small_model's table plus self-tuned SNH rows (SNH choosing its ρ through small_model itself)."""
    path, table, profiles = small_model
    rows = []
    for i, city in enumerate(TRAIN_CITIES):
        region, x, y, user = _synthetic(city, seed=10 + i, n_users=300 + 300 * i)
        rows += training_rows(f"syn-{city}", city, x, y, user, region, profiles[city], epsilons=EPSILONS,
                              privacy_unit="record", mechanisms=("snh",), bands=((100.0, 1000.0),),
                              n_queries=200, mechanism_params={"snh": {**FAST_SNH, "paramselect_model": str(path)}})
    snh_rows = pd.DataFrame(rows)
    out = tmp_path_factory.mktemp("ps-snh") / "model.joblib"
    ParamSelectModel(pd.concat([table, snh_rows], ignore_index=True), profiles, seed=0, n_estimators=30).save(out)
    return out, snh_rows


def test_self_tuned_snh_has_one_row_per_case_without_a_rho_search(model_with_snh):
    _, snh_rows = model_with_snh
    # One fit per (dataset, ε) at SNH's own ρ: no ρ column to search, the cost model sees it as fixed.
    assert len(snh_rows) == len(TRAIN_CITIES) * len(EPSILONS)
    assert snh_rows["rho"].isna().all() and (snh_rows["log_rho"] == 0).all()
    assert (snh_rows["is_snh"] == 1).all() and (snh_rows["is_identity"] == 0).all()
    assert (snh_rows["error"] > 0).all() and np.isfinite(snh_rows["error"]).all()


def test_auto_weighs_every_mechanism_its_model_has_rows_for(small_model, model_with_snh):
    from dpcore.mechanisms.auto import AutoMechanism
    from dpcore.paramselect import Choice

    assert AutoMechanism(model_path=str(small_model[0]))._candidates() == ("identity", "ug")
    assert AutoMechanism(model_path=str(model_with_snh[0]))._candidates() == ("identity", "snh", "ug")
    # SNH chosen by auto runs with its defaults (it reaches ParamSelect's ρ itself; an explicit ρ would
    # switch it to the flat grid), the grid gets the ρ.
    assert Choice("snh", 400.0, None, 0.1, {}, []).mechanism_params() == {}
    assert Choice("identity", 400.0, None, 0.1, {}, []).mechanism_params() == {"cell_width_m": 400.0}


def test_a_choice_between_mechanisms_needs_rows_for_each(small_model, model_with_snh):
    region = city_region("chicago")
    with pytest.raises(ParamSelectError, match="no training rows for \\['snh'\\]"):
        select_params(region=region, n=5000, epsilon=0.2, mechanisms=("identity", "snh"), model_path=small_model[0])
    # SNH alone may borrow the grid's ρ from a model without SNH rows (it only asks for its ρ) ...
    alone = select_params(region=region, n=5000, epsilon=0.2, mechanisms=("snh",), model_path=small_model[0])
    grid = select_params(region=region, n=5000, epsilon=0.2, mechanisms=("identity",), model_path=small_model[0])
    assert alone.cell_width_m == grid.cell_width_m and alone.predicted_error == grid.predicted_error
    # ... and with its rows the choice weighs SNH's own predicted error.
    both = select_params(region=region, n=5000, epsilon=0.2, mechanisms=("identity", "snh", "ug"),
                         model_path=model_with_snh[0])
    assert both.mechanism in ("identity", "snh", "ug")


def test_evaluate_fits_auto_once_per_query_band_unless_the_band_is_given(small_model):
    """auto tunes itself to a query band, so an evaluation over two bands fits it once per band (each fit
    answers its own band, with the same noise seed); a band given as a parameter means one fit for all,
    and mechanisms without a band are fitted once."""
    from dpcore.data.points import Points
    from dpcore.evaluation.range import EvalConfig, evaluate

    path, _, _ = small_model
    region, x, y, user = _synthetic("chicago", seed=5)
    lat, lon = region.unproject(x, y)
    points = Points(user=np.unique(user, return_inverse=True)[1], ts=np.zeros(x.size, dtype=np.int64), lat=lat, lon=lon)
    bands = [(25.0, 100.0), (1000.0, 5000.0)]
    fits: list[str] = []
    auto = {"mechanisms": "identity,ug", "model_path": str(path)}
    identity = {"cell_width_m": "auto", "paramselect_model": str(path)}
    config = EvalConfig(mechanisms=["auto", "ug", "identity"], epsilons=[0.5], privacy_unit="record",
                        query_sides_m=bands, n_queries=100, trials=2,
                        mechanism_params={"auto": auto, "identity": identity})
    report = evaluate(points, region, config, on_fit=lambda m, e, t, s: fits.append(m))
    # bands × trials for the band-tuned ones (identity@ParamSelect too); trials for ug
    assert fits.count("auto") == 2 * 2 and fits.count("identity") == 2 * 2 and fits.count("ug") == 2
    rows = {(r["mechanism"], tuple(r["query_sides_m"])): r for r in report["results"]}
    for band in bands:
        assert tuple(rows[("auto", band)]["params"]["query_sides_m"]) == band
        assert tuple(rows[("identity", band)]["params"]["query_sides_m"]) == band
        assert rows[("ug", band)]["params"] == {}
    fits.clear()
    fixed = EvalConfig(mechanisms=["auto"], epsilons=[0.5], privacy_unit="record", query_sides_m=bands,
                       n_queries=100, trials=1, mechanism_params={"auto": {**auto, "query_sides_m": (100.0, 1000.0)}})
    report = evaluate(points, region, fixed, on_fit=lambda m, e, t, s: fits.append(m))
    assert fits == ["auto"]
    assert all(tuple(r["params"]["query_sides_m"]) == (100.0, 1000.0) for r in report["results"])


def test_identity_takes_its_cell_width_from_paramselect_when_asked(small_model):
    """identity@ParamSelect: ρ is the model's choice for the band at the paid n̂; the count is charged,
    the grid gets the rest, the charges sum to ε, and the release says where ρ came from."""
    path, _, _ = small_model
    region, x, y, user = _synthetic("chicago", seed=5)
    data = FitInput(x, y, region, "record", None, user=user)
    band = (25.0, 100.0)
    mech = get_mechanism("identity", cell_width_m="auto", query_sides_m=band, paramselect_model=str(path))
    syn = mech.fit(data, 0.4, NoiseSource.seeded(3))
    charges = syn.privacy.charges
    assert charges[0]["name"] == "total_count" and charges[-1]["name"] == "cell_counts"
    assert sum(c["epsilon"] for c in charges) == pytest.approx(0.4)
    assert any("chosen by ParamSelect" in n for n in syn.privacy.notes)
    paid = [c["epsilon"] for c in charges if c["name"].startswith("total_count")]
    # the paid n̂ itself, drawn again from the same seeded noise (it is ~20% off the true count here,
    # which can lie across a step of the searched widths)
    n_hat = public_n_for_fit(data, FitRecord(0.4, count_quantum=data.count_quantum), NoiseSource.seeded(3),
                             mech.total_fraction).n
    expected = select_params(region=region, n=n_hat, epsilon=0.4 - sum(paid), band=band,
                             mechanisms=("identity",), model_path=path).cell_width_m
    assert expected != 100.0  # not the fixed default width
    side = max(1, round(region.side_m / expected))
    assert syn.values.shape == (side, side)
    # The manifest's params keep "auto" and name the width used.
    assert syn.privacy.params["cell_width_m"] == "auto"
    assert syn.privacy.params["chosen_cell_width_m"] == pytest.approx(region.side_m / side)
    public = get_mechanism("identity", cell_width_m="auto", paramselect_model=str(path)).fit(
        dataclasses.replace(data, public_total=float(x.size)), 0.4, NoiseSource.seeded(3))
    assert [c["name"] for c in public.privacy.charges] == ["cell_counts"]  # a public n costs nothing


@pytest.mark.parametrize("params, names", [
    ({"cell_width_m": "fine"}, "cell_width_m"),
    ({"cell_width_m": "auto", "query_sides_m": (100.0, 10.0)}, "query_sides_m"),
    ({"cell_width_m": "auto", "total_fraction": 0.0}, "total_fraction"),
])
def test_identity_checks_its_paramselect_parameters(params, names):
    """A bad value is refused without data, and the refusal names the parameter it is about."""
    from dpcore.mechanisms import MechanismError

    with pytest.raises(MechanismError, match=names):
        get_mechanism("identity", **params).check_params()
