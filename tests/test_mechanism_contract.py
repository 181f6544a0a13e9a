"""The contract every registered mechanism keeps, checked for every name in ``mechanism_names()``.

New mechanisms are picked up automatically, and everything the checks need is read from the class's
tags (``MechanismTags``): the input shape to build (``input_type``), quick parameters for mechanisms
that train (``fast_params``), and the sensitivity every charge must be calibrated to (``sensitivity``:
the count sensitivity k, or 1 at record level; or 1 per person whatever k is). The ``check_*``
functions are the contract itself; tests/test_mechanism_new_shape.py runs them on a mechanism of a
data shape no built-in mechanism reads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpcore.geo import Region
from dpcore.mechanisms import (
    MechanismError,
    MechanismInput,
    PrivacyUnit,
    PrivateSample,
    get_mechanism,
    get_mechanism_class,
    input_for,
    mechanism_names,
)
from dpcore.privacy.budget import BudgetError
from dpcore.privacy.noise import NoiseSource
from dpcore.synopsis.base import Synopsis, load_synopsis

K = 5
EPSILON = 0.8
N_SLOTS = 4
SLOT_SECONDS = 3600


def quick_params(name: str) -> dict:
    return dict(get_mechanism_class(name).tags.fast_params)


def contract_region() -> Region:
    return Region("contract", 40.7, -74.0, side_km=2.0)


def contract_sample(region: Region) -> PrivateSample:
    """Small synthetic user-level sample: 300 users, ≤ K points each, a cluster plus background, with
    time slots, so every input shape can be built from it."""
    rng = np.random.default_rng(11)
    n_users = 300
    per_user = rng.integers(1, K + 1, n_users)
    user = np.repeat(np.arange(n_users), per_user)
    n = user.size
    h = region.half_m
    clustered = rng.random(n) < 0.5
    x = np.where(clustered, rng.normal(200, 60, n), rng.uniform(-h, h, n)).clip(-h + 1e-6, h - 1e-6)
    y = np.where(clustered, rng.normal(-100, 60, n), rng.uniform(-h, h, n)).clip(-h + 1e-6, h - 1e-6)
    return PrivateSample(x, y, region, PrivacyUnit.user(K), user=user, slot=rng.integers(0, N_SLOTS, n),
                         n_slots=N_SLOTS, slot_seconds=SLOT_SECONDS, window_start_s=1_700_000_000)


def input_of(name: str, sample: PrivateSample) -> MechanismInput:
    return input_for(get_mechanism_class(name).tags.input_type, sample)


def boxes_in(region: Region) -> np.ndarray:
    rng = np.random.default_rng(5)
    h = region.half_m
    c = rng.uniform(-h, h, (50, 2))
    s = rng.uniform(50, 800, 50)
    return np.c_[c - s[:, None] / 2, c + s[:, None] / 2]


# -- the contract ---------------------------------------------------------------------------------------
def fit_quick(name: str, sample: PrivateSample) -> Synopsis:
    return get_mechanism(name, **quick_params(name)).fit(input_of(name, sample), EPSILON, NoiseSource.seeded(123))


def check_charges(name: str, syn: Synopsis, sample: PrivateSample) -> None:
    """Charges are recorded, positive, add up to ε, and each is calibrated to the tagged sensitivity."""
    assert isinstance(syn, Synopsis)
    charges = syn.privacy.charges
    assert charges, f"{name} recorded no charge"
    spent = math.fsum(c["epsilon"] for c in charges)
    assert 0.999 * EPSILON <= spent <= EPSILON * (1 + 1e-9), (name, spent)
    assert all(c["epsilon"] > 0 for c in charges)
    assert syn.privacy.epsilon == pytest.approx(EPSILON)
    assert syn.privacy.privacy_unit == sample.unit.kind
    expected = get_mechanism_class(name).tags.charge_sensitivity(sample.unit)
    assert syn.privacy.sensitivity == pytest.approx(expected)
    for c in charges:
        assert c["sensitivity"] == pytest.approx(expected), (name, c)


def check_round_trip(syn: Synopsis, directory: Path) -> None:
    """Saved and loaded, a synopsis answers, renders and states its privacy exactly as before."""
    syn.save(directory)
    back = load_synopsis(directory)
    assert type(back) is type(syn)
    boxes = boxes_in(syn.region)
    before = syn.answer(boxes)
    assert before.shape == (boxes.shape[0],) and np.all(np.isfinite(before))
    assert np.array_equal(back.answer(boxes), before)
    assert np.array_equal(back.density(16), syn.density(16))
    # Compared as JSON (what the manifest holds): a tuple parameter comes back as a list.
    assert json.loads(json.dumps(back.privacy.to_dict(), default=str)) == json.loads(
        json.dumps(syn.privacy.to_dict(), default=str))


def check_bad_epsilon(name: str, epsilon: float, sample: PrivateSample) -> None:
    noise = NoiseSource.seeded(0)
    with pytest.raises(BudgetError):
        get_mechanism(name, **quick_params(name)).fit(input_of(name, sample), epsilon, noise)
    assert noise.rng.bit_generator.state == NoiseSource.seeded(0).rng.bit_generator.state


def check_bad_params(name: str, bad: dict, sample: PrivateSample) -> None:
    """A bad value is a one-line MechanismError without data (construction or ``check_params``, which is
    what lets release planning refuse it before the ledger is charged), and a fit draws no noise."""
    with pytest.raises(MechanismError) as refused:
        get_mechanism(name, **{**quick_params(name), **bad}).check_params()
    assert "\n" not in str(refused.value)
    noise = NoiseSource.seeded(0)
    with pytest.raises(MechanismError):
        get_mechanism(name, **{**quick_params(name), **bad}).fit(input_of(name, sample), EPSILON, noise)
    assert noise.rng.bit_generator.state == NoiseSource.seeded(0).rng.bit_generator.state


# -- every registered mechanism -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def sample() -> PrivateSample:
    return contract_sample(contract_region())


@pytest.fixture(scope="module")
def fitted() -> dict[str, Synopsis]:
    """One fit per mechanism, shared by the checks below (training mechanisms are the slow part)."""
    return {}


def _fit(name: str, sample: PrivateSample, fitted: dict[str, Synopsis]) -> Synopsis:
    if name not in fitted:
        fitted[name] = fit_quick(name, sample)
    return fitted[name]


def test_registry_lists_the_classic_mechanisms() -> None:
    assert {"identity", "ug", "ag", "hb", "privtree"} <= set(mechanism_names())


@pytest.mark.parametrize("name", mechanism_names())
def test_fit_records_charges_at_the_tagged_sensitivity(name: str, sample: PrivateSample,
                                                       fitted: dict[str, Synopsis]) -> None:
    check_charges(name, _fit(name, sample, fitted), sample)


@pytest.mark.parametrize("name", mechanism_names())
def test_save_load_round_trip_answers_identically(name: str, sample: PrivateSample, fitted: dict[str, Synopsis],
                                                  tmp_path: Path) -> None:
    check_round_trip(_fit(name, sample, fitted), tmp_path / name)


@pytest.mark.parametrize("name", mechanism_names())
@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan")])
def test_non_positive_epsilon_is_refused(name: str, epsilon: float, sample: PrivateSample) -> None:
    check_bad_epsilon(name, epsilon, sample)


#: Parameter values no mechanism can work with, at least one per registered mechanism: ranges, wrong
#: types (a list, a word, a fraction where a whole number is needed), and rules between parameters.
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
    ("hb", {"levels": 2.5}),
    ("hb", {"branching": True}),
    ("hb", {"total_fraction": 1.0}),
    ("privtree", {"min_leaf_m": 0.0}),
    ("privtree", {"tree_fraction": 1.0}),
    ("ug", {"c": 0}),
    ("ug", {"c": "ten"}),
    ("ug", {"max_grid": 0}),
    ("ug", {"grid_size": 0}),
    ("ug", {"total_fraction": -0.1}),
    ("identity", {"cell_width_m": 0.0}),
    ("identity", {"cell_width_m": [1, 2]}),
    ("identity", {"cell_width_m": "wide"}),
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
    ("laplace-top", {"quantum": 0}),  # the base class's constraints still apply
    ("snh", {"loss": "huber"}),
    ("snh", {"cell_width_m": 0.0}),
    ("snh", {"data_collection": "octree"}),
    ("snh", {"query_sides_m": (0.0, 100.0)}),
    ("snh", {"query_sides_m": (500.0, 100.0)}),
    ("snh", {"n_sizes": 0}),
    ("snh", {"public_workload": "w.csv", "public_workload_boxes": [[0.0, 0.0, 10.0, 10.0]]}),
    ("snh", {"public_workload_boxes": [[10.0, 0.0, 0.0, 10.0]]}),  # xmin > xmax
    ("snh", {"public_workload": "/nonexistent/public-workload.csv"}),
    ("snh", {"total_fraction": 0.0}),
    ("auto", {"mechanisms": "identity,dawa"}),
    ("auto", {"mechanisms": ""}),
    ("auto", {"query_sides_m": (0.0, 100.0)}),
    ("auto", {"total_fraction": 1.0}),
]


@pytest.mark.parametrize(("name", "bad"), BAD_PARAMS, ids=[f"{n}-{'-'.join(b)}" for n, b in BAD_PARAMS])
def test_bad_parameter_values_are_refused_before_any_noise(name: str, bad: dict, sample: PrivateSample) -> None:
    check_bad_params(name, bad, sample)


def test_bad_params_table_covers_every_registered_mechanism() -> None:
    assert {name for name, _ in BAD_PARAMS} == set(mechanism_names())


@pytest.mark.parametrize("name", mechanism_names())
def test_default_and_quick_parameters_are_accepted_and_recorded_unchanged(name: str) -> None:
    """Construction validates without converting: what the caller gave is what manifests record."""
    for params in ({}, quick_params(name)):
        mech = get_mechanism(name, **params)
        mech.check_params()
        recorded = mech.get_params()
        for key, value in params.items():
            assert recorded[key] == value and type(recorded[key]) is type(value), (name, key)


def test_an_integer_for_a_float_parameter_is_kept_as_given() -> None:
    """Manifests and release keys hash the parameters as given, so validation must not coerce 10 to 10.0."""
    mech = get_mechanism("ug", c=10)
    assert mech.get_params()["c"] == 10 and type(mech.get_params()["c"]) is int


def test_a_mechanism_refuses_an_input_of_another_shape(sample: PrivateSample) -> None:
    """A spatio-temporal mechanism given 2-D points (no time slots) refuses before any noise is drawn."""
    points = input_of("identity", sample)
    noise = NoiseSource.seeded(0)
    with pytest.raises(MechanismError, match="time slots"):
        get_mechanism("identity3d").fit(points, EPSILON, noise)
    assert noise.rng.bit_generator.state == NoiseSource.seeded(0).rng.bit_generator.state


def test_fit_refuses_a_mechanism_that_builds_its_own_privacy_record(sample: PrivateSample) -> None:
    """``fit`` owns the privacy record; a ``_fit`` that sets one is a contract violation, not overwritten."""
    from dpcore.mechanisms import Mechanism
    from dpcore.mechanisms.tags import MechanismTags
    from dpcore.synopsis.base import GridSynopsis, PrivacyInfo

    class SelfRecording(Mechanism):
        name = "self-recording"
        tags = MechanismTags()

        def __init__(self) -> None:
            pass

        def _fit(self, data, acct, noise):
            acct.spend_rest("cells", data.sensitivity)
            fake = PrivacyInfo(self.name, {}, acct.epsilon, [], "record", 1.0, None, "", [])
            return GridSynopsis(np.zeros((2, 2)), data.region, fake, {})

    with pytest.raises(MechanismError, match="privacy record"):
        SelfRecording().fit(input_of("identity", sample), EPSILON, NoiseSource.seeded(0))
