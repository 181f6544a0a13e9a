"""A denoiser for SNH's noisy pyramid, learned from PUBLIC datasets only (beyond the SNH paper).

SNH's nets learn from one noisy grid of the private city and nothing else; what they can learn about
how cities look is limited to what survives the noise. Public location data say a lot about that
(venues cluster, parks and water are empty, density falls off smoothly around centres), and a
network trained on public cities can carry it over to a private one at no privacy cost: it is
applied to the noisy pyramid, so it is post-processing.

The model is a small U-Net over a fixed (G, G) grid (G = :data:`DENOISER_GRID`). Its inputs are the
pyramid estimate, the three noisy levels (each upsampled to G) and their noise scales, all divided by
the estimate's mean per cell, so one model serves any n and ε. It outputs a log-domain correction to
the pyramid estimate; a softmax over the cells turns it into a distribution that is scaled to the
estimate's total (mass-preserving, non-negative). It is trained on simulated releases of public
datasets (random ε, record or user level, the eight rotations and reflections of the map) with the
mean relative error of random 25–1000 m range queries as the loss — the metric releases are judged by.

A trained model lists the regions of the datasets it learned from; SNH does not use it for a region
that overlaps one of them, so a city is never denoised by a model that saw it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpcore.geo import Region
from dpcore.grid.histogram import answer_boxes, prefix_sums
from dpcore.grid.pyramid import LEVEL_DIVISORS, LEVEL_WEIGHTS, release_pyramid
from dpcore.models.denoiser_meta import (  # noqa: F401 - re-exported: the denoiser's files and metadata
    BAND_DENOISER_PATH,
    DEFAULT_DENOISER_PATH,
    DENOISER_GRID,
    load_meta,
    model_fingerprint,
    region_record,
    regions_overlap,
    shipped_denoiser_usable,
    trained_band,
    usable_for,
)

#: Resolution of the true counts used for training targets (20 m cells on a 20 km city).
TRUTH_GRID = 1024
_N_CHANNELS = 2 + 2 + 3  # estimate, finest level, two coarser levels upsampled, three noise scales


class PyramidDenoiser(nn.Module):
    """A two-scale U-Net: (B, 7, G, G) features → (B, G, G) distributions (each sums to 1)."""

    def __init__(self, channels: int = 32):
        super().__init__()
        c = int(channels)
        self.channels = c
        act = nn.SiLU
        self.enc1 = nn.Sequential(nn.Conv2d(_N_CHANNELS, c, 3, padding=1), act(), nn.Conv2d(c, c, 3, padding=1), act())
        self.enc2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), act(),
                                  nn.Conv2d(2 * c, 2 * c, 3, padding=1), act())
        self.enc3 = nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1), act(),
                                  nn.Conv2d(2 * c, 2 * c, 3, padding=1), act(),
                                  nn.Conv2d(2 * c, 2 * c, 3, padding=1), act())
        self.dec2 = nn.Sequential(nn.Conv2d(4 * c, 2 * c, 3, padding=1), act())
        self.dec1 = nn.Sequential(nn.Conv2d(3 * c, c, 3, padding=1), act(), nn.Conv2d(c, 1, 3, padding=1))
        # Zero output layer: an untrained model returns the pyramid estimate unchanged.
        nn.init.zeros_(self.dec1[-1].weight)
        nn.init.zeros_(self.dec1[-1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.enc1(x)
        b = self.enc2(a)
        c = self.enc3(b)
        b2 = self.dec2(torch.cat([b, F.interpolate(c, scale_factor=2)], 1))
        correction = self.dec1(torch.cat([a, F.interpolate(b2, scale_factor=2)], 1))[:, 0]
        # Channel 0 is log1p(estimate / mean cell): undo it and add a small floor so empty cells can
        # still receive mass.
        base = torch.log(torch.expm1(x[:, 0]) + 1e-2)
        logits = (base + correction).flatten(1)
        return torch.softmax(logits, 1).view_as(correction)


def _signed_log(a: np.ndarray) -> np.ndarray:
    return np.sign(a) * np.log1p(np.abs(a))


def pyramid_features(estimate: np.ndarray, noisy_levels: dict[int, np.ndarray],
                     noise_var: dict[int, float]) -> np.ndarray:
    """(7, G, G) float32 inputs from a pyramid release: everything is a DP output or public."""
    grid = int(estimate.shape[0])
    mean_cell = max(float(estimate.sum()), 1.0) / grid ** 2
    channels = [estimate / mean_cell]
    for d in LEVEL_DIVISORS[::-1]:  # finest first
        g = grid // d
        level = np.asarray(noisy_levels[g], dtype=np.float64)
        channels.append(np.kron(level, np.ones((d, d))) / (d * d) / mean_cell if d > 1 else level / mean_cell)
    channels = [_signed_log(c) for c in channels]
    for d in LEVEL_DIVISORS[::-1]:
        g = grid // d
        channels.append(np.full((grid, grid), math.log(math.sqrt(noise_var[g]) / (d * d) / mean_cell)))
    return np.stack(channels).astype(np.float32)


def denoise(model: PyramidDenoiser, estimate: np.ndarray, noisy_levels: dict[int, np.ndarray],
            noise_var: dict[int, float]) -> np.ndarray:
    """The denoised (G, G) counts: non-negative, with the pyramid estimate's total."""
    device = next(model.parameters()).device
    feats = torch.from_numpy(pyramid_features(estimate, noisy_levels, noise_var))[None].to(device)
    model.eval()
    with torch.no_grad():
        dist = model(feats)[0].double().cpu().numpy()
    return dist * (float(estimate.sum()) / dist.sum())  # float32 softmax sums to 1 only within ~1e-7


