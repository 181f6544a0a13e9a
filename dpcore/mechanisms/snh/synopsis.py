"""SNH step 4, answering (post-processing): the noisy grid and the trained nets, saved and loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpcore.geo import Region
from dpcore.grid.histogram import answer_boxes, block_sum, prefix_sums
from dpcore.mechanisms.snh.augmentation import normalise_xy
from dpcore.mechanisms.snh.rules import BLEND_SMALL_SIDE_M, CAVEAT_DROPPED_FRACTION, GEOMETRIC_NETS_WEIGHTS
from dpcore.mechanisms.snh.training import pick_device
from dpcore.synopsis.base import PrivacyInfo, Synopsis, SynopsisError
from dpcore.synopsis.noise import NoInterval, NoiseModel


class SNHSynopsis(Synopsis):
    """Noisy grid + k_s trained nets. Saves as weights (npz, no pickle) + config; loads without training."""

    kind = "snh"

    def __init__(self, noisy: np.ndarray, net, config: dict, region: Region, privacy: PrivacyInfo):
        self.noisy = np.asarray(noisy, dtype=np.float64)
        self.net = net
        self.config = dict(config)
        self.region = region
        self.privacy = privacy
        self.sides = np.asarray(config["sides_m"], dtype=np.float64)
        self.scales = np.asarray(config["label_scales"], dtype=np.float64)
        # A release with a fine level holds the fine grid; its block sums at grid_size are the denoised grid,
        # which answers squares of 100 m and more (the fine cells' split is for smaller ones).
        size = int(config.get("grid_size", self.noisy.shape[0]))
        fine = self.noisy.shape[0] > size and self.noisy.shape[0] % size == 0
        self._prefix = prefix_sums(block_sum(self.noisy, self.noisy.shape[0] // size) if fine else self.noisy)
        self._fine_prefix = prefix_sums(self.noisy) if fine else self._prefix
        self._device = pick_device(None)
        self.net.to(self._device)
        self.net.eval()

    @property
    def training_losses(self) -> list[float]:
        return list(self.config.get("training", {}).get("losses", []))

    def answer(self, boxes: np.ndarray) -> np.ndarray:
        from dpcore.models.snh_net import predict_grouped

        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        if b.shape[1] != 4:
            raise SynopsisError(f"boxes must have shape (q, 4), got {b.shape}")
        w = np.maximum(b[:, 2] - b[:, 0], 0.0)
        h = np.maximum(b[:, 3] - b[:, 1], 0.0)
        area = w * h
        r = np.sqrt(area)
        out = np.empty(b.shape[0], dtype=np.float64)
        large = r > self.config["query_sides_m"][1]
        if large.any():
            out[large] = answer_boxes(self._prefix, self.region.bounds_m, b[large])
        small = np.flatnonzero(~large)
        rule = self.config.get("answer", "nets")  # releases saved before the rule existed used the nets
        if small.size and rule == "grid":
            out[small] = self._grid_answers(b[small], r[small])
        elif small.size:
            which = np.abs(r[small, None] - self.sides[None, :]).argmin(axis=1)
            centres = np.stack([(b[small, 0] + b[small, 2]) / 2, (b[small, 1] + b[small, 3]) / 2], axis=1)
            pred = predict_grouped(self.net, normalise_xy(centres, self.region).astype(np.float32), which,
                                   self._device)
            # A count is never negative: a net's negative answer is answered 0 (closer to every truth).
            nets = np.maximum(pred * self.scales[which] * area[small] / self.sides[which] ** 2, 0.0)
            if rule in ("geometric", "blend"):
                # Releases saved before the blend stored no weights: theirs is the geometric rule.
                small_w, large_w = self.config.get("nets_weights", GEOMETRIC_NETS_WEIGHTS)
                a = np.where(r[small] < BLEND_SMALL_SIDE_M, small_w, large_w)
                grid = self._grid_answers(b[small], r[small])
                # 0^0 = 1, so a = 0 gives the grid even where the nets say 0.
                nets = nets ** a * np.maximum(grid, 0.0) ** (1.0 - a)
            out[small] = nets
        if self.config.get("answers_floor_zero", False):  # a flat release's answers below 0 are answered 0
            np.maximum(out, 0.0, out=out)
        return out

    def _grid_answers(self, boxes: np.ndarray, r: np.ndarray) -> np.ndarray:
        """The grid's answers: the fine grid's under BLEND_SMALL_SIDE_M, the (denoised) grid's from it."""
        out = answer_boxes(self._prefix, self.region.bounds_m, boxes)
        tiny = r < BLEND_SMALL_SIDE_M
        if self._fine_prefix is not self._prefix and tiny.any():
            out[tiny] = answer_boxes(self._fine_prefix, self.region.bounds_m, boxes[tiny])
        return out

    def noise_model(self) -> NoiseModel:
        return NoInterval("SNH's neural denoiser is not linear in the noise; its bootstrap is not implemented")

    def caveats(self) -> list[str]:
        dropped = float(self.config.get("dropped_fraction", 0.0))  # releases saved before it recorded none
        if dropped < CAVEAT_DROPPED_FRACTION:
            return []
        return [f"the public denoiser's cap dropped {dropped:.0%} of this release's mass (its noisy counts could "
                "not place it), so its counts are low, most of all in dense areas; for hotspots release with "
                "--param denoiser=none (README: 'Caveat')"]

    def density(self, nx: int, ny: int | None = None) -> np.ndarray:
        """Counts on an (nx, ny) grid: each cell answered as a range query (nets or grid by cell size)."""
        ny = nx if ny is None else ny
        xmin, ymin, xmax, ymax = self.region.bounds_m
        ex = np.linspace(xmin, xmax, nx + 1)
        ey = np.linspace(ymin, ymax, ny + 1)
        x0, y0 = np.meshgrid(ex[:-1], ey[:-1], indexing="ij")
        x1, y1 = np.meshgrid(ex[1:], ey[1:], indexing="ij")
        boxes = np.stack([x0.ravel(), y0.ravel(), x1.ravel(), y1.ravel()], axis=1)
        return self.answer(boxes).reshape(nx, ny)

    def extra_meta(self) -> dict:
        return {"config": self.config}

    def _save_arrays(self, directory: Path) -> list[str]:
        np.savez_compressed(directory / "snh_grid.npz", values=self.noisy)
        np.savez(directory / "snh_weights.npz", **self.net.state_arrays())
        return ["snh_grid.npz", "snh_weights.npz"]

    @classmethod
    def _load_arrays(cls, directory: Path, meta: dict, region: Region, privacy: PrivacyInfo) -> SNHSynopsis:
        from dpcore.models.snh_net import BatchedSineSwishMLP

        config = meta["extra"]["config"]
        with np.load(directory / "snh_grid.npz") as z:
            noisy = z["values"]
        with np.load(directory / "snh_weights.npz") as z:
            arrays = {k: z[k] for k in z.files}
        net = BatchedSineSwishMLP(len(config["sides_m"]), 2, int(config["hidden"]), int(config["depth"]),
                                  float(config["omega0"]))
        net.load_state_arrays(arrays)
        return cls(noisy, net, config, region, privacy)


# Saved releases name their class "dpcore.mechanisms.snh:SNHSynopsis" (synopsis.json's kind); the package
# re-exports it under that name, so releases saved before and after the split load the same way.
SNHSynopsis.__module__ = "dpcore.mechanisms.snh"
