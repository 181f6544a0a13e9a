"""Each term of a 95% interval against its own realised error, per mechanism × band × unit (issue 43 item 1).

A release's answer to a box misses the truth by the sum of:
- noise: the noise-free answer on the release's own cells (each cell's true count, spread evenly over
  the part the box covers) less the released answer; its stated half-widths are the noise model's;
- spread: the truth (of the released sample) less that noise-free answer; stated: CellSpread.halfwidths;
- at user level also the bounding's bias, T − t_b/κ (T the full count, t_b the k-sample's, κ its true
  kept share; stated: z·ContributionProfile.cell_bias_sd) and the factor's error, (1/κ − f̂)·t_b (stated:
  the factor draws' quantiles times û).
Printed per term: the share of boxes whose realised error lies within its stated half-widths (the term's
own coverage; each should be near 0.95 where it dominates) and the median |error| / half-width; then the
whole interval's coverage. Same data and squares as bench/bench_coverage.py.

    nice -n 10 .venv/bin/python bench/decompose_coverage.py --units record [--dataset austin --seed 101]
    nice -n 10 .venv/bin/python bench/decompose_coverage.py --days 8     # one release per busy day instead
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_coverage as bc

from dpcore.queries.range import true_counts
from dpcore.synopsis.spread import leaf_squares


def cells_of(syn):
    """(x0, y0, side_x, side_y) of every cell or leaf whose count the release spreads."""
    xmin, ymin, xmax, ymax = syn.region.bounds_m
    leaves = leaf_squares(syn)
    if leaves is not None:
        x0, y0, w = leaves
        return x0, y0, w, w
    nx, ny = syn.values.shape
    i = np.arange(nx * ny)
    wx, wy = (xmax - xmin) / nx, (ymax - ymin) / ny
    return xmin + (i // ny) * wx, ymin + (i % ny) * wy, np.full(i.size, wx), np.full(i.size, wy)


def noise_free(syn, x, y, boxes):
    """The answer of the release's own cells holding their true counts of (x, y)."""
    x0, y0, wx, wy = cells_of(syn)
    model = syn.noise_model()
    if getattr(model, "leaf_at", lambda *_: None)(x[:1], y[:1]) is not None:
        # each point in the leaf the mechanism put it in (a venue on a leaf's edge is not split by rounding)
        c = np.bincount(model.leaf_at(x, y)[0], minlength=x0.size).astype(np.float64)
    else:
        c = true_counts(x, y, np.stack([x0, y0, x0 + wx, y0 + wy], axis=1)).astype(np.float64)
    if leaf_squares(syn) is not None and getattr(syn, "values", None) is not None:
        # the release answers from its raster of the leaves: the noise-free one is the same raster of the
        # true leaf counts (a leaf's edge inside a raster cell moves a little of its count across the edge:
        # that is the spread term's, not the noise's)
        from dpcore.grid.histogram import answer_boxes, prefix_sums
        from dpcore.mechanisms.ug import rasterise_rectangles
        raster = rasterise_rectangles(x0, y0, x0 + wx, y0 + wy, c, syn.region, syn.values.shape[0])
        return answer_boxes(prefix_sums(raster), syn.region.bounds_m, boxes)
    keep = c > 0
    x0, y0, wx, wy, c = x0[keep], y0[keep], wx[keep], wy[keep], c[keep]
    out = np.zeros(len(boxes))
    for s in range(0, len(boxes), 64):
        b = boxes[s:s + 64]
        ox = np.clip(np.minimum(b[:, 2:3], x0 + wx) - np.maximum(b[:, 0:1], x0), 0, None) / wx
        oy = np.clip(np.minimum(b[:, 3:4], y0 + wy) - np.maximum(b[:, 1:2], y0), 0, None) / wy
        out[s:s + 64] = (ox * oy) @ c
    return out


