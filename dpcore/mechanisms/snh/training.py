"""SNH step 3, training (post-processing): the k_s nets learn the augmented noisy grid together."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from dpcore.geo import Region
from dpcore.mechanisms.contract import MechanismError
from dpcore.mechanisms.snh.augmentation import augment, normalise_xy, workload_overlaps

log = logging.getLogger("dpcore.mechanisms.snh")

#: A long training says how far it is on stderr at most this often (seconds of wall time); a short one
#: (tests, evaluation loops) stays silent.
PROGRESS_EVERY_S = 10.0


def _shown(logger: logging.Logger) -> logging.Logger:
    """``logger``, printing INFO lines on stderr when nothing else was set up to show them (the CLI's
    in-process release sets up no logging; a caller that configured its own handlers keeps them)."""
    if not logger.hasHandlers():
        logger.addHandler(logging.StreamHandler())
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return logger


def progress_lines(max_epochs: int, every_s: float = PROGRESS_EVERY_S):
    """A training-progress callback (epoch, loss) that logs one line per ``every_s`` seconds of training
    (the CLI's in-process release, a pipe, a run's log)."""
    start = last = time.perf_counter()

    def report(epoch: int, loss: float) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= every_s:
            last = now
            # The epoch count is public (the work's size); the loss stays out of logs that a run publishes.
            _shown(log).info("snh training: epoch %d of at most %d, %.0f s", epoch, max_epochs, now - start)

    return report


def pick_device(device: str | None) -> torch.device:
    from dpcore.models.snh_net import pick_device

    return pick_device(device)


def train_snh(noisy: np.ndarray, region: Region, sides: np.ndarray, psi: float, *, hidden: int = 64,
              depth: int = 3, omega0: float = 8.0, lr: float = 1e-3, batch_size: int = 1024,
              max_epochs: int = 40, patience: int = 4, samples_per_epoch: int = 32768,
              device: torch.device | None = None, generator: torch.Generator | None = None,
              workload: np.ndarray | None = None, loss: str = "relative_l1", clip_labels: bool = False,
              sampling: str = "uniform"):
    """Augment the noisy grid and train the k_s nets together. Returns (net, label_scales, info).

    ``workload``: PUBLIC (q, 4) boxes in metres; each sample's loss weight is multiplied by the number of
    them overlapping its square (:func:`workload_overlaps`). None: every sample counts once.
    ``clip_labels``: labels below 0 (noise alone: a count is never negative) are learned as 0, as in the paper.
    ``sampling``: ``"mass"`` draws each batch ∝ the noisy labels (:class:`TrainConfig`), post-processing.

    Labels of net i are divided by a scale s_i (mean |label|, at least ψ) so every net regresses
    values of order 1; the loss weight s_i²/max(y, ψ) makes the normalised loss equal the paper's
    w/max(y, ψ)-weighted MSE on raw counts, up to a global constant.
    """
    from dpcore.models.snh_net import BatchedSineSwishMLP, TrainConfig, train_batched

    if loss not in ("relative_l1", "paper"):
        raise MechanismError(f"loss must be 'relative_l1' or 'paper', got {loss!r}")
    device = device or pick_device(None)
    generator = generator or torch.Generator().manual_seed(0)
    inputs, targets, weights, scales = [], [], [], []
    for r in sides:
        centres, labels = augment(noisy, region, float(r))
        if clip_labels:
            labels = np.maximum(labels, 0.0)
        s = max(float(np.mean(np.abs(labels))), psi, 1e-9)
        # In units of the normalised labels y/s: s²·(·)² or s·|·| gives back the loss on raw counts.
        w = (s * s if loss == "paper" else s) / np.maximum(labels, psi)
        if workload is not None:
            w = w * workload_overlaps(noisy.shape, region, float(r), workload)
        inputs.append(normalise_xy(centres, region).astype(np.float32))
        targets.append((labels / s).astype(np.float32))
        weights.append(w.astype(np.float32))
        scales.append(s)
    # One global normalisation of the weights keeps Adam's effective step the same across datasets.
    w_mean = float(np.mean(np.concatenate(weights)))
    if not w_mean > 0:
        raise MechanismError("the public workload overlaps no training square of the region")
    weights = [w / w_mean for w in weights]
    net = BatchedSineSwishMLP(len(sides), 2, hidden, depth, omega0, generator=generator)
    cfg = TrainConfig(lr=lr, batch_size=batch_size, max_epochs=max_epochs, patience=patience,
                      samples_per_epoch=samples_per_epoch, loss="mse" if loss == "paper" else "l1",
                      sampling=sampling)
    res = train_batched(net, inputs, targets, weights, cfg, device, generator, progress=progress_lines(max_epochs))
    info = {"epochs": res.epochs, "losses": [float(v) for v in res.losses], "seconds": res.seconds,
            "stopped_early": res.stopped_early, "samples_per_size": [int(a.shape[0]) for a in inputs],
            "weighted_by_workload": workload is not None, "sampling": sampling,
            "zero_weight_samples": [int(np.count_nonzero(w == 0)) for w in weights]}
    return net.cpu(), np.asarray(scales), info
