"""Can geodp's SNH nets fit their labels? One net, the SNH authors' smallest query size, their exact protocol
(issue 44 item 1).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/fit_snh_noise_free.py --sampling uniform --omega0 40
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/fit_snh_noise_free.py --sampling mass --omega0 300
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/fit_snh_noise_free.py --labels noisy --sampling mass

The grid, noise, labels and 10,000 test squares are the authors' (github szeighami/SNH, conf 0; see
bench_snh_authors.py ``authors_protocol``): CABS_SFS scaled to [-5, 5], a 343² grid of ρ = 0.0293, one
training square of side 0.02375 per cell, label = the cell × (0.02375/0.0293)² clipped at 0 — noise-free
(``--labels exact``, not DP: it asks whether a net can represent the labels at all) or with their Laplace
noise at ε 0.05 (``--labels noisy``). The net is geodp's (dpcore.models.snh_net: sine first layer, swish
after, trained by ``train_batched``); the knobs are the ones this bench found to matter: which squares a
batch holds (``--sampling``), the sine layer's frequency (``--omega0``, inputs on [-1, 1]) and the loss.
Prints the per-square relative error on the test squares (each answer scaled to its own square, as geodp's
benches score; the authors' logged metric beside it) every ``--every`` epochs, and CPU-seconds. Nothing here
asserts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_snh import CABS_FILE, SHARED
from bench_snh_authors import MAX_VAL, authors_protocol, cpu_s, scorers, training_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help=f"default ../shared/data/{CABS_FILE}")
    ap.add_argument("--labels", choices=["exact", "noisy"], default="exact")
    ap.add_argument("--sampling", choices=["uniform", "mass"], default="mass")
    ap.add_argument("--omega0", type=float, default=300.0, help="sine frequency on [-1, 1] (343 cells a side)")
    ap.add_argument("--loss", choices=["l1", "mse"], default="l1",
                    help="l1: |error|/max(y, ψ) (relative_l1); mse: the paper's squared error / max(y, ψ)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--epochs", type=int, default=40, help="epochs of --per-epoch samples")
    ap.add_argument("--per-epoch", type=int, default=131072)
    ap.add_argument("--every", type=int, default=5)
    args = ap.parse_args()

    import torch

    from dpcore.models.snh_net import BatchedSineSwishMLP, TrainConfig, train_batched

    p = authors_protocol(Path(args.data or SHARED / CABS_FILE))
    theirs, own, _ = scorers(p)
    x, labels = training_set(p, args.labels)
    x = x.astype(np.float32)
    psi = p["psi"]
    scale = max(float(labels.mean()), psi)  # as dpcore.mechanisms.snh.training: labels of order 1
    w = (scale if args.loss == "l1" else scale * scale) / np.maximum(labels, psi)
    test = torch.tensor(p["loc"] / (MAX_VAL / 2), dtype=torch.float32)
    net = BatchedSineSwishMLP(1, 2, args.hidden, args.depth, args.omega0, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(lr=args.lr, batch_size=args.batch, max_epochs=args.epochs, patience=args.epochs + 1,
                      samples_per_epoch=args.per_epoch, cpu_threads=1, loss=args.loss, sampling=args.sampling)
    print(f"one net {args.depth} × {args.hidden}, ω₀ {args.omega0:g}, {args.sampling} batches of {args.batch}, "
          f"loss {args.loss}, lr {args.lr:g}, {args.labels} labels, {x.shape[0]:,} squares; per-square / their "
          "metric on the smallest model's 10,000 test squares", flush=True)
    c0 = cpu_s()

    def report(epoch: int, loss: float) -> None:
        if epoch % args.every and epoch != args.epochs:
            return
        with torch.no_grad():
            pred = np.maximum(net.forward_one(0, test).double().numpy() * scale, 0)
        net.train()
        print(f"epoch {epoch:3d}  CPU {cpu_s() - c0:6.1f} s  loss {loss:.4f}  per-square {own(pred):.4f}  "
              f"theirs {theirs(pred):.4f}", flush=True)

    train_batched(net, [x], [(labels / scale).astype(np.float32)], [(w / w.mean()).astype(np.float32)], cfg,
                  torch.device("cpu"), torch.Generator().manual_seed(1), progress=report)
    print(f"CPU {cpu_s():.1f} s in all")


if __name__ == "__main__":
    main()
