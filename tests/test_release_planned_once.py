"""A release is planned once (tasks/release_plan.py, tasks/release_city_plan.py: CityPlan): the mechanism is
built once for the whole run, the input is listed once and that listing gives both the release keys'
data version and the files the data pass reads, and the plan carries typed values, not strings."""

from __future__ import annotations

import os

import pytest

import dpcore.data.inputs
import tasks.release_city_plan
from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from flows.release import release_cities
from tasks.config import PrivacyUnitName, ReleaseParams
from tasks.release_city_plan import NoiseSpec
from tasks.release_plan import plan_release
from tasks.storage.store import ReleaseStore


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "checkins.parquet"
    generate_checkins(city_region("boston"), n_users=60, days=2, seed=3, start="2024-03-01").to_parquet(path)
    os.utime(path, (1_710_000_000, 1_710_000_000))
    return path


def _params(data, store, **more) -> ReleaseParams:
    return ReleaseParams(data=str(data), cities=["boston", "chicago"], period="2024-03-01", epsilon=0.5,
                         mechanism="ug", store=str(store), **more)


def test_one_release_builds_its_mechanism_and_lists_its_input_once(data, tmp_path, monkeypatch):
    built, listed = [], []
    real_build, real_list = tasks.release_city_plan.get_mechanism, dpcore.data.inputs.resolve_input

    def counting_build(*args, **kwargs):
        built.append(args)
        return real_build(*args, **kwargs)

    def counting_list(*args, **kwargs):
        listed.append(args)
        return real_list(*args, **kwargs)

    monkeypatch.setattr(tasks.release_city_plan, "get_mechanism", counting_build)
    monkeypatch.setattr(dpcore.data.inputs, "resolve_input", counting_list)
    summary = release_cities(_params(data, tmp_path / "store"), in_process=True, artifacts=False)
    assert [r["status"] for r in summary["releases"]] == ["committed", "committed"]
    assert len(built) == 1  # two cities: one plan, one mechanism
    assert len(listed) == 1  # the listing behind the keys' data version is the one the data pass read
    (m, _) = ReleaseStore(str(tmp_path / "store")).list_releases()
    assert m.input.data_version.endswith("1files")


def test_the_plan_carries_typed_values(data, tmp_path):
    plan = plan_release(_params(data, tmp_path / "s", seed=7, privacy_unit="user"))
    first, second = plan.plans
    assert first.privacy_unit is PrivacyUnitName.USER and first.noise == NoiseSpec(7)
    assert first.mech is second.mech and first.mech.get_params() == second.mech.get_params()
    assert first.budget == 0.5 and first.unit.k == first.max_points_per_user
    # the key hashes the spec's label, as it always did, so committed releases keep their keys
    assert first.config["noise"] == "seeded:7" and first.config["privacy_unit"] == "user"
    assert plan.input.files and plan.input.version == first.data_version
