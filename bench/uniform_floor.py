"""The no-noise floor of uniform grids on data-centred squares: what a uniform grid's error is with the
noise taken away (identity at ε = 10⁷, record level), i.e. the spread of counts within its cells alone.

Reporting only: it reads the held-out sets to say why no uniform grid, and no design measured, gets within
×0.8 of the hindsight grid on small squares (bench/README.md); nothing is tuned on it. Same squares as the
evaluation protocol (1000 per band, seed 0).

    nice -n 10 .venv/bin/python bench/uniform_floor.py ../shared/data/gowalla_nyc_checkins.tsv.gz new-york
    nice -n 10 .venv/bin/python bench/uniform_floor.py sf_cabs_starts.parquet san-francisco
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from dpcore.data.points import load_points  # noqa: E402
from dpcore.evaluation.metrics import psi_for, relative_error  # noqa: E402
from dpcore.evaluation.range import make_fit_input, protocol_workloads, region_data  # noqa: E402
from dpcore.geo import city_region  # noqa: E402
from dpcore.mechanisms import get_mechanism  # noqa: E402
from dpcore.privacy.noise import NoiseSource  # noqa: E402

BANDS = ((25.0, 100.0), (100.0, 1000.0))
SIZES = (128, 256, 512, 1024, 2048)
NO_NOISE_EPSILON = 1e7


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("city")
    ap.add_argument("--queries", type=int, default=1000)
    args = ap.parse_args(argv)
    data = region_data(load_points(args.data).points, city_region(args.city))
    psi = psi_for(data.n_points)
    workloads = protocol_workloads(data, BANDS, args.queries, 0)
    fit_input = make_fit_input(data, "record", 1, np.random.default_rng(0))
    for m in SIZES:
        syn = get_mechanism("identity", grid_size=m).fit(fit_input, NO_NOISE_EPSILON, NoiseSource.seeded(0))
        errs = [f"{a:g}-{b:g} m: {relative_error(syn.answer(boxes), truth, psi).mean():.4f}"
                for (a, b), boxes, truth in workloads]
        print(f"{args.city} m = {m} ({data.region.side_m / m:.0f} m cells), no noise: " + ", ".join(errs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
