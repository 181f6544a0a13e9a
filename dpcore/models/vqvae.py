"""A fully convolutional VQ-VAE that denoises the time slices of a noisy spatio-temporal histogram.

After VDR (Ahuja et al., PACMMOD 2023): the encoder maps an image to a grid of vectors, each snapped
to its nearest code of a learned codebook of B codes; the decoder rebuilds the image from the codes.
With few codes per patch the model cannot reproduce cell-independent noise, so its reconstruction
of the noisy slice keeps the spatial structure and drops the noise. Loss = reconstruction MSE
+ α·(codebook loss + β·commitment loss), straight-through gradients through the quantiser.

Improvements over the paper:
- temporal context: the input of slice t holds slices t−1, t, t+1 as channels, so the denoiser
  sees where the mass was in neighbouring slots (the paper denoised each slice alone);
- fully convolutional with padding to a multiple of the downsampling factor, so one model handles
  any grid size (the paper's model was fixed to 576²);
- a variance-stabilising input transform asinh(x / σ_s), σ_s the noise std at resolution s, so
  heavy and empty cells are learned on one scale and the noise has unit scale near zero;
- unused codes are restarted on encoder outputs, so the codebook is actually used.

Training data (multi-resolution, as in the paper): every slice plus its 2×2 and 4×4 block
aggregates. Everything here is post-processing of already-noisy counts: no privacy cost.
The device is CUDA when available, else CPU; the code is the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpcore.grid.histogram import block_sum
from dpcore.models.st_statistics import residual_wiener

Progress = Callable[[int, int, str], None]
logger = logging.getLogger(__name__)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes: int, code_dim: int, beta: float = 0.25):
        super().__init__()
        self.codebook = nn.Embedding(n_codes, code_dim)
        self.codebook.weight.data.uniform_(-1.0 / n_codes, 1.0 / n_codes)
        self.beta = beta

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z (b, d, h, w) → (quantised z with straight-through gradient, vq loss, code indices)."""
        b, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)
        e = self.codebook.weight
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ e.t() + e.pow(2).sum(1)[None, :]
        idx = dist.argmin(1)
        q = e[idx].view(b, h, w, d).permute(0, 3, 1, 2)
        codebook_loss = F.mse_loss(q, z.detach())
        commitment = F.mse_loss(z, q.detach())
        q_st = z + (q - z).detach()
        return q_st, codebook_loss + self.beta * commitment, idx


