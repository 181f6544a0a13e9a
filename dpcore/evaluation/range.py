"""Evaluation harness: mechanisms × ε × workloads on one region, with exact truth.

Protocol (stated in every result):
- The region is public configuration; only points inside it are used.
- User-level: each trial bounds every user to k points (``bounding="sample"``: a uniform k-subset per
  user) before the mechanism, or (``bounding="weight"``) keeps every point with weight min(1, k/n_u)
  (dpcore.privacy.bounding.contribution_weights; grid mechanisms only). Truth is the exact count over *all*
  points, so the synopsis is scaled to full counts by
  N / n̂, where N (the region's point count) is an explicit *public input* of the evaluation
  (recorded as ``total_points_source``) and n̂ is a DP estimate of the bounded sample's size (or
  weight sum) that costs 10% of ε (see dpcore.privacy.scaling); the mechanism gets the other 90%.
- Record-level: no bounding, sensitivity 1, no scaling (the UG/AG/SNH papers' setting).
- Relative error |est − truth| / max(truth, ψ), ψ = 0.1% of N. Workloads are squares with side
  uniform in [a, b] metres centred on uniformly drawn points of the evaluated data (``workload="data"``,
  the default: queries where people are), or uniformly over the region (``"uniform"``), or on points
  of a public file (``"public:PATH"``); the same workload is used for every mechanism, ε and trial.
  Noise is seeded (experiments only), derived from ``seed``.
- Two references per band, printed beside every mechanism as ratios: answering 0 to every query,
  and the *hindsight grid*: the identity grid (discrete Laplace, same ε, sensitivity, bounding and
  scaling as the mechanisms) whose size m ∈ HINDSIGHT_GRID_SIZES has the least mean error on the
  true answers of the same queries and trials. Picking m with the truth makes it a yardstick, not a
  DP mechanism.
- A mechanism that tunes itself to a query band (``auto``, ``identity`` with ``cell_width_m="auto"``) is
  fitted once per band, with that band as its parameter and the same noise seed, and answers only that
  band (see :func:`band_runs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpcore.data.points import Points, clip_to_region
from dpcore.evaluation.metrics import psi_for, relative_error
from dpcore.geo import Region
from dpcore.mechanisms import PointsInput, PrivacyUnit, get_mechanism, input_for
from dpcore.privacy.bounding import (
    bound_contributions,
    check_privacy_unit,
    contribution_weights,
)
from dpcore.privacy.budget import check_epsilon
from dpcore.privacy.noise import NoiseSource
from dpcore.privacy.scaling import fit_scaled
from dpcore.queries.range import (
    DEFAULT_QUERY_SIDES_M,
    DEFAULT_WORKLOAD,
    WorkloadSpec,
    parse_workload,
    square_workload,
    true_counts,
    workload_centres,
)
from dpcore.synopsis.base import Synopsis

Progress = Callable[[int, int, str], None]
#: called with (mechanism, ε, trial, synopsis) after every fit, e.g. to collect SNH training losses;
#: it sees only the released synopsis and must not change the protocol
OnFit = Callable[[str, float, int, Synopsis], None]
DEFAULT_MAX_POINTS_PER_USER = 20
#: User-level bounding in the evaluation: a uniform k-sample per user, or weights min(1, k/n_u).
BOUNDINGS = ("sample", "weight")
#: Grid sizes the hindsight reference picks from (cells per side of the region).
HINDSIGHT_GRID_SIZES = (32, 64, 128, 256, 512, 1024)


@dataclass
class EvalConfig:
    mechanisms: list[str]
    epsilons: list[float]
    privacy_unit: str = "user"
    max_points_per_user: int = DEFAULT_MAX_POINTS_PER_USER
    query_sides_m: list[tuple[float, float]] = field(default_factory=lambda: list(DEFAULT_QUERY_SIDES_M))
    n_queries: int = 2000
    trials: int = 3
    seed: int = 0
    mechanism_params: dict[str, dict] = field(default_factory=dict)
    workload: str = DEFAULT_WORKLOAD
    bounding: str = "sample"
    #: compute the hindsight-grid reference (6 identity fits per ε and trial)
    hindsight: bool = True

    def __post_init__(self) -> None:
        check_privacy_unit(self.privacy_unit)
        self.epsilons = [check_epsilon(e) for e in self.epsilons]
        if not self.mechanisms:
            raise ValueError("at least one mechanism is needed")
        self.workload = str(parse_workload(self.workload))
        check_bounding(self.bounding, self.privacy_unit)


def check_bounding(bounding: str, privacy_unit: str) -> str:
    from dpcore.privacy.bounding import SamplingError

    if bounding not in BOUNDINGS:
        raise SamplingError(f"bounding must be one of {BOUNDINGS}, got {bounding!r}")
    if bounding == "weight" and privacy_unit != "user":
        raise SamplingError("weighted bounding bounds a person's points: it needs --privacy-unit user")
    return bounding


@dataclass(frozen=True)
class RegionData:
    """All points of a region (for truth) plus their users (for bounding)."""

    x: np.ndarray
    y: np.ndarray
    user: np.ndarray
    region: Region

    @property
    def n_points(self) -> int:
        return int(self.x.size)

    @property
    def n_users(self) -> int:
        return int(np.unique(self.user).size)


def region_data(points: Points, region: Region) -> RegionData:
    idx, x, y = clip_to_region(points, region)
    return RegionData(x, y, points.user[idx], region)


def make_fit_input(data: RegionData, privacy_unit: str, max_points_per_user: int,
                   rng: np.random.Generator, bounding: str = "sample") -> PointsInput:
    """Bound (user-level: a k-sample, or every point weighted min(1, k/n_u)) and wrap a region's points
    for a mechanism."""
    if privacy_unit == "user":
        unit = PrivacyUnit.user(max_points_per_user)
        if bounding == "weight":
            return PointsInput(data.x, data.y, data.region, unit, user=data.user,
                               weights=contribution_weights(data.user, max_points_per_user))
        keep = bound_contributions(data.user, max_points_per_user, rng).keep
        return PointsInput(data.x[keep], data.y[keep], data.region, unit, user=data.user[keep])
    return PointsInput(data.x, data.y, data.region, PrivacyUnit.of(privacy_unit), user=data.user)


def fit_and_scale(mechanism: str, params: dict, fit_input: PointsInput, epsilon: float, noise: NoiseSource,
                  total_points: int) -> Synopsis:
    """Fit on the region's points in the shape the mechanism reads (its ``tags.input_type``), scaled to
    the protocol's public total at user level."""
    mech = get_mechanism(mechanism, **params)
    if fit_input.privacy_unit == "user":
        return fit_scaled(mech, fit_input, epsilon, noise, total_points,
                          "public input of the evaluation protocol")
    return mech.fit(input_for(mech.tags.input_type, fit_input), epsilon, noise)


