"""Speed of the core steps. Prints wall and CPU seconds and throughput; CPU time is the figure to
compare when the machine is shared (wall time then includes other processes' load).

    .venv/bin/python bench/bench_speed.py [--sf-cabs ../shared/data/sf_cabs.parquet]

Targets: bounding ≥ 5 M points/s, discrete Laplace ≥ 10 M cells/s, range answering
≥ 1 M queries/s; plus the end-to-end release time of the SF cabs region (≈10 M points).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


class Timer:
    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c


def line(name: str, n: float, unit: str, t: Timer, target: float | None = None) -> None:
    rate_cpu = n / max(t.cpu, 1e-9) / 1e6
    rate_wall = n / max(t.wall, 1e-9) / 1e6
    verdict = "" if target is None else ("  OK" if rate_cpu >= target else f"  BELOW target {target:g} M/s")
    print(f"{name:<34} {n / 1e6:>7.2f} M {unit:<8} wall {t.wall:7.3f}s ({rate_wall:6.1f} M/s)  "
          f"cpu {t.cpu:7.3f}s ({rate_cpu:6.1f} M/s){verdict}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf-cabs", default=str(Path(__file__).resolve().parents[2] / "shared/data/sf_cabs.parquet"))
    args = ap.parse_args()

    from dpcore.geo import city_region
    from dpcore.grid.histogram import grid_counts
    from dpcore.mechanisms import FitInput, get_mechanism
    from dpcore.privacy.bounding import bound_contributions
    from dpcore.privacy.noise import NoiseSource
    from dpcore.queries.range import square_workload

    rng = np.random.default_rng(0)
    n = 10_000_000
    users = (rng.pareto(1.2, n) * 10).astype(np.int64) % 300_000
    with Timer() as t:
        bound_contributions(users, 20, rng)
    line("bound k=20, 300k power-law users", n, "points", t, 5)
    cab_users = rng.integers(0, 537, n)
    with Timer() as t:
        bound_contributions(cab_users, 50, rng)
    line("bound k=50, 537 heavy users", n, "points", t, 5)

    for ns in (NoiseSource.secure(), NoiseSource.seeded(1)):
        with Timer() as t:
            ns.discrete_laplace(20.0, n)
        line(f"discrete Laplace ({ns.description.split(':')[0]})", n, "cells", t, 10)

    region = city_region("san-francisco")
    x = rng.normal(0, 3000, n)
    y = rng.normal(0, 3000, n)
    with Timer() as t:
        grid_counts(x, y, region.bounds_m, 1000, 1000)
    line("grid build 1000x1000", n, "points", t)

    syn = get_mechanism("identity", cell_width_m=20.0).fit(
        FitInput(x[:100_000], y[:100_000], region, "record", None), 1.0, NoiseSource.seeded(0))
    boxes = square_workload(region, 1_000_000, 25, 5000, rng)
    with Timer() as t:
        syn.answer(boxes)
    line("range answering (1000² grid)", 1_000_000, "queries", t, 1)

    path = Path(args.sf_cabs)
    if not path.exists():
        print(f"(skipping end-to-end SF cabs release: {path} is missing)")
        return
    from dpcore.data.points import load_points
    from dpcore.evaluation.range import make_fit_input, region_data

    with Timer() as t_all:
        with Timer() as t:
            loaded = load_points(path)
        line("load + validate SF cabs", len(loaded.points), "points", t)
        with Timer() as t:
            data = region_data(loaded.points, region)
        line("project + clip to SF box", len(loaded.points), "points", t)
        ns = NoiseSource.secure()
        with Timer() as t:
            fit_input = make_fit_input(data, "user", 1000, ns.rng)
        line("bound k=1000 (user-level)", data.n_points, "points", t)
        with Timer() as t:
            syn = get_mechanism("identity", cell_width_m=50.0).fit(fit_input, 1.0, ns)
        line("identity fit 400x400", fit_input.n, "points", t)
        with Timer() as t, tempfile.TemporaryDirectory() as d:
            syn.save(d)
        line("save synopsis", 400 * 400, "cells", t)
    print(f"end-to-end SF cabs release ({data.n_points:,} points in the box): wall {t_all.wall:.1f}s, "
          f"cpu {t_all.cpu:.1f}s")


if __name__ == "__main__":
    main()
