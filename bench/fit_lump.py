"""The spread term of a user-level release against its own error, with a cut cell's k-bounded count as
lumps of at most L·k in one place (bench/spread_variants.lump_spread; None: the whole count at one
place, today's). A cell of y bounded points holds at least y/k people, each adding at most k: if people
sat at different places, the spread of a small square inside a coarse cell would be ~√(k/y) of the
one-place bound. Error: the k-sample's true count less the noise-free answer of the release's own cells
(bench/decompose_coverage.py's split), scaled by the factor; share of squares inside the stated
half-widths per band, 2 releases × 200 squares.

    nice -n 10 .venv/bin/python bench/fit_lump.py
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_coverage as bc
import decompose_coverage as dc
from spread_variants import lump_spread

from dpcore.privacy.bounding import bound_contributions
from dpcore.queries.range import true_counts

LUMPS = (1.0, 5.0, 20.0, 50.0, None)


def main() -> None:
    print("| data | mechanism | " + " | ".join(f"L {'none' if v is None else f'{v:g}'}" for v in LUMPS) + " |")
    print("|---|---|" + "---|" * len(LUMPS))
    for d, seed in (("austin", 101), ("san-francisco", 101), ("nyc", 11)):
        x, y, user, _, region = bc.load(d)
        for name in ("identity", "ug", "ag"):
            hits = {(v, b): [] for v in LUMPS for b in range(3)}
            for r in range(2):
                syn = bc.release(name, bc.MECHANISMS[name], x, y, user, region, "user", 20, 1.0, seed + r)
                keep = bound_contributions(user, 20, np.random.default_rng(seed + r)).keep
                rng = np.random.default_rng(1000 + r)
                for bi, band in enumerate(bc.BANDS):
                    boxes = bc.squares(x, y, band, 200, rng)
                    err = (true_counts(x[keep], y[keep], boxes)
                           - dc.noise_free(syn.inner, x[keep], y[keep], boxes)) * syn.factor
                    for v in LUMPS:
                        lo, hi = lump_spread(syn.inner, v).halfwidths(boxes, 0.95, kept=1.0 / syn.factor)
                        hits[v, bi].append((err >= -syn.factor * lo) & (err <= syn.factor * hi))
            print(f"| {d} | {name} | " + " | ".join(
                "/".join(f"{np.mean(hits[v, b]):.2f}" for b in range(3)) for v in LUMPS) + " |", flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\n<!-- {ru.ru_utime + ru.ru_stime:.0f} CPU-seconds -->")


if __name__ == "__main__":
    main()
