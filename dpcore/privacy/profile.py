"""The contribution profile: a DP histogram of points per person, paid once per release.

Each bounding unit (a person, or a person and UTC day under per-day bounding) falls in one bucket of
its point count in the release: buckets [2^j, 2^(j+1)) for j = 0 … PROFILE_BUCKETS − 1, the last one
open. Adding or removing one unit changes one bucket by 1, so the histogram has L1 sensitivity 1 and
takes discrete Laplace noise of scale 1/ε_p. Everything below reads only the noisy histogram and
public quantities (k, ε): post-processing.

From it:
- N̂, the total points, and K̂(k), the points a k-bound keeps; their ratio κ(k) = K̂/N̂ is the kept
  fraction, and a bounded answer divided by κ estimates a full count;
- the uncertainty of 1/κ from the profile's noise and from where counts lie inside a bucket (a
  parametric bootstrap, :meth:`ContributionProfile.factor_draws`);
- the spread of a box's full count around its bounded count / κ (:meth:`ContributionProfile.cell_bias_sd`),
  the bounding's bias that varies from box to box.

Within a bucket, counts follow a density ∝ n^−α whose α comes from the ratio of the bucket's count to
the next one's (:func:`tail_slopes`; the bootstrap recomputes it on each draw). The profile cannot see a bucket holding fewer people
than its noise: buckets more than TAIL_BUCKETS above the highest bucket that clears
:func:`visible_threshold` are taken as empty, and so is a visible bucket above the largest that
no run of non-empty-looking buckets, each at most TAIL_BUCKETS above the last, reaches from the largest,
unless a visible one is that close below it (:meth:`ContributionProfile.visible_top`;
docs/decisions/0018-contribution-profile.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance

#: Share of a user-level release's ε spent on the profile when no public total is declared. It replaces
#: the 10% that scaling by a public total spends on n̂ (dpcore.privacy.scaling).
PROFILE_FRACTION = 0.10
#: Buckets [2^j, 2^(j+1)), j < 24; the last also holds every larger count (16.7 M points a unit).
PROFILE_BUCKETS = 24
#: Buckets above the highest visible one that still count (noisy, clamped at 0); higher ones are taken
#: as empty.
TAIL_BUCKETS = 2
#: Draws behind the point estimates (their median).
ESTIMATE_DRAWS = 4001
#: Chance that noise alone lifts an empty bucket over the visibility threshold, over all buckets.
VISIBLE_FALSE_RATE = 0.05

UNIT_WORDS = {False: "person", True: "person and UTC day"}

#: Draws a profile keeps (:meth:`ContributionProfile.draws`): the verdict tries up to 30 options on one profile
#: (dpcore.synopsis.profile_verdict.what_would_help), most with the same k, each drawing from a fresh generator of
#: the same seed.
DRAWN_KEPT = 16


def _exponent(n: np.ndarray) -> np.ndarray:
    """e with n = m·2^e, ½ ≤ m < 1, of each count n (0 for 0): ⌊log2 n⌋ + 1, exact for every count below
    2^53. frexp reads the float's exponent bits, where log2 computes a logarithm (3-4× the CPU a row)."""
    return np.frexp(n.astype(np.float64))[1]


def bucket_of(points_per_unit: np.ndarray) -> np.ndarray:
    """Bucket index ⌊log2 n⌋ (capped at the last bucket) of each unit's point count n ≥ 1."""
    n = np.asarray(points_per_unit, dtype=np.int64)
    if n.size and n.min() < 1:
        raise ValueError("a unit in the profile has at least one point")
    return np.minimum(_exponent(n) - 1, PROFILE_BUCKETS - 1).astype(np.int64)


def profile_counts(points_per_unit: np.ndarray, skip_empty: bool = False) -> np.ndarray:
    """Units per bucket (private: the data's own histogram; it leaves the data pass only noised).
    ``skip_empty``: ``points_per_unit`` is a table by code in which codes with no point are no unit, left out."""
    n = np.asarray(points_per_unit, dtype=np.int64)
    if not skip_empty:
        return np.bincount(bucket_of(n), minlength=PROFILE_BUCKETS).astype(np.int64)
    if n.size and n.min() < 0:
        raise ValueError("a point count is never negative")
    e = np.minimum(_exponent(n), PROFILE_BUCKETS)  # bucket + 1; 0 for a code without points
    return np.bincount(e, minlength=PROFILE_BUCKETS + 1)[1:].astype(np.int64)