def box_answers(density: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Differentiable range counts: (B, G, G) densities, (B, Q, 4) boxes in cell units → (B, Q).

    Bilinear interpolation of the prefix table is the uniformity assumption inside cells (the same
    rule as dpcore.grid.histogram.answer_boxes)."""
    batch, n, _ = density.shape
    prefix = F.pad(density.cumsum(1).cumsum(2), (1, 0, 1, 0))
    rows = torch.arange(batch, device=density.device)[:, None]

    def cumulative(gx: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
        gx, gy = gx.clamp(0, n), gy.clamp(0, n)
        i0 = gx.floor().long().clamp(max=n - 1)
        j0 = gy.floor().long().clamp(max=n - 1)
        fx, fy = gx - i0, gy - j0
        return (prefix[rows, i0, j0] * (1 - fx) * (1 - fy) + prefix[rows, i0 + 1, j0] * fx * (1 - fy)
                + prefix[rows, i0, j0 + 1] * (1 - fx) * fy + prefix[rows, i0 + 1, j0 + 1] * fx * fy)

    x0, y0, x1, y1 = boxes.unbind(-1)
    return cumulative(x1, y1) - cumulative(x0, y1) - cumulative(x1, y0) + cumulative(x0, y0)


@dataclass
class PublicDataset:
    """A public dataset prepared for training: raw truth plus the pyramid counts of its releases.

    ``levels[k]`` holds, for record level (k = 0) and user level with k points per user, a few
    bounded versions (each a dict g → (g, g) counts) — bounding is random, so several draws."""

    name: str
    region: Region
    n_points: int
    truth: np.ndarray
    levels: dict[int, list[dict[int, np.ndarray]]] = field(default_factory=dict)

    @classmethod
    def from_points(cls, name: str, x: np.ndarray, y: np.ndarray, user: np.ndarray, region: Region,
                    ks: tuple[int, ...] = (1, 5, 20), versions: int = 2, seed: int = 0) -> PublicDataset:
        from dpcore.grid.histogram import grid_counts
        from dpcore.privacy.bounding import bound_contributions

        bounds = region.bounds_m

        def level_counts(xx: np.ndarray, yy: np.ndarray) -> dict[int, np.ndarray]:
            return {DENOISER_GRID // d: grid_counts(xx, yy, bounds, DENOISER_GRID // d, DENOISER_GRID // d)
                    .astype(np.float64) for d in LEVEL_DIVISORS}

        levels = {0: [level_counts(x, y)]}
        for k in ks:
            draws = []
            for v in range(versions):
                keep = bound_contributions(user, k, np.random.default_rng([seed, k, v])).keep
                draws.append(level_counts(x[keep], y[keep]))
            levels[k] = draws
        truth = grid_counts(x, y, bounds, TRUTH_GRID, TRUTH_GRID).astype(np.float64)
        return cls(name, region, int(x.size), truth, levels)


@dataclass
class DenoiserTrainConfig:
    steps: int = 1500
    batch_size: int = 6
    queries_per_sample: int = 512
    lr: float = 5e-4
    channels: int = 32
    epsilon_range: tuple[float, float] = (0.02, 3.0)
    #: Train on record-level releases only (no user-level bounding).
    record_only: bool = False
    #: Draw each simulated release's signal n·ε/s log-uniformly from this range (ε follows from the
    #: released sample's n and s) instead of drawing ε from ``epsilon_range``. A denoiser for a band of
    #: signals helps inside it and hurts far below it (docs/decisions/0004-snh-public-denoiser.md); it
    #: ships as :data:`BAND_DENOISER_PATH`, which snh applies only to the releases inside its band.
    signal_range: tuple[float, float] | None = None
    query_sides_m: tuple[float, float] = (25.0, 1000.0)
    seed: int = 0
    #: None: CUDA when present, else CPU (dpcore.models.snh_net.pick_device).
    device: str | None = None


def _dihedral(a: np.ndarray, t: int) -> np.ndarray:
    if t & 4:
        a = a.T
    return np.ascontiguousarray(np.rot90(a, t & 3))


def simulate_release(counts: dict[int, np.ndarray], sensitivity: float, epsilon: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, dict[int, np.ndarray], dict[int, float]]:
    """SNH's pyramid release of public counts (the same levels, shares and combination)."""
    from dpcore.privacy.noise import NoiseSource

    shares = np.asarray(LEVEL_WEIGHTS) / sum(LEVEL_WEIGHTS)
    level_eps = {DENOISER_GRID // d: epsilon * share for d, share in zip(LEVEL_DIVISORS, shares, strict=True)}
    # Public data: seeded noise is fine.
    return release_pyramid(counts, sensitivity, level_eps, NoiseSource(secure_mode=False, rng=rng))


def _turned_prefix(p: np.ndarray, t: int) -> np.ndarray:
    """prefix_sums(_dihedral(a, t)) from p = prefix_sums(a), for integer counts a: a flipped axis's prefix is
    the total less the prefix from the other end, which is exact (and so bit for bit the table of the
    turned counts) while every sum stays below 2^53; a transpose is the transposed table."""
    if t & 4:
        p = p.T
    k = t & 3
    if k == 1:  # rot90 once: the transpose with its rows reversed
        p = p.T
        p = p[-1:, :] - p[::-1, :]
    elif k == 2:
        p = p[-1:, :] - p[::-1, :]
        p = p[:, -1:] - p[:, ::-1]
    elif k == 3:  # three times: the transpose with its columns reversed
        p = p.T
        p = p[:, -1:] - p[:, ::-1]
    return p


def _truth_prefix(ds: PublicDataset, t: int, cache: dict[int, np.ndarray | None]) -> np.ndarray:
    """The prefix table of the dataset's truth turned by ``t``: from its one untransformed table where the
    truth is whole counts below 2^53 in total (two cumsums of 1,024² cells saved per sample), else
    computed."""
    key = id(ds)
    if key not in cache:
        whole = bool(np.all(ds.truth >= 0) and np.all(ds.truth == np.floor(ds.truth)) and ds.truth.sum() < 2.0 ** 53)
        cache[key] = prefix_sums(ds.truth) if whole else None
    p = cache[key]
    return prefix_sums(_dihedral(ds.truth, t)) if p is None else _turned_prefix(p, t)


def _training_batch(datasets: list[PublicDataset], cfg: DenoiserTrainConfig, rng: np.random.Generator,
                    prefixes: dict[int, np.ndarray | None] | None = None):
    """One batch of simulated releases; ``prefixes`` keeps each dataset's truth table across batches."""
    prefixes = {} if prefixes is None else prefixes
    feats, boxes, truths, totals, psis = [], [], [], [], []
    lo, hi = cfg.query_sides_m
    q = cfg.queries_per_sample
    for _ in range(cfg.batch_size):
        ds = datasets[int(rng.integers(len(datasets)))]
        k = 0 if cfg.record_only else list(ds.levels)[int(rng.integers(len(ds.levels)))]
        versions = ds.levels[k]
        counts = versions[int(rng.integers(len(versions)))]
        sensitivity = float(max(k, 1))
        if cfg.signal_range is None:
            eps = float(np.exp(rng.uniform(*np.log(cfg.epsilon_range))))
        else:
            released = max(float(counts[DENOISER_GRID].sum()), 1.0)  # the bounded sample at user level
            eps = float(np.exp(rng.uniform(*np.log(cfg.signal_range)))) * sensitivity / released
        est, noisy, var = simulate_release(counts, sensitivity, eps, rng)
        t = int(rng.integers(8))
        feats.append(np.stack([_dihedral(c, t) for c in pyramid_features(est, noisy, var)]))
        # Half small (log-uniform), half large queries, centred uniformly (the protocol's workload).
        small = rng.random(q) < 0.5
        side_m = np.where(small, np.exp(rng.uniform(np.log(lo), np.log(min(100.0, hi)), q)), rng.uniform(
            min(100.0, hi), hi, q))
        side = side_m / ds.region.side_m * DENOISER_GRID
        cx, cy = rng.uniform(0, DENOISER_GRID, q), rng.uniform(0, DENOISER_GRID, q)
        bx = np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], 1)
        truths.append(answer_boxes(_truth_prefix(ds, t, prefixes), (0.0, 0.0, DENOISER_GRID, DENOISER_GRID), bx))
        boxes.append(bx)
        # The target is the raw data (what releases are scored against); user-level releases are
        # scaled to it outside SNH, so the distribution is compared at the raw total.
        totals.append(float(ds.n_points))
        psis.append(max(1.0, 1e-3 * ds.n_points))
    return tuple(torch.tensor(np.asarray(a), dtype=torch.float32) for a in (feats, boxes, truths, totals, psis))


