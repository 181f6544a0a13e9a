"""The release form (the served `release` deployment's parameters, tasks.config.ReleaseParams): its JSON
schema as the Prefect UI and server read it, the store taken from the configuration, an empty city list
refused, and a run summary that links its previews when inlining them would be too large."""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import ValidationError

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from dpcore.mechanisms import get_mechanism_class, mechanism_names
from flows.serve import build_deployments
from tasks.config import ConfigError, ReleaseParams
from tasks.release_plan import plan_release
from tasks.settings import load_settings
from tasks.storage.store import ReleaseStore


@pytest.fixture(scope="module")
def form(tmp_path_factory) -> dict:
    """The parameter schema of the served release deployment."""
    cfg = tmp_path_factory.mktemp("form") / "geodp.toml"
    cfg.write_text('store = "s3://configured/prod"\n')
    deps = {d.name: d for d in build_deployments(load_settings(cfg), cfg)}
    return deps["release"]._parameter_openapi_schema.model_dump()


def _valid(form: dict, params: dict) -> bool:
    return jsonschema.Draft202012Validator(form).is_valid({"params": params})


def test_the_form_requires_epsilon_or_rho(form):
    base = {"data": "x.parquet", "cities": ["boston"]}
    assert not _valid(form, base)
    assert _valid(form, {**base, "epsilon": 0.5}) and _valid(form, {**base, "rho": 0.1})
    assert not _valid(form, {**base, "epsilon": None})
    with pytest.raises(ValidationError, match="exactly one of epsilon"):
        ReleaseParams(**base)


def test_the_mechanism_is_a_choice_with_typed_parameters(form):
    props = form["definitions"]["ReleaseParams"]["properties"]
    assert props["mechanism"]["enum"] == mechanism_names()
    variants = {v["title"]: v for v in props["mechanism_params"]["anyOf"]}
    assert set(variants) == {f"{name} parameters" for name in mechanism_names()}
    ug = get_mechanism_class("ug")._params_model.model_json_schema()
    assert variants["ug parameters"]["properties"] == ug["properties"]
    assert variants["ug parameters"]["additionalProperties"] is False
    base = {"data": "x.parquet", "cities": ["boston"], "epsilon": 0.5}
    assert _valid(form, {**base, "mechanism": "ug", "mechanism_params": {"c": 5}})
    assert not _valid(form, {**base, "mechanism": "magic"})
    assert not _valid(form, {**base, "mechanism": "ug", "mechanism_params": {"cc": 5}})  # no mechanism takes cc
    # the model refuses what the schema cannot tie together: a parameter of another mechanism
    with pytest.raises(ValidationError, match="ug takes no parameter cell_width_m"):
        ReleaseParams(**base, mechanism="ug", mechanism_params={"cell_width_m": 500})
    with pytest.raises(ValidationError, match="unknown mechanism 'magic'"):
        ReleaseParams(**base, mechanism="magic")


def test_an_empty_city_list_is_refused(form):
    with pytest.raises(ValidationError, match="at least one city"):
        ReleaseParams(data="x.parquet", cities=[], epsilon=0.5)
    assert ReleaseParams(data="x.parquet", cities=[], center="40.7,-74.0", epsilon=0.5).center


def test_the_store_defaults_to_the_configured_one(form, tmp_path):
    props = form["definitions"]["ReleaseParams"]["properties"]
    assert props["store"].get("default") is None and "configuration" in props["store"]["description"]
    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("boston"), n_users=20, days=1, seed=1, start="2024-03-01").to_parquet(data)
    configured = tmp_path / "configured-store"
    cfg = tmp_path / "geodp.toml"
    cfg.write_text(f'store = "{configured}"\n')
    params = ReleaseParams(data=str(data), cities=["boston"], epsilon=0.5, period="2024-03-01")
    assert plan_release(params, str(cfg)).store_url == ReleaseStore(str(configured)).url
    named = tmp_path / "named-store"
    assert plan_release(params.model_copy(update={"store": str(named)}), str(cfg)).store_url == str(named)
    bare = tmp_path / "bare.toml"
    bare.write_text("[budget]\ndefault_cap = 1.0\n")
    with pytest.raises(ConfigError, match="no release store"):
        plan_release(params, str(bare))


def test_a_large_summary_links_its_previews(tmp_path):
    from flows.release import release_cities
    from flows.release_summary import summary_markdown

    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("boston"), n_users=50, days=1, seed=2, start="2024-03-01").to_parquet(data)
    store_url = str(tmp_path / "store")
    params = ReleaseParams(data=str(data), cities=["boston", "chicago"], epsilon=0.5, period="2024-03-01",
                           mechanism="ug", store=store_url)
    summary = release_cities(params, in_process=True, artifacts=False)
    store = ReleaseStore(store_url)
    results = {m.city: m for m in store.list_releases()}
    previews = {city: m.file("preview.png") for city, m in results.items()}
    inline = summary_markdown(summary, results, store)
    assert inline.count("data:image/png;base64,") == 2
    total = sum(-(-4 * f.size // 3) for f in previews.values())
    linked = summary_markdown(summary, results, store, inline_limit=total - 1)
    assert "data:image/png;base64," not in linked and len(linked) < 6000
    for city, m in results.items():
        assert f"[preview.png]({m.url}/{previews[city].path})" in linked