def visible_threshold(epsilon: float) -> float:
    """A noisy count above this is not noise alone with probability ≥ 1 − VISIBLE_FALSE_RATE over all
    buckets: P(DLap(1/ε) ≥ t) ≤ e^(−εt)/2 per bucket."""
    return math.log(PROFILE_BUCKETS / (2 * VISIBLE_FALSE_RATE)) / float(epsilon)


def nonzero_threshold(epsilon: float) -> float:
    """A noisy count above this is not noise alone with probability ≥ 1 − VISIBLE_FALSE_RATE for one
    bucket on its own (what a bucket just below a visible one clears when that one is real)."""
    return math.log(1.0 / (2 * VISIBLE_FALSE_RATE)) / float(epsilon)


@functools.lru_cache(maxsize=64)
def group_threshold(epsilon: float) -> float:
    """A sum of three neighbouring noisy counts above this is not noise alone with probability
    ≥ 1 − VISIBLE_FALSE_RATE over all buckets, as a visible bucket's count (the exact tail of a sum of three
    DLap(1/ε): 82 at ε 0.1, where one bucket needs 55)."""
    a = math.exp(-float(epsilon))
    span = int(math.ceil(40.0 / float(epsilon)))
    one = (1.0 - a) / (1.0 + a) * a ** np.abs(np.arange(-span, span + 1))
    three = np.convolve(np.convolve(one, one), one)
    tail = np.cumsum(three[::-1])[::-1]  # P(sum ≥ −3·span + i)
    return float(-3 * span + int(np.argmax(tail <= VISIBLE_FALSE_RATE / PROFILE_BUCKETS)))


def supported(noisy: np.ndarray, visible: np.ndarray, nonzero: np.ndarray, epsilon: float) -> np.ndarray:
    """Per bucket: whether a visible bucket may hold people. It may where it is one of the lowest
    TAIL_BUCKETS (they count anyway), has another visible bucket at most TAIL_BUCKETS away (a run of heavy
    units, as cabs), is joined to bucket 0 or 1 by buckets that each clear :func:`nonzero_threshold`, each
    at most TAIL_BUCKETS above the last (people per doubling change gradually), or it and its two
    neighbours sum to more than :func:`group_threshold` (a heavy group, whose people spread over a few
    doublings: 150 units of ~10⁴ points, or a day of 66 cabs in [256, 512) and 22 above).

    A visible bucket with none of these is what noise alone makes in 5% of profiles, anywhere in the 24
    buckets; where the real buckets are too thin to be visible (a day of a few dozen people) it is the
    largest and set 1/κ̂(20) up to 2·10⁵ on days whose truth is 1.0-1.25: one profile per UTC day at
    ε_p 0.1 gave factors over 3× the truth on 7 of 452 Gowalla NYC days, 17 of 445 Austin and 19 of 467
    San Francisco days (bench/factor_tail.py, bench/results/2026-11-29-factor-5.md)."""
    group = np.convolve(noisy, np.ones(3), mode="same") >= group_threshold(epsilon)
    return (np.arange(noisy.size) < TAIL_BUCKETS) | linked_from_bottom(nonzero) | visible_near(visible) | group


def linked_from_bottom(nonzero: np.ndarray) -> np.ndarray:
    """Per bucket: it clears the one-bucket threshold (``nonzero``) and a run of such buckets, each at most
    TAIL_BUCKETS above the last, joins it to bucket 0 or 1 with at least one of the run below it."""
    from_bottom = np.zeros(nonzero.size, dtype=bool)
    linked = np.zeros(nonzero.size, dtype=bool)
    for i in range(nonzero.size):
        below = slice(max(i - TAIL_BUCKETS, 0), i)
        from_bottom[i] = nonzero[i] and (i < TAIL_BUCKETS or from_bottom[below].any())
        linked[i] = nonzero[i] and from_bottom[below].any()
    return linked


