"""Scaling a user-level release of the k-bounded sample to full counts.

A user-level release counts at most k points per user, so its totals fall short of the data's.
Scaling by N / n̂ restores full counts, where
- N, the region's total point count, must be *public* (configuration or a published figure): under
  user-level privacy its sensitivity is unbounded, so it cannot be estimated with noise at any
  useful accuracy. Its source is recorded.
- n̂, the size of the bounded sample, is estimated with a stated fraction of ε (a discrete-Laplace
  count of sensitivity k), recorded as the charge ``sample_total_for_scaling``. Using the
  synopsis's own total instead would be free but, for a fine identity grid, its noise (the sum
  of every cell's noise) swamps the total at small ε. n̂ is clamped to [k/ε_n, N] (post-processing)
  and handed to the mechanism as ``FitInput.sample_size`` (with its noise variance), so mechanisms that
  size a grid from n (UG, AG, HB, SNH, auto) do not pay for the same count twice, and SNH's pyramid
  can weigh it against its own total.

Under weighted bounding (``FitInput.weights``: every point weighs min(1, k/n_u)) the release counts
weight, not points, so n̂ estimates the weight sum Σw (sensitivity k: a person's weights add up to
≤ k), with discrete Laplace noise on the weights' lattice, and the factor is N / n̂ as before. In
expectation the k-sample keeps exactly those weights (a point is in a uniform k-subset with probability
min(1, k/n_u)), so both boundings scale the same way; the weighted one has no sampling noise.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dpcore.geo import Region
from dpcore.privacy.budget import Accountant, check_epsilon
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.profile import PROFILE_BUCKETS, TAIL_BUCKETS, ContributionProfile
from dpcore.synopsis.base import AnswerUnit, PrivacyInfo, Synopsis, load_synopsis
from dpcore.synopsis.noise import Intervals, NoInterval, NoiseLaw, NoiseModel
from dpcore.synopsis.scaled_noise import ScaledNoise

if TYPE_CHECKING:  # the caller builds the mechanism: privacy never imports the mechanisms above it
    from dpcore.mechanisms.base import Mechanism
    from dpcore.mechanisms.inputs import PointsInput

#: Share of ε spent on n̂ when a user-level release is scaled to full counts. n̂'s relative error is
#: ≈ √2·k/(f·ε·n); at 5% it reached ~100% on the SF cabs (537 users, k = 50, ε = 0.05) and blew the
#: factor up, so 10% trades a little mechanism noise for a usable factor.
DEFAULT_SCALE_FRACTION = 0.10


class ScaledSynopsis(Synopsis):
    """An inner synopsis of the bounded sample multiplied by factor = N / n̂ (post-processing)."""

    kind = "scaled"

    def __init__(self, inner: Synopsis, factor: float, total_points: float, total_source: str,
                 privacy: PrivacyInfo | None = None, profile: dict | None = None):
        self.inner = inner
        self.factor = float(factor)
        self.total_points = float(total_points)
        self.total_source = total_source
        self.region = inner.region
        self.privacy = privacy or inner.privacy
        #: the paid contribution profile (ContributionProfile.to_dict()) when the factor is 1/κ̂ from it
        self.profile = profile

    def answer(self, boxes: np.ndarray) -> np.ndarray:
        return self.inner.answer(boxes) * self.factor

    def density(self, nx: int, ny: int | None = None) -> np.ndarray:
        return self.inner.density(nx, ny) * self.factor

    def caveats(self) -> list[str]:
        return self.inner.caveats()

    def unit(self) -> AnswerUnit:
        return AnswerUnit("points")

    def noise_model(self) -> NoiseModel:
        """The inner release's model and the factor's law: 1/κ̂ given the paid contribution profile (with the
        bounding's bias from box to box), or N/n̂ with n̂'s discrete Laplace law (the
        ``sample_total_for_scaling`` charge), clamped as :func:`fit_scaled` clamps it. Built once per release."""
        if self.__dict__.get("_model") is None:
            self.__dict__["_model"] = self._build_noise_model()
        return self.__dict__["_model"]

    def _build_noise_model(self) -> NoiseModel:
        inner = self.inner.noise_model()
        if isinstance(inner, NoInterval):
            return NoInterval(f"a release scaled to full counts whose inner release has no exact law ({inner.reason})")
        if self.profile is not None:
            return ProfiledNoise(inner, ContributionProfile.from_dict(self.profile), int(self.profile["k"]))
        paid = next((c for c in self.privacy.charges if c.get("name") == "sample_total_for_scaling"), None)
        if paid is None or paid.get("noise") != "discrete_laplace" or not paid.get("epsilon"):
            return NoInterval("the scale factor's noise (sample_total_for_scaling) is not recorded")
        law = NoiseLaw("laplace", float(paid["sensitivity"]) / float(paid["epsilon"]), float(paid.get("quantum") or 1.0))
        return ScaledNoise(inner, law, self.total_points / self.factor, self.total_points, max(law.param, 1.0))

    def spread_model(self):
        return self.inner.spread_model()

    def intervals(self, boxes_m: np.ndarray, level: float = 0.95, spread: bool = True) -> tuple[np.ndarray, Intervals]:
        from dpcore.synopsis.spread import widen

        boxes = np.atleast_2d(np.asarray(boxes_m, dtype=np.float64))
        inner_est = self.inner.answer(boxes)
        est = inner_est * self.factor
        model = self.noise_model()
        cells = self.spread_model() if spread else None
        halfwidths = None
        if cells is not None and not isinstance(model, NoInterval):
            halfwidths = cells.halfwidths(boxes, level, kept=1.0 / self.factor if self.profile is not None else 1.0)
        if isinstance(model, ProfiledNoise):
            iv = model.intervals(boxes, est, level, inner_est=inner_est,
                                 spread_above=None if halfwidths is None else halfwidths[1])
        elif isinstance(model, ScaledNoise):
            iv = model.intervals(boxes, est, level, inner_est=inner_est)
        else:
            iv = model.intervals(boxes, est, level)
        return est, widen(iv, est, cells, boxes, level, self.factor, halfwidths)


    def __getattr__(self, name: str):
        if name in ("inner", "factor") or name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self.inner, name)
        # Extended count queries of the inner synopsis (e.g. spatio-temporal) are scaled as well.
        if name.startswith("answer"):
            return lambda *a, **k: attr(*a, **k) * self.factor
        return attr

    def extra_meta(self) -> dict:
        meta = {"factor": self.factor, "total_points": self.total_points, "total_source": self.total_source}
        if self.profile is not None:
            meta["profile"] = self.profile
        return meta

    def _save_arrays(self, directory: Path) -> list[str]:
        return [f"inner/{f}" for f in self.inner.save(directory / "inner")]

    @classmethod
    def _load_arrays(cls, directory: Path, meta: dict, region: Region, privacy: PrivacyInfo) -> ScaledSynopsis:
        extra = meta["extra"]
        return cls(load_synopsis(directory / "inner"), extra["factor"], extra["total_points"],
                   extra["total_source"], privacy, extra.get("profile"))


#: Chance that noise alone lifts an empty bucket over the threshold that continues a scale factor's reach.
REACH_FALSE_RATE = 0.25


def reach_bucket(profile: ContributionProfile) -> int:
    """The highest bucket the upper end of a scale factor's interval counts: TAIL_BUCKETS above the end of
    the run of buckets, from the highest visible one (or the largest) up, whose noisy counts each clear
    the threshold noise alone passes with probability REACH_FALSE_RATE. The estimate stops TAIL_BUCKETS
    above the highest visible bucket (``ContributionProfile.top_bucket``): at ε_p 0.1 a bucket needs 55
    people to be visible, and the Gowalla sample's Austin (357 people) shows [… 53 74 52 23 18 10 −1 …]
    where buckets [256, 512) and up held 41 people and 60% of the points. Over 40 profiles the factor's
    interval held the true 1/κ for 42% (Austin) and 25% (San Francisco); with the upper end reaching this
    far, 95% and 93% (REACH_FALSE_RATE fitted there; 0.05 gave 90% and 75%), and 95% on Gowalla NYC (held
    out; 90% before). bench/factor_interval.py, bench/results/2026-11-28-coverage-4.md. Reads only the
    noisy profile: post-processing."""
    # from the highest visible bucket, or from bucket 0 where none is visible (a profile of a few hundred
    # people may show none at ε_p 0.1: its estimate then counts buckets 0 and 1 only). Not from the largest
    # noisy count: on a day of a few dozen people the largest of 24 buckets' noise often tops every real
    # bucket, and a run from bucket 21 reached 1/κ up to 10⁵ (Gowalla NYC 2010-01-19, 28 people in
    # bucket 0: a 4 km square's interval [−2, 474,481] around 5).
    j = max(profile.visible_top(), 0)
    threshold = math.log(1.0 / (2.0 * REACH_FALSE_RATE)) / float(profile.epsilon)
    while j + 1 < PROFILE_BUCKETS and profile.noisy[j + 1] >= threshold:
        j += 1
    return int(min(PROFILE_BUCKETS - 1, max(j + TAIL_BUCKETS, profile.top_bucket())))


class ProfiledNoise(NoiseModel):
    """Full counts 1/κ̂·û from a paid contribution profile (dpcore.privacy.profile): plausible full counts
    f*·(û + e*) + b*, with e* the inner release's noise (symmetric: û + e* is as likely a bounded count as
    û − e*), f* the factor given the noisy profile and b* the bounding's bias that varies from box to box
    (normal, sd BIAS_SHARE × ContributionProfile.cell_bias_sd of the box's bounded count: below the answer
    at û, above it at the bounded count the upper end stands for, û plus its noise's and spread's
    half-widths, since a box holding more than its answer says holds more people). In closed form, every
    box at once: each side's half-width adds in quadrature the inner interval's (times the median factor),
    the factor's own quantile's distance from its median (times û) and the bias's normal quantile, as
    independent errors' do. It covers the noise and the bias of bounding each person to k points, as far
    as the profile tells it."""

    covers = "noise and bounding bias"
    DRAWS = 4000
    #: The bounding's bias sd as a share of cell_bias_sd's widest case (every person's points in the box).
    #: On Gowalla NYC the widest case alone covered 0.93–0.96 of boxes' full-minus-scaled-bounded counts (the
    #: sampling-only model 0.08–0.45); 0.6 with the spread's BOUNDED_SHARE fitted NYC but under-covered the
    #: held-out Gowalla sample's cities more (bench/results/2026-11-28-coverage-2.md), so it stays whole.
    BIAS_SHARE = 1.0

    def __init__(self, inner: NoiseModel, profile: ContributionProfile, k: int, seed: int = 0):
        self.inner, self.profile, self.k = inner, profile, k
        self._factor = profile.factor_draws(k, self.DRAWS, np.random.default_rng(seed))
        self._median = float(np.median(self._factor))
        # people the profile's noise may hide above its top bucket only add points: the factor's upper end
        # reaches as far up as they may be (reach_bucket), its lower end and centre stay the estimate's
        self._reach = profile.factor_draws(k, self.DRAWS, np.random.default_rng(seed), top=reach_bucket(profile))
        self.method = (f"1/κ̂·û with û's noise ({inner.method}), κ̂'s given the paid contribution profile (its "
                       "quantiles over the profile's noise), and the bounding's bias from box to box, added in "
                       "quadrature; covers the noise and the bias of bounding each person to k points")

    def moments(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("a full count's error is skewed; use intervals()")

    def intervals(self, boxes: np.ndarray, est: np.ndarray, level: float = 0.95,
                  inner_est: np.ndarray | None = None, spread_above: np.ndarray | None = None) -> Intervals:
        """``spread_above``: the spread's half-width above each answer, in bounded counts (0 when None)."""
        from statistics import NormalDist

        u = est / self._median if inner_est is None else inner_est
        iv = self.inner.intervals(boxes, u, level)
        f_lo, f_hi = np.quantile(self._factor, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
        f_hi = max(f_hi, float(np.quantile(self._reach, (1.0 + level) / 2.0)))
        z = NormalDist().inv_cdf((1.0 + level) / 2.0) * self.BIAS_SHARE
        u_hi = iv.upper if spread_above is None else iv.upper + spread_above
        bias_lo = z * self.profile.cell_bias_sd(self.k, u)
        bias_hi = z * self.profile.cell_bias_sd(self.k, u_hi)
        pos = np.maximum(u, 0.0)
        centre = self._median * u
        below = np.sqrt((self._median * (u - iv.lower)) ** 2 + ((self._median - f_lo) * pos) ** 2 + bias_lo ** 2)
        above = np.sqrt((self._median * (iv.upper - u)) ** 2 + ((f_hi - self._median) * pos) ** 2 + bias_hi ** 2)
        noise = (self._median * (u - iv.lower), self._median * (iv.upper - u))
        return Intervals(centre - below, centre + above, self.method, noise)

    def sd(self, boxes: np.ndarray) -> np.ndarray:
        return self.inner.sd(boxes) * self._median


def fit_scaled(mech: Mechanism, data: PointsInput, epsilon: float, noise: NoiseSource,
               total_points: float, total_source: str,
               scale_fraction: float = DEFAULT_SCALE_FRACTION) -> ScaledSynopsis:
    """Fit a user-level release with (1 − f)·ε and spend f·ε on n̂; the charges add up to ε."""
    eps = check_epsilon(epsilon)
    if data.privacy_unit != "user":
        raise ValueError("scaling to full counts applies to user-level releases only")
    if not (0 < scale_fraction < 1):
        raise ValueError("scale_fraction must be in (0, 1)")
    acct = Accountant(eps, count_quantum=data.count_quantum)
    what = "Σ weights" if data.weighted else "|bounded sample|"
    eps_n = acct.spend_fraction("sample_total_for_scaling", scale_fraction, data.sensitivity,
                                note=f"n̂ = {what} + DLap(k/ε_n); scales the release to the public total")
    raw_n_hat = float(data.add_count_noise(np.array([data.mass]), eps_n, noise)[0])
    # Post-processing with public quantities only: the sample is never larger than the full data
    # (factor ≥ 1), and an estimate below one noise scale (k/ε_n) says nothing about n, so it is
    # floored there; otherwise a draw near 0 at tiny ε would multiply every answer by up to N.
    n_hat = min(max(raw_n_hat, data.sensitivity / eps_n, 1.0), float(total_points))
    # n̂ is already a paid DP estimate of the sample size, so the mechanism may reuse it instead of
    # spending a second share of ε on the same count.
    data = dataclasses.replace(data, sample_size=n_hat, sample_size_variance=data.count_noise_variance(eps_n))
    input_type = mech.tags.input_type
    inner = mech.fit(data if isinstance(data, input_type) else input_type.from_sample(data.to_sample()),
                     acct.remaining, noise)
    charges = acct.to_list() + inner.privacy.charges
    p = inner.privacy
    privacy = PrivacyInfo(p.mechanism, p.params, eps, charges, p.privacy_unit, p.sensitivity,
                          p.max_points_per_user, p.noise_source,
                          [*p.notes, f"scaled to full counts: factor N/n̂ with N={total_points:g} ({total_source}), "
                                     f"n̂ a DP estimate of the {'weight sum' if data.weighted else 'sample size'}"])
    return ScaledSynopsis(inner, float(total_points) / n_hat, total_points, total_source, privacy)


def fit_profiled(mech: Mechanism, data: PointsInput, epsilon: float, noise: NoiseSource,
                 profile: ContributionProfile, profile_note: str = "") -> ScaledSynopsis:
    """Fit a user-level release with ε − ε_p and scale it to full counts by 1/κ̂(k) from the paid
    contribution profile (dpcore.privacy.profile), whose charge ε_p is recorded here. The profile was
    noised once for the whole run (every region of it): each region's release records the same charge,
    as each records the run's one bounding."""
    eps = check_epsilon(epsilon)
    if data.privacy_unit != "user":
        raise ValueError("scaling to full counts applies to user-level releases only")
    if not 0 < profile.epsilon < eps:
        raise ValueError("the profile's ε must be a part of the release's")
    acct = Accountant(eps, count_quantum=data.count_quantum)
    unit = "person and UTC day" if profile.per_day else "person"
    acct.spend("contribution_profile", profile.epsilon, 1.0,
               note=f"units per bucket [2^j, 2^(j+1)) of points per {unit}, + DLap(1/ε_p); one histogram for "
                    "the whole run; it gives the kept fraction κ̂ and N̂" + (f"; {profile_note}" if profile_note else ""))
    k = int(data.max_points_per_user)
    factor = profile.factor(k)
    total = profile.total_estimate()
    input_type = mech.tags.input_type
    inner = mech.fit(data if isinstance(data, input_type) else input_type.from_sample(data.to_sample()),
                     acct.remaining, noise)
    p = inner.privacy
    note = (f"scaled to full counts: factor 1/κ̂ = {factor:.4g}, κ̂ = the share of points a bound of k = {k} keeps, "
            f"from the paid contribution profile (N̂ = {total:.6g} points in the run)")
    privacy = PrivacyInfo(p.mechanism, p.params, eps, acct.to_list() + p.charges, p.privacy_unit, p.sensitivity,
                          p.max_points_per_user, p.noise_source, [*p.notes, note])
    return ScaledSynopsis(inner, factor, total, "estimated from the paid contribution profile",
                          privacy, {**profile.to_dict(), "k": k})
