"""Noise models of answers scaled by a noisy factor (N/n̂ from a paid sample size), and of space × time
grids: the factor's law is shared by every box, so each box's interval is a quantile of a mixture over
FACTOR_NODES values of it, solved for all boxes at once."""

from __future__ import annotations

from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from dpcore.synopsis.noise import (
    Intervals,
    NoInterval,
    NoiseLaw,
    NoiseModel,
    axis_power_sum,
    draw_noise,
    terms,
)

if TYPE_CHECKING:
    from dpcore.synopsis.base import Synopsis


class ScaledNoise(NoiseModel):
    """ŷ = N·û/n̂: the inner release's error and n̂'s discrete Laplace noise (clamped to [floor, N] as the
    fit clamps it) re-drawn around the released values. The interval is for N·u/n, the bounded sample's
    count scaled by its true size, from the error's first four moments (Cornish–Fisher)."""

    covers = "noise"
    DRAWS = 20000

    def __init__(self, inner: NoiseModel, n_law: NoiseLaw, n_hat: float, total: float, floor: float,
                 seed: int = 0):
        self.inner, self.n_law, self.n_hat, self.total, self.floor = inner, n_law, n_hat, total, floor
        rng = np.random.default_rng(seed)
        n_star = np.clip(n_hat + draw_noise(rng, n_law, self.DRAWS), floor, total)
        r = total / n_star
        self._r = r
        self.method = ("parametric bootstrap of the scaled answer N·û/n̂ over û's noise law and n̂'s; "
                       "covers the noise, not the bias of bounding each person to k points")

    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("a scaled answer's error is skewed; use intervals()")

    def intervals(self, boxes: np.ndarray, est: np.ndarray, level: float = 0.95,
                  inner_est: np.ndarray | None = None) -> Intervals:
        if isinstance(self.inner, NoInterval):
            nan = np.full(len(boxes), np.nan)
            return Intervals(nan, nan.copy(), self.inner.method)
        u = est * self.n_hat / self.total if inner_est is None else inner_est
        iv = self.inner.intervals(boxes, u, level)
        lo, hi = mixture_quantiles(self._r, u, (iv.upper - iv.lower) / 2.0, level)
        # the basic bootstrap: the re-drawn error's quantiles, turned around the released answer
        return Intervals(2.0 * est - hi, 2.0 * est - lo, self.method)

    def sd(self, boxes: np.ndarray) -> np.ndarray:
        return self.inner.sd(boxes) * self.total / self.n_hat


#: Equal-mass nodes of the scale factor's law in a scaled answer's mixture.
FACTOR_NODES = 32