def check_signal_range(signal_range) -> None:
    """A band of release signals n·ε/s: two numbers (low, high) with 0 < low < high."""
    if len(signal_range) != 2 or not 0 < signal_range[0] < signal_range[1]:
        raise ValueError(f"signal_range must be (low, high) with 0 < low < high, got {tuple(signal_range)}")


def train_denoiser(datasets: list[PublicDataset], cfg: DenoiserTrainConfig | None = None,
                   progress: Callable[[int, float], None] | None = None) -> tuple[PyramidDenoiser, dict]:
    """Train on simulated releases of public datasets; returns the model and a training report."""
    cfg = cfg or DenoiserTrainConfig()
    if not datasets:
        raise ValueError("the denoiser needs at least one public dataset")
    if cfg.signal_range is not None:
        check_signal_range(cfg.signal_range)
    from dpcore.models.snh_net import pick_device

    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = PyramidDenoiser(cfg.channels).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps)
    losses = []
    t0 = time.perf_counter()
    model.train()
    prefixes: dict[int, np.ndarray | None] = {}
    for step in range(cfg.steps):
        feats, boxes, truth, totals, psi = (t.to(device) for t in _training_batch(datasets, cfg, rng, prefixes))
        pred = box_answers(model(feats) * totals[:, None, None], boxes)
        loss = ((pred - truth).abs() / torch.maximum(truth, psi[:, None])).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step, float(np.mean(losses[-50:])))
    model.cpu()  # saved and applied on the CPU (one forward pass per release)
    report = {"steps": cfg.steps, "seconds": time.perf_counter() - t0, "device": str(device), "config": {
        **{k: v for k, v in cfg.__dict__.items()}, "epsilon_range": list(cfg.epsilon_range),
        "query_sides_m": list(cfg.query_sides_m)},
        "loss_last_100": float(np.mean(losses[-100:])), "loss_curve": [float(np.mean(losses[i:i + 50]))
                                                                        for i in range(0, len(losses), 50)]}
    return model, report


def save_denoiser(path: str | Path, model: PyramidDenoiser, meta: dict) -> None:
    """Weights as .npz (no pickle) + metadata (training regions, report) as .json beside it."""
    path = Path(path)
    np.savez(path, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    path.with_suffix(".json").write_text(json.dumps({**meta, "channels": model.channels,
                                                      "grid": DENOISER_GRID}, indent=1))


def load_denoiser(path: str | Path) -> tuple[PyramidDenoiser, dict]:
    meta = load_meta(path)
    model = PyramidDenoiser(int(meta["channels"]))
    with np.load(path) as z:
        model.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files})
    model.eval()
    return model, meta
