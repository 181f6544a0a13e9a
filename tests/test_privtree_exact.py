"""PrivTree's split decisions follow the exact law of its biased Laplace test (no float Laplace, whose
53-bit uniforms never go beyond ~36λ and so give some tree shapes probability 0 on one input and more
on a neighbour). Frequencies match the paper's law, a node far above the threshold can still stop,
and a release's manifest says the splits are exact. Through the CLI for the release."""

import json
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpcore.geo import city_region
from dpcore.mechanisms.privtree import SplitLaw
from dpcore.privacy.noise import NoiseSource
from tests.cli_runner import run_geodp

LAM = 3.5


def _laplace_test(c: float, d: int, theta: float = 0.0) -> float:
    """P(max(c − dδ, θ − δ) + Lap(λ) > θ) with δ = λ·ln 4, the paper's split probability."""
    delta = LAM * math.log(4)
    b = max(c - d * delta, theta - delta) - theta
    return 1 - 0.5 * math.exp(-b / LAM) if b >= 0 else 0.5 * math.exp(b / LAM)


@pytest.mark.parametrize("c,d", [(0, 0), (0, 3), (3, 1), (5, 1), (9, 2), (12, 0), (30, 4), (2, 5)])
def test_split_frequencies_follow_the_laplace_test(c, d):
    law = SplitLaw(Fraction(LAM), Fraction(0))
    n = 200_000
    split = law.decide(np.full(n, float(c)), d, NoiseSource.seeded(c * 31 + d).random_words)
    p = _laplace_test(c, d)
    assert abs(split.mean() - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_a_node_far_above_the_threshold_still_stops_with_its_exact_probability():
    """c − θ = 200λ: the float sampler's noise is ≥ −37λ, so this node always split. The exact law
    stops it with probability ½e^-200: a uniform below that (leading zero words) stops it."""
    law = SplitLaw(Fraction(LAM), Fraction(0))
    tiny = iter([np.zeros(1, dtype=np.uint64)] * 5 + [np.ones(1, dtype=np.uint64)])

    def words(n):
        return next(tiny) if n == 1 else np.zeros(n, dtype=np.uint64)

    assert not law.decide(np.array([200 * LAM]), 0, words)[0]
    assert law.decide(np.array([200 * LAM]), 0, NoiseSource.seeded(1).random_words)[0]


def test_a_privtree_release_says_its_splits_are_exact(tmp_path):
    region = city_region("new-york")
    rng = np.random.default_rng(2)
    x, y = rng.normal(0, 0.05, (2, 400)) * region.side_m
    lat, lon = region.unproject(x, y)
    data = tmp_path / "checkins.parquet"
    pd.DataFrame({"user_id": np.arange(400) % 80, "timestamp": pd.Timestamp("2024-01-01T10:00Z"),
                  "lat": lat, "lon": lon}).to_parquet(data)
    summary = json.loads(run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--mechanism",
                                   "privtree", "--out", tmp_path / "out", "--json").stdout)
    manifest = json.loads(run_geodp("release", "show", summary["releases"][0]["url"], "--json").stdout)
    charges = {c["name"]: c for c in manifest["privacy"]["charges"]}
    assert "exact law" in charges["tree_splits"]["noise"]
    assert sum(c["epsilon"] for c in charges.values()) == pytest.approx(1.0)