def mixture_quantiles(r: np.ndarray, u: np.ndarray, halfwidth: np.ndarray, level: float,
                      extra_sd: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (1 ∓ level)/2 quantiles of r·(u + X) + B over independent r (draws of a positive factor, shared by
    every box), X (a box's symmetric error, read as normal with the sd that puts its (1 + level)/2
    quantile at ``halfwidth``) and B (normal, sd ``extra_sd``, 0 when None):
    P(· ≤ c) = E_r[Φ((c − r·u)/√(r²s² + σ_B²))], r on FACTOR_NODES equal-mass nodes, solved by bisection."""
    from scipy.special import ndtr

    u = np.asarray(u, dtype=np.float64)
    extra = np.zeros_like(u) if extra_sd is None else np.broadcast_to(np.asarray(extra_sd, dtype=np.float64),
                                                                        u.shape)
    chunk = 32768  # bounded memory: (boxes × nodes) per step
    if len(u) > chunk:
        parts = [mixture_quantiles(r, u[i:i + chunk], halfwidth[i:i + chunk], level, extra[i:i + chunk])
                 for i in range(0, len(u), chunk)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    nodes = np.quantile(r, (np.arange(FACTOR_NODES) + 0.5) / FACTOR_NODES)[None, :]
    z = NormalDist().inv_cdf((1.0 + level) / 2.0)
    s = np.asarray(halfwidth, dtype=np.float64)[:, None] / z
    sd = np.maximum(np.sqrt((nodes * s) ** 2 + extra[:, None] ** 2), 1e-12)
    centre = nodes * u[:, None]
    lo0 = (centre - 12 * sd).min(axis=1)
    hi0 = (centre + 12 * sd).max(axis=1)
    out = []
    for target in ((1.0 - level) / 2.0, (1.0 + level) / 2.0):
        lo, hi = lo0.copy(), hi0.copy()
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            below = ndtr((mid[:, None] - centre) / sd).mean(axis=1) < target
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out.append(0.5 * (lo + hi))
    return out[0], out[1]


class WindowCellNoise:
    """A space × time grid whose cells carry independent noise of one law, times a scale factor (N/n̂ when
    the release was scaled to a public total with a paid n̂, whose law re-draws too): intervals of
    box × time-window counts, cells and slots covered pro rata."""

    def __init__(self, law: NoiseLaw, shape: tuple[int, int, int], bounds: tuple[float, float, float, float],
                 factor: float = 1.0, n_law: NoiseLaw | None = None, n_hat: float | None = None,
                 total: float | None = None, slot_factor: int = 1):
        self.law, self.shape, self.bounds, self.slot_factor = law, shape, bounds, int(slot_factor)
        self.factor, self.n_law, self.n_hat, self.total = float(factor), n_law, n_hat, total
        self.covers = "noise"
        if self.factor == 1.0 or n_law is None:
            self.method = f"exact noise law ({law.words()}) over the cells and slots, tabulated quantiles"
        else:
            self.method = ("parametric bootstrap of the scaled answer N·û/n̂ over the cells' exact noise law and "
                           "n̂'s; covers the noise, not the bias of bounding each person to k points")

    def intervals(self, boxes: np.ndarray, g0: np.ndarray, g1: np.ndarray, est: np.ndarray,
                  level: float = 0.95) -> Intervals:
        """``g0``, ``g1``: the window in slot units (fractional, clipped to the release)."""
        xmin, ymin, xmax, ymax = self.bounds
        nx, ny, nt = self.shape
        # the noise sits on merged slots of slot_factor released slots each (the last one shorter)
        f = self.slot_factor
        merged = -(-nt // f)

        def to_merged(g: np.ndarray) -> np.ndarray:
            j = np.minimum(np.floor(g / f), merged - 1)
            return j + (g - j * f) / np.minimum(f, nt - j * f)

        m0, m1 = to_merged(np.asarray(g0, dtype=np.float64)), to_merged(np.asarray(g1, dtype=np.float64))
        s = {}
        for p in (2, 4):
            s[p] = (axis_power_sum(boxes[:, 0], boxes[:, 2], nx, (xmin, xmax), p)
                    * axis_power_sum(boxes[:, 1], boxes[:, 3], ny, (ymin, ymax), p)
                    * axis_power_sum(m0, m1, merged, (0.0, float(merged)), p))
        var, m = self.law.variance * s[2], terms(s[2], s[4])
        if self.factor == 1.0 or self.n_law is None:
            h = self.law.halfwidth(level, var, m)
            return Intervals(est - h, est + h, self.method)
        r = np.maximum(1.0, self.n_hat + draw_noise(np.random.default_rng(0), self.n_law, ScaledNoise.DRAWS))
        lo, hi = mixture_quantiles(self.total / r, est / self.factor, self.law.halfwidth(level, var, m), level)
        return Intervals(2.0 * est - hi, 2.0 * est - lo, self.method)

    def spec(self) -> dict:
        return {"kind": f"{__name__}:WindowCellNoise", "law": self.law.to_dict(), "factor": self.factor,
                "n_law": None if self.n_law is None else self.n_law.to_dict(), "n_hat": self.n_hat,
                "total": self.total, "slot_factor": self.slot_factor}

    @classmethod
    def from_spec(cls, spec: dict, synopsis: Synopsis) -> WindowCellNoise:
        n_law = spec.get("n_law")
        return cls(NoiseLaw.from_dict(spec["law"]), synopsis.shape, synopsis.region.bounds_m,
                   float(spec.get("factor") or 1.0), None if n_law is None else NoiseLaw.from_dict(n_law),
                   spec.get("n_hat"), spec.get("total"), int(spec.get("slot_factor") or 1))