class VQVAE(nn.Module):
    """Encoder (stride-2 convs, ``levels`` times) → quantiser → decoder (transposed convs)."""

    def __init__(self, in_channels: int = 3, hidden: int = 32, code_dim: int = 16, n_codes: int = 128,
                 levels: int = 2, beta: float = 0.25):
        super().__init__()
        if levels < 1:
            raise ValueError("levels must be ≥ 1")
        # No full-resolution hidden layers: the first conv already strides and the last transposed
        # conv writes the single output channel, which keeps a CPU step cheap (most cost sits at
        # full resolution).
        enc: list[nn.Module] = []
        ch = in_channels
        for _ in range(levels):
            enc += [nn.Conv2d(ch, hidden, 4, stride=2, padding=1), nn.ReLU()]
            ch = hidden
        enc += [nn.Conv2d(hidden, hidden, 3, padding=1), nn.ReLU(), nn.Conv2d(hidden, code_dim, 1)]
        self.encoder = nn.Sequential(*enc)
        self.quantizer = VectorQuantizer(n_codes, code_dim, beta)
        dec: list[nn.Module] = [nn.Conv2d(code_dim, hidden, 3, padding=1), nn.ReLU()]
        for i in range(levels):
            last = i == levels - 1
            dec += [nn.ConvTranspose2d(hidden, 1 if last else hidden, 4, stride=2, padding=1)]
            if not last:
                dec += [nn.ReLU()]
        self.decoder = nn.Sequential(*dec)
        self.factor = 2 ** levels

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (b, c, H, W), any H, W → (reconstruction (b, 1, H, W), vq loss, codes, encoder output)."""
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.factor, (-w) % self.factor
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))  # zero = empty cells in the transformed domain
        z = self.encoder(x)
        q, vq_loss, idx = self.quantizer(z)
        out = self.decoder(q)[..., :h, :w]
        return out, vq_loss, idx, z


@dataclass
class DenoiserConfig:
    n_codes: int = 128          # B in the paper
    alpha: float = 1.0          # weight of the codebook/commitment loss (paper: α = 1)
    beta: float = 0.25          # commitment weight inside the vq loss (van den Oord et al.)
    hidden: int = 32
    code_dim: int = 16
    levels: int = 2             # downsampling 2**levels per side before quantising
    temporal_context: int = 1   # slices on each side given as extra channels
    window_mean: bool = True    # one more channel: the mean slice of the whole window (noise / √T)
    resolutions: tuple[int, ...] = (1, 2, 4)
    steps: int = 300
    batch_size: int = 16
    crop: int = 64
    lr: float = 2e-3
    max_seconds: float | None = None  # optional wall-clock cap (stops early; recorded)
    seed: int = 0
    residual_window: int = 5    # local Wiener correction of the residual (0 = off), see residual_wiener
    # block sizes at which the residual is corrected, coarse first (block totals, then detail)
    residual_scales: tuple[int, ...] = (256, 128, 64, 32, 16, 8, 4, 2, 1)


@dataclass
class TrainReport:
    steps: int
    seconds: float
    final_loss: float
    codes_used: int
    device: str
    stopped_early: bool


def _with_context(v: np.ndarray, context: int) -> np.ndarray:
    """(nt, H, W) → (nt, 2·context+1, H, W) stacking slices t−c..t+c (edges repeat the end slice)."""
    nt = v.shape[0]
    idx = np.clip(np.arange(nt)[:, None] + np.arange(-context, context + 1)[None, :], 0, nt - 1)
    return v[idx]


class SliceDenoiser:
    """Trains a :class:`VQVAE` on the noisy histogram and returns its denoised reconstruction."""

    def __init__(self, config: DenoiserConfig | None = None, device: torch.device | str | None = None):
        self.config = config or DenoiserConfig()
        self.device = torch.device(device) if device is not None else default_device()
        c = self.config
        torch.manual_seed(c.seed)
        channels = 2 * c.temporal_context + 1 + int(c.window_mean)
        self.model = VQVAE(channels, c.hidden, c.code_dim, c.n_codes, c.levels, c.beta).to(self.device)

    def _transform(self, h: np.ndarray, sigma: float) -> np.ndarray:
        return np.arcsinh(h / sigma).astype(np.float32)

    def _inputs(self, h: np.ndarray, sigma: float) -> np.ndarray:
        """(nx, ny, nt) counts with per-cell noise std σ → (nt, channels, nx, ny) model inputs.

        Channels: slices t−c..t+c, then (``window_mean``) the mean slice of the window, whose noise
        is σ/√T: at small ε it carries the spatial structure that single slices drown in noise.
        """
        c = self.config
        x = _with_context(self._transform(np.moveaxis(h, 2, 0), sigma), c.temporal_context)
        if c.window_mean:
            nt = h.shape[2]
            mean = self._transform(h.mean(axis=2), sigma / np.sqrt(nt))
            x = np.concatenate([x, np.broadcast_to(mean, (nt, 1, *mean.shape))], axis=1)
        return np.ascontiguousarray(x)

    def fit(self, noisy: np.ndarray, noise_std: float, progress: Progress | None = None) -> TrainReport:
        """Train on an (nx, ny, nt) noisy histogram whose per-cell noise std is ``noise_std``."""
        c = self.config
        rng = np.random.default_rng(c.seed)
        sets = []
        for s in c.resolutions:
            agg = block_sum(noisy, s)
            if min(agg.shape[:2]) < 4:
                continue
            # Noise of an s×s block sum has std s·σ: normalising by it keeps noise at unit scale.
            sets.append(torch.from_numpy(self._inputs(agg, s * noise_std)).to(self.device))
        opt = torch.optim.Adam(self.model.parameters(), lr=c.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, c.steps)
        self.model.train()
        t0 = time.perf_counter()
        usage = torch.zeros(c.n_codes, device=self.device)
        loss_ema = float("nan")
        step = 0
        stopped = False
        mid = c.temporal_context
        for step in range(1, c.steps + 1):
            data = sets[int(rng.integers(len(sets)))]
            batch = _random_crops(data, c.batch_size, c.crop, rng)
            recon, vq_loss, idx, z = self.model(batch)
            loss = F.mse_loss(recon, batch[:, mid:mid + 1]) + c.alpha * vq_loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            usage += torch.bincount(idx, minlength=c.n_codes).float()
            loss_ema = loss.item() if np.isnan(loss_ema) else 0.9 * loss_ema + 0.1 * loss.item()
            if step % 25 == 0:
                self._restart_dead_codes(usage, z, rng)
                usage.zero_()
            stopped = c.max_seconds is not None and time.perf_counter() - t0 > c.max_seconds
            if step % 25 == 0 or step == c.steps or stopped:  # the last step too: a short training reports once
                message = f"VQ-VAE loss {loss_ema:.4f} ({time.perf_counter() - t0:.0f}s)"
                if progress:
                    progress(step, c.steps, message)
                else:  # e.g. inside a Prefect task: its log handlers pick this up when configured
                    logger.info("step %d/%d %s", step, c.steps, message)
            if stopped:
                break
        codes = self._codes_used(sets[0])
        return TrainReport(step, time.perf_counter() - t0, loss_ema, codes, str(self.device), stopped)

    @torch.no_grad()
    def _restart_dead_codes(self, usage: torch.Tensor, z: torch.Tensor, rng: np.random.Generator) -> None:
        dead = torch.nonzero(usage == 0).flatten()
        if dead.numel() == 0:
            return
        flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        pick = torch.from_numpy(rng.integers(0, flat.shape[0], dead.numel())).to(flat.device)
        self.model.quantizer.codebook.weight.data[dead] = flat[pick]

    @torch.no_grad()
    def _codes_used(self, data: torch.Tensor) -> int:
        self.model.eval()
        _, _, idx, _ = self.model(data[: min(8, data.shape[0])])
        return int(torch.unique(idx).numel())

    @torch.no_grad()
    def denoise(self, noisy: np.ndarray, noise_std: float, batch: int = 16) -> np.ndarray:
        """(nx, ny, nt) noisy counts → denoised counts (same shape, may be negative: caller clamps)."""
        c = self.config
        self.model.eval()
        v = self._inputs(noisy, noise_std)
        out = np.empty(v.shape[0:1] + v.shape[2:], dtype=np.float64)
        for a in range(0, v.shape[0], batch):
            x = torch.from_numpy(v[a:a + batch]).to(self.device)
            out[a:a + batch] = self.model(x)[0][:, 0].double().cpu().numpy()
        denoised = np.moveaxis(np.sinh(out) * noise_std, 0, 2)
        if c.residual_window:
            denoised = residual_wiener(noisy, denoised, noise_std, c.residual_window, c.residual_scales)
        return denoised

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Weights as numpy arrays (saved with the release; loading a release needs no torch)."""
        return {f"vqvae.{k}": v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        state = {k[len("vqvae."):]: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()
                 if k.startswith("vqvae.")}
        self.model.load_state_dict(state)


def _random_crops(data: torch.Tensor, n: int, crop: int, rng: np.random.Generator) -> torch.Tensor:
    """n random (slice, window) crops of side ≤ crop from (nt, c, H, W)."""
    nt, _, h, w = data.shape
    ch, cw = min(crop, h), min(crop, w)
    ts = rng.integers(0, nt, n)
    ys = rng.integers(0, h - ch + 1, n)
    xs = rng.integers(0, w - cw + 1, n)
    return torch.stack([data[t, :, y:y + ch, x:x + cw] for t, y, x in zip(ts, ys, xs, strict=True)])
