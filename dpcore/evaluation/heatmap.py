"""Heatmap evaluation harness (Ghazi et al. AAAI 2023 protocol): sample n users per trial, build the
true user-normalised heatmap at resolution Δ, release it with each mechanism at each ε, and score
the release by EMD, KL divergence and Pearson correlation against the truth (dpcore.heatmap.metrics).

Sweeps ε × n × Δ. The same user sample serves every mechanism, ε and Δ of a trial (paired
comparison); noise seeds are derived from (seed, trial, n, Δ, ε, mechanism) so runs are
reproducible. Output JSON: ``{"results": [{"mechanism", "epsilon", "resolution", "users", "emd",
"kl", "pearson", "trials", ...}], ...}`` (extra keys: standard deviations, fit seconds, the EMD
approximation bound).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from dpcore import GeoDPError
from dpcore.data.points import Points, clip_to_region
from dpcore.geo import Region
from dpcore.heatmap.metrics import DEFAULT_EMD_MAX_SIDE, emd, emd_coarsening_bound, kl_divergence, pearson
from dpcore.heatmap.quadtree import user_normalised_grid
from dpcore.mechanisms import PointsInput, PrivacyUnit, get_mechanism, input_for, mechanism_names
from dpcore.privacy.noise import NoiseSource


def heatmap_mechanisms() -> list[str]:
    """Every registered mechanism tagged as a heatmap (``MechanismTags.heatmap``)."""
    return mechanism_names(lambda tags: tags.heatmap)


class HeatmapEvalError(GeoDPError, ValueError):
    pass


def parse_mechanism_spec(spec: str) -> tuple[str, str, dict]:
    """'laplace-top:top_percent=0.05:...' → (label, name, params); values parsed as numbers when they are."""
    parts = [p.strip() for p in spec.split(":") if p.strip()]
    if not parts:
        raise HeatmapEvalError("empty mechanism name")
    params: dict = {}
    for item in parts[1:]:
        if "=" not in item:
            raise HeatmapEvalError(f"mechanism parameters are NAME:KEY=VALUE[:KEY=VALUE], got {spec!r}")
        k, v = item.split("=", 1)
        try:
            params[k] = int(v) if v.lstrip("-").isdigit() else float(v)
        except ValueError:
            params[k] = v
    return spec.strip(), parts[0], params


@dataclass
class HeatmapEvalConfig:
    mechanisms: list[str] = field(default_factory=heatmap_mechanisms)
    epsilons: list[float] = field(default_factory=lambda: [0.2, 1.0, 5.0])
    resolutions: list[int] = field(default_factory=lambda: [64, 128, 256])
    users: list[int] = field(default_factory=lambda: [50, 200, 500])
    trials: int = 3
    seed: int = 0
    privacy_unit: str = "user"
    emd_max_side: int = DEFAULT_EMD_MAX_SIDE
    #: extra constructor parameters per mechanism label (merged over those in the spec)
    params: dict[str, dict] = field(default_factory=dict)

    def validate(self) -> None:
        if self.trials < 1:
            raise HeatmapEvalError("trials must be ≥ 1")
        if not self.mechanisms or not self.epsilons or not self.resolutions or not self.users:
            raise HeatmapEvalError("mechanisms, epsilons, resolutions and users must all be non-empty")
        if any(n < 1 for n in self.users):
            raise HeatmapEvalError("users per trial must be ≥ 1")
        if any(e <= 0 for e in self.epsilons):
            raise HeatmapEvalError("epsilons must be > 0")
        for spec in self.mechanisms:
            parse_mechanism_spec(spec)


def _seed_for(*parts: object) -> int:
    # crc32, not hash(): str hashes are salted per process, which would make runs irreproducible.
    return int(np.random.SeedSequence([zlib.crc32(str(p).encode()) for p in parts]).generate_state(1)[0])


def evaluate_heatmap(points: Points, region: Region, config: HeatmapEvalConfig,
                     progress: Callable[[int, int, str], None] | None = None,
                     keep_example: bool = False) -> dict:
    """Run the sweep; returns the JSON-able report (``example`` holds one truth/release set of grids
    per mechanism for rendering when ``keep_example``)."""
    config.validate()
    idx, x, y = clip_to_region(points, region)
    if idx.size == 0:
        raise HeatmapEvalError(f"no points fall inside region {region.name}")
    user = points.user[idx]
    users_in_region = np.unique(user)
    too_many = [n for n in config.users if n > users_in_region.size]
    if too_many:
        raise HeatmapEvalError(f"asked for {max(too_many)} users per trial but region {region.name} has only "
                               f"{users_in_region.size} users with points in it")
    specs = [parse_mechanism_spec(s) for s in config.mechanisms]
    rng = np.random.default_rng(config.seed)
    scores: dict[tuple, list[tuple[float, float, float, float]]] = {}
    example: dict = {}
    total = len(config.users) * config.trials * len(config.resolutions) * len(config.epsilons) * len(specs)
    done = 0
    for n_users in config.users:
        for trial in range(config.trials):
            chosen = rng.choice(users_in_region, size=n_users, replace=False)
            sel = np.isin(user, chosen)
            data = PointsInput(x[sel], y[sel], region, PrivacyUnit.of(config.privacy_unit),
                               user=user[sel] if config.privacy_unit == "user" else None)
            for res in config.resolutions:
                truth = user_normalised_grid(data.x, data.y, data.user, region.bounds_m, res, quantum=None)
                for eps in config.epsilons:
                    for label, name, spec_params in specs:
                        params = {"resolution": res, **spec_params, **config.params.get(label, {})}
                        mech = get_mechanism(name, **params)
                        noise = NoiseSource.seeded(_seed_for(config.seed, trial, n_users, res, eps, label))
                        t0 = time.perf_counter()
                        syn = mech.fit(input_for(mech.tags.input_type, data), eps, noise)
                        fit_s = time.perf_counter() - t0
                        released = syn.density(res)
                        scores.setdefault((label, eps, res, n_users), []).append(
                            (emd(truth, released, config.emd_max_side), kl_divergence(truth, released),
                             pearson(truth, released), fit_s))
                        if keep_example and trial == 0:
                            example.setdefault((eps, res, n_users), {"truth": truth})[label] = released
                        done += 1
                        if progress:
                            progress(done, total, f"{label} ε={eps:g} Δ={res} n={n_users} trial {trial + 1}")
    results = []
    for (label, eps, res, n_users), rows in scores.items():
        a = np.asarray(rows)
        results.append({"mechanism": label, "epsilon": eps, "resolution": res, "users": n_users,
                        "emd": float(a[:, 0].mean()), "kl": float(a[:, 1].mean()), "pearson": float(a[:, 2].mean()),
                        "trials": int(a.shape[0]), "emd_std": float(a[:, 0].std()), "pearson_std": float(a[:, 2].std()),
                        "fit_seconds": float(a[:, 3].mean()),
                        "emd_approximation_bound": emd_coarsening_bound(res, config.emd_max_side)})
    report = {"region": region.to_dict(), "n_points": int(idx.size), "n_users": int(users_in_region.size),
              "privacy_unit": config.privacy_unit, "emd_max_side": config.emd_max_side,
              "emd_units": "region side", "config": asdict(config), "results": results}
    if keep_example:
        report["example"] = example
    return report


def format_table(report: dict) -> str:
    """A readable table of the results, one line per (mechanism, ε, Δ, n)."""
    lines = [f"{'mechanism':32s} {'eps':>6s} {'res':>5s} {'users':>6s} {'EMD':>8s} {'KL':>8s} {'Pearson':>8s}"]
    for r in sorted(report["results"], key=lambda r: (r["users"], r["resolution"], r["epsilon"], r["mechanism"])):
        lines.append(f"{r['mechanism'][:32]:32s} {r['epsilon']:6g} {r['resolution']:5d} {r['users']:6d} "
                     f"{r['emd']:8.4f} {r['kl']:8.3f} {r['pearson']:8.3f}")
    return "\n".join(lines)