def visible_near(visible: np.ndarray) -> np.ndarray:
    """Per bucket: another visible bucket lies at most TAIL_BUCKETS away (or it is visible with such a
    neighbour: the count over the window holds more than one)."""
    return np.convolve(visible.astype(int), np.ones(2 * TAIL_BUCKETS + 1, dtype=int), mode="same") > 1


def _bucket_bounds() -> tuple[np.ndarray, np.ndarray]:
    """Each bucket's integers lo … hi − 1 as the continuous span [lo − ½, hi − ½)."""
    lo = 2.0 ** np.arange(PROFILE_BUCKETS)
    return lo - 0.5, 2.0 * lo - 0.5


def _power_integral(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    """∫_a^b x^p dx, elementwise (the log where p = −1)."""
    a, b, p = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float), np.asarray(p, float))
    near = np.abs(p + 1.0) < 1e-9
    q = np.where(near, 1.0, p + 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        power = (b ** q - a ** q) / q
    return np.where(near, np.log(b / a), power)


def tail_slopes(counts: np.ndarray) -> np.ndarray:
    """α per bucket of a density ∝ n^−α inside it, from the ratio of its count to the next bucket's
    (units per doubling fall by 2^(1−α)); the last counted bucket takes its neighbour's; in [0, 3]."""
    c = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None) + 1.0
    alpha = np.ones(c.shape)
    ratio = c[..., 1:] / c[..., :-1]
    alpha[..., :-1] = 1.0 - np.log2(ratio)
    alpha[..., -1] = alpha[..., -2] if c.shape[-1] > 1 else 1.0
    return np.clip(alpha, 0.0, 3.0)


def bucket_means(alpha: np.ndarray, k: float | None = None) -> np.ndarray:
    """Mean count per unit in each bucket (of min(count, k) with ``k``) under a density ∝ n^−α inside
    it (α = 0 uniform, 1 log-uniform, 2 the tail of check-in data)."""
    a, b = _bucket_bounds()
    a, b = a[: np.shape(alpha)[-1]], b[: np.shape(alpha)[-1]]
    mass = _power_integral(a, b, -alpha)
    if k is None:
        return _power_integral(a, b, 1.0 - alpha) / mass
    kk = np.clip(float(k) - 0.5, a, b)  # integers ≥ k (spans from k − ½) count as k
    return (_power_integral(a, kk, 1.0 - alpha) + float(k) * _power_integral(kk, b, -alpha)) / mass


