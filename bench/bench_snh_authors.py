"""SNH against its authors' own CABS_SFS figure: what their 0.065 measures, how geodp's nets learn, and what the
nets' labels can give at best (issue 44 item 1).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_snh_authors.py metric
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_snh_authors.py nets --depth 8 --cpu-s 150
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_snh_authors.py interpolate

``metric`` re-derives the test protocol of the authors' public code (github szeighami/SNH: `utils.py`
get_train_test, `fit_base_JAX.py`, `tests/test_sf_cabs/0/conf.json`) in numpy: each axis of
../shared/data/cabs_sfs_trip_starts.npy scaled to [-5, 5], a 343² grid of ρ = 0.0293 with their Laplace noise
(numpy seed 0, which reproduces the noisy cells their sample out.txt prints), 10,000 test squares centred on data
points with sides uniform in [0.02, 0.0275], ψ = 0.1% of n. Their 'rel. error' multiplies every prediction by
(r₀/0.02375)², r₀ the FIRST test square's side (a (n, 1) × (n,) broadcast in calc_metrics, of which val[0] is
logged), so it scores answers for one size against truths of another; this prints grid answers under that metric
and under the per-square one (each answer at its own square's size, as geodp's benches score).
``nets`` trains ONE of geodp's SNH nets (dpcore.models.snh_net, the authors' smallest query size) on the
authors' exact labels (their noisy cells, clipped, ×(0.02375/0.0293)²) and prints its learning curve in
CPU-seconds under both metrics. ``interpolate`` answers geodp's CABS bench squares (`bench_snh.py cabs`) from
SNH's augmentation labels interpolated by a spline (linear or cubic) instead of a net: the answers a net that
fitted its labels exactly and interpolated smoothly would give. Prints numbers; nothing here asserts.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_snh import CABS_BANDS_FRACTION, CABS_FILE, SHARED

from dpcore.grid.histogram import answer_boxes, grid_counts, prefix_sums
from dpcore.queries.range import square_workload, true_counts

MAX_VAL, RHO, AUG, UTIL, EPS = 10.0, 0.0293, 0.02375, 0.0075, 0.05  # their conf.json, smallest model


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def authors_protocol(path: Path) -> dict:
    """The authors' grid, noise, labels and test squares, in their normalised coordinates."""
    raw = np.load(path)
    lo, hi = raw.min(axis=0), raw.max(axis=0)
    db = ((raw - lo) / (hi - lo) - 0.5) * MAX_VAL
    t = np.arange(-MAX_VAL / 2 - AUG, MAX_VAL / 2 + AUG, RHO)  # cell i spans [t_i, t_i + ρ)
    edges = np.append(t, t[-1] + RHO)
    exact, _, _ = np.histogram2d(db[:, 0], db[:, 1], bins=[edges, edges])
    rs = np.random.RandomState(0)  # their np.random.seed(random_seed = 0): the same stream, draws in their order
    noisy = exact + rs.laplace(0, 1 / EPS, exact.shape)
    side = rs.rand(10000, 1)[:, 0] * UTIL + (AUG - UTIL / 2)
    loc = db.copy()
    rs.shuffle(loc)
    loc = loc[:10000]
    boxes = np.stack([loc[:, 0] - side / 2, loc[:, 1] - side / 2, loc[:, 0] + side / 2, loc[:, 1] + side / 2], 1)
    return {"db": db, "t": t, "exact": exact, "noisy": noisy, "side": side, "loc": loc, "boxes": boxes,
            "truth": true_counts(db[:, 0], db[:, 1], boxes).astype(np.float64), "psi": 0.001 * raw.shape[0],
            "bounds": (edges[0], edges[0], edges[-1], edges[-1])}


def training_set(p: dict, labels: str) -> tuple[np.ndarray, np.ndarray]:
    """The smallest model's training squares: centres on [-1, 1]² (one per cell, as their total_in_cell) and
    labels, the ``labels`` ("noisy" or "exact") cell × (AUG/ρ)² clipped at 0."""
    k = int((MAX_VAL + AUG) / RHO)
    grid = p["noisy"] if labels == "noisy" else p["exact"]
    centres = p["t"][:k] + AUG / 2
    x = np.stack(np.meshgrid(centres, centres, indexing="ij"), -1).reshape(-1, 2) / (MAX_VAL / 2)
    return x, np.maximum(grid[:k, :k] * (AUG / RHO) ** 2, 0).ravel()


