"""The contract every registered mechanism keeps, checked for every name in ``mechanism_names()``.

New mechanisms are picked up automatically. A mechanism whose training is expensive gets quick
parameters from its class attribute ``fast_params`` (a dict) when it has one, else from
``FAST_PARAMS`` below. A mechanism whose charges are calibrated to something other than the count
sensitivity (k, or 1 at record level) declares it with ``charge_sensitivity(data)``; for every
other mechanism each charge must be calibrated to exactly the count sensitivity.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpcore.geo import Region
from dpcore.mechanisms import FitInput, MechanismError, get_mechanism, get_mechanism_class, mechanism_names
from dpcore.privacy.budget import BudgetError
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import Synopsis, load_synopsis

K = 5
EPSILON = 0.8
N_SLOTS = 4
SLOT_SECONDS = 3600

#: Quick settings for mechanisms that train models (the defaults are for real releases).
FAST_PARAMS: dict[str, dict] = {
    "snh": {"n_sizes": 2, "hidden": 8, "depth": 1, "max_epochs": 1, "samples_per_epoch": 1024, "batch_size": 256},
    "vdr": {"grid_size": 16, "steps": 2, "batch_size": 2, "crop": 16, "hidden": 8, "n_codes": 8, "code_dim": 4,
            "max_train_seconds": 10.0},
}


def _params(name: str) -> dict:
    cls = get_mechanism_class(name)
    return dict(getattr(cls, "fast_params", None) or FAST_PARAMS.get(name, {}))


@pytest.fixture(scope="module")
def region() -> Region:
    return Region("contract", 40.7, -74.0, side_km=2.0)


@pytest.fixture(scope="module")
def fit_inputs(region: Region) -> dict[bool, FitInput]:
    """Small synthetic user-level inputs: 300 users, ≤ K points each, a cluster plus background."""
    rng = np.random.default_rng(11)
    n_users = 300
    per_user = rng.integers(1, K + 1, n_users)
    user = np.repeat(np.arange(n_users), per_user)
    n = user.size
    h = region.half_m
    clustered = rng.random(n) < 0.5
    x = np.where(clustered, rng.normal(200, 60, n), rng.uniform(-h, h, n)).clip(-h + 1e-6, h - 1e-6)
    y = np.where(clustered, rng.normal(-100, 60, n), rng.uniform(-h, h, n)).clip(-h + 1e-6, h - 1e-6)
    slot = rng.integers(0, N_SLOTS, n)
    spatial = FitInput(x, y, region, "user", K, user=user)
    st = FitInput(x, y, region, "user", K, user=user, slot=slot, n_slots=N_SLOTS, slot_seconds=SLOT_SECONDS,
                  window_start_s=1_700_000_000)
    return {False: spatial, True: st}


def _input_for(name: str, fit_inputs: dict[bool, FitInput]) -> FitInput:
    return fit_inputs[bool(get_mechanism_class(name).spatio_temporal)]


def _boxes(region: Region) -> np.ndarray:
    rng = np.random.default_rng(5)
    h = region.half_m
    c = rng.uniform(-h, h, (50, 2))
    s = rng.uniform(50, 800, 50)
    return np.c_[c - s[:, None] / 2, c + s[:, None] / 2]


def _expected_sensitivity(name: str, data: FitInput) -> float:
    cls = get_mechanism_class(name)
    declared = getattr(cls, "charge_sensitivity", None)
    return float(declared(data)) if declared is not None else float(data.sensitivity)


@pytest.fixture(scope="module")
def fitted(fit_inputs: dict[bool, FitInput]) -> dict[str, Synopsis]:
    """One fit per mechanism, shared by the checks below (training mechanisms are the slow part)."""
    return {}


def _fit(name: str, fit_inputs: dict[bool, FitInput], fitted: dict[str, Synopsis]) -> Synopsis:
    if name not in fitted:
        mech = get_mechanism(name, **_params(name))
        fitted[name] = mech.fit(_input_for(name, fit_inputs), EPSILON, NoiseSource.seeded(123))
    return fitted[name]


def test_registry_lists_the_classic_mechanisms() -> None:
    assert {"identity", "ug", "ag", "hb", "privtree"} <= set(mechanism_names())


@pytest.mark.parametrize("name", mechanism_names())
def test_fit_returns_synopsis_and_charges_add_up(name: str, fit_inputs: dict[bool, FitInput],
                                                 fitted: dict[str, Synopsis]) -> None:
    syn = _fit(name, fit_inputs, fitted)
    assert isinstance(syn, Synopsis)
    charges = syn.privacy.charges
    assert charges, f"{name} recorded no charge"
    spent = math.fsum(c["epsilon"] for c in charges)
    assert 0.999 * EPSILON <= spent <= EPSILON * (1 + 1e-9), (name, spent)
    assert all(c["epsilon"] > 0 for c in charges)
    assert syn.privacy.epsilon == pytest.approx(EPSILON)
    assert syn.privacy.privacy_unit == "user"


@pytest.mark.parametrize("name", mechanism_names())
def test_every_charge_is_calibrated_to_the_stated_sensitivity(name: str, fit_inputs: dict[bool, FitInput],
                                                               fitted: dict[str, Synopsis]) -> None:
    syn = _fit(name, fit_inputs, fitted)
    expected = _expected_sensitivity(name, _input_for(name, fit_inputs))
    for c in syn.privacy.charges:
        assert c["sensitivity"] == pytest.approx(expected), (name, c)


@pytest.mark.parametrize("name", mechanism_names())
def test_save_load_round_trip_answers_identically(name: str, fit_inputs: dict[bool, FitInput],
                                                  fitted: dict[str, Synopsis], tmp_path: Path,
                                                  region: Region) -> None:
    syn = _fit(name, fit_inputs, fitted)
    syn.save(tmp_path / name)
    back = load_synopsis(tmp_path / name)
    assert type(back) is type(syn)
    boxes = _boxes(region)
    before = syn.answer(boxes)
    assert before.shape == (boxes.shape[0],) and np.all(np.isfinite(before))
    assert np.array_equal(back.answer(boxes), before)
    assert np.array_equal(back.density(16), syn.density(16))
    # Compared as JSON (what the manifest holds): a tuple parameter comes back as a list.
    assert json.loads(json.dumps(back.privacy.to_dict(), default=str)) == json.loads(
        json.dumps(syn.privacy.to_dict(), default=str))


@pytest.mark.parametrize("name", mechanism_names())
@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan")])
def test_non_positive_epsilon_is_refused(name: str, epsilon: float, fit_inputs: dict[bool, FitInput]) -> None:
    mech = get_mechanism(name, **_params(name))
    with pytest.raises(BudgetError):
        mech.fit(_input_for(name, fit_inputs), epsilon, NoiseSource.seeded(0))


#: Parameter values no mechanism can work with, at least one per mechanism that checks values. Each must
#: be refused by ``check_params`` alone (no data, no ε), which is what lets the platform refuse it while
#: planning, before the ledger is charged.
BAD_PARAMS: list[tuple[str, dict]] = [
    ("ag", {"c": 0}),
    ("ag", {"alpha": 1.5}),
    ("ag", {"min_m1": 0}),
    ("ag", {"raster_size": 0}),
    ("ag", {"total_fraction": 0.0}),
    ("hb", {"branching": 1}),
    ("hb", {"c": -1.0}),
    ("hb", {"level_split": "fibonacci"}),
    ("hb", {"levels": 6}),  # branching 4 and a 2048 leaf cap allow at most 5 levels
    ("hb", {"levels": 0}),
    ("hb", {"total_fraction": 1.0}),
    ("privtree", {"min_leaf_m": 0.0}),
    ("privtree", {"tree_fraction": 1.0}),
    ("ug", {"c": 0}),
    ("ug", {"max_grid": 0}),
    ("ug", {"grid_size": 0}),
    ("ug", {"total_fraction": -0.1}),
    ("identity", {"cell_width_m": 0.0}),
    ("identity", {"grid_size": -3}),
    ("identity3d", {"grid_size": 0}),
    ("identity3d", {"cell_width_m": -5.0}),
    ("identity3d", {"count_fraction": 1.5}),
    ("vdr", {"refinement": "shrink"}),
    ("vdr", {"count_fraction": 0.0}),
    ("vdr", {"steps": 0}),
    ("vdr", {"resolutions": (2, 4)}),
    ("vdr", {"grid_size": None, "cell_width_m": 0.0}),
    ("dpheatmap", {"normalisation": "points"}),
    ("dpheatmap", {"resolution": 100}),
    ("dpheatmap", {"depth": 9}),  # resolution 256 has 8 levels
    ("dpheatmap", {"w": 0}),
    ("dpheatmap", {"level_split": "fibonacci"}),
    ("dpheatmap", {"root_fraction": 1.0}),
    ("laplace", {"normalisation": "points"}),
    ("laplace", {"quantum": 0}),
    ("laplace", {"resolution": 0}),
    ("laplace-top", {"top_percent": 0}),
    ("laplace-top", {"top_percent": 150}),
    ("laplace-top", {"quantum": 0}),  # the base class's checks still apply
    ("snh", {"loss": "huber"}),
    ("snh", {"cell_width_m": 0.0}),
    ("snh", {"data_collection": "octree"}),
    ("snh", {"query_sides_m": (0.0, 100.0)}),
    ("snh", {"query_sides_m": (500.0, 100.0)}),
    ("snh", {"n_sizes": 0}),
    ("snh", {"public_workload": "w.csv", "public_workload_boxes": [[0.0, 0.0, 10.0, 10.0]]}),
    ("snh", {"public_workload_boxes": [[10.0, 0.0, 0.0, 10.0]]}),  # xmin > xmax
    ("snh", {"public_workload": "/nonexistent/public-workload.csv"}),
    ("snh", {"total_fraction": 0.0}),  # spent on n when ParamSelect picks ρ (no cell_width_m)
    ("auto", {"mechanisms": "identity,dawa"}),
    ("auto", {"mechanisms": ""}),
    ("auto", {"query_sides_m": (0.0, 100.0)}),
    ("auto", {"total_fraction": 1.0}),
]


@pytest.mark.parametrize(("name", "bad"), BAD_PARAMS, ids=[f"{n}-{'-'.join(b)}" for n, b in BAD_PARAMS])
def test_bad_parameter_values_are_refused_by_check_params_before_any_noise(
        name: str, bad: dict, fit_inputs: dict[bool, FitInput]) -> None:
    # The quick settings keep a wrongly accepted value from starting a long training run.
    mech = get_mechanism(name, **{**_params(name), **bad})
    with pytest.raises(MechanismError):
        mech.check_params()
    noise = NoiseSource.seeded(0)
    untouched = NoiseSource.seeded(0)
    with pytest.raises(MechanismError):
        mech.fit(_input_for(name, fit_inputs), EPSILON, noise)
    # Nothing was drawn: the generator is where a fresh one starts.
    assert noise.rng.bit_generator.state == untouched.rng.bit_generator.state
    assert noise.rng.random() == untouched.rng.random()


def test_bad_params_table_covers_every_mechanism_with_value_checks() -> None:
    covered = {name for name, _ in BAD_PARAMS}
    assert covered == {"ag", "hb", "privtree", "ug", "identity", "identity3d", "vdr", "dpheatmap", "laplace",
                       "laplace-top", "snh", "auto"}
    assert covered <= set(mechanism_names())


@pytest.mark.parametrize("name", mechanism_names())
def test_default_and_quick_parameters_pass_check_params(name: str) -> None:
    get_mechanism(name).check_params()
    get_mechanism(name, **_params(name)).check_params()
