"""Torch modules for Spatial Neural Histograms (SNH): k_s small MLPs trained as one batched model.

SNH (Zeighami et al., VLDB 2022) trains one network per query size. Training them one after the
other costs k_s times the Python/kernel overhead; here the k_s networks' weights are stacked into
(k_s, d_in, d_out) tensors and every layer is one ``torch.baddbmm``, so a step trains all of them.

Architecture (paper): first activation sine, swish (SiLU) after, linear output. The sine layer
is SIREN-style, ``sin(ω₀ · (W x + b))``, which lets a small net represent a spatially varying count
surface; the inputs are query centres normalised to [-1, 1].

Everything here is post-processing of a noisy grid: it never sees private data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when present, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class BatchedSineSwishMLP(nn.Module):
    """``n_models`` independent MLPs R^in_dim → R evaluated together.

    ``forward(x)`` takes (n_models, batch, in_dim) and returns (n_models, batch).
    ``forward_one(i, x)`` evaluates model i alone on (batch, in_dim) (used when answering).
    """

    def __init__(self, n_models: int, in_dim: int = 2, hidden: int = 64, depth: int = 3,
                 omega0: float = 8.0, generator: torch.Generator | None = None):
        super().__init__()
        if n_models < 1 or hidden < 1 or depth < 1:
            raise ValueError("n_models, hidden and depth must be ≥ 1")
        self.n_models, self.in_dim, self.hidden, self.depth, self.omega0 = n_models, in_dim, hidden, depth, omega0
        dims = [in_dim] + [hidden] * depth + [1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for layer, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            # SIREN init for the sine layer (uniform ±1/d_in, scaled by ω₀ in forward). The swish layers
            # and the output take He-uniform weights (variance 2/d_in) and zero biases, as the authors'
            # VarianceScaling(2.0): with PyTorch's default bound 1/sqrt(d_in) the signal shrinks ~10× per
            # layer, and a net of their 20 layers stops learning after 100 epochs at 0.153 on CABS_SFS
            # (bench/results/2026-11-28-snh-gpu.md) where He-uniform keeps it learning.
            bound = 1.0 / d_in if layer == 0 else math.sqrt(6.0 / d_in)
            w = (torch.rand(n_models, d_in, d_out, generator=generator) * 2 - 1) * bound
            b = ((torch.rand(n_models, 1, d_out, generator=generator) * 2 - 1) * (1.0 / math.sqrt(d_in)) if layer == 0
                 else torch.zeros(n_models, 1, d_out))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weights, self.biases
        h = torch.sin(self.omega0 * torch.baddbmm(b[0], x, w[0]))
        for layer in range(1, len(w) - 1):
            h = nn.functional.silu(torch.baddbmm(b[layer], h, w[layer]))
        return torch.baddbmm(b[-1], h, w[-1]).squeeze(-1)

    def forward_one(self, i: int, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weights, self.biases
        h = torch.sin(self.omega0 * torch.addmm(b[0][i], x, w[0][i]))
        for layer in range(1, len(w) - 1):
            h = nn.functional.silu(torch.addmm(b[layer][i], h, w[layer][i]))
        return torch.addmm(b[-1][i], h, w[-1][i]).squeeze(-1)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Weights as float32 numpy arrays (saved with np.savez: no pickle in a release)."""
        out = {}
        for layer, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            out[f"w{layer}"] = w.detach().cpu().numpy().astype(np.float32)
            out[f"b{layer}"] = b.detach().cpu().numpy().astype(np.float32)
        return out

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for layer, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                w.copy_(torch.from_numpy(np.asarray(arrays[f"w{layer}"], dtype=np.float32)))
                b.copy_(torch.from_numpy(np.asarray(arrays[f"b{layer}"], dtype=np.float32)))


@dataclass
class TrainConfig:
    lr: float = 1e-3
    batch_size: int = 1024
    max_epochs: int = 40
    #: Early stopping on the *training* loss: stop after ``patience`` epochs without a relative
    #: improvement of at least ``min_rel_improvement`` (never on test error: that would need truth).
    patience: int = 4
    min_rel_improvement: float = 0.01
    #: Samples drawn per model per "epoch" (cycling through shuffled copies of small training sets):
    #: a fixed amount of work per epoch whatever the grid size, so coarse grids still get enough steps.
    samples_per_epoch: int = 32768
    #: Intra-op CPU threads while training (restored afterwards). The nets' matmuls are small, so a
    #: second thread gains little, and on a busy machine OpenMP threads that wait for each other made
    #: epochs ~6x slower (bench/README.md); 1 is the robust default. Ignored on CUDA.
    cpu_threads: int = 1
    #: ``"mse"``: weighted squared error (the SNH paper); ``"l1"``: weighted absolute error, which with
    #: weights 1/max(y, ψ) is the relative error the releases are judged by (and, with Laplace label
    #: noise, the likelihood's own loss).
    loss: str = "mse"
    #: ``"uniform"``: every sample equally often. ``"mass"``: samples drawn with probability ∝ their
    #: (normalised, clipped) label plus ``mass_floor`` of the mean, so the nets see the squares where the
    #: counts are — where queries centred on data fall — as the paper's public-workload weights make its nets
    #: do. On CABS_SFS's 117 k squares, nearly all empty, uniform batches hold a few non-empty squares and
    #: the nets never fit even noise-free labels (bench/fit_snh_noise_free.py).
    sampling: str = "uniform"
    mass_floor: float = 0.1


@dataclass
class TrainResult:
    epochs: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    stopped_early: bool = False