def scorers(p: dict):
    """(their metric, per-square metric) of answers for the model size AUG at each test centre."""
    truth, psi = p["truth"], p["psi"]
    s0 = (p["side"][0] / AUG) ** 2

    def rel(a: np.ndarray) -> float:
        return float(np.mean(np.abs(a - truth) / np.maximum(truth, psi)))

    return (lambda a: rel(a * s0)), (lambda a: rel(a * (p["side"] / AUG) ** 2)), rel


def cmd_metric(args: argparse.Namespace) -> None:
    from scipy.ndimage import map_coordinates

    p = authors_protocol(Path(args.data or SHARED / CABS_FILE))
    theirs, own, rel = scorers(p)
    print(f"{p['exact'].shape[0]}² cells; noisy[0:2, 0:2] = {np.round(p['noisy'][:2, :2], 4).tolist()} (their out.txt: "
          f"[[2.0545, 11.2557], [-48.332, 18.3054]]); r₀ = {p['side'][0]:.5f}, every prediction ×"
          f"{(p['side'][0] / AUG) ** 2:.3f}; answer 0: {rel(np.zeros_like(p['truth'])):.4f}")
    print("| grid | answer | their metric | per-square metric |\n|---|---|---|---|")
    loc, at_aug = p["loc"], None
    aug_boxes = np.concatenate([loc - AUG / 2, loc + AUG / 2], axis=1)
    for name in ("exact", "noisy"):
        g = p[name]
        at_aug = np.maximum(answer_boxes(prefix_sums(g), p["bounds"], aug_boxes), 0)
        print(f"| {name} | uniformity, answers < 0 → 0 | {theirs(at_aug):.4f} | {own(at_aug):.4f} |")
        labels = np.maximum(g * (AUG / RHO) ** 2, 0)  # the smallest model's training labels
        fi = (loc - (p["t"][0] + AUG / 2)) / RHO       # at the training squares' centres t_i + AUG/2
        for order, what in ((0, "nearest"), (1, "linear"), (3, "cubic")):
            f = np.maximum(map_coordinates(labels, [fi[:, 0], fi[:, 1]], order=order, mode="nearest"), 0)
            print(f"| {name} | the clipped labels, {what} interpolation | {theirs(f):.4f} | {own(f):.4f} |")
    print(f"CPU {cpu_s():.1f} s")


def cmd_nets(args: argparse.Namespace) -> None:
    import torch

    from dpcore.models.snh_net import BatchedSineSwishMLP

    torch.set_num_threads(1)
    p = authors_protocol(Path(args.data or SHARED / CABS_FILE))
    theirs, own, _ = scorers(p)
    x, labels = training_set(p, args.labels)
    psi = p["psi"]
    scale = max(float(labels.mean()), psi)  # as dpcore.mechanisms.snh.training: labels of order 1
    w = scale * scale / np.maximum(labels, psi)  # the authors' weighted squared error, w = 1/max(y, ψ)
    xs = torch.tensor(x, dtype=torch.float32)[None]
    ys = torch.tensor(labels / scale, dtype=torch.float32)[None]
    ws = torch.tensor(w / w.mean(), dtype=torch.float32)[None]
    test = torch.tensor(p["loc"] / (MAX_VAL / 2), dtype=torch.float32)[None]
    net = BatchedSineSwishMLP(1, 2, args.width, args.depth, args.omega0, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1)
    n = x.shape[0]
    batch = min(args.batch, n)
    print(f"one net, depth {args.depth} × {args.width}, ω₀ {args.omega0:g}, batch {batch} of {n} squares, "
          f"lr {args.lr:g}, {args.labels} labels; their metric / per-square metric at CPU-seconds", flush=True)
    c0, step, pos, perm = cpu_s(), 0, n, None
    while True:
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos:pos + batch]
        pos += batch
        resid = net(xs[:, idx]) - ys[:, idx]
        loss = (ws[:, idx] * resid * resid).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        done = cpu_s() - c0 > args.cpu_s
        if step % args.every == 0 or done:
            with torch.no_grad():
                pred = np.maximum(net(test)[0].double().numpy() * scale, 0)
            print(f"step {step:6d}  CPU {cpu_s() - c0:6.1f} s  loss {loss.item():.5f}  their {theirs(pred):.4f}  "
                  f"per-square {own(pred):.4f}", flush=True)
        if done:
            break


