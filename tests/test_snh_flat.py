"""SNH's flat grid (the paper's data collection, the one that reaches its authors' CABS_SFS number):
non-negative cells and answers, and through the CLI a public configured region, one charge and refusals."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dpcore.geo import Region
from dpcore.mechanisms import FitInput, get_mechanism
from dpcore.privacy.noise import NoiseSource
from tests.cli_runner import run_geodp

TINY = dict(n_sizes=2, hidden=8, depth=1, max_epochs=2, samples_per_epoch=1024, batch_size=256, device="cpu")


def _sparse_points(region: Region, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A few dense spots in an empty region: most cells hold nothing, so at small ε half of them go
    negative under the noise."""
    rng = np.random.default_rng(seed)
    spots = rng.uniform(-0.4, 0.4, (4, 2)) * region.side_m
    pick = spots[rng.integers(0, 4, n)]
    xy = pick + rng.normal(0, 30.0, (n, 2))
    return xy[:, 0], xy[:, 1]


def test_flat_grid_release_answers_no_negative_count_and_learns_labels_clipped_at_zero():
    """Bug: the flat grid's answers and the nets' outputs could be below 0, further from every truth than 0
    is, and the nets learned negative labels (noise alone) that the paper clips at 0; a count is never
    negative (post-processing). The cells stay unclipped, so sums over many cells stay unbiased."""
    region = Region("test", 40.0, -74.0, 2.0)
    x, y = _sparse_points(region, 3000, seed=1)
    data = FitInput(x, y, region, "record", None)
    rng = np.random.default_rng(3)
    centres = rng.uniform(-900, 900, (500, 2))
    side = rng.uniform(50, 400, (500, 1))
    boxes = np.hstack([centres - side / 2, centres + side / 2])
    for answer in ("nets", "grid"):
        syn = get_mechanism("snh", cell_width_m=50.0, query_sides_m=(50.0, 200.0), answer=answer, **TINY).fit(
            data, 0.05, NoiseSource.seeded(2))
        assert syn.config["data_collection"] == "grid" and syn.noisy.min() < 0.0  # the cells are not clipped
        assert syn.answer(boxes).min() >= 0.0, answer
    raw = get_mechanism("snh", cell_width_m=50.0, query_sides_m=(50.0, 200.0), answer="grid", clip_negative=False,
                        **TINY).fit(data, 0.05, NoiseSource.seeded(2))
    assert np.array_equal(raw.noisy, syn.noisy)  # the same noisy grid: only its post-processing differs
    assert raw.answer(boxes).min() < 0.0
    assert np.array_equal(np.maximum(raw.answer(boxes), 0.0), syn.answer(boxes))


def test_clipped_labels_are_learned_as_zero():
    region = Region("test", 40.0, -74.0, 1.0)
    noisy = np.full((10, 10), -5.0)  # noise alone, every label below 0
    from dpcore.mechanisms.snh import query_sides, train_snh

    sides = query_sides(100.0, 200.0, 2)
    _, scales, _ = train_snh(noisy, region, sides, psi=1.0, hidden=8, depth=1, max_epochs=1, samples_per_epoch=256,
                             batch_size=64, device=None, clip_labels=True)
    _, raw_scales, _ = train_snh(noisy, region, sides, psi=1.0, hidden=8, depth=1, max_epochs=1,
                                 samples_per_epoch=256, batch_size=64, device=None)
    # the labels' scale is their mean |label|, at least ψ: ψ when they are all 0, |−5·cells| when not
    assert scales.tolist() == [1.0, 1.0] and min(raw_scales) > 1.0


@pytest.fixture(scope="module")
def cabs_like(tmp_path_factory):
    """A small record-level point table whose own bounding box is far smaller than the configured region."""
    region = Region("cfg", 37.76369, -122.43371, 3.0)
    x, y = _sparse_points(region, 4000, seed=4)
    lat, lon = region.unproject(x * 0.3, y * 0.3)  # the data covers ~30% of the region's side
    p = tmp_path_factory.mktemp("cabs") / "starts.parquet"
    pd.DataFrame({"user_id": np.arange(lat.size, dtype=np.int64), "timestamp": pd.Timestamp("2008-06-01", tz="UTC"),
                  "lat": lat, "lon": lon}).to_parquet(p)
    return p


FLAT = ["--param", "cell_width_m=60", "--param", "query_sides_m=[40,160]", "--param", "n_sizes=2",
        "--param", "hidden=8", "--param", "depth=1", "--param", "max_epochs=2", "--param", "samples_per_epoch=1024"]


