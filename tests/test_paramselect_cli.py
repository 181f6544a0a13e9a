"""`geodp paramselect predict` and the cached per-dataset step of the paramselect-train flow."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flows.cli import main
from flows.paramselect_flow import TrainParams, public_datasets
from tasks.paramselect_tasks import dataset_rows

DASK_WORKERS = 1  # the session's one-worker cluster (tests/conftest.py): these flows need no second worker


def test_predict_prints_a_choice_from_the_shipped_model(capsys):
    rc = main(["paramselect", "predict", "--city", "new-york", "--n", "115000", "--epsilon", "0.1",
               "--privacy-unit", "record", "--json"])
    assert rc == 0
    choice = json.loads(capsys.readouterr().out)
    assert choice["mechanism"] == "identity"
    assert 25 <= choice["cell_width_m"] <= 3200
    assert choice["excluded_groups"] == ["new-york"]  # never trained on the city it predicts for


def test_predict_chooses_k_for_user_level(capsys):
    rc = main(["paramselect", "predict", "--city", "fargo", "--n", "30000", "--epsilon", "0.4",
               "--mechanisms", "identity,ug,ag,privtree", "--json"])
    assert rc == 0
    choice = json.loads(capsys.readouterr().out)
    assert choice["max_points_per_user"] in (1, 2, 5, 10, 20, 50)
    assert choice["mechanism"] in ("identity", "ug", "ag", "privtree")
    assert choice["inputs"]["profile_source"] == "median of the training profiles"  # fargo has no public data


def test_predict_bad_input_is_a_clean_error(capsys):
    assert main(["paramselect", "predict", "--city", "new-york", "--n", "-1", "--epsilon", "0.1"]) == 2
    assert "n must be a positive number" in capsys.readouterr().err
    assert main(["paramselect", "predict", "--city", "new-york", "--n", "100", "--epsilon", "0.1",
                 "--mechanisms", "identity,dawa"]) == 2
    assert "ParamSelect knows mechanisms" in capsys.readouterr().err


def test_shipped_model_gives_snh_its_rho_but_does_not_weigh_it(capsys):
    """The shipped table has no SNH rows (its default training set, flows/paramselect_flow.py): snh alone
    still gets the grid's ρ, but a choice between snh and the grid is refused, naming the retrain."""
    assert main(["paramselect", "predict", "--city", "boston", "--n", "20000", "--epsilon", "0.2",
                 "--mechanisms", "snh", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["mechanism"] == "snh" and 25 <= alone["cell_width_m"] <= 3200
    assert main(["paramselect", "predict", "--city", "boston", "--n", "20000", "--epsilon", "0.2",
                 "--mechanisms", "identity,snh"]) == 2
    err = capsys.readouterr().err
    assert "no training rows for ['snh']" in err and "geodp paramselect train --mechanisms" in err


def _check_candidates(choice: dict, margin: float) -> None:
    """Every candidate is listed best first, and the chosen one is the least after the self-tuned margin."""
    cands = choice["inputs"]["candidates"]
    errors = [c["predicted_error"] for c in cands]
    assert errors == sorted(errors)
    chosen = next(c for c in cands if c["mechanism"] == choice["mechanism"])
    assert chosen["predicted_error"] == choice["predicted_error"]
    assert [c["chosen"] for c in cands].count(True) == 1 and chosen["chosen"]
    weighed = [c["predicted_error"] * (1 + margin if c["self_tuned"] else 1) for c in cands if c["within_reach"]]
    assert chosen["predicted_error"] * (1 + margin if chosen["self_tuned"] else 1) == min(weighed)


def test_predict_lists_every_candidate_best_first(capsys):
    """The choice comes with what it was chosen from: each candidate's prediction."""
    from dpcore.paramselect import SELF_TUNED_MARGIN

    args = ["paramselect", "predict", "--city", "new-york", "--n", "115000", "--epsilon", "0.1",
            "--privacy-unit", "record", "--mechanisms", "identity,ug,ag,privtree", "--query-sides-m", "1000:5000"]
    assert main(args + ["--json"]) == 0
    choice = json.loads(capsys.readouterr().out)
    assert sorted(c["mechanism"] for c in choice["inputs"]["candidates"]) == ["ag", "identity", "privtree", "ug"]
    _check_candidates(choice, SELF_TUNED_MARGIN)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "candidates" in text and f"* {choice['mechanism']}" in text


def test_predict_says_a_self_tuned_candidate_needs_a_lead(capsys, tmp_path):
    """With a model that has SNH rows, snh is listed and weighed at (1 + SELF_TUNED_MARGIN), and the text
    output says so (why one with a lower prediction may lose)."""
    from dpcore.paramselect import (
        SELF_TUNED_MARGIN,
        ParamSelectModel,
        PublicProfile,
        config_columns,
        feature_row,
    )

    rows = []
    for group, n in (("tulsa", 2_000), ("fargo", 20_000), ("phoenix", 200_000)):
        for eps in (0.05, 0.2, 0.8):
            base = {"dataset": group, "group": group, "privacy_unit": "record", "k": None, "epsilon": eps,
                    "band_lo": 1000.0, "band_hi": 5000.0, "n_points": n, **feature_row(n, eps, 1.0, 8.0, (1000.0, 5000.0))}
            rows += [{**base, "mechanism": "identity", "rho": rho, "error": 0.2 + rho / 10_000, **config_columns("identity", rho)}
                     for rho in (200.0, 800.0)]
            rows.append({**base, "mechanism": "snh", "rho": None, "error": 0.15, "snh_denoised": 0,
                         **config_columns("snh", None)})
    profiles = {g: PublicProfile(g, f"public-{g}", 1000, 100, 8.0, {1: 0.5, 5: 0.8, 20: 0.95})
                for g in ("tulsa", "fargo", "phoenix")}
    model = tmp_path / "model.joblib"
    ParamSelectModel(pd.DataFrame(rows), profiles, seed=0, n_estimators=10).save(model)
    args = ["paramselect", "predict", "--city", "fargo", "--n", "20000", "--epsilon", "0.2", "--privacy-unit",
            "record", "--mechanisms", "identity,snh", "--query-sides-m", "1000:5000", "--model", str(model)]
    assert main(args + ["--json"]) == 0
    choice = json.loads(capsys.readouterr().out)
    assert sorted(c["mechanism"] for c in choice["inputs"]["candidates"]) == ["identity", "snh"]
    assert next(c for c in choice["inputs"]["candidates"] if c["mechanism"] == "snh")["self_tuned"] is True
    _check_candidates(choice, SELF_TUNED_MARGIN)
    assert main(args) == 0
    assert f"self-tuned: weighed at ×{1 + SELF_TUNED_MARGIN:g}" in capsys.readouterr().out


def test_dataset_rows_are_cached(tmp_path):
    spec = {"name": "synthetic-tulsa-9", "group": "synthetic-9", "city": "tulsa", "source": "synthetic",
            "seed": 9, "n_users": 200, "n_hotspots": 10}
    config = {"epsilons": [0.5], "mechanisms": ["identity"], "rhos": [200.0, 800.0], "user_ks": [5],
              "bands": [[100.0, 1000.0]], "n_queries": 100, "trials": 1, "seed": 0}
    first = dataset_rows.fn(spec, config, str(tmp_path))
    second = dataset_rows.fn(spec, config, str(tmp_path))
    assert not first["cached"] and second["cached"]
    # The environment the rows were computed in is recorded with them and read back from the cache.
    assert first["environment"]["cpu"] and second["environment"] == first["environment"]
    rows = pd.read_csv(first["rows"])
    assert len(rows) == 2 * 2  # 2 ρ × (record + user k=5)
    assert set(rows["privacy_unit"]) == {"record", "user"}
    changed = dataset_rows.fn(spec, {**config, "epsilons": [0.25]}, str(tmp_path))
    assert not changed["cached"]  # another configuration is another cache entry


def test_row_sets_group_by_the_environment_they_were_computed_in():
    from flows.paramselect_flow import group_by_environment

    here, there = {"cpu": "a", "torch": "2.13.0"}, {"cpu": "b", "torch": "2.13.0"}
    outs = [{"rows": "/c/rows-a.csv", "environment": here}, {"rows": "/c/rows-b.csv", "environment": None},
            {"rows": "/c/rows-c.csv", "environment": there}, {"rows": "/c/rows-d.csv", "environment": dict(here)}]
    groups = group_by_environment(outs)
    # A set cached before environments were recorded is its own group ("not recorded"), never merged.
    assert groups == [{"environment": here, "row_sets": ["rows-a.csv", "rows-d.csv"]},
                      {"environment": None, "row_sets": ["rows-b.csv"]},
                      {"environment": there, "row_sets": ["rows-c.csv"]}]


def test_training_datasets_group_by_city(tmp_path):
    specs = public_datasets(TrainParams(shared_data=str(tmp_path), synthetic_seeds=[1, 2]))
    assert [s["source"] for s in specs] == ["synthetic", "synthetic"]  # no public files in tmp_path
    assert len({s["group"] for s in specs}) == 2


@pytest.mark.slow
def test_paramselect_train_flow_runs_on_a_real_server_and_caches(prefect_harness, dask_cluster, tmp_path):
    """The `paramselect-train` flow on Prefect + the session's Dask LocalCluster, tiny search on two synthetic cities:
    it writes model, table and a CV report, the model predicts, and a second run reads every row from
    the cache. (The real run, with the Gowalla data and SNH rows, takes 2–2.5 hours from an empty cache: docs/mechanisms.md.)"""
    from dpcore.geo import city_region
    from dpcore.paramselect import PublicProfile, select_params
    from flows.paramselect_flow import run_paramselect_train

    params = TrainParams(shared_data=str(tmp_path / "none"), cache_dir=str(tmp_path / "cache"),
                         model_path=str(tmp_path / "m.joblib"), table_path=str(tmp_path / "t.csv"),
                         report_path=str(tmp_path / "r.json"), epsilons=[0.2, 1.6], fractions=[1.0],
                         synthetic_seeds=[1, 2], mechanisms=["identity", "ug"], rhos=[200.0, 800.0],
                         user_ks=[], bands=[[100.0, 1000.0]], n_queries=100, n_estimators=10,
                         dask_address=dask_cluster)
    report = run_paramselect_train(params)
    # 2 datasets × 2 ε × (2 ρ + ug) × 1 band
    assert report["rows"] == 2 * 2 * 3
    assert set(report["cross_validation"]["groups"]) == {"synthetic-1", "synthetic-2"}
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == report["rows"]
    import numpy

    assert report["environment"]["numpy"] == numpy.__version__ and set(report["environment"]) >= {"python", "torch"}
    # Both row sets were computed by this run, so they carry its environment.
    assert [(g["environment"], len(g["row_sets"])) for g in report["row_environments"]] == [(report["environment"], 2)]
    # Synthetic datasets give the model no city profiles, so the caller supplies a public one.
    profile = PublicProfile("boston", "a public profile given by the caller", 0, 0, 9.0, {})
    choice = select_params(region=city_region("boston"), n=20_000, epsilon=0.2, mechanisms=("identity", "ug"),
                           profile=profile, model_path=tmp_path / "m.joblib")
    assert choice.mechanism in ("identity", "ug") and choice.cell_width_m > 0
    cached = sorted((tmp_path / "cache").glob("rows-*.csv"))
    assert len(cached) == 2
    stamps = [p.stat().st_mtime_ns for p in cached]
    again = run_paramselect_train(params)
    assert again["rows"] == report["rows"]
    assert [p.stat().st_mtime_ns for p in cached] == stamps  # nothing recomputed


def test_training_rows_report_progress():
    from dpcore.geo import city_region
    from dpcore.paramselect import PublicProfile, training_rows
    from tasks.paramselect_tasks import dataset_points

    spec = {"name": "synthetic-tulsa-9", "group": "synthetic-9", "city": "tulsa", "source": "synthetic",
            "seed": 9, "n_users": 200, "n_hotspots": 10}
    x, y, user = dataset_points(spec)
    region = city_region("tulsa")
    profile = PublicProfile.from_points(x, y, user, region, spec["name"])
    calls = []
    rows = training_rows(spec["name"], "g", x, y, user, region, profile, epsilons=(0.5, 1.0), privacy_unit="user",
                         ks=(1, 5), mechanisms=("identity", "ug"), rhos=(200.0, 800.0), bands=((100.0, 1000.0),),
                         n_queries=50, progress=lambda done, total, what: calls.append((done, total, what)))
    total = 2 * 2 * 3  # k × ε × (2 ρ + ug)
    assert [c[0] for c in calls] == list(range(1, total + 1)) and {c[1] for c in calls} == {total}
    assert len(rows) == total and "ug" in calls[-1][2]


def test_snh_rows_key_their_cache_on_the_denoiser():
    """SNH's rows depend on the shipped denoisers, so their fingerprints are part of their cache key (and
    only of theirs: the cheap mechanisms' rows stay cached when the denoiser changes)."""
    from dpcore.models.pyramid_denoiser import model_fingerprint
    from flows.paramselect_flow import search_config
    from tasks.paramselect_tasks import cache_key

    p = TrainParams()
    snh, cheap = search_config(p, ["snh"]), search_config(p, ["identity", "ug"])
    assert snh["snh_denoiser"] == model_fingerprint() and "snh_denoiser" not in cheap
    # So is the specialist's, which replaces the general model on the releases of its band.
    from dpcore.models.pyramid_denoiser import BAND_DENOISER_PATH

    assert snh["snh_band_denoiser"] == model_fingerprint(BAND_DENOISER_PATH) and "snh_band_denoiser" not in cheap
    assert "snh_band_denoiser" not in search_config(p, ["snh"], "new-york", denoised=False)
    spec = {"name": "d", "city": "tulsa"}
    assert cache_key(spec, snh) != cache_key(spec, {**snh, "snh_denoiser": "another-model"})
    # The denoised snh's post-processing rules are part of the key too: a new rule recomputes those rows.
    from dpcore.mechanisms.snh import DENOISED_RULES_KEY

    assert snh["snh_answer"] == DENOISED_RULES_KEY and "snh_answer" not in cheap
    assert cache_key(spec, snh) != cache_key(spec, {**snh, "snh_answer": "geometric"})
    assert "snh_answer" not in search_config(p, ["snh"], "new-york", denoised=False)
    # Per city: only where snh applies the denoiser (the shipped one never saw new-york; it learned from
    # tulsa's synthetic data, so snh there runs without it and those rows do not depend on it).
    assert "snh_denoiser" in search_config(p, ["snh"], "new-york")
    assert "snh_denoiser" not in search_config(p, ["snh"], "tulsa")


def test_cheap_and_self_tuned_rows_average_their_own_number_of_trials():
    """The cheap mechanisms' rows (ρ's labels) average cheap_trials noise draws, snh's rows `trials`; each
    count keys only its own rows' cache, so more draws for the grid never recompute the neural fits."""
    from flows.paramselect_flow import search_config
    from tasks.paramselect_tasks import cache_key

    p = TrainParams(trials=1, cheap_trials=10)
    cheap, snh = search_config(p, ["identity", "ug"]), search_config(p, ["snh"], "new-york")
    assert cheap["trials"] == 10 and snh["trials"] == 1
    more = TrainParams(trials=1, cheap_trials=20)
    spec = {"name": "d", "city": "new-york"}
    assert cache_key(spec, search_config(more, ["identity", "ug"])) != cache_key(spec, cheap)
    assert cache_key(spec, search_config(more, ["snh"], "new-york")) == cache_key(spec, snh)


def test_train_cli_refuses_a_trial_count_below_one(tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["paramselect", "train", "--shared-data", str(tmp_path), "--out-dir", str(out),
                 "--cheap-trials", "0"]) == 2
    assert "--cheap-trials" in capsys.readouterr().err
    assert not any(out.glob("*"))  # refused before anything was trained or written


def test_snh_rows_are_built_with_and_without_the_denoiser_where_it_applies():
    """Where snh applies the denoiser the table gets both variants (tagged), each its own cache entry;
    elsewhere snh runs plain and has one."""
    from flows.paramselect_flow import snh_configs
    from tasks.paramselect_tasks import cache_key

    p = TrainParams()
    nyc = snh_configs(p, ["snh"], "new-york")
    assert [denoised for _, denoised in nyc] == [True, False]
    (den, _), (plain, _) = nyc
    assert "snh_denoiser" in den and "mechanism_params" not in den
    assert plain["mechanism_params"] == {"snh": {"denoiser": "none"}} and "snh_denoiser" not in plain
    spec = {"name": "d", "city": "new-york"}
    assert cache_key(spec, den) != cache_key(spec, plain)
    assert snh_configs(p, [], "new-york") == []


def test_cities_the_shipped_denoiser_learned_from_get_denoised_rows_from_the_holdout_one(tmp_path):
    """Austin overlaps the shipped denoiser's training regions; a hold-out denoiser trained elsewhere
    gives its denoised SNH rows (tagged, keyed on that model), and none is used where it overlaps too."""
    from dpcore.geo import city_region
    from dpcore.mechanisms.snh import DENOISED_RULES_KEY, PLAIN_RULES_KEY
    from dpcore.models.pyramid_denoiser import (
        PyramidDenoiser,
        model_fingerprint,
        region_record,
        save_denoiser,
    )
    from flows.paramselect_flow import snh_configs

    hold = tmp_path / "holdout.npz"
    save_denoiser(hold, PyramidDenoiser(4), {"training_regions": [region_record(city_region("tulsa"))]})
    p = TrainParams(holdout_denoiser=str(hold))
    austin = snh_configs(p, ["snh"], "austin")
    assert [d for _, d in austin] == [False, True]
    (plain, _), (held, _) = austin
    assert "mechanism_params" not in plain and "snh_denoiser" not in plain  # snh's default skips the shipped one
    assert held["mechanism_params"] == {"snh": {"denoiser": str(hold)}}
    assert held["snh_denoiser"] == model_fingerprint(hold)
    assert held["snh_answer"] == DENOISED_RULES_KEY  # a rule change recomputes these rows too
    assert plain["snh_plain_answer"] == PLAIN_RULES_KEY and "snh_plain_answer" not in held
    # Where the shipped denoiser applies, its rows are keyed on the denoised rules, the plain ones on theirs.
    (den, _), (nyc_plain, _) = snh_configs(p, ["snh"], "new-york")
    assert den["snh_answer"] == DENOISED_RULES_KEY and "snh_plain_answer" not in den
    assert nyc_plain["snh_plain_answer"] == PLAIN_RULES_KEY and "snh_answer" not in nyc_plain
    assert [d for _, d in snh_configs(p, ["snh"], "tulsa")] == [False]  # the hold-out model learned tulsa
    assert [d for _, d in snh_configs(TrainParams(holdout_denoiser=None), ["snh"], "austin")] == [False]


def test_predict_auto_weighs_what_an_auto_release_weighs(capsys):
    """`--mechanisms auto` is every mechanism the model has rows for, exactly auto's default candidates."""
    from dpcore.mechanisms import get_mechanism

    base = ["paramselect", "predict", "--city", "new-york", "--n", "115000", "--epsilon", "0.2",
            "--privacy-unit", "record", "--json", "--mechanisms"]
    assert main(base + ["auto"]) == 0
    via_auto = json.loads(capsys.readouterr().out)
    listed = ",".join(get_mechanism("auto")._candidates())
    assert main(base + [listed]) == 0
    listed_out = json.loads(capsys.readouterr().out)
    # the same candidates weighed with the same predictions; only auto's own decision is added
    assert {c["mechanism"]: c["predicted_error"] for c in listed_out["inputs"]["candidates"]} == \
        {c["mechanism"]: c["predicted_error"] for c in via_auto["inputs"]["candidates"]}
    assert via_auto["inputs"]["auto"]["cost_model"]["mechanism"] == listed_out["mechanism"]
    assert sorted(c["mechanism"] for c in via_auto["inputs"]["candidates"]) == sorted(listed.split(","))
    # the shipped model knows the mechanisms of the default training set
    assert sorted(listed.split(",")) == sorted(TrainParams().mechanisms)
    assert main(base + ["auto,identity"]) == 2
    assert "--mechanisms auto stands alone" in capsys.readouterr().err


def test_predict_auto_prints_what_an_auto_release_runs(capsys):
    """`--mechanisms auto` reports auto's own decision (band rule, rule-sized grid), not the cost model's
    pick: for each band it names the mechanism and grid an auto release with the same public n runs."""
    import numpy as np

    from dpcore.geo import city_region
    from dpcore.mechanisms import FitInput, get_mechanism
    from dpcore.privacy.noise import NoiseSource

    reg = city_region("new-york")
    rng = np.random.default_rng(0)
    x, y = rng.normal(0, 2000, 5000), rng.normal(0, 2000, 5000)
    data = FitInput(x, y, reg, "record", None, public_total=115_000.0)
    picks, model_picks = [], []
    for band in ("25:100", "100:1000", "1000:5000"):
        assert main(["paramselect", "predict", "--city", "new-york", "--n", "115000", "--epsilon", "0.2",
                     "--privacy-unit", "record", "--mechanisms", "auto", "--query-sides-m", band, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        lo, hi = (float(v) for v in band.split(":"))
        syn = get_mechanism("auto", query_sides_m=(lo, hi)).fit(data, 0.2, NoiseSource.seeded(0))
        chosen = syn.privacy.params["chosen"]
        assert out["mechanism"] == chosen["mechanism"] == out["inputs"]["auto"]["mechanism"]
        assert out["inputs"]["auto"]["params"] == chosen["params"]
        assert [c["mechanism"] for c in out["inputs"]["candidates"] if c["chosen"]] == [chosen["mechanism"]]
        picks.append((out["mechanism"], chosen["params"].get("grid_size")))
        model_picks.append(out["inputs"]["auto"]["cost_model"]["mechanism"])
    # under 1 km a rule-sized grid (finer for the smaller band), from 1 km AG; the cost model alone picks
    # otherwise here, so this fails if predict prints the cost model's choice
    assert [m for m, _ in picks] == ["ug", "ag", "ag"]
    assert picks[0][1] > 8 and picks[1][1] is None
    assert [m for m, _ in picks] != model_picks
    assert main(["paramselect", "predict", "--city", "new-york", "--n", "115000", "--epsilon", "0.2",
                 "--privacy-unit", "record", "--mechanisms", "auto", "--query-sides-m", "25:100"]) == 0
    text = capsys.readouterr().out
    assert f"a {picks[0][1]}² grid" in text and "auto's choice, by the band rule" in text
    assert main(["paramselect", "predict", "--city", "new-york", "--n", "115000", "--epsilon", "0.2",
                 "--privacy-unit", "record", "--mechanisms", "auto", "--query-sides-m", "100:1000"]) == 0
    text = capsys.readouterr().out
    assert "parameters         alpha=0.2, c=5, min_m1=32" in text and "cell width" not in text


def test_predict_with_a_broken_model_file_is_a_one_line_error(capsys, tmp_path):
    """A model copied without its training table, or a file that is not a model: exit 2, one line, no
    traceback."""
    from dpcore.paramselect import DEFAULT_MODEL_PATH

    alone = tmp_path / "paramselect_model.joblib"
    alone.write_bytes(DEFAULT_MODEL_PATH.read_bytes())
    not_a_model = tmp_path / "other.joblib"
    not_a_model.write_text("not a model\n")
    for path, says in ((alone, "needs its training table"), (not_a_model, "is not a ParamSelect model file")):
        assert main(["paramselect", "predict", "--city", "boston", "--n", "20000", "--epsilon", "0.2",
                     "--model", str(path)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
