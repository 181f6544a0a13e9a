"""Spatio-temporal synopsis: an (nx, ny, nt) array of released counts over a region and a time window.

Range counts over a box × slot range come from a 3-D prefix table: along time the slot range is a
whole number of slots, so the answer is the 2-D uniformity-assumption answer of the slice-sum
``P[:, :, t1] − P[:, :, t0]``, computed for all queries at once by bilinear interpolation of the
two 2-D prefix tables at the box corners (no loop over queries or cells).
Like every synopsis this is post-processing of noisy output and costs no budget.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpcore.geo import Region
from dpcore.grid.histogram import cumulative_at, resample_grid
from dpcore.synopsis.base import AnswerUnit, PrivacyInfo, Synopsis, SynopsisError
from dpcore.synopsis.noise import Intervals, NoiseModel, model_from_spec
from dpcore.synopsis.scaled_noise import WindowCellNoise

ST_ARRAYS = "st_grid.npz"
ATTACHMENTS = "model_weights.npz"


def prefix_sums_3d(values: np.ndarray) -> np.ndarray:
    """(nx+1, ny+1, nt+1) table P with P[i, j, t] = sum of values[:i, :j, :t]."""
    v = np.asarray(values, dtype=np.float64)
    p = np.zeros((v.shape[0] + 1, v.shape[1] + 1, v.shape[2] + 1), dtype=np.float64)
    np.cumsum(np.cumsum(np.cumsum(v, axis=0), axis=1), axis=2, out=p[1:, 1:, 1:])
    return p


def check_slot_ranges(slot_ranges: np.ndarray, n_slots: int, n_queries: int) -> np.ndarray:
    """(q, 2) int64 [t0, t1) slot ranges, clipped to [0, n_slots]; raises on malformed input."""
    r = np.atleast_2d(np.asarray(slot_ranges))
    if r.ndim != 2 or r.shape[1] != 2:
        raise SynopsisError("slot ranges must be a (q, 2) array of [t0, t1) slot indices")
    if r.shape[0] == 1 and n_queries > 1:
        r = np.repeat(r, n_queries, axis=0)
    if r.shape[0] != n_queries:
        raise SynopsisError(f"{r.shape[0]} slot ranges for {n_queries} boxes")
    if not np.all(np.isfinite(r.astype(np.float64))):
        raise SynopsisError("slot ranges must be finite")
    r = np.clip(r.astype(np.int64), 0, n_slots)
    if np.any(r[:, 1] < r[:, 0]):
        raise SynopsisError("a slot range [t0, t1) needs t1 ≥ t0")
    return r


class SpatioTemporalSynopsis(Synopsis):
    """Released counts ``values[ix, iy, it]`` over the region × ``n_slots`` slots of ``slot_seconds``.

    ``attachments`` are extra float arrays saved beside the counts (e.g. a denoiser's weights, stored
    as numpy so that loading a release never needs torch).
    """

    kind = "spatio_temporal_grid"

    def __init__(self, values: np.ndarray, region: Region, privacy: PrivacyInfo, *,
                 slot_seconds: int | None = None, window_start_s: int | None = None,
                 extra: dict | None = None, attachments: dict[str, np.ndarray] | None = None):
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 3:
            raise SynopsisError(f"SpatioTemporalSynopsis values must be 3-D (nx, ny, nt), got shape {v.shape}")
        self.values = v
        self.region = region
        self.privacy = privacy
        self.slot_seconds = None if slot_seconds is None else int(slot_seconds)
        self.window_start_s = None if window_start_s is None else int(window_start_s)
        self._extra = dict(extra or {})
        self.attachments = dict(attachments or {})
        self._prefix = prefix_sums_3d(v)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.values.shape  # type: ignore[return-value]

    @property
    def n_slots(self) -> int:
        return int(self.values.shape[2])

    # -- queries --------------------------------------------------------------------------------
    def answer_st(self, boxes: np.ndarray, slot_ranges: np.ndarray) -> np.ndarray:
        """Counts in (q, 4) boxes [xmin, ymin, xmax, ymax] (metres) × (q, 2) slot ranges [t0, t1).

        A single slot range is broadcast to all boxes. Partly covered cells count pro rata
        (uniformity); slots count whole.
        """
        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        if b.ndim != 2 or b.shape[1] != 4:
            raise SynopsisError("boxes must be a (q, 4) array [xmin, ymin, xmax, ymax]")
        r = check_slot_ranges(slot_ranges, self.n_slots, b.shape[0])
        xmin, ymin, xmax, ymax = self.region.bounds_m
        nx, ny = self.values.shape[:2]
        gx0 = (b[:, 0] - xmin) * (nx / (xmax - xmin))
        gx1 = (b[:, 2] - xmin) * (nx / (xmax - xmin))
        gy0 = (b[:, 1] - ymin) * (ny / (ymax - ymin))
        gy1 = (b[:, 3] - ymin) * (ny / (ymax - ymin))
        p = self._prefix

        def corner(gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
            # Mass below-left of (gx, gy) in slots [t0, t1): difference of two 2-D prefix tables,
            # each interpolated bilinearly (exact under the uniformity assumption).
            return cumulative_at(p, gx, gy, r[:, 1]) - cumulative_at(p, gx, gy, r[:, 0])

        return corner(gx1, gy1) - corner(gx0, gy1) - corner(gx1, gy0) + corner(gx0, gy0)

    def answer_st_time(self, boxes: np.ndarray, start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
        """Counts in boxes × epoch-second windows [start, end); partly covered slots count pro rata
        (uniformity in time, like partly covered cells in space)."""
        if self.slot_seconds is None or self.window_start_s is None:
            raise SynopsisError("this release records no time window; give slot indices instead")
        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        n = b.shape[0]
        g0 = np.broadcast_to((np.asarray(start_s, dtype=np.float64) - self.window_start_s) / self.slot_seconds, (n,))
        g1 = np.broadcast_to((np.asarray(end_s, dtype=np.float64) - self.window_start_s) / self.slot_seconds, (n,))
        if np.any(g1 < g0):
            raise SynopsisError("a time window needs end ≥ start")
        g0 = np.clip(g0, 0, self.n_slots)
        g1 = np.clip(g1, 0, self.n_slots)

        def upto(g: np.ndarray) -> np.ndarray:
            # Mass in slots [0, g): whole slots plus the covered fraction of the next one.
            t = np.minimum(np.floor(g).astype(np.int64), self.n_slots - 1)
            frac = g - t
            zero = np.zeros_like(t)
            whole = self.answer_st(b, np.stack([zero, t], axis=1))
            part = self.answer_st(b, np.stack([t, t + 1], axis=1))
            return whole + frac * part

        return upto(g1) - upto(g0)

    def unit(self) -> AnswerUnit:
        """Full point counts when the release was scaled to a public total, else as the privacy unit says."""
        if self._extra.get("public_total") is not None or float(self._extra.get("scale_factor") or 1.0) != 1.0:
            return AnswerUnit("points")
        return super().unit()

    def noise_model(self) -> NoiseModel | WindowCellNoise:
        """The model the mechanism stored (cells × slots with their law), or NoInterval and why."""
        if getattr(self, "_noise_model", None) is None:
            self._noise_model = model_from_spec(self._extra.get("noise_model"), self,
                                                "this release was saved before releases stored their noise model")
        return self._noise_model

    def window_intervals(self, boxes: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                         level: float = 0.95) -> tuple[np.ndarray, Intervals]:
        """(estimates, intervals) of box × [start, end) counts, every box at once."""
        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        est = self.answer_st_time(b, start_s, end_s)
        model = self.noise_model()
        if not isinstance(model, WindowCellNoise):
            return est, model.intervals(b, est, level)
        n = b.shape[0]
        g0 = np.broadcast_to((np.asarray(start_s, dtype=np.float64) - self.window_start_s) / self.slot_seconds, (n,))
        g1 = np.broadcast_to((np.asarray(end_s, dtype=np.float64) - self.window_start_s) / self.slot_seconds, (n,))
        return est, model.intervals(b, np.clip(g0, 0, self.n_slots), np.clip(g1, 0, self.n_slots), est, level)

    def intervals(self, boxes_m: np.ndarray, level: float = 0.95, spread: bool = True) -> tuple[np.ndarray, Intervals]:
        """Intervals over the whole window."""
        if self.window_start_s is None or self.slot_seconds is None:
            return super().intervals(boxes_m, level, spread)
        b = np.atleast_2d(np.asarray(boxes_m, dtype=np.float64))
        start = float(self.window_start_s)
        end = start + float(self.slot_seconds) * self.n_slots
        return self.window_intervals(b, np.full(len(b), start), np.full(len(b), end), level)

    def answer(self, boxes: np.ndarray) -> np.ndarray:
        """Counts in boxes over the whole window."""
        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        return self.answer_st(b, np.array([[0, self.n_slots]]))

    def answer_st_latlon(self, boxes_latlon: np.ndarray, slot_ranges: np.ndarray) -> np.ndarray:
        return self.answer_st(self.region.box_latlon_to_m(boxes_latlon), slot_ranges)

    def slots_for_times(self, start_s: int, end_s: int) -> tuple[int, int]:
        """[t0, t1) slots covering epoch seconds [start, end); needs the window recorded at fit time."""
        if self.slot_seconds is None or self.window_start_s is None:
            raise SynopsisError("this release records no time window; give slot indices instead")
        t0 = (int(start_s) - self.window_start_s) // self.slot_seconds
        t1 = -((self.window_start_s - int(end_s)) // self.slot_seconds)  # ceiling division
        return int(np.clip(t0, 0, self.n_slots)), int(np.clip(t1, 0, self.n_slots))

    def density(self, nx: int, ny: int | None = None) -> np.ndarray:
        """Counts summed over the window on an (nx, ny) grid."""
        ny = nx if ny is None else ny
        total = self.values.sum(axis=2)
        if (nx, ny) == total.shape:
            return total
        return resample_grid(total, nx, ny)

    def density_st(self, nx: int, ny: int | None = None) -> np.ndarray:
        """(nx, ny, nt) counts, re-gridded in space (mass preserving) when the shape differs."""
        ny = nx if ny is None else ny
        if (nx, ny) == self.values.shape[:2]:
            return self.values.copy()
        return np.stack([resample_grid(self.values[:, :, t], nx, ny) for t in range(self.n_slots)], axis=2)

    def series(self, boxes: np.ndarray) -> np.ndarray:
        """(q, nt) per-slot counts of each box: the released time series a forecast is fitted on."""
        b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
        q, t = b.shape[0], self.n_slots
        starts = np.tile(np.arange(t), q)
        ranges = np.stack([starts, starts + 1], axis=1)
        return self.answer_st(np.repeat(b, t, axis=0), ranges).reshape(q, t)

    # -- persistence ----------------------------------------------------------------------------
    def extra_meta(self) -> dict:
        return {**self._extra, "shape": list(self.values.shape), "slot_seconds": self.slot_seconds,
                "window_start_s": self.window_start_s, "attachments": sorted(self.attachments)}

    def _save_arrays(self, directory: Path) -> list[str]:
        # float64 so that a loaded release answers bit-for-bit like the one that was fitted.
        np.savez_compressed(directory / ST_ARRAYS, values=self.values)
        files = [ST_ARRAYS]
        if self.attachments:
            np.savez_compressed(directory / ATTACHMENTS, **self.attachments)
            files.append(ATTACHMENTS)
        return files

    @classmethod
    def _load_arrays(cls, directory: Path, meta: dict, region: Region,
                     privacy: PrivacyInfo) -> SpatioTemporalSynopsis:
        path = directory / ST_ARRAYS
        if not path.exists():
            raise SynopsisError(f"{directory} lacks {ST_ARRAYS}")
        with np.load(path) as z:
            values = z["values"].astype(np.float64)
        attachments = {}
        if (directory / ATTACHMENTS).exists():
            with np.load(directory / ATTACHMENTS) as z:
                attachments = {k: z[k] for k in z.files}
        extra = dict(meta.get("extra", {}))
        slot_seconds = extra.pop("slot_seconds", None)
        window_start_s = extra.pop("window_start_s", None)
        for key in ("shape", "attachments"):
            extra.pop(key, None)
        return cls(values, region, privacy, slot_seconds=slot_seconds, window_start_s=window_start_s,
                   extra=extra, attachments=attachments)


__all__ = ["SpatioTemporalSynopsis", "check_slot_ranges", "prefix_sums_3d"]
