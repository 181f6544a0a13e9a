"""VDR: spatio-temporal release with user-level DP, VQ-VAE denoising and statistical refinement.

Ahuja, Zeighami, Ghinita, Shahabi, "A Neural Approach to Spatio-Temporal Data Release with User-Level
Differential Privacy", PACMMOD 2023.

Privacy (the only steps that read private data):
1. The caller bounds every user to ≤ k points over the whole window (dpcore.privacy.bounding); one user then
   changes the M × M × T histogram's L1 norm by ≤ k (1 under record-level privacy).
2. ``sample_size``: n̂ = n + DLap(k / ε_n), ε_n = ``count_fraction``·ε; n changes by ≤ k per user.
   Skipped (no charge) when a public total is given, ``refinement="mass"`` (which needs no n̂) and the
   resolution is fixed. Under the resolution rule (``resolution="rule"``, and ``"auto"``, the default,
   at user level with no grid given) n̂ also sets the grid: cells per side follow from n̂, ε, k and T
   only (dpcore.mechanisms.st_resolution, decision 0015). The requested slots are always kept: before
   any charge, slots that a public size (a declared public total, or an already-paid n̂) shows the data
   cannot carry are refused in one line naming the finest slot width it carries (``slot_signal``).
3. ``cell_counts``: H̄ = H + DLap(k / ε_c) on every cell of the chosen grid, ε_c = the rest of ε.
The charges add up to ε. Everything after is post-processing (no budget):
4. Denoising: a VQ-VAE (dpcore.models.vqvae) trained on H̄'s slices and their 2×2 and 4×4 aggregates,
   with neighbouring slices and the window's mean slice as input channels; Ĥ = its reconstruction
   plus the part of the residual H̄ − Ĥ that a multi-scale local Wiener test finds to be signal.
5. Refinement, scaling Ĥ to counts of all N points:
   - N is the region's total. It is private with unbounded user-level sensitivity, so it is used only
     when the caller declares it public (``FitInput.public_total``); otherwise N = n̂ and the release
     stays at the bounded-sample scale (stated in the notes).
   - ``refinement="mass"`` (default): Ĥ ← Ĥ · N / ΣĤ, i.e. the estimate's total equals N. This is
     γ of the paper without its shrinkage term, which is what range counts need (see below).
   - ``refinement="gamma"``: the paper's γ = n·N·C / (2·m·k²/ε² + (1 − C)·n + C·n²) applied to Ĥ
     normalised to n̂, with n = n̂ (paid above), N as above, m = cells and C = Σ μ_c² estimated from
     Ĥ (post-processing, free). γ minimises the expected *per-cell* squared error of γ·H̄; on a fine
     grid at small ε the noise term 2mk²/ε² dwarfs C·n², so γ shrinks totals towards 0 and range
     counts suffer. Kept for fidelity and comparison.
   - ``refinement="none"``: Ĥ · N / n̂.
6. Output is non-negative (the paper's code leaves negative cells). Default (``multiscale_kappa``):
   a coarse-to-fine quadtree shrinkage (dpcore.models.st_statistics.multiscale_shrink) keeps a block's
   deviation from its siblings only where it stands out from H̄'s noise (window-summed and per-slot
   parts separately) and splits the rest evenly, so at user level, where single cells are noise,
   the counts follow the heavy coarse blocks instead of noise peaks. ``multiscale_kappa=None``: the
   old projection, negatives zeroed and each ``nonneg_block``² tile rescaled to its signed total.
7. Consistency (``consistency_kappa``, default 4; None = off): a second quadtree pass
   (dpcore.models.st_statistics.multiscale_consistency) takes the step-6 output as the prior and H̄'s block
   sums as unbiased data, and adds back each block's residual deviation H̄ − estimate with the
   weight max(0, 1 − κ·σ²/deviation²). At record level, where H̄'s block sums are accurate, this
   reduces the denoiser's large-box bias (not all of it); at user level the residuals mostly look like
   noise and the estimate is mostly kept. Non-negative, keeps the total; post-processing of H̄ only (no
   budget). ``consistency_universal`` (default on) raises κ at a level of n nodes to max(κ, 2·ln n), so
   almost no pure-noise node passes. The knobs (κ = 2 for step 6; κ = 4 and universal here) come from
   held-out data only, never the evaluation sets; the trade-off they make between record-level range
   error and user-level hotspot regret is in docs/decisions/0008-vdr-output-stages.md.
   In both steps the root's T per-slot totals are tested at ``slot_kappa`` (a Bonferroni-level
   threshold, α = 5% over all T): with only T tests the usual factors let a pure-noise slot through
   often, and a slot that passes carries a spike of the whole region.
8. Blend (``noisy_weight``, default 0.25): Ĥ ← (1 − w)·Ĥ + w·max(H̄, 0)·ΣĤ/Σmax(H̄, 0). On real check-ins the
   stages above spread a dense cell's mass into its neighbours, which then pass hotspot thresholds they do
   not reach; a quarter of H̄ puts single cells part of the way back. Chosen on held-out sets; with paired
   seeds vdr still loses to H̄ on hotspot regret on the Austin sample (ε 1, 4-week slots: +0.34 ± 0.19) and
   on Gowalla NYC's month in 5-day slots at ε 1 (+0.54 ± 0.18), while its range errors stay at or below H̄'s
   (bench/results/2026-11-29-vdr-heatmap-5.md). Post-processing of H̄ only.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field

from dpcore.geo import Region
from dpcore.mechanisms.base import Mechanism
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.identity3d import (
    paid_resolution,
    paid_sample_size,
    public_total_slot_refusal,
    rule_max_cells,
    st_cells,
    st_counts,
    st_grid_size,
)
from dpcore.mechanisms.inputs import SpatioTemporalInput
from dpcore.mechanisms.params import Fraction, NonNegativeInt, OptionalFraction, Positive, PositiveInt
from dpcore.mechanisms.st_resolution import DEFAULT_QUERY_SIDES_M, SLOT_SIGNAL
from dpcore.mechanisms.tags import MechanismTags
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance
from dpcore.synopsis.noise import NoInterval
from dpcore.synopsis.spatiotemporal import SpatioTemporalSynopsis

REFINEMENTS = ("mass", "gamma", "none")
#: Share of H̄'s non-negative part blended into the denoised histogram (step 8 of the module docstring),
#: chosen on the held-out Gowalla sample (Austin) and synthetic check-ins, never Gowalla NYC.
NOISY_WEIGHT = 0.25


def _block_sizes(v: tuple[int, ...]) -> tuple[int, ...]:
    if 1 not in v:
        raise ValueError(f"block sizes must include 1, got {list(v)}")
    return v


#: Block sizes of the multi-resolution release: whole numbers ≥ 1, including 1 (the cells themselves).
BlockSizes = Annotated[tuple[PositiveInt, ...], AfterValidator(_block_sizes)]


def gamma_factor(n: float, total: float, c: float, m: int, k: float, epsilon: float,
                 noise_var: float | None = None) -> float:
    """The paper's γ = n·N·C / (m·σ² + (1 − C)·n + C·n²), σ² by default the variance of the
    discrete Laplace noise of scale k/ε (≈ 2k²/ε² when k/ε ≫ 1).

    Derivation: with H_c ~ Binomial(n, μ_c) (sampling) plus independent noise of variance σ², the
    expected squared error Σ_c E(γ·H̄_c − N·μ_c)² is a quadratic in γ whose minimiser is this.
    """
    var = discrete_laplace_variance(k / epsilon) if noise_var is None else float(noise_var)
    den = m * var + (1.0 - c) * n + c * n * n
    return float(n * total * c / den) if den > 0 else 0.0


class VDR(Mechanism):
    """VQ-VAE denoised spatio-temporal histogram (see the module docstring for privacy and steps).

    Parameters are public: grid, budget split, denoiser architecture and training schedule.
    ``steps`` fixes the training length (reproducible); ``max_train_seconds`` optionally caps wall time.
    """

    name = "vdr"
    tags = MechanismTags(input_type=SpatioTemporalInput, scales_to_public_total=True, fast_params={
        "grid_size": 16, "steps": 2, "batch_size": 2, "crop": 16, "hidden": 8, "n_codes": 8, "code_dim": 4,
        "max_train_seconds": 10.0})

    def __init__(self, *, grid_size: PositiveInt | None = None, cell_width_m: Positive | None = None,
                 count_fraction: Fraction = 0.05, refinement: Literal["mass", "gamma", "none"] = "mass",
                 n_codes: Annotated[int, Field(ge=2)] = 128,
                 alpha: float = 1.0, steps: PositiveInt = 300, batch_size: int = 16, crop: int = 64,
                 hidden: int = 32, code_dim: int = 16, levels: int = 2, temporal_context: NonNegativeInt = 1,
                 window_mean: bool = True, residual_window: int = 5, nonneg_block: int = 16,
                 resolutions: BlockSizes = (1, 2, 4), lr: float = 2e-3, multiscale_kappa: float | None = 2.0,
                 consistency_kappa: float | None = 4.0, consistency_universal: bool = True,
                 max_train_seconds: float | None = 150.0, device: str | None = None, train_seed: int = 0,
                 resolution: Literal["auto", "fixed", "rule"] = "auto", slot_signal: Positive = SLOT_SIGNAL,
                 rule_query_sides_m: tuple[Positive, Positive] = DEFAULT_QUERY_SIDES_M,
                 noisy_weight: OptionalFraction = NOISY_WEIGHT):
        self.noisy_weight = noisy_weight
        self.grid_size = grid_size
        self.cell_width_m = cell_width_m
        self.count_fraction = count_fraction
        self.refinement = refinement
        self.n_codes = n_codes
        self.alpha = alpha
        self.steps = steps
        self.batch_size = batch_size
        self.crop = crop
        self.hidden = hidden
        self.code_dim = code_dim
        self.levels = levels
        self.temporal_context = temporal_context
        self.window_mean = window_mean
        self.residual_window = residual_window
        self.nonneg_block = nonneg_block
        self.resolutions = tuple(resolutions)
        self.lr = lr
        self.multiscale_kappa = multiscale_kappa
        self.consistency_kappa = consistency_kappa
        self.consistency_universal = consistency_universal
        self.max_train_seconds = max_train_seconds
        self.device = device
        self.train_seed = train_seed
        self.resolution = resolution
        self.slot_signal = slot_signal
        self.rule_query_sides_m = tuple(rule_query_sides_m)
        #: optional callback (done, total, message) for training progress; not a release parameter
        self.progress = None

    def fine_grid(self, region: Region) -> int | None:
        """The release's own m × m × T grid (public parameters): its counts are exact. Under the
        resolution rule, the largest grid the rule may pick (every choice is a power of two dividing it)."""
        if self.resolution == "rule":
            return rule_max_cells(region, self.grid_size, self.cell_width_m)
        return st_cells(region, self.grid_size, self.cell_width_m)  # fixed, and auto (≥ any rule choice)

    def uses_rule(self, data: SpatioTemporalInput) -> bool:
        """Whether this fit picks its resolution by the rule: ``rule``, or ``auto`` under user-level
        privacy with no grid given (a fixed fine grid drowns a k-bounded sample in noise, decision 0015).
        Reads only public facts: parameters and the privacy unit."""
        return self._uses_rule_for(data.unit.kind)

    def _uses_rule_for(self, unit_kind: str) -> bool:
        if self.resolution == "auto":
            return unit_kind == "user" and self.grid_size is None and self.cell_width_m is None
        return self.resolution == "rule"

    def slots_refusal(self, unit_kind: str, sensitivity: float, epsilon: float, public_total: float,
                      n_slots: int, slot_seconds: int | None) -> str | None:
        """Before any charge: the refusal of slots a public total cannot carry under the resolution rule."""
        if not self._uses_rule_for(unit_kind):
            return None
        return public_total_slot_refusal(public_total, epsilon, sensitivity, self.count_fraction, n_slots,
                                         slot_seconds, float(self.slot_signal))

    def get_params(self) -> dict:
        params = super().get_params()
        params["resolutions"] = list(self.resolutions)
        params["rule_query_sides_m"] = list(self.rule_query_sides_m)
        return params

    def _fit(self, data: SpatioTemporalInput, acct: FitRecord, noise: NoiseSource) -> SpatioTemporalSynopsis:
        from dpcore.models.st_statistics import (
            multiscale_consistency,
            multiscale_shrink,
            nonnegative_keep_block_mass,
        )
        from dpcore.models.vqvae import DenoiserConfig, SliceDenoiser

        # Parameter values were checked by check_params (fit calls it before any budget is spent).
        k = data.sensitivity
        public = data.public_total is not None
        n_hat = None
        res = warn = None
        if self.uses_rule(data):
            # n̂ is paid first; the grid and slot length follow from it and other public inputs only
            n_hat, res, counts, warn = paid_resolution(
                data, acct, noise, self.count_fraction, float(self.slot_signal),
                rule_max_cells(data.region, self.grid_size, self.cell_width_m), self.rule_query_sides_m)
            m = res.cells
        else:
            m = st_grid_size(data, self.grid_size, self.cell_width_m)
            counts = st_counts(data, m)
            # mass refinement to a public N needs no n̂ (a caller's already-paid one is still used)
            if data.sample_size is not None or not (public and self.refinement == "mass"):
                n_hat = paid_sample_size(data, int(counts.sum()), acct, noise, self.count_fraction,
                                         "n = points kept after bounding; one unit changes it by ≤ k")
        eps_c = acct.spend_rest("cell_counts", k, note=f"{m}x{m}x{counts.shape[2]} disjoint cells; L1 sensitivity "
                                                       "= per-unit bound over the whole window")
        noisy = noise.add_discrete_laplace(counts, k, eps_c).astype(np.float64)
        del counts  # nothing below reads the private histogram
        # --- post-processing ---------------------------------------------------------------------
        scale = k / eps_c
        noise_std = float(np.sqrt(discrete_laplace_variance(scale)))
        config = DenoiserConfig(n_codes=self.n_codes, alpha=self.alpha, hidden=self.hidden, code_dim=self.code_dim,
                                levels=self.levels, temporal_context=self.temporal_context,
                                window_mean=bool(self.window_mean), residual_window=int(self.residual_window),
                                resolutions=tuple(int(s) for s in self.resolutions), steps=self.steps,
                                batch_size=self.batch_size, crop=self.crop, lr=self.lr,
                                max_seconds=self.max_train_seconds, seed=self.train_seed)
        denoiser = SliceDenoiser(config, self.device)
        report = denoiser.fit(noisy, noise_std, self.progress)
        t0 = time.perf_counter()
        denoised = denoiser.denoise(noisy, noise_std)
        if self.multiscale_kappa is not None:
            # the denoised map's noise variance is at most H̄'s, so H̄'s is a conservative bound
            denoised = multiscale_shrink(denoised, noise_std ** 2, float(self.multiscale_kappa),
                                         total_floor=noise_std * np.sqrt(noisy.size))
        else:
            denoised = nonnegative_keep_block_mass(denoised, self.nonneg_block)
        if self.consistency_kappa is not None:
            # put back H̄'s block sums where they differ from the estimate by more than their noise
            denoised = multiscale_consistency(denoised, noisy, noise_std ** 2, float(self.consistency_kappa),
                                              universal=bool(self.consistency_universal))
        if self.noisy_weight > 0:
            # blend with H̄'s non-negative part at the same mass: single cells keep more of what was measured
            pos = np.maximum(noisy, 0.0)
            if pos.sum() > 0:
                w = float(self.noisy_weight)
                denoised = (1 - w) * denoised + w * pos * (float(denoised.sum()) / float(pos.sum()))
        infer_s = time.perf_counter() - t0

        total = float(data.public_total) if public else float(n_hat)
        mass = float(denoised.sum())
        gamma = None
        c_hat = None
        if mass <= 0:
            released = np.full(noisy.shape, total / noisy.size)
        elif self.refinement == "mass":
            released = denoised * (total / mass)
        elif self.refinement == "gamma":
            mu = denoised / mass
            c_hat = float(np.sum(mu * mu))
            gamma = gamma_factor(n_hat, total, c_hat, noisy.size, k, eps_c)
            released = mu * n_hat * gamma
        else:
            released = denoised * (total / n_hat)
        notes = [
            f"N = {'public total ' + format(total, 'g') if public else 'n̂ (no public total: bounded-sample scale)'}",
            f"refinement {self.refinement}" + (f": γ={gamma:.4g}, C estimated from the denoised histogram={c_hat:.3g}"
                                               if gamma is not None else ""),
            (f"output ≥ 0 by multi-scale significance shrinkage (κ={self.multiscale_kappa:g})"
             if self.multiscale_kappa is not None else
             f"output projected to ≥ 0 keeping {self.nonneg_block}x{self.nonneg_block}-cell tile totals")
            + (f", then pulled towards the noisy histogram's significant block sums (κ={self.consistency_kappa:g})"
               if self.consistency_kappa is not None else ""),
            *([f"blended with the noisy histogram's non-negative part at weight {self.noisy_weight:g}"]
              if self.noisy_weight > 0 else []),
            f"denoiser trained {report.steps} steps in {report.seconds:.1f}s on {report.device}"
            + (" (stopped by max_train_seconds)" if report.stopped_early else ""),
        ]
        if res is not None:
            notes += [res.note()] + ([warn] if warn else [])
        extra = {"grid_size": m, "cell_width_m": data.region.side_m / m, "n_slots": int(data.n_slots or 0),
                 "n_estimate": n_hat, "public_total": data.public_total, "gamma": gamma, "C_estimate": c_hat,
                 "train_steps": report.steps, "train_seconds": report.seconds, "train_loss": report.final_loss,
                 "codes_used": report.codes_used, "inference_seconds": infer_s, "device": report.device,
                 "resolution": res.record() if res is not None else None,
                 "noise_model": NoInterval("VDR's denoiser is not linear in the noise").spec()}
        acct.describe(notes)
        return SpatioTemporalSynopsis(released, data.region, None,
                                      slot_seconds=data.slot_seconds, window_start_s=data.window_start_s,
                                      extra=extra, attachments=denoiser.state_arrays())