def cmd_interpolate(args: argparse.Namespace) -> None:
    import pandas as pd
    from scipy.ndimage import map_coordinates

    from dpcore.data.points import load_points
    from dpcore.evaluation.metrics import psi_for, relative_error
    from dpcore.evaluation.range import region_data
    from dpcore.geo import resolve_region
    from dpcore.mechanisms.snh.augmentation import augment, query_sides, sample_corners
    from dpcore.privacy.noise import NoiseSource

    latlon = np.load(args.data or SHARED / CABS_FILE)
    region = resolve_region(center="37.76369,-122.43371", side_km=13.0)
    table = Path(args.tmp) / "bench_snh_authors_cabs.parquet"
    pd.DataFrame({"user_id": np.arange(latlon.shape[0]), "timestamp": pd.Timestamp("2008-06-01", tz="UTC"),
                  "lat": latlon[:, 0], "lon": latlon[:, 1]}).to_parquet(table)
    data = region_data(load_points(table).points, region)
    psi = psi_for(data.n_points)
    rng = np.random.default_rng([0, 0xCAB5])  # the squares of `bench_snh.py cabs`
    bands = []
    for lo, hi in CABS_BANDS_FRACTION:
        b = square_workload(region, args.queries, lo * region.side_m, hi * region.side_m, rng, (data.x, data.y))
        bands.append((b, true_counts(data.x, data.y, b)))

    def spline(noisy: np.ndarray, boxes: np.ndarray, sides: np.ndarray, order: int) -> np.ndarray:
        r = np.sqrt((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
        which = np.abs(r[:, None] - sides[None, :]).argmin(axis=1)
        out, cw = np.zeros(len(boxes)), region.side_m / noisy.shape[0]
        for i, s in enumerate(sides):
            sel = which == i
            if sel.any():
                _, lab = augment(noisy, region, float(s))
                xs, ys = sample_corners(noisy.shape, region, float(s))
                labels = np.maximum(lab, 0).reshape(xs.size, ys.size)  # the flat grid's clipped labels
                fx = ((boxes[sel, 0] + boxes[sel, 2]) / 2 - s / 2 - xs[0]) / cw
                fy = ((boxes[sel, 1] + boxes[sel, 3]) / 2 - s / 2 - ys[0]) / cw
                f = map_coordinates(labels, [fx, fy], order=order, mode="nearest")
                out[sel] = np.maximum(f, 0) * r[sel] ** 2 / s ** 2
        return out

    sides = query_sides(26.0, 104.0, 8)
    print(f"{data.n_points:,} points, ψ {psi:.1f}, {args.queries} squares per band (26–36 m, 26–104 m); one noise "
          "draw (seed 1000); the nets' 8 query sides over 26–104 m\n")
    print("| ε | cells | grid, answers < 0 → 0 | labels, linear | labels, cubic |\n|---|---|---|---|---|")
    for eps in (float(e) for e in args.epsilons.split(",")):
        for m in (int(v) for v in args.grids.split(",")):
            noisy = NoiseSource.seeded(1000).add_discrete_laplace(
                grid_counts(data.x, data.y, region.bounds_m, m, m), 1.0, eps).astype(np.float64)
            prefix = prefix_sums(noisy)
            cells = [" / ".join(f"{relative_error(np.maximum(answer_boxes(prefix, region.bounds_m, b), 0), t, psi).mean():.4f}"
                                for b, t in bands)]
            for order in (1, 3):
                cells.append(" / ".join(f"{relative_error(spline(noisy, b, sides, order), t, psi).mean():.4f}"
                                        for b, t in bands))
            print(f"| {eps:g} | {m}² ({region.side_m / m:.0f} m) | " + " | ".join(cells) + " |", flush=True)
    print(f"\nCPU {cpu_s():.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help=f"CABS_SFS trip starts (.npy lat, lon); default ../shared/data/{CABS_FILE}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("metric").set_defaults(func=cmd_metric)
    n = sub.add_parser("nets")
    n.add_argument("--depth", type=int, default=8)
    n.add_argument("--width", type=int, default=80)
    n.add_argument("--omega0", type=float, default=17.3,
                   help="sine frequency on [-1, 1]; 17.3 is the authors' first layer (He-uniform on [-5, 5])")
    n.add_argument("--batch", type=int, default=2048, help="samples per Adam step (≥ 116,964: full batch, theirs)")
    n.add_argument("--lr", type=float, default=1e-3)
    n.add_argument("--labels", choices=["noisy", "exact"], default="noisy")
    n.add_argument("--cpu-s", type=float, default=150.0)
    n.add_argument("--every", type=int, default=1000)
    n.set_defaults(func=cmd_nets)
    i = sub.add_parser("interpolate")
    i.add_argument("--epsilons", default="0.05,0.2,0.8")
    i.add_argument("--grids", default="256,367,512")
    i.add_argument("--queries", type=int, default=4000)
    i.add_argument("--tmp", default="/tmp")
    i.set_defaults(func=cmd_interpolate)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