def band_runs(mechanism: str, params: dict, query_sides_m: list[tuple[float, float]],
              ) -> list[tuple[dict, list[int]]]:
    """The fits one (mechanism, ε, trial) needs: (parameters, indices of the bands they answer).

    A configuration that tunes itself to a query band (``Mechanism.tuned_band_parameter``: auto's and
    identity@ParamSelect's ``query_sides_m``) is fitted once per band of the workload, each fit
    answering its own band, unless the caller fixed that parameter; every other one is fitted once and
    answers every band."""
    key = get_mechanism(mechanism, **params).tuned_band_parameter()
    if key is None or key in params:
        return [(params, list(range(len(query_sides_m))))]
    return [({**params, key: (float(a), float(b))}, [w]) for w, (a, b) in enumerate(query_sides_m)]


#: Stream tags of the workload generators: the evaluation protocol's, and ParamSelect's training table's.
EVAL_WORKLOAD_STREAM = 0xB0C5
PARAMSELECT_WORKLOAD_STREAM = 0x5E1EC7


def protocol_workloads(data: RegionData, query_sides_m: list[tuple[float, float]] | tuple[tuple[float, float], ...],
                       n_queries: int, seed: int, stream: int = EVAL_WORKLOAD_STREAM,
                       workload: str | WorkloadSpec = DEFAULT_WORKLOAD,
                       ) -> list[tuple[tuple[float, float], np.ndarray, np.ndarray]]:
    """The protocol's workloads: per band (sides, boxes, true counts), drawn from a stream of ``seed``
    and ``stream`` alone, so every mechanism and any reference computed elsewhere sees the same queries.
    ``workload`` says where the centres come from (dpcore.queries.range.parse_workload; default: the data)."""
    rng = np.random.default_rng([seed, stream])
    centres = workload_centres(workload, data.region, data.x, data.y)
    out = []
    for a, b in query_sides_m:
        boxes = square_workload(data.region, n_queries, a, b, rng, centres)
        out.append(((a, b), boxes, true_counts(data.x, data.y, boxes)))
    return out


#: Stream tag of the hindsight grid's noise (independent of the mechanisms evaluated beside it).
HINDSIGHT_STREAM = 0x41D5