def within(err, below, above):
    return (err >= -below) & (err <= above)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mechanisms", default=",".join(bc.MECHANISMS))
    ap.add_argument("--units", default="record,user")
    ap.add_argument("--dataset", default="nyc")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--releases", type=int, default=2)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--days", type=int, default=0, help="instead of --releases whole-file releases: one release "
                                                        "of each of this many busy days (spread over them)")
    a = ap.parse_args()
    x_all, y_all, user_all, t_all, region = bc.load(a.dataset)
    if a.days:  # days at least as busy as the median, evenly spread over them
        day = t_all // 86400
        dd, n = np.unique(day, return_counts=True)
        busy = dd[n >= np.quantile(n, 0.5)]
        parts = [day == v for v in busy[np.linspace(0, busy.size - 1, a.days).astype(int)]]
    else:
        parts = [np.ones(x_all.size, bool)] * a.releases
    z = NormalDist().inv_cdf(0.975)
    print(f"{a.dataset}: per term, share within its stated half-widths (median |err|/half-width); then all")
    for unit in a.units.split(","):
        for name in a.mechanisms.split(","):
            acc: dict = {}
            for r, part in enumerate(parts):
                x, y, user = x_all[part], y_all[part], user_all[part]
                seed = a.seed + r
                syn = bc.release(name, bc.MECHANISMS[name], x, y, user, region, unit, a.k, 1.0, seed)
                if unit == "user":  # the k-sample the release was drawn from (bc.release's own draw)
                    from dpcore.privacy.bounding import bound_contributions
                    keep = bound_contributions(user, a.k, np.random.default_rng(seed)).keep
                    inner, f_hat = syn.inner, syn.factor
                    kappa = np.asarray(keep).size / x.size if np.asarray(keep).dtype != bool else keep.mean()
                else:
                    keep, inner, f_hat, kappa = np.ones(x.size, bool), syn, 1.0, 1.0
                rng = np.random.default_rng(1000 + r)
                for bi, band in enumerate(bc.BANDS):
                    boxes = bc.squares(x, y, band, a.queries, rng)
                    truth = true_counts(x, y, boxes).astype(float)
                    tb = true_counts(x[keep], y[keep], boxes).astype(float)
                    u = inner.answer(boxes)
                    nf = noise_free(inner, x[keep], y[keep], boxes)
                    niv = inner.noise_model().intervals(boxes, u, 0.95)
                    n_lo, n_hi = u - niv.lower, niv.upper - u
                    sm = inner.spread_model()
                    s_lo, s_hi = sm.halfwidths(boxes, 0.95, kept=1.0 / f_hat if unit == "user" else 1.0)
                    terms = {"noise": (f_hat * (nf - u), f_hat * n_lo, f_hat * n_hi),
                             "spread": (f_hat * (tb - nf), f_hat * s_lo, f_hat * s_hi)}
                    if unit == "user":
                        pm = syn.noise_model()
                        f_lo, f_hi = np.quantile(pm._factor, [0.025, 0.975])
                        f_hi = max(f_hi, float(np.quantile(pm._reach, 0.975)))  # the upper end's reach
                        pos = np.maximum(u, 0)
                        bias_lo = z * pm.BIAS_SHARE * pm.profile.cell_bias_sd(pm.k, u)
                        bias_hi = z * pm.BIAS_SHARE * pm.profile.cell_bias_sd(pm.k, niv.upper + s_hi)
                        terms["bias"] = (truth - tb / kappa, bias_lo, bias_hi)
                        terms["factor"] = ((1 / kappa - f_hat) * tb, (pm._median - f_lo) * pos,
                                           (f_hi - pm._median) * pos)
                    est, iv = syn.intervals(boxes)
                    terms["all"] = (truth - est, est - iv.lower, iv.upper - est)
                    for t, (err, lo, hi) in terms.items():
                        d = acc.setdefault((t, bi), {"in": [], "ratio": [], "err": [], "hw": []})
                        d["in"].append(within(err, lo, hi))
                        hw = np.where(err >= 0, hi, lo)
                        d["ratio"].append(np.abs(err) / np.maximum(hw, 1e-9))
                        d["err"].append(np.abs(err))
                        d["hw"].append(hw)
            for t in dict.fromkeys(k[0] for k in acc):
                cells = []
                for bi in range(3):
                    d = acc[(t, bi)]
                    cells.append(f"{np.mean(np.concatenate(d['in'])):.3f} ({np.median(np.concatenate(d['ratio'])):.2f};"
                                 f" err {np.median(np.concatenate(d['err'])):.1f} hw {np.median(np.concatenate(d['hw'])):.1f})")
                print(f"{name:9s} {unit:6s} {t:7s} " + " | ".join(cells), flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"# {ru.ru_utime + ru.ru_stime:.0f} CPU-s")


if __name__ == "__main__":
    main()