def test_flat_snh_release_through_the_cli_uses_the_configured_region_and_one_charge(cabs_like, tmp_path):
    out = tmp_path / "rel"
    r = run_geodp("release", "run", cabs_like, "--center", "37.76369,-122.43371", "--side-km", "3",
                  "--privacy-unit", "record", "--epsilon", "0.05", "--mechanism", "snh", *FLAT, "--out", out, "--json")
    (rel,) = json.loads(r.stdout)["releases"]
    assert rel["region"] == {"name": rel["region"]["name"], "center_lat": 37.76369, "center_lon": -122.43371,
                             "side_km": 3.0}
    (version,) = out.glob("releases/*/*/all/v1")
    manifest = json.loads((version / "_MANIFEST.json").read_text())
    charges = manifest["privacy"]["charges"]
    # the cell width is public, so the one flat grid pays for everything: no paid n, no second level
    assert [c["name"] for c in charges] == ["cell_counts"] and charges[0]["epsilon"] == pytest.approx(0.05)
    synopsis = json.loads(next(version.rglob("synopsis.json")).read_text())
    # the grid covers the configured 3 km box (60 m cells → 50), not the data's own ~1 km box
    assert synopsis["extra"]["config"]["grid_size"] == 50
    boxes = tmp_path / "boxes.csv"
    lat, lon = np.meshgrid(np.linspace(37.75, 37.775, 8), np.linspace(-122.445, -122.42, 8))
    pd.DataFrame({"min_lat": lat.ravel(), "min_lon": lon.ravel(), "max_lat": lat.ravel() + 5e-4,
                  "max_lon": lon.ravel() + 6e-4}).to_csv(boxes, index=False)
    q = run_geodp("query", "range", rel["url"], "--boxes", boxes, "--json")
    assert min(row["estimate"] for row in json.loads(q.stdout)) >= 0.0


def test_a_refused_flat_snh_parameter_charges_nothing(cabs_like, tmp_path):
    out = tmp_path / "rel"
    r = run_geodp("release", "run", cabs_like, "--center", "37.76369,-122.43371", "--side-km", "3",
                  "--privacy-unit", "record", "--epsilon", "0.05", "--mechanism", "snh", *FLAT,
                  "--param", "clip_negative=maybe", "--out", out, ok=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert "clip_negative=" in line and "maybe" in line
    assert not any(out.rglob("*"))


def _spikes_fit(sampling: str) -> float:
    """Mean prediction at 10 squares of label 50 among 3,590 empty ones, after a short training."""
    import torch

    from dpcore.models.snh_net import BatchedSineSwishMLP, TrainConfig, predict_grouped, train_batched

    g = np.linspace(-1, 1, 60, dtype=np.float32)
    x = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    y = np.zeros(x.shape[0], dtype=np.float32)
    spikes = np.random.default_rng(0).choice(x.shape[0], 10, replace=False)
    y[spikes] = 50.0
    gen = torch.Generator().manual_seed(0)
    net = BatchedSineSwishMLP(1, 2, 32, 2, omega0=60.0, generator=gen)
    cfg = TrainConfig(lr=3e-3, batch_size=64, max_epochs=20, patience=20, samples_per_epoch=1024, sampling=sampling)
    train_batched(net, [x], [y], [np.ones_like(y)], cfg, torch.device("cpu"), gen)
    return float(predict_grouped(net, x[spikes], np.zeros(10, dtype=np.int64), torch.device("cpu")).mean())


def test_flat_grid_nets_are_trained_where_the_mass_is():
    """Bug: every training square was drawn equally often, so on a city's grid (CABS_SFS: 117 k squares,
    nearly all empty) a batch held a few squares with counts and the nets did not fit even noise-free labels
    (0.12 against the grid's 0.073, bench/fit_snh_noise_free.py). Batches drawn ∝ the noisy labels
    (post-processing) fit the rare dense squares; uniform batches, on the same budget, do not."""
    assert _spikes_fit("mass") > 35.0
    assert _spikes_fit("uniform") < 15.0
    region = Region("test", 40.0, -74.0, 2.0)
    x, y = _sparse_points(region, 3000, seed=1)
    syn = get_mechanism("snh", cell_width_m=50.0, query_sides_m=(50.0, 200.0), **TINY).fit(
        FitInput(x, y, region, "record", None), 0.5, NoiseSource.seeded(2))
    # the flat grid's nets: batches ∝ mass, and a sine frequency that follows the grid (40 cells a side)
    assert syn.config["training"]["sampling"] == "mass" and syn.config["omega0"] == 40.0
