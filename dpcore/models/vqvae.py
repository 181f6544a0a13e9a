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

from dpcore.grid.histogram import block_sum, expand, shrink_factor, split_to_parent

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


def _quadtree_sums(values: np.ndarray) -> tuple[int, dict[int, np.ndarray]]:
    """(size, {g: (g, g, nt) block sums}) for g = 1, 2, 4, ..., size: the (nx, ny, nt) array zero-padded
    to the next power-of-two side, summed 2 × 2 level by level."""
    nx, ny, nt = values.shape
    size = 1
    while size < max(nx, ny):
        size *= 2
    padded = np.zeros((size, size, nt))
    padded[:nx, :ny] = values
    sums = {size: padded}
    g = size
    while g > 1:
        sums[g // 2] = block_sum(sums[g], 2)
        g //= 2
    return size, sums


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
                message = f"VQ-VAE loss {loss_ema:.4f} ({time.perf_counter() - t0:.0f}s)"
                if progress:
                    progress(step, c.steps, message)
                else:  # e.g. inside a Prefect task: its log handlers pick this up when configured
                    logger.info("step %d/%d %s", step, c.steps, message)
            if c.max_seconds is not None and time.perf_counter() - t0 > c.max_seconds:
                stopped = True
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


def residual_wiener(noisy: np.ndarray, denoised: np.ndarray, noise_std: float, window: int,
                    scales: tuple[int, ...] = (256, 128, 64, 32, 16, 8, 4, 2, 1),
                    bar: float = 2.0) -> np.ndarray:
    """Add back the part of the residual H̄ − D that is signal, not noise (local Wiener filter), at
    several block scales.

    Where the bottleneck dropped real structure (a sharp peak, or mass shifted between blocks), the
    residual's local energy exceeds the known noise variance and the residual is kept in proportion
    1 − 2·var/energy; where it looks like noise it is dropped. At scale s the residual is summed over
    s×s blocks (noise variance s²σ²), energy is averaged over window × window blocks of each slice,
    and the kept part is spread over the block in proportion to the current estimate. Coarse scales
    go first and restore block totals, fine ones restore sharp peaks, so at high SNR the output
    moves towards the noisy histogram's unbiased totals and at low SNR it stays the denoiser's.
    Post-processing only.
    """
    from scipy.ndimage import uniform_filter

    current = np.asarray(denoised, dtype=np.float64).copy()
    nx, ny, nt = current.shape
    for s in scales:
        if s > min(nx, ny):
            continue
        px, py = (-nx) % s, (-ny) % s
        resid = np.pad(noisy - current, ((0, px), (0, py), (0, 0)))
        block = block_sum(resid, s)
        var = (s * noise_std) ** 2
        energy = uniform_filter(block * block, size=(window, window, 1), mode="nearest")
        # With bar = 2 (twice the noise variance) a window of pure noise rarely reaches it, so at
        # low SNR (nearly everywhere at small ε) no noise is added back.
        kept = np.clip(1.0 - bar * var / np.maximum(energy, 1e-12), 0.0, 1.0) * block
        if s == 1:
            current += kept
            continue
        pos = np.pad(np.maximum(current, 0.0), ((0, px), (0, py), (0, 0)))
        pos_block = block_sum(pos, s)
        up = expand(pos_block, s)
        share = np.where(up > 0, pos / np.where(up > 0, up, 1.0), 1.0 / (s * s))
        current += (expand(kept, s) * share)[:nx, :ny]
    return current


def nonnegative_keep_block_mass(values: np.ndarray, block: int) -> np.ndarray:
    """Project to ≥ 0 without the upward bias of plain clamping.

    Clamping noise-like cells at 0 adds mass wherever counts are near 0; here the clamped values of
    each block × block tile (per slot) are rescaled to the tile's signed total (floored at 0), so
    tile totals are what they were before the projection.
    """
    v = np.asarray(values, dtype=np.float64)
    pos = np.maximum(v, 0.0)
    if block <= 1:
        return pos
    nx, ny = v.shape[:2]
    target = np.maximum(block_sum(v, block, pad=True), 0.0)
    have = block_sum(pos, block, pad=True)
    factor = np.divide(target, have, out=np.zeros_like(have), where=have > 0)
    return pos * expand(factor, block)[:nx, :ny]


def _random_crops(data: torch.Tensor, n: int, crop: int, rng: np.random.Generator) -> torch.Tensor:
    """n random (slice, window) crops of side ≤ crop from (nt, c, H, W)."""
    nt, _, h, w = data.shape
    ch, cw = min(crop, h), min(crop, w)
    ts = rng.integers(0, nt, n)
    ys = rng.integers(0, h - ch + 1, n)
    xs = rng.integers(0, w - cw + 1, n)
    return torch.stack([data[t, :, y:y + ch, x:x + cw] for t, y, x in zip(ts, ys, xs, strict=True)])


#: Family-wise false-positive rate of the slot-total test at the quadtree's root (see slot_kappa).
SLOT_TEST_ALPHA = 0.05


def slot_kappa(kappa: float, n_slots: int, alpha: float = SLOT_TEST_ALPHA) -> float:
    """The shrinkage factor for the n_slots per-slot total deviations at the root of a quadtree stage.

    There are only T of them, so 2·ln T (the universal threshold) or a small κ lets a pure-noise
    slot through often (κ' = 6.1 passes 2.5 σ; one of 21 slots does so about a quarter of the time),
    and that one slot then carries a spurious spike of the whole region. The root uses
    max(κ, z²) with z the Gaussian quantile at 1 − α/(2T) (a Bonferroni bound: a slot of pure noise
    passes with probability ≤ α over all T), since slot totals are sums of thousands of cells.
    """
    from scipy.special import ndtri

    if n_slots < 1:
        raise ValueError(f"n_slots must be ≥ 1, got {n_slots}")
    z = float(ndtri(1.0 - alpha / (2.0 * n_slots)))
    return max(float(kappa), z * z)


def multiscale_shrink(values: np.ndarray, noise_var: float, kappa: float = 2.0,
                      total_floor: float = 1.0) -> np.ndarray:
    """Coarse-to-fine significance shrinkage of a (nx, ny, nt) count estimate; output ≥ 0 (post-processing).

    A spatial quadtree over the window: the root is the whole region (its signed total, floored at
    ``total_floor``); each node's estimate is split among its 4 children as the equal share plus each
    child's deviation from its siblings' mean, shrunk by max(0, 1 − κ·σ_d² / d²) (a per-node
    positive-part Wiener factor; σ_d² is the deviation's noise variance, from ``noise_var`` per cell).
    The deviation is split into its window-total part (noise variance T times smaller relative to
    signal) and its per-slot remainder, shrunk separately, so structure that is only visible summed
    over the whole window and over large blocks is kept and pushed down, while structure that
    does not stand out from the noise is flattened to the parent's even split. Children are clipped
    at 0 and rescaled to the parent's estimate, so no level adds mass.
    """
    v = np.asarray(values, dtype=np.float64)
    nx, ny, nt = v.shape
    size, sums = _quadtree_sums(v)  # noisy sums at every level (g × g × nt)
    slot_tot = sums[1][0, 0]
    root_total = max(float(slot_tot.sum()), float(total_floor))
    # root: split the total across slots (per-slot deviations shrunk likewise, at slot_kappa)
    dev = slot_tot - slot_tot.mean()
    dvar = noise_var * size * size * (1.0 - 1.0 / nt)
    lam = shrink_factor(dev, dvar, slot_kappa(kappa, nt)) if nt > 1 else np.zeros(nt)
    est = np.maximum(root_total / nt + lam * dev, 0.0)
    est = (est * (root_total / est.sum()) if est.sum() > 0 else np.full(nt, root_total / nt))[None, None, :]
    g = 1
    while g < size:
        child = sums[2 * g].reshape(g, 2, g, 2, nt)
        cells = (size // (2 * g)) ** 2  # cells per child
        d = child - child.mean(axis=(1, 3), keepdims=True)            # per-slot sibling deviations
        dw = d.sum(axis=4, keepdims=True)                              # window-total deviation
        rem = d - dw / nt
        var_w = noise_var * cells * nt * 0.75
        var_r = noise_var * cells * 0.75 * (1.0 - 1.0 / nt)
        lw = shrink_factor(dw, var_w, kappa)
        lr = shrink_factor(rem, var_r, kappa) if nt > 1 else 0.0
        parent = est[:, None, :, None, :]
        c = split_to_parent(np.maximum(parent / 4.0 + lw * dw / nt + lr * rem, 0.0), parent)
        est = c.reshape(2 * g, 2 * g, nt)
        g *= 2
    return est[:nx, :ny]


def multiscale_consistency(estimate: np.ndarray, noisy: np.ndarray, noise_var: float, kappa: float = 2.0,
                           min_block: int = 1, universal: bool = False) -> np.ndarray:
    """Pull a (nx, ny, nt) estimate towards the noisy histogram's block sums where they are significant.

    A coarse-to-fine quadtree over the window, like :func:`multiscale_shrink`, but the prior is the
    estimate (e.g. the denoiser's output) instead of the even split, and the data is H̄ (unbiased,
    cell noise variance ``noise_var``). At every node the parent's final total is first split in
    proportion to the estimate's children; then each child's residual deviation from its siblings,
    e = (H̄_c − D_c) − mean over siblings, is added back with the positive-part Wiener weight
    max(0, 1 − κ·σ_e² / e²) (σ_e² = 0.75·cells·noise_var per slot). So where a block's noisy sum
    disagrees with the estimate by much more than its noise (large blocks at high SNR: the
    denoiser's bias), the output follows the unbiased sum; where the difference looks like noise
    (everywhere at low SNR), the estimate's shape is kept. As in multiscale_shrink the window-total
    part of e (noise T times smaller relative to signal) and its per-slot remainder are weighed
    separately. The root keeps the estimate's total; per-slot totals are corrected likewise, with
    the stricter :func:`slot_kappa` (only T tests, each a whole-region spike if it passes).
    The weighted corrections are re-centred so that siblings' corrections cancel; children are
    clipped at 0 (then rescaled to their parent), so the output is ≥ 0 with the estimate's total. Below ``min_block`` (cells per side) the final block totals are spread in proportion to
    the estimate. ``universal``: at a level with n tested deviations the factor is max(κ, 2·ln n)
    (the universal threshold of wavelet denoising): a level of pure noise then lets almost none of
    its n nodes through, instead of the fraction that exceeds √κ noise standard deviations by chance.
    Post-processing only: it reads nothing but the two released-side arrays.
    """
    e = np.maximum(np.asarray(estimate, dtype=np.float64), 0.0)
    y = np.asarray(noisy, dtype=np.float64)
    if e.shape != y.shape or e.ndim != 3:
        raise ValueError(f"estimate and noisy must have one (nx, ny, nt) shape, got {e.shape} and {y.shape}")
    nx, ny, nt = e.shape
    size, se = _quadtree_sums(e)
    _, sy = _quadtree_sums(y)

    def _weight(d: np.ndarray, var: float) -> np.ndarray:
        k = max(kappa, 2.0 * np.log(d.size)) if universal and d.size > 1 else kappa
        return shrink_factor(d, var, k)

    root_total = float(se[1].sum())
    est = se[1].copy()  # (1, 1, nt)
    if nt > 1 and root_total > 0:
        r = sy[1] - est
        d = r - r.mean()
        slot_var = noise_var * size * size * (1.0 - 1.0 / nt)
        moved = np.maximum(est + shrink_factor(d, slot_var, slot_kappa(kappa, nt)) * d, 0.0)
        if moved.sum() > 0:
            est = moved * (root_total / moved.sum())
    block = max(1, int(min_block))
    g = 1
    while g < size and size // (2 * g) >= block:
        cells = (size // (2 * g)) ** 2
        parent = est[:, None, :, None, :]
        child_e = se[2 * g].reshape(g, 2, g, 2, nt)
        prior = split_to_parent(child_e, parent)
        r = sy[2 * g].reshape(g, 2, g, 2, nt) - prior
        d = (r - r.mean(axis=(1, 3), keepdims=True)).reshape(2 * g, 2 * g, nt)
        dw = d.sum(axis=2, keepdims=True)
        rem = d - dw / nt
        lw = _weight(dw, noise_var * cells * nt * 0.75)
        lr = _weight(rem, noise_var * cells * 0.75 * (1.0 - 1.0 / nt)) if nt > 1 else 0.0
        shape = (g, 2, g, 2, nt)
        dw, rem = dw.reshape(g, 2, g, 2, 1), rem.reshape(shape)
        lw = lw.reshape(g, 2, g, 2, 1)
        lr = lr.reshape(shape) if nt > 1 else 0.0
        corr = lw * dw / nt + lr * rem
        # re-centre after weighting: the children's corrections cancel, so the parent's total is kept
        # without rescaling every child (a rescale would move mass in proportion to the prior)
        corr = corr - corr.mean(axis=(1, 3), keepdims=True)
        c = split_to_parent(np.maximum(prior + corr, 0.0), parent)
        est = c.reshape(2 * g, 2 * g, nt)
        g *= 2
    if g < size:  # spread the final block totals over their cells in proportion to the estimate
        s = size // g
        est = split_to_parent(se[size].reshape(g, s, g, s, nt), est[:, None, :, None, :]).reshape(size, size, nt)
    return est[:nx, :ny]