def hindsight_grid(data: RegionData, workloads: list[tuple[tuple[float, float], np.ndarray, np.ndarray]],
                   epsilon: float, config: EvalConfig, psi: float,
                   sizes: tuple[int, ...] = HINDSIGHT_GRID_SIZES) -> list[dict]:
    """The hindsight-grid reference at one ε, one row per band: the identity grid of each size m in
    ``sizes`` run through the protocol (same ε, sensitivity, bounding and scaling as the mechanisms,
    ``config.trials`` trials, the same queries), and the m with the least mean relative error on the
    true answers. NOT a DP mechanism: choosing m with the truth is what makes it a yardstick."""
    errs = {m: [[] for _ in workloads] for m in sizes}
    for trial in range(config.trials):
        seed = int(np.random.SeedSequence([config.seed, trial, int(epsilon * 1e6), HINDSIGHT_STREAM]
                                          ).generate_state(1)[0])
        for m in sizes:
            noise = NoiseSource.seeded(seed)
            fit_input = make_fit_input(data, config.privacy_unit, config.max_points_per_user, noise.rng,
                                       config.bounding)
            synopsis = fit_and_scale("identity", {"grid_size": m}, fit_input, epsilon, noise, data.n_points)
            for w, (_, boxes, truth) in enumerate(workloads):
                errs[m][w].append(relative_error(synopsis.answer(boxes), truth, psi))
    out = []
    for w, (sides, _, _) in enumerate(workloads):
        mean = {m: float(np.concatenate(errs[m][w]).mean()) for m in sizes}
        best = min(sizes, key=lambda m: (mean[m], m))
        out.append({"epsilon": epsilon, "query_sides_m": [sides[0], sides[1]], "grid_size": best,
                    "cell_width_m": data.region.side_m / best, "mean_relative_error": mean[best],
                    "median_relative_error": float(np.median(np.concatenate(errs[best][w]))),
                    "errors_by_grid_size": {str(m): mean[m] for m in sizes}, "dp": False,
                    "note": "identity grid whose size was picked with the true answers: a yardstick, not DP"})
    return out


def answer_zero(workloads: list[tuple[tuple[float, float], np.ndarray, np.ndarray]], psi: float) -> list[dict]:
    """Answering 0 to every query: error t / max(t, ψ) per query (1 on every query holding ≥ ψ points)."""
    return [{"query_sides_m": [sides[0], sides[1]],
             "mean_relative_error": float(relative_error(np.zeros_like(truth, dtype=np.float64), truth, psi).mean())}
            for sides, _, truth in workloads]


def add_ratios(results: list[dict], zero: list[dict], hindsight: list[dict]) -> None:
    """Each result row's mean error over the band's answer-0 and hindsight-grid references (in place)."""
    z = {tuple(r["query_sides_m"]): r["mean_relative_error"] for r in zero}
    g = {(r["epsilon"], tuple(r["query_sides_m"])): r for r in hindsight}
    for r in results:
        band = tuple(r["query_sides_m"])
        e = r["mean_relative_error"]
        r["ratio_to_answer_zero"] = e / z[band] if z.get(band) else None
        ref = g.get((r["epsilon"], band))
        r["ratio_to_hindsight_grid"] = e / ref["mean_relative_error"] if ref and ref["mean_relative_error"] else None
        r["hindsight_grid_size"] = ref["grid_size"] if ref else None