@dataclass(frozen=True)
class ContributionProfile:
    """A noisy histogram of points per bounding unit (published) and the ε that paid for it."""

    noisy: np.ndarray
    epsilon: float
    per_day: bool = False
    # draws already made, by everything they depend on besides the profile itself (post-processing only)
    _drawn: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def scale(self) -> float:
        return 1.0 / float(self.epsilon)

    def to_dict(self) -> dict:
        return {"buckets": "[2^j, 2^(j+1)) points per " + UNIT_WORDS[self.per_day] + ", j = 0…"
                           f"{PROFILE_BUCKETS - 1} (the last open)",
                "noisy_counts": [int(v) for v in self.noisy], "epsilon": float(self.epsilon),
                "per_day": bool(self.per_day)}

    @classmethod
    def from_dict(cls, d: dict) -> ContributionProfile:
        return cls(np.asarray(d["noisy_counts"], dtype=np.float64), float(d["epsilon"]), bool(d.get("per_day")))

    # -- post-processing -------------------------------------------------------------------------
    def visible_top(self) -> int:
        """The highest visible bucket (its noisy count clears :func:`visible_threshold`) that is reached (−1
        when none is visible): every bucket up to the largest visible one is; above it, a bucket that clears
        :func:`nonzero_threshold` with a reached one at most TAIL_BUCKETS below it, or a visible one with
        another visible one that close below it. A visible bucket counts as visible only where
        :func:`supported` says it may hold people: a lone one, as noise makes it, is not the largest even
        when its count is.

        A visible bucket not reached is taken as noise: an empty bucket clears the visibility threshold by
        noise alone in 5% of profiles, and people per doubling change gradually, so a real heavy bucket above
        the largest has people in the buckets just below it, down to the largest (or is one of a run of
        visible ones: two empty buckets that close both clear it in about 2·10⁻⁴ of profiles). On 2,000 draws
        of Gowalla NYC's profile at ε_p = 0.1 asking only for one bucket just below to look non-empty left
        out 41 noise-made top buckets and one real one (5 people that noise lifted to 81); on the 333 people
        of the Gowalla sample's San Francisco 27 and 11. Counted, a lone noise-made bucket sets N̂ on a small
        dataset: Gowalla NYC 2010-05-06, 379 points, a noisy 57 people in [32, 64) and its two tail buckets
        gave N̂ = 5,955 and 1/κ̂(5) = 8.5 where the truth is 1.33 (docs/decisions/0018-contribution-profile.md).
        The bucket below must itself be reached: about 1 profile in 1,000 has a noise-made non-empty bucket
        under a noise-made visible one far above the data, which set 1/κ̂(20) = 2,125 on 1,500 synthetic
        people whose truth is 1.5 (a release published at 1,400× its counts;
        bench/results/2026-11-29-verdict-5.md)."""
        noisy = np.asarray(self.noisy, dtype=np.float64)
        visible = noisy >= visible_threshold(self.epsilon)
        nonzero = noisy >= nonzero_threshold(self.epsilon)
        visible &= supported(noisy, visible, nonzero, self.epsilon)
        if not visible.any():
            return -1
        largest = int(np.argmax(np.where(visible, noisy, -np.inf)))
        reached = np.arange(noisy.size) <= largest
        for j in range(largest + 1, noisy.size):
            below = slice(max(j - TAIL_BUCKETS, 0), j)
            reached[j] = (nonzero[j] and reached[below].any()) or (visible[j] and visible[below].any())
        return int(np.flatnonzero(visible & reached)[-1])

    def without_top(self) -> ContributionProfile | None:
        """The profile without its highest visible bucket and everything above it, when that bucket stands
        alone: more than TAIL_BUCKETS above the next visible one (None otherwise): what it says if that
        bucket is noise. A bucket clears the visibility threshold by noise alone in 5% of profiles, far
        above the real ones as often as not, and on a small dataset its phantom heavy units then set N̂
        (κ̂ near 0, 1/κ̂ up to 2·10⁵ on 300 people). A real heavy tail shows as a run of visible buckets.
        The estimates already leave out such a bucket unless it is the largest or a bucket just below it
        looks non-empty (:meth:`visible_top`)."""
        visible = np.flatnonzero(self.noisy >= visible_threshold(self.epsilon))
        if visible.size < 2 or visible[-1] - visible[-2] <= TAIL_BUCKETS or visible[-1] > self.visible_top():
            return None  # none stands alone, or the estimates already leave it out (visible_top)
        top = int(visible[-1])
        noisy = self.noisy.copy()
        noisy[top:] = 0.0
        return ContributionProfile(noisy, self.epsilon, self.per_day)

    def top_bucket(self) -> int:
        """The highest bucket that counts: TAIL_BUCKETS above the highest visible one."""
        return min(PROFILE_BUCKETS - 1, self.visible_top() + TAIL_BUCKETS)

    def counts(self, noisy: np.ndarray | None = None) -> np.ndarray:
        """Units per bucket as estimated, up to :meth:`top_bucket`: noisy counts clamped at 0."""
        c = np.asarray(self.noisy if noisy is None else noisy, dtype=np.float64)[..., : self.top_bucket() + 1]
        return np.clip(c, 0.0, None)

    def _sum(self, c: np.ndarray, k: int | None) -> np.ndarray:
        """Σ count × mean over the buckets."""
        return np.sum(c * bucket_means(tail_slopes(c), k), axis=-1)

    def _means(self, counts: np.ndarray, k: int | None) -> np.ndarray:
        return bucket_means(tail_slopes(np.clip(counts, 0.0, None)), k)

    def total_points(self) -> float:
        """N̂: the points of the release's units (inside its regions and window)."""
        return float(self._sum(self.counts(), None))

    def kept_points(self, k: int) -> float:
        """K̂(k): the points a bound of k per unit keeps."""
        return float(self._sum(self.counts(), k))

    def kept_fraction(self, k: int) -> float:
        """κ(k) = K̂/N̂, 1 when the profile sees nothing (then there is nothing to scale)."""
        n = self.total_points()
        return 1.0 if n <= 0 else float(np.clip(self.kept_points(k) / n, 1e-6, 1.0))

    def kept_variance(self, k: int) -> float:
        """Variance of K̂(k) from the profile's noise (each bucket's noise × its kept mean)."""
        m = self._means(self.counts(), k)
        return float(discrete_laplace_variance(self.scale) * np.sum(m * m))

    def draws(self, k: int, draws: int, rng: np.random.Generator,
              top: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Draws of (N, K(k)) over what the profile leaves open: plausible true counts (the noisy counts
        minus fresh noise of the same law, clamped at 0, up to :meth:`top_bucket` or ``top``), each draw
        with its own slopes inside buckets."""
        top = self.top_bucket() if top is None else int(top)
        noisy = np.asarray(self.noisy, dtype=np.float64)
        key = (int(k), int(draws), top, repr(rng.bit_generator.state))
        made = self._drawn.get(key)
        if made is not None:  # the same draws, and the generator left where drawing them leaves it
            rng.bit_generator.state = made[2]
            return made[0].copy(), made[1].copy()
        # simulation, not published noise: numpy's geometric differences have the discrete Laplace law
        p = -np.expm1(-1.0 / self.scale)
        noise = rng.geometric(p, (draws, top + 1)) - rng.geometric(p, (draws, top + 1))
        c = np.clip(noisy[None, : top + 1] - noise, 0.0, None)
        n, kept = self._sum(c, None), self._sum(c, k)
        if len(self._drawn) >= DRAWN_KEPT:
            self._drawn.pop(next(iter(self._drawn)))
        self._drawn[key] = (n, kept, rng.bit_generator.state)
        return n.copy(), kept.copy()

    def factor_draws(self, k: int, draws: int, rng: np.random.Generator, top: int | None = None) -> np.ndarray:
        """Draws of 1/κ(k) (see :meth:`draws`)."""
        n, kept = self.draws(k, draws, rng, top)
        return np.where(kept > 0, np.maximum(n, kept) / np.maximum(kept, 1e-300), 1.0)

    def factor(self, k: int) -> float:
        """The scale factor 1/κ̂(k): the median of :meth:`factor_draws` (a fixed public seed), so that
        buckets too thin for the noise to show still weigh in the estimate as they do in its interval."""
        return float(np.median(self.factor_draws(k, ESTIMATE_DRAWS, np.random.default_rng(0))))

    def total_estimate(self) -> float:
        """N̂: the median of :meth:`draws`' N (a fixed public seed)."""
        return float(np.median(self.draws(1, ESTIMATE_DRAWS, np.random.default_rng(0))[0]))

    def sampling_variance(self, k: int) -> float:
        """Variance, per full point of a box, of its bounded count / κ from which points the bound keeps:
        a point of a unit with n points is kept with probability p = min(n, k)/n, apart from the box's
        other points (a unit's points spread over many boxes), so Var(kept) = Σ p(1 − p) over the box's
        points, times 1/κ²; points are drawn in proportion to the units' full points. It is what a small k
        costs besides its bias (:meth:`cell_bias_sd` takes every unit's points as lying in one box)."""
        c = self.counts()
        n_mean, k_mean = self._means(c, None), self._means(c, k)
        full = c * n_mean
        if full.sum() <= 0:
            return 0.0
        p = np.clip(k_mean / np.maximum(n_mean, 1e-300), 0.0, 1.0)
        return float(np.sum(full * p * (1.0 - p)) / full.sum() / self.kept_fraction(k) ** 2)

    def cell_bias_sd(self, k: int, bounded: np.ndarray) -> np.ndarray:
        """sd of a box's full count around bounded/κ, for boxes holding ``bounded`` kept points.

        The units in a box are taken as drawn from the profile in proportion to the points they keep in it,
        each with as many of its points in the box as the box can hold: m = min(n, bounded/κ), the box's
        full count (a person's points lie in one box where the box is large enough to hold them all, the
        widest case; a box of 30 check-ins holds at most 30 of a heavy person's 1,000). A unit with m points
        in the box keeps about m·p of them (p = min(n, k)/n) and adds m·(1 − p/κ) to the full count's
        deviation; a box of B kept points holds about B / E[m·p] units. One more unit is drawn in proportion
        to its full points: the person whose place a box is centred on (a query drawn where the data are) is
        more often a heavy one. Evaluated on a table of box sizes (:meth:`_bias_table`), every box at once."""
        b = np.clip(np.atleast_1d(np.asarray(bounded, dtype=np.float64)), 0.0, None)
        table = self._bias_table(k)
        if table is None:
            return np.zeros(np.shape(bounded))
        inv_kappa, per_point, centred = table
        # the most full points one person can have in the box: the box's own full count (at least 1), as a
        # position on the table's uniform grid of log2 sizes (linear interpolation between its nodes)
        pos = np.maximum(b * inv_kappa, 1.0)
        np.log2(pos, out=pos)
        pos *= self.BIAS_STEPS
        np.fmin(pos, per_point.size - 1.000001, out=pos)  # fmin: a NaN count reads the last node, and stays NaN
        i = pos.astype(np.intp)
        pos -= i  # the share of the way to the next node
        var = np.take(per_point, i)
        var += pos * np.take(np.diff(per_point, append=per_point[-1]), i)
        var *= b
        var += (np.take(centred, i) + pos * np.take(np.diff(centred, append=centred[-1]), i)) * (b > 0)
        return np.sqrt(var, out=var).reshape(np.shape(bounded))

    #: Steps per doubling of the box sizes :meth:`cell_bias_sd` is tabulated on.
    BIAS_STEPS = 8

    def _bias_table(self, k: int) -> tuple[float, np.ndarray, np.ndarray] | None:
        """(1/κ, variance per kept point, the centred unit's variance) for boxes whose full count is C =
        2^(i/BIAS_STEPS), i = 0 … PROFILE_BUCKETS·BIAS_STEPS (None when the profile sees no points); built
        once per k (the profile is immutable)."""
        cache = self.__dict__.setdefault("_bias_tables", {})
        if k not in cache:
            cache[k] = self._build_bias_table(k)
        return cache[k]

    def _build_bias_table(self, k: int) -> tuple[float, np.ndarray, np.ndarray] | None:
        c = self.counts()
        n_mean, k_mean = self._means(c, None), self._means(c, k)
        if np.sum(c * k_mean) <= 0:
            return None
        kappa = self.kept_fraction(k)
        p = np.clip(k_mean / np.maximum(n_mean, 1e-300), 0.0, 1.0)
        log_cap = np.arange(0, PROFILE_BUCKETS * self.BIAS_STEPS + 1) / self.BIAS_STEPS
        m = np.minimum(n_mean[None, :], 2.0 ** log_cap[:, None])  # (sizes, buckets): points in the box
        kept = c * m * p  # kept points in the box, per bucket
        w = kept / np.maximum(kept.sum(axis=1, keepdims=True), 1e-300)
        dev = m * (1.0 - p / kappa)
        mean = np.sum(w * dev, axis=1, keepdims=True)
        var_unit = np.sum(w * (dev - mean) ** 2, axis=1)
        units_per_point = 1.0 / np.maximum(np.sum(w * m * p, axis=1), 1e-300)
        full = c * n_mean
        centred = np.sum(full * dev * dev, axis=1) / full.sum()
        return 1.0 / kappa, units_per_point * var_unit, centred


def noisy_profile(true_counts: np.ndarray, epsilon: float, noise: NoiseSource,
                  per_day: bool = False) -> ContributionProfile:
    """The profile with ε-DP discrete Laplace noise (sensitivity 1: a unit is in one bucket)."""
    counts = np.asarray(true_counts, dtype=np.int64)
    if counts.shape != (PROFILE_BUCKETS,):
        raise ValueError(f"a profile has {PROFILE_BUCKETS} buckets, got {counts.shape}")
    return ContributionProfile(noise.add_discrete_laplace(counts, 1.0, float(epsilon)).astype(np.float64),
                               float(epsilon), per_day)
