"""Adding a mechanism of a data shape no built-in one reads touches only its own module and ``register``.

The toy below reads 1-D counts (points counted in equal-width west-east strips), declares that shape with
its tags, and is registered here only. The contract checks of tests/test_mechanism_contract.py, release
planning (tasks/release_city_plan.py) and the evaluation protocol (dpcore/evaluate.py) accept it as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

import dpcore.mechanisms as registry
from dpcore.data.points import Points
from dpcore.evaluation.range import EvalConfig, evaluate
from dpcore.geo import Region
from dpcore.grid.countgrid import coarsen
from dpcore.mechanisms import (
    Mechanism,
    MechanismError,
    MechanismInput,
    MechanismTags,
    PrivacyUnit,
    PrivateSample,
    get_mechanism,
    mechanism_names,
    register,
)
from dpcore.mechanisms.params import PositiveInt
from dpcore.synopsis.base import GridSynopsis
from tests.test_mechanism_contract import (
    EPSILON,
    check_bad_epsilon,
    check_bad_params,
    check_charges,
    check_round_trip,
    contract_region,
    contract_sample,
    fit_quick,
)


@dataclass(frozen=True)
class StripCounts(MechanismInput):
    """Points counted in ``BINS`` equal-width strips from west to east: a 1-D histogram."""

    counts: np.ndarray
    region: Region
    unit: PrivacyUnit

    BINS: ClassVar[int] = 32

    @classmethod
    def from_sample(cls, sample: PrivateSample) -> StripCounts:
        if sample.fine is not None:  # a cluster's fine count grid (tasks/dask_path.py): sum it into strips
            fine = sample.fine if sample.fine.ndim == 2 else sample.fine.sum(axis=2)
            return cls(coarsen(fine, cls.BINS, 1).ravel(), sample.region, sample.unit)
        xmin, _, xmax, _ = sample.region.bounds_m
        counts, _ = np.histogram(sample.x, bins=cls.BINS, range=(xmin, xmax))
        return cls(counts.astype(np.int64), sample.region, sample.unit)


class NoisyStrips(Mechanism):
    """Discrete Laplace on every strip count; the strips are released as a BINS × ``rows`` grid."""

    name = "toy-strips"
    tags = MechanismTags(input_type=StripCounts, fast_params={"rows": 2})

    def __init__(self, *, rows: PositiveInt = 1, clamp_negative: bool = False):
        self.rows = rows
        self.clamp_negative = clamp_negative

    def fine_grid(self, region: Region) -> int | None:
        """A cluster counts the points on a grid whose columns add up to the strips exactly."""
        return 4 * StripCounts.BINS

    def _fit(self, data: StripCounts, acct, noise) -> GridSynopsis:
        eps = acct.spend_rest("strip_counts", data.sensitivity, note="disjoint strips: L1 sensitivity k")
        noisy = noise.add_discrete_laplace(data.counts, data.sensitivity, eps).astype(np.float64)
        if self.clamp_negative:
            noisy = np.maximum(noisy, 0.0)
        acct.describe([f"{data.counts.size} strips"])
        grid = np.repeat(noisy[:, None] / self.rows, int(self.rows), axis=1)
        return GridSynopsis(grid, data.region, None, {"strips": int(data.counts.size)})


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "_EXTRA", dict(registry._EXTRA))
    register(NoisyStrips)
    return NoisyStrips.name


def test_the_contract_checks_accept_the_new_shape(toy: str, tmp_path) -> None:
    sample = contract_sample(contract_region())
    syn = fit_quick(toy, sample)
    check_charges(toy, syn, sample)
    check_round_trip(syn, tmp_path / toy)
    check_bad_epsilon(toy, 0.0, sample)
    check_bad_params(toy, {"rows": 0}, sample)
    check_bad_params(toy, {"clamp_negative": "maybe"}, sample)
    # The strips hold the sample's points, up to noise of scale k/ε per strip.
    assert abs(syn.density(StripCounts.BINS, 1).sum() - sample.x.size) < 40 * 5 / EPSILON


def test_release_planning_and_privatize_accept_the_new_shape(toy: str) -> None:
    from dpcore.grid.histogram import grid_counts
    from tasks.config import parse_period
    from tasks.dask_path import CityData
    from tasks.release_city_plan import make_plans
    from tasks.release_tasks import grid_specs, privatize

    common = {"dataset": "toy", "cities": [], "center": "40.7,-74.0", "side_km": 2.0, "period": parse_period(None),
              "mechanism": toy, "epsilon": EPSILON, "privacy_unit": "user", "max_points_per_user": 5, "seed": 7,
              "data_version": "v1"}
    with pytest.raises(MechanismError, match="rows"):
        make_plans(**common, params={"rows": 0})
    (plan,) = make_plans(**common, params={"rows": 2})
    (spec,) = grid_specs([plan])  # what the cluster's data pass counts for this city
    assert spec.cells == 4 * StripCounts.BINS
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-900, 900, (2, 400))
    fine = grid_counts(x, y, plan.region.bounds_m, spec.cells)
    syn = privatize.fn(plan, CityData(fine=fine))
    assert [c["name"] for c in syn.privacy.charges] == ["strip_counts"]
    assert syn.privacy.mechanism == toy and syn.privacy.max_points_per_user == 5
    assert syn.values.shape == (StripCounts.BINS, 2)
    # The strips count the city's points, up to noise of scale k/ε per strip.
    assert abs(syn.values.sum() - 400) < 40 * 5 / EPSILON


def test_evaluation_accepts_the_new_shape(toy: str) -> None:
    region = Region("toy-eval", 40.7, -74.0, side_km=2.0)
    rng = np.random.default_rng(4)
    n = 3000
    lat = region.center_lat + rng.uniform(-0.008, 0.008, n)
    lon = region.center_lon + rng.uniform(-0.01, 0.01, n)
    points = Points(rng.integers(0, 300, n).astype(np.int64), np.full(n, 1_700_000_000, dtype=np.int64), lat, lon)
    config = EvalConfig(mechanisms=[toy], epsilons=[1.0], privacy_unit="record", trials=1, n_queries=50,
                        hindsight=False)
    report = evaluate(points, region, config)
    rows = [r for r in report["results"] if r["mechanism"] == toy]
    assert rows and all(np.isfinite(r["mean_relative_error"]) for r in rows)


def test_the_toy_is_gone_after_the_test() -> None:
    assert NoisyStrips.name not in mechanism_names()
    with pytest.raises(MechanismError, match="unknown mechanism"):
        get_mechanism(NoisyStrips.name)


def test_register_refuses_a_taken_name(toy: str) -> None:
    """Issue 46: register() replaced a built-in mechanism silently (a class named 'ug' took over every
    release asking for ug). A built-in name, or one another class holds, is refused; the same class again
    is accepted and the registry is unchanged."""
    builtin_ug = registry.get_mechanism_class("ug")
    impostor = type("Impostor", (NoisyStrips,), {"name": "ug"})
    with pytest.raises(MechanismError, match="built-in"):
        register(impostor)
    assert registry.get_mechanism_class("ug") is builtin_ug
    other = type("OtherStrips", (NoisyStrips,), {"name": toy})
    with pytest.raises(MechanismError, match="taken by"):
        register(other)
    assert register(NoisyStrips) is NoisyStrips and registry.get_mechanism_class(toy) is NoisyStrips