def train_batched(model: BatchedSineSwishMLP, inputs: list[np.ndarray], targets: list[np.ndarray],
                  weights: list[np.ndarray], config: TrainConfig, device: torch.device,
                  generator: torch.Generator,
                  progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train model i on (inputs[i], targets[i]) with per-sample loss weights[i], all models at once.

    Each epoch draws ``min(samples_per_epoch, n_i)`` samples per model (a permutation when the set
    is smaller, uniform with replacement otherwise), so models with different sample counts train in
    lockstep on equal-shaped (n_models, batch, in_dim) tensors.
    """
    k = model.n_models
    if not (len(inputs) == len(targets) == len(weights) == k):
        raise ValueError("need one input/target/weight array per model")
    if device.type != "cpu" or not config.cpu_threads:
        return _train(model, inputs, targets, weights, config, device, generator, progress)
    previous = torch.get_num_threads()
    torch.set_num_threads(int(config.cpu_threads))
    try:
        return _train(model, inputs, targets, weights, config, device, generator, progress)
    finally:
        torch.set_num_threads(previous)


def _train(model: BatchedSineSwishMLP, inputs: list[np.ndarray], targets: list[np.ndarray],
           weights: list[np.ndarray], config: TrainConfig, device: torch.device, generator: torch.Generator,
           progress: Callable[[int, float], None] | None) -> TrainResult:
    k = model.n_models
    model.to(device)
    sizes = [int(np.asarray(a).shape[0]) for a in inputs]
    # One padded (k, n_max, ·) tensor per quantity, so a step gathers every model's batch with a single
    # advanced-indexing op; each model's indices stay below its own size, so padding is never read.
    n_max = max(sizes)
    xs = torch.zeros(k, n_max, model.in_dim, dtype=torch.float32, device=device)
    ys = torch.zeros(k, n_max, dtype=torch.float32, device=device)
    ws = torch.zeros(k, n_max, dtype=torch.float32, device=device)
    for i in range(k):
        xs[i, :sizes[i]] = torch.as_tensor(np.asarray(inputs[i]), dtype=torch.float32, device=device)
        ys[i, :sizes[i]] = torch.as_tensor(np.asarray(targets[i]), dtype=torch.float32, device=device)
        ws[i, :sizes[i]] = torch.as_tensor(np.asarray(weights[i]), dtype=torch.float32, device=device)
    rows = torch.arange(k, device=device)[:, None]
    if config.sampling not in ("uniform", "mass"):
        raise ValueError(f"sampling must be 'uniform' or 'mass', got {config.sampling!r}")
    probs = None
    if config.sampling == "mass":
        probs = [_mass_probabilities(np.asarray(t), config.mass_floor) for t in targets]
    if config.loss not in ("mse", "l1"):
        raise ValueError(f"loss must be 'mse' or 'l1', got {config.loss!r}")
    l1 = config.loss == "l1"
    per_epoch = config.samples_per_epoch
    steps = max(1, math.ceil(per_epoch / config.batch_size))
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    result = TrainResult(0)
    best = math.inf
    stale = 0
    t0 = time.perf_counter()
    for epoch in range(config.max_epochs):
        # Index plan for this epoch: (k, steps*batch) sample indices per model.
        idx = torch.stack([
            (_epoch_indices(n, steps * config.batch_size, generator) if probs is None
             else torch.multinomial(probs[i], steps * config.batch_size, replacement=True, generator=generator)
             ).to(device) for i, n in enumerate(sizes)
        ])
        total = 0.0
        for s in range(steps):
            sl = idx[:, s * config.batch_size:(s + 1) * config.batch_size]
            resid = model(xs[rows, sl]) - ys[rows, sl]
            loss = (ws[rows, sl] * (resid.abs() if l1 else resid * resid)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        epoch_loss = total / steps
        result.losses.append(epoch_loss)
        result.epochs = epoch + 1
        if progress is not None:
            progress(epoch + 1, epoch_loss)
        if epoch_loss < best * (1 - config.min_rel_improvement):
            best = epoch_loss
            stale = 0
        else:
            stale += 1
            if stale >= config.patience:
                result.stopped_early = True
                break
    result.seconds = time.perf_counter() - t0
    return result


def _mass_probabilities(targets: np.ndarray, floor: float) -> torch.Tensor:
    """Sampling weights ∝ max(label, 0) + floor · mean(max(label, 0)) (uniform when every label is ≤ 0)."""
    mass = np.maximum(np.asarray(targets, dtype=np.float64), 0.0)
    mean = float(mass.mean()) if mass.size else 0.0
    w = mass + floor * mean if mean > 0 else np.ones_like(mass)
    return torch.as_tensor(w, dtype=torch.float64)


def _epoch_indices(n: int, count: int, generator: torch.Generator) -> torch.Tensor:
    if n >= count:
        return torch.randperm(n, generator=generator)[:count]
    reps = math.ceil(count / n)
    return torch.cat([torch.randperm(n, generator=generator) for _ in range(reps)])[:count]


@torch.no_grad()
def predict_grouped(model: BatchedSineSwishMLP, x: np.ndarray, which: np.ndarray, device: torch.device,
                    chunk: int = 262144) -> np.ndarray:
    """Evaluate model ``which[j]`` at ``x[j]`` for every j: one pass per model over its own rows."""
    model.eval()
    out = np.empty(x.shape[0], dtype=np.float64)
    for i in np.unique(which):
        rows = np.flatnonzero(which == i)
        for start in range(0, rows.size, chunk):
            r = rows[start:start + chunk]
            xt = torch.as_tensor(x[r], dtype=torch.float32, device=device)
            out[r] = model.forward_one(int(i), xt).double().cpu().numpy()
    return out