def evaluate(points: Points, region: Region, config: EvalConfig, progress: Progress | None = None,
             on_fit: OnFit | None = None) -> dict:
    """Run the protocol; returns the JSON-able result in the documented schema.

    ``on_fit`` (optional) gets each fitted synopsis, for diagnostics such as training curves."""
    data = region_data(points, region)
    if data.n_points == 0:
        from dpcore.data.points import DataError

        raise DataError(f"no points fall inside region {region.name} ({region.side_km} km around "
                        f"{region.center_lat}, {region.center_lon})")
    if config.bounding == "weight" and config.privacy_unit == "user":
        from dpcore.mechanisms import MechanismError, get_mechanism_class

        unsupported = [m for m in config.mechanisms if not get_mechanism_class(m).tags.supports_weights]
        if unsupported:  # before any fit, not halfway through the table
            raise MechanismError(f"weighted bounding is not supported by {', '.join(unsupported)}")
    psi = psi_for(data.n_points)
    spec = parse_workload(config.workload)
    workloads = protocol_workloads(data, config.query_sides_m, config.n_queries, config.seed, workload=spec)

    runs_per_mech = {m: band_runs(m, dict(config.mechanism_params.get(m, {})), config.query_sides_m)
                     for m in config.mechanisms}
    total = sum(len(r) for r in runs_per_mech.values()) * len(config.epsilons) * config.trials
    done = 0
    results = []
    for mech, runs in runs_per_mech.items():
        for eps in config.epsilons:
            errs: list[list[np.ndarray]] = [[] for _ in workloads]
            fit_s: list[list[float]] = [[] for _ in workloads]
            answer_s: list[list[float]] = [[] for _ in workloads]
            for trial in range(config.trials):
                # One noise seed per (mechanism, ε, trial): a mechanism fitted per band draws the same
                # noise for each band's fit, as one fit for all bands would.
                seed = int(np.random.SeedSequence(
                    [config.seed, trial, int(eps * 1e6), sum(map(ord, mech))]).generate_state(1)[0])
                for params, bands in runs:
                    noise = NoiseSource.seeded(seed)
                    fit_input = make_fit_input(data, config.privacy_unit, config.max_points_per_user, noise.rng,
                                               config.bounding)
                    t0 = time.perf_counter()
                    synopsis = fit_and_scale(mech, params, fit_input, eps, noise, data.n_points)
                    fitted = time.perf_counter() - t0
                    if on_fit is not None:
                        on_fit(mech, eps, trial, synopsis)
                    t0 = time.perf_counter()
                    for w in bands:
                        errs[w].append(relative_error(synopsis.answer(workloads[w][1]), workloads[w][2], psi))
                    answered = time.perf_counter() - t0
                    for w in bands:
                        fit_s[w].append(fitted)
                        answer_s[w].append(answered)
                    done += 1
                    if progress:
                        a, b = workloads[bands[0]][0]
                        progress(done, total, f"{mech} ε={eps:g} trial {trial + 1}/{config.trials}"
                                 + (f" band {a:g}-{b:g} m" if len(runs) > 1 else ""))
            for w, (sides, _, _) in enumerate(workloads):
                e = np.concatenate(errs[w])
                params = next(p for p, bands in runs if w in bands)
                results.append({
                    "mechanism": mech, "epsilon": eps, "query_sides_m": [sides[0], sides[1]],
                    "max_points_per_user": config.max_points_per_user if config.privacy_unit == "user" else None,
                    "mean_relative_error": float(e.mean()), "median_relative_error": float(np.median(e)),
                    "trials": config.trials, "queries": config.n_queries,
                    "fit_seconds": float(np.mean(fit_s[w])), "answer_seconds": float(np.mean(answer_s[w])),
                    "params": params,
                })
    # Answering 0 to every query: with ψ = 0.1% of n a release on sparse data can do worse than
    # that, and then it says less than a blank map (bench/README.md, SNH section).
    zero = answer_zero(workloads, psi)
    hindsight = [row for eps in config.epsilons for row in hindsight_grid(data, workloads, eps, config, psi)] \
        if config.hindsight else []
    add_ratios(results, zero, hindsight)
    return {
        "n_points": data.n_points, "n_users": data.n_users, "privacy_unit": config.privacy_unit,
        "region": region.to_dict(), "psi": psi, "seed": config.seed,
        "total_points_source": "public input of the evaluation protocol" if config.privacy_unit == "user" else None,
        "noise_source": "seeded (experiments only)",
        "workload": {"centres": str(spec), "description": spec.describe()},
        "bounding": config.bounding if config.privacy_unit == "user" else None,
        "results": results,
        "reference_answer_zero": zero,
        "reference_hindsight_grid": hindsight,
    }


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(report: dict) -> str:
    """The text table: every mechanism row with its ratios to the band's references (×0: over answering
    0; ×grid: over the hindsight grid at its ε), then the reference rows."""
    work = report.get("workload", {}).get("centres", "uniform")
    bounding = f", bounding {report['bounding']}" if report.get("bounding") else ""
    rows = [f"{report['n_points']:,} points, {report['n_users']:,} users, privacy unit {report['privacy_unit']}"
            f"{bounding}, ψ = {report['psi']:g}, query centres: {work}",
            f"{'mechanism':<12} {'ε':>6} {'sides (m)':>12} {'mean rel.err':>13} {'×0':>6} {'×grid':>6} "
            f"{'median':>9} {'fit s':>7}"]
    for r in report["results"]:
        a, b = r["query_sides_m"]
        rows.append(f"{r['mechanism']:<12} {r['epsilon']:>6g} {f'{a:g}-{b:g}':>12} "
                    f"{r['mean_relative_error']:>13.4f} {_ratio(r.get('ratio_to_answer_zero')):>6} "
                    f"{_ratio(r.get('ratio_to_hindsight_grid')):>6} "
                    f"{r['median_relative_error']:>9.4f} {r['fit_seconds']:>7.2f}")
    for ref in report.get("reference_answer_zero", []):
        a, b = ref["query_sides_m"]
        rows.append(f"{'answer 0':<12} {'-':>6} {f'{a:g}-{b:g}':>12} {ref['mean_relative_error']:>13.4f}   "
                    "(reference: no data, no noise)")
    for ref in report.get("reference_hindsight_grid", []):
        a, b = ref["query_sides_m"]
        rows.append(f"{'hindsight':<12} {ref['epsilon']:>6g} {f'{a:g}-{b:g}':>12} "
                    f"{ref['mean_relative_error']:>13.4f}   (reference, NOT DP: {ref['grid_size']}x{ref['grid_size']} "
                    "grid picked with the true answers)")
    return "\n".join(rows)
