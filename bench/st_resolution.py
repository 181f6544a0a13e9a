"""Signal per cell against noise for user-level spatio-temporal grids, on public data only.

For each public preset of bench_vdr.py (never the held-out Gowalla NYC or SF cabs), bounds every user to
k points over the window and prints, per ε and grid (cells per side × slots): points per cell, the
noise std per cell (discrete Laplace of scale k/ε_cells, ε_cells = 95% of ε), the share of the sample
in cells above 2σ, and the noise std summed over the whole grid against the sample size; then the
resolution rule's choice (dpcore.mechanisms.st_resolution) for the exact n (the release pays for a
noisy one). Example:

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/st_resolution.py gowalla-austin gowalla-sf synthetic
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_vdr
import numpy as np

from dpcore.data.points import clip_to_region
from dpcore.geo import city_region, parse_slot, time_slots
from dpcore.grid.histogram import grid_counts_3d
from dpcore.mechanisms.st_resolution import st_resolution
from dpcore.privacy.bounding import bound_contributions
from dpcore.privacy.noise import discrete_laplace_variance

HELD_OUT = ("gowalla-nyc", "sf-cabs")


def main(names: list[str]) -> int:
    for name in names:
        if name in HELD_OUT:
            print(f"{name} is a held-out evaluation set: not measured here", file=sys.stderr)
            return 2
        preset = bench_vdr.PRESETS[name]
        region = city_region(preset["city"])
        start, end = (bench_vdr._ts(t) for t in preset["window"])
        slot_s = parse_slot(preset.get("slot", "1d"))
        t = -(-(end - start) // slot_s)
        pts = bench_vdr.load_preset_points(preset).between(start, end)
        idx, x, y = clip_to_region(pts, region)
        slot = time_slots(pts.ts[idx], start, slot_s, t)
        ok = slot >= 0
        x, y, slot, user = x[ok], y[ok], slot[ok], pts.user[idx][ok]
        k = preset["k"]
        keep = bound_contributions(user, k, np.random.default_rng(0)).keep
        n = keep.size
        print(f"\n### {name}: {x.size:,} points, {np.unique(user).size:,} users, n = {n:,} after bounding to k = {k}, "
              f"T = {t}\n")
        print("| ε | cells² × slots | points/cell | noise std/cell | share in cells > 2σ | grid noise std / n |")
        print("|---|---|---|---|---|---|")
        for eps in (0.5, 1.0):
            sd = float(np.sqrt(discrete_laplace_variance(k / (0.95 * eps))))
            for m in (256, 64, 32, 16, 8):
                for tc in (t, 1):
                    h = grid_counts_3d(x[keep], y[keep], slot[keep] * tc // t, region.bounds_m, m, m, tc)
                    share = float(h[h > 2 * sd].sum()) / n
                    print(f"| {eps:g} | {m}² × {tc} | {n / h.size:.3g} | {sd:.0f} | {share:.2f} | "
                          f"{sd * np.sqrt(h.size) / n:.2f} |")
            res = st_resolution(n, 0.95 * eps, k, t)
            print(f"| {eps:g} | rule: {res.cells}² × {res.coarse_slots} | | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["gowalla-austin", "gowalla-sf", "synthetic"]))
