"""The SNH mechanism (Spatial Neural Histograms: Zeighami, Ahuja, Ghinita, Shahabi, VLDB 2022).

Method (only step 1 reads data):

1. **Data collection.** ``data_collection="grid"`` (the paper's): an equi-width grid of cell width ρ
   over the (public) region with discrete Laplace noise of scale sensitivity/ε on every cell. A count is
   never negative, so its training labels and its answers below 0 are set to 0 (``clip_negative``, as
   the paper clips its labels; post-processing).
   ``"pyramid"`` (beyond the paper): noisy grids at three quadtree levels G/16, G/4, G
   (G = the power of two nearest 4·side/ρ; ε split 1 : 2 : 2), combined into one (G, G) estimate by
   inverse-variance consistency and coarse-to-fine Wiener shrinkage (:func:`pyramid_estimate`,
   post-processing). ``"auto"`` (default): the pyramid when ρ comes from ParamSelect, and the paper's
   grid when the caller fixes ``cell_width_m`` (the 4× finer rule is tied to ParamSelect's ρ; the choice
   is recorded in docs/decisions/0003-snh-pyramid-loss-and-answer-blend.md). Every level's cells are disjoint, so its L1 sensitivity
   is the per-unit contribution bound: k (``max_points_per_user``) under user-level privacy, 1 under
   record-level. When ρ is not given it is chosen by ParamSelect from public inputs (ε, the
   sensitivity, the public region, and n): n is ``public_total`` when the caller declares one,
   otherwise a noisy total paid with 1% of ε, and up to ``total_fraction`` only when 1% is too coarse
   (sensitivity k; dpcore.mechanisms.sample_size.public_n_for_fit) — the ledger says which.
   **Public denoiser** (``denoiser="auto"``, beyond the paper): when the shipped model
   (dpcore.models.pyramid_denoiser, trained only on public datasets) was not trained on data of this
   region, the pyramid is taken at the model's fixed grid (128², so no ρ and no paid n are needed) and
   its estimate is replaced by the model's output: a U-Net that has learned from simulated releases of
   public cities what a city's density looks like under this noise. Post-processing of the noisy
   levels; the nets then learn from its output. Two guards with the denoiser, also post-processing: the pyramid's total
   takes in the caller's already-paid sample size n̂ (user level: dpcore.privacy.scaling) or a record-level
   ``public_total`` by inverse variance (:func:`known_total`), and the denoised grid's blocks are capped
   at their own levels' combined counts + ``denoiser_cap_sigmas``·σ (:func:`cap_to_levels`), the
   excess dropped; the manifest says how much. The denoiser is applied only while the release's signal
   n̂·ε/s is below ``denoiser_max_signal`` (:data:`DENOISER_MAX_SIGNAL`): above it the counts alone
   resolve the density better, and the plain pyramid estimate at the model's grid is kept. Where a
   release's signal and privacy unit fall in the band a shipped specialist was trained on
   (``denoiser_bands``, :data:`BAND_DENOISER_PATH`: record level, signal 3,000–40,000), that model
   denoises it instead of the general one; the signal is post-processing, so this choice costs nothing.
   **Fine level** (``fine_factor`` f > 1, with the pyramid; off by default): one more noisy level at f·G
   (f = 2 with the denoiser: 78 m cells on 20 km) takes ``fine_share`` of the collection's ε, the other
   levels the rest in their 1 : 2 : 2 ratio. Its block sums join level G by inverse variance before the
   estimate (and the denoiser), and the G grid (denoised and capped, or not) is split down to it by the same Wiener-shrunk splits as the pyramid
   (:func:`refine_to_fine`): a cell's mass goes to its sub-cells evenly except where the fine counts stand
   out from their noise, i.e. in dense cells. The nets learn the G grid (the fine grid's block sums).
2. **Augmentation** (post-processing). For k_s query sides r_i = l + (u − l)(i + ½)/k_s over
   [l, u], the label of every grid-aligned square of side r_i (bottom-left corner on a cell corner)
   is the mass of the (noisy or pyramid) grid it covers: whole cells plus the uniformity share of partly covered cells,
   computed from prefix sums (bilinear interpolation of the prefix table), no loops.
3. **Training** (post-processing). One small MLP per query side, all k_s trained together as one
   batched model (stacked weights + bmm); sine first activation, swish after; Adam; float32; loss
   = absolute error weighted per sample by w/max(y, ψ) (``loss="relative_l1"``: the metric the
   releases are judged by; the default with the pyramid) or the paper's squared error with the same
   weights (``loss="paper"``; the default with the flat grid), with w = the number of *public* workload queries that
   overlap the sample's square (``public_workload`` / ``public_workload_boxes``; w = 1 without one; a
   sample no workload query overlaps gets weight 0, as in the paper) and ψ = 0.1% of n̂,
   where n̂ is a paid estimate, ``public_total`` or the sum of the *noisy* grid (post-processing),
   never the raw n.
   Early stopping on the training loss.
4. **Answering** (post-processing). A query of side r (√(w·h) for rectangles) goes to the net whose
   r_i is nearest, evaluated at the query centre, scaled by (w·h)/r_i². Queries larger than the
   trained range (side > u) are answered from the noisy grid with prefix sums instead, where the
   uniformity assumption is accurate and a net would extrapolate. A count is never negative, so a net's
   negative answer is answered 0.
   With the pyramid (``answer="auto"``) a query up to u gets a weighted geometric mean of the
   net's answer and the (denoised) grid's, nets^a · grid^(1−a) (``ANSWER_RULES``): on squares of 100 m
   and more the grid resolves more where the signal n̂·ε/s is large (record level), the nets are
   better where it is small (user level); a is set from n̂·ε/s and the query side by
   :func:`blend_nets_weights`, chosen on public data. Without the denoiser the nets answer alone below
   signal 4,000 (:data:`PLAIN_BLEND_MIN_SIGNAL`). The paper's flat grid keeps the paper's nets. With a
   fine level, squares under 100 m take the fine grid's answer (nets weight
   :data:`~dpcore.mechanisms.snh.rules.FINE_NETS_WEIGHT_SMALL` = 0) and larger ones the G grid's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import StrictBool

from dpcore.geo import Region
from dpcore.grid.histogram import block_sum
from dpcore.grid.pyramid import (
    LEVEL_DIVISORS,
    LEVEL_WEIGHTS,
    cap_to_levels,
    pyramid_size,
    refine_to_fine,
    release_pyramid,
)
from dpcore.mechanisms.base import Mechanism, MechanismError
from dpcore.mechanisms.contract import FitRecord
from dpcore.mechanisms.inputs import PointsInput
from dpcore.mechanisms.params import Band, Fraction, NonNegative, Positive, PositiveInt
from dpcore.mechanisms.snh import denoisers
from dpcore.mechanisms.snh.augmentation import check_workload, load_public_workload, query_sides
from dpcore.mechanisms.snh.rules import (
    BLEND_SMALL_SIDE_M,
    DENOISER_CAP_SIGMAS,
    DENOISER_MAX_SIGNAL,
    GEOMETRIC_NETS_WEIGHTS,
    PSI_FRACTION,
    blend_nets_weights,
    release_signal,
)
from dpcore.mechanisms.tags import MechanismTags
from dpcore.models.denoiser_meta import DENOISER_GRID
from dpcore.privacy.noise import NoiseSource, discrete_laplace_variance


class SpatialNeuralHistogram(Mechanism):
    """SNH mechanism. See the module docstring for the method and its privacy accounting.

    Defaults are chosen so a 20 × 20 km release trains in well under 2 minutes on a 2-core CPU
    (``bench/bench_snh.py``: 12–26 s under load): 8 query sides, nets of 3 hidden layers × 64 units,
    sine frequency ω₀ = m/6 for an m × m grid (clipped to [4, 40]), ≤ 40 epochs of 32k samples per
    net, early stopping on the training loss, one CPU training thread. By default the shipped public
    denoiser is used (``denoiser="auto"``) and the pyramid's finest level is its grid (``denoiser_grid``:
    128², or 256² for small squares at record level, see :data:`DENOISER_GRIDS`); where
    it may not be used (its training regions overlap the release's, or ``denoiser="none"``) and
    ``cell_width_m`` is not given, ρ comes from ParamSelect: the identity grid's ρ (the shipped
    table's SNH rows are measured at this choice, not searched over ρ), and with the pyramid ρ only
    sets the finest level, G ≈ 4·side/ρ.
    """

    name = "snh"
    tags = MechanismTags(auto_role="self_tuned", fast_params={
        "n_sizes": 2, "hidden": 8, "depth": 1, "max_epochs": 1, "samples_per_epoch": 1024, "batch_size": 256})

    def __init__(self, *, cell_width_m: Positive | None = None, query_sides_m: Band = (25.0, 1000.0),
                 n_sizes: PositiveInt = 8, hidden: PositiveInt = 64, depth: PositiveInt = 3,
                 omega0: Positive | None = None, lr: Positive = 1e-3, batch_size: PositiveInt = 1024,
                 max_epochs: PositiveInt = 40, patience: PositiveInt = 4, samples_per_epoch: PositiveInt = 32768,
                 total_fraction: Fraction = 0.05, paramselect_model: str | None = None, device: str | None = None,
                 public_workload: str | None = None, public_workload_boxes: list | None = None,
                 data_collection: Literal["auto", "grid", "pyramid"] = "auto", pyramid_kappa: NonNegative = 1.0,
                 loss: Literal["auto", "relative_l1", "paper"] = "auto", denoiser: str = "auto",
                 answer: Literal["auto", "nets", "grid", "geometric", "blend"] = "auto",
                 denoiser_grid: Literal[128, 256] = DENOISER_GRID,
                 denoiser_cap_sigmas: NonNegative | None = DENOISER_CAP_SIGMAS,
                 denoiser_max_signal: Positive | None = DENOISER_MAX_SIGNAL, denoiser_bands: StrictBool = True,
                 fine_factor: Literal[1, 2, 4] = 1, fine_share: Fraction = 0.3, clip_negative: StrictBool = True,
                 sampling: Literal["auto", "uniform", "mass"] = "auto"):
        self.cell_width_m = cell_width_m
        self.query_sides_m = query_sides_m
        self.n_sizes = n_sizes
        self.hidden = hidden
        self.depth = depth
        self.omega0 = omega0
        self.lr = lr
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.samples_per_epoch = samples_per_epoch
        self.total_fraction = total_fraction
        self.paramselect_model = paramselect_model
        self.device = device
        self.public_workload = public_workload
        self.public_workload_boxes = public_workload_boxes
        self.data_collection = data_collection
        self.pyramid_kappa = pyramid_kappa
        self.loss = loss
        self.denoiser = denoiser
        self.answer = answer
        self.denoiser_grid = denoiser_grid
        self.denoiser_cap_sigmas = denoiser_cap_sigmas
        self.denoiser_max_signal = denoiser_max_signal
        self.denoiser_bands = denoiser_bands
        self.fine_factor = fine_factor
        self.fine_share = fine_share
        self.clip_negative = clip_negative
        self.sampling = sampling

    # -- step 1: the only step that reads data --------------------------------------------------
    def _choose_cell_width(self, data: PointsInput, acct: FitRecord, noise: NoiseSource) -> tuple[float, str]:
        if self.cell_width_m is not None:
            return float(self.cell_width_m), "cell width given as a public parameter"
        from dpcore.mechanisms.sample_size import cell_width_for_fit

        return cell_width_for_fit(data, acct, noise, mechanism="snh", band=tuple(float(v) for v in self.query_sides_m),
                                  total_fraction=self.total_fraction, model_path=self.paramselect_model)

    def _workload(self, region: Region) -> tuple[np.ndarray | None, str]:
        """The PUBLIC workload that sets the loss weights w (None: w = 1), and a note for the release."""
        if self.public_workload is not None:
            boxes = load_public_workload(self.public_workload, region)
            source = f"file {self.public_workload}"
        elif self.public_workload_boxes is not None:
            boxes = check_workload(self.public_workload_boxes, "public_workload_boxes")
            source = "public_workload_boxes"
        else:
            return None, "loss weight w = 1 (no public workload)"
        return boxes, (f"loss weight w = number of the {boxes.shape[0]} public workload queries ({source}) "
                       "overlapping each training square: public configuration, no budget")

    def _denoiser_for(self, region: Region) -> tuple[object | None, str]:
        return denoisers.choose_denoiser(self.denoiser, region, flat_grid=self.cell_width_m is not None
                                         or self.data_collection == "grid")

    def _band_denoiser(self, region: Region) -> tuple[object, tuple[float, float, bool]] | None:
        return denoisers.band_denoiser(self.denoiser, region, bands=bool(self.denoiser_bands),
                                       grid=int(self.denoiser_grid))

    def _collect_pyramid(self, data: PointsInput, acct: FitRecord, noise: NoiseSource,
                         rho: float, denoiser=None, specialist=None) -> tuple[np.ndarray, int, str, dict]:
        """Noisy quadtree levels G/16, G/4, G (budget 1 : 2 : 2), combined by :func:`pyramid_estimate`.

        Each level is a partition of the region, so its L1 sensitivity is the per-unit bound; the levels
        compose sequentially and their ε add up to what is left. The combined (G, G) estimate replaces the
        flat noisy grid as the source of SNH's labels and of large-query answers (post-processing).
        ``specialist``: a denoiser (model, (lowest signal, highest signal, record level only)) that replaces
        ``denoiser`` on the releases it was trained for.
        Returns (estimate, G, note, facts for the config: the estimated total before the denoised grid's cap,
        whether the public denoiser was applied, the band of the specialist that was (None: the general
        model or none), the fraction of mass its cap dropped).
        """
        s = float(data.sensitivity)
        G = int(self.denoiser_grid) if denoiser is not None else pyramid_size(data.region.side_m, rho)
        levels = [max(1, G // d) for d in LEVEL_DIVISORS]
        weights = np.asarray(LEVEL_WEIGHTS, dtype=np.float64)
        collection_eps = acct.remaining
        fine_g = G * int(self.fine_factor)
        coarse_share = 1.0 - float(self.fine_share) if fine_g > G else 1.0
        level_eps = {}
        for i, (g, share) in enumerate(zip(levels, weights / weights.sum(), strict=True)):
            note = (f"pyramid level {g}x{g} ({data.region.side_m / g:.0f} m cells); disjoint cells, L1 "
                    "sensitivity = per-unit contribution bound")
            level_eps[g] = acct.spend_rest(f"pyramid_{g}", s, note=note) if i == len(levels) - 1 and fine_g == G \
                else acct.spend(f"pyramid_{g}", collection_eps * share * coarse_share, s, note=note)
        counts = {g: data.grid_counts(g, g) for g in levels}
        fine = None
        if fine_g > G:
            # A level below the denoiser's grid for squares smaller than its cells; disjoint cells again.
            fine_eps = acct.spend_rest(f"pyramid_{fine_g}", s, note=(
                f"fine level {fine_g}x{fine_g} ({data.region.side_m / fine_g:.0f} m cells); disjoint cells, "
                "L1 sensitivity = per-unit contribution bound"))
            fine = (noise.add_discrete_laplace(data.grid_counts(fine_g, fine_g), s, fine_eps).astype(np.float64),
                    discrete_laplace_variance(s / fine_eps))
        # Only the denoised path takes in a known total: ParamSelect's rows of the plain pyramid were
        # measured without it (their cache key does not name it).
        total, total_note = denoisers.known_total(data) if denoiser is not None else (None, "")
        # The fine level's block sums join level G before the estimate the denoiser starts from.
        est, noisy_levels, noise_var = release_pyramid(counts, s, level_eps, noise, float(self.pyramid_kappa),
                                                       total=total, fine=fine)
        note = (f"data collection: noisy pyramid {levels} (ε shares {list(LEVEL_WEIGHTS)}), combined "
                f"by inverse-variance consistency and Wiener shrinkage (κ={self.pyramid_kappa:g}){total_note}")
        estimated_total = float(est.sum())
        dropped = 0.0
        band_used = None
        signal = release_signal(estimated_total, collection_eps, s)
        if denoiser is not None and self.denoiser_max_signal is not None and signal >= self.denoiser_max_signal:
            note += (f"; the public denoiser not applied: signal n̂·ε/s = {signal:,.0f} ≥ "
                     f"{self.denoiser_max_signal:,.0f}, where the counts alone resolve the density better")
            denoiser = None
        elif denoiser is not None:
            if specialist is not None:
                model, (low, high, record_only) = specialist
                if low <= signal < high and (data.privacy_unit == "record" or not record_only):
                    denoiser, band_used = model, [low, high]
                    note += (f"; signal n̂·ε/s = {signal:,.0f} is in the band {low:,.0f}–{high:,.0f} the shipped "
                             f"specialist denoiser was trained on{' (record level)' if record_only else ''}, "
                             "so it replaces the general one")
            from dpcore.models.pyramid_denoiser import denoise

            est = denoise(denoiser, est, noisy_levels, noise_var)
            note += "; then the public denoiser (post-processing of the noisy levels)"
            if self.denoiser_cap_sigmas is not None:
                est, dropped = cap_to_levels(est, noisy_levels, noise_var, float(self.denoiser_cap_sigmas))
                note += (f", its blocks capped at their levels' combined counts + {self.denoiser_cap_sigmas:g}σ "
                         f"({dropped:.1%} of the mass dropped)")
        if fine is not None:
            est = refine_to_fine(est, fine[0], fine[1], float(self.pyramid_kappa))
            note += (f"; refined to the fine level {fine_g}x{fine_g} ({self.fine_share:g} of the collection's ε) "
                     "by Wiener-shrunk splits (post-processing)")
        return est, G, note, {"estimated_total": estimated_total, "denoised": denoiser is not None,
                               "denoiser_band": band_used, "dropped_fraction": dropped,
                               "fine_grid": fine_g if fine is not None else None}

    def check_params(self) -> None:
        # Rules that tie parameters together (single values are declared in __init__'s annotations).
        if self.denoiser_grid != DENOISER_GRID and (self.denoiser == "none" or self.cell_width_m is not None
                                                     or self.data_collection == "grid"):
            raise MechanismError("denoiser_grid sets the grid the public denoiser works on: it needs the pyramid "
                                 "and a denoiser (not denoiser='none', cell_width_m or data_collection='grid')")
        if self.denoiser not in ("auto", "none"):
            if not Path(self.denoiser).exists():
                raise MechanismError(f"denoiser model file {self.denoiser} does not exist")
            if self.data_collection == "grid" or self.cell_width_m is not None:
                raise MechanismError("a denoiser works on the pyramid at its own grid: do not combine it with "
                                     "data_collection='grid' or cell_width_m")
        if self.fine_factor != 1 and (self.cell_width_m is not None or self.data_collection == "grid"):
            raise MechanismError("fine_factor adds a level below the pyramid's finest: it needs the pyramid "
                                 "(not cell_width_m or data_collection='grid')")
        if self.public_workload is not None and self.public_workload_boxes is not None:
            raise MechanismError("give public_workload (a file) or public_workload_boxes, not both")
        if self.public_workload_boxes is not None:
            # Boxes given inline need no region (already metres); a workload file is read in _fit.
            check_workload(self.public_workload_boxes, "public_workload_boxes")
        if self.public_workload is not None and not Path(self.public_workload).exists():
            # Its contents need the region, but a missing file is known before any budget is reserved.
            raise MechanismError(f"public workload file {self.public_workload} does not exist")

    def _fit(self, data: PointsInput, acct: FitRecord, noise: NoiseSource):  # -> SNHSynopsis
        import torch

        from dpcore.mechanisms.snh.synopsis import SNHSynopsis
        from dpcore.mechanisms.snh.training import pick_device, train_snh

        lo, hi = (float(v) for v in self.query_sides_m)
        sides = query_sides(lo, hi, int(self.n_sizes))
        side = data.region.side_m
        denoiser, denoiser_note = self._denoiser_for(data.region)
        if denoiser is not None:
            # The denoiser works on its own fixed grid and does the smoothing that ParamSelect's ρ would
            # otherwise trade off, so no ρ (and no paid n) is needed.
            G = int(self.denoiser_grid)
            rho, rho_note = side / G, f"finest pyramid level fixed at {G} by the public denoiser"
        else:
            rho, rho_note = self._choose_cell_width(data, acct, noise)
        collection_eps = acct.remaining  # the data collection spends all that is left
        collection = self.data_collection
        if collection == "auto":  # the paper's grid when the caller fixes ρ, else the pyramid
            collection = "grid" if self.cell_width_m is not None else "pyramid"
        if collection == "grid":
            m = max(1, int(round(side / rho)))
            counts = data.grid_counts(m, m)
            eps = acct.spend_rest("cell_counts", data.sensitivity,
                                  note=f"{m}x{m} grid (ρ={side / m:.1f} m); disjoint cells, L1 sensitivity = "
                                       "per-unit contribution bound")
            noisy = noise.add_discrete_laplace(counts, data.sensitivity, eps).astype(np.float64)
            noisy_total = float(noisy.sum())
            collection_note = "data collection: one flat noisy grid (the paper's)"
            if self.clip_negative:
                # A count is never negative (post-processing): as in the paper, the nets learn labels clipped
                # at 0, and an answer below 0 is answered 0. The cells themselves stay unclipped: a clipped
                # cell's noise no longer averages out, so squares of many cells would be biased upwards.
                collection_note += "; training labels and answers below 0 set to 0 (post-processing)"
            facts = {"estimated_total": noisy_total, "denoised": False, "denoiser_band": None, "dropped_fraction": 0.0,
                     "fine_grid": None}
        else:  # "pyramid"
            specialist = self._band_denoiser(data.region) if denoiser is not None else None
            noisy, m, collection_note, facts = self._collect_pyramid(data, acct, noise, rho, denoiser, specialist)
            noisy_total = facts["estimated_total"]
        # ---- everything below is post-processing of `noisy` ----
        if data.sample_size is not None:
            n_hat = float(data.sample_size)
        elif data.public_total is not None:
            n_hat = float(data.public_total)
        else:
            n_hat = max(noisy_total, 1.0)
        psi = PSI_FRACTION * n_hat
        # The sine layer's frequency sets the finest detail the nets can draw; scale it with the grid
        # (ω₀ ≈ m/6: ~8 for a 50-cell grid) unless given.
        # With the flat grid the nets learn the cells themselves, so the frequency follows the grid (ω₀ ≈ m:
        # on CABS_SFS's 343² grid ω₀ ≤ 60 cannot draw its streets, 300 can; bench/fit_snh_noise_free.py).
        omega0 = (float(self.omega0) if self.omega0 is not None
                  else float(np.clip(m, 4.0, 1024.0)) if collection == "grid" else float(np.clip(m / 6.0, 4.0, 40.0)))
        sampling = self.sampling if self.sampling != "auto" else ("mass" if collection == "grid" else "uniform")
        loss = self.loss if self.loss != "auto" else ("relative_l1" if collection == "pyramid" else "paper")
        answer_rule = self.answer if self.answer != "auto" else ("blend" if collection == "pyramid" else "nets")
        # The collection's estimated total (post-processing; before the denoised grid's cap) is the size of
        # the data the noise was added to: the bounded sample at user level, which n̂ for ψ need not be
        # (public_total is the full data's).
        signal = release_signal(noisy_total, collection_eps, float(data.sensitivity))
        nets_weights = {"geometric": GEOMETRIC_NETS_WEIGHTS,
                        "blend": blend_nets_weights(signal, facts["denoised"],
                                                    fine=facts["fine_grid"] is not None)}.get(answer_rule)
        if nets_weights is not None:
            answer_note = (f"queries up to {hi:g} m answered by {answer_rule}: nets^a · grid^(1−a) with a = "
                           f"{nets_weights[0]:g} under {BLEND_SMALL_SIDE_M:g} m, {nets_weights[1]:g} above "
                           f"(signal n̂·ε/s = {signal:.3g})")
        else:
            answer_note = f"queries up to {hi:g} m answered by {answer_rule}"
        workload, workload_note = self._workload(data.region)
        device_ = pick_device(self.device)
        seed = int(noise.rng.integers(0, 2**63 - 1))  # non-published randomness: init + shuffling
        gen = torch.Generator().manual_seed(seed)
        # With a fine level the nets learn the denoised grid (its block sums): their squares are grid-aligned,
        # and squares under 100 m are answered from the fine grid itself (FINE_NETS_WEIGHT_SMALL).
        coarse = noisy if noisy.shape[0] == m else block_sum(noisy, noisy.shape[0] // m)
        net, scales, train = train_snh(coarse, data.region, sides, psi, hidden=int(self.hidden),
                                       depth=int(self.depth), omega0=omega0, lr=float(self.lr),
                                       batch_size=int(self.batch_size), max_epochs=int(self.max_epochs),
                                       patience=int(self.patience), samples_per_epoch=int(self.samples_per_epoch),
                                       device=device_, generator=gen, workload=workload, loss=loss,
                                       clip_labels=collection == "grid" and bool(self.clip_negative),
                                       sampling=sampling)
        n_source = ("paid sample-size estimate" if data.sample_size is not None
                    else "public_total" if data.public_total is not None else "noisy grid sum")
        notes = [rho_note, collection_note, denoiser_note, f"ψ = 0.1% of n̂ = {psi:.3g} (n̂ from {n_source})", f"training loss {loss}, batches {sampling}",
                 "augmentation, training and answering are post-processing of the noisy grid", workload_note,
                 f"trained {train['epochs']} epochs in {train['seconds']:.1f} s on {device_}",
                 answer_note]
        params = {**self.get_params(), "query_sides_m": [lo, hi]}  # JSON-native, so save/load round-trips
        if self.public_workload_boxes is not None:
            params["public_workload_boxes"] = np.asarray(self.public_workload_boxes, dtype=np.float64).tolist()
        acct.describe(notes, params=params)
        config = {"sides_m": sides.tolist(), "hidden": int(self.hidden), "depth": int(self.depth),
                  "omega0": omega0, "label_scales": scales.tolist(), "grid_size": m,
                  "cell_width_m": side / m, "psi": psi, "query_sides_m": [lo, hi], "training": train,
                  "data_collection": collection, "loss": loss, **facts,
                  "answer": answer_rule, "signal": signal,
                  "answers_floor_zero": collection == "grid" and bool(self.clip_negative)}
        if nets_weights is not None:
            config["nets_weights"] = list(nets_weights)
        return SNHSynopsis(noisy, net, config, data.region, None)
