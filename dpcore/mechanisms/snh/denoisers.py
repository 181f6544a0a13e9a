"""Which public denoiser an SNH release applies, decided from public inputs only, and the pyramid's
known total. Model files are read once per process and version."""

from __future__ import annotations

import functools
from pathlib import Path

from dpcore.geo import Region
from dpcore.mechanisms.contract import MechanismError
from dpcore.mechanisms.inputs import PointsInput
from dpcore.models.denoiser_meta import (
    BAND_DENOISER_PATH,
    DEFAULT_DENOISER_PATH,
    DENOISER_GRID,
    trained_band,
    usable_for,
)


def known_total(data: PointsInput) -> tuple[tuple[float, float] | None, str]:
    """An independent measurement (value, variance) of the noised points' total for the pyramid's root,
    with a note for the manifest: a paid sample size the caller hands over, or at record level a public
    total (the region's count, exact). None when there is neither, or a paid size comes without its variance."""
    if data.sample_size is not None and data.sample_size_variance is not None:
        return ((float(data.sample_size), float(data.sample_size_variance)),
                "; its total joined by the already-paid sample size n̂ (inverse-variance)")
    if data.sample_size is None and data.public_total is not None and data.privacy_unit == "record":
        return (float(data.public_total), 0.0), "; its total set to public_total"
    return None, ""


@functools.lru_cache(maxsize=4)
def _load_denoiser(path: str, mtime_ns: int):
    """A denoiser file read once per process and version (``mtime_ns`` makes a retrained file a new entry)."""
    from dpcore.models.pyramid_denoiser import load_denoiser

    return load_denoiser(path)


def read_denoiser(path: Path):
    """(model, metadata) of a denoiser file from the per-process cache, so a fit reads neither file again;
    an unreadable or malformed file is reported as a MechanismError."""
    try:
        return _load_denoiser(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise MechanismError(f"cannot read denoiser model {path}: {exc}") from exc


def choose_denoiser(denoiser: str, region: Region, *, flat_grid: bool) -> tuple[object | None, str]:
    """The public denoiser to apply (None: plain pyramid) and why; decided from public inputs only.

    ``"auto"`` uses the shipped model when the release uses the pyramid (``flat_grid`` False: ρ not fixed
    by the caller), the model file is present, and none of its training regions overlaps this region; a
    path must name a model that was not trained on this region (refused otherwise)."""
    if denoiser == "none":
        return None, "no denoiser (denoiser='none')"
    if denoiser == "auto":
        if flat_grid:
            return None, "no denoiser (the paper's flat grid at a given ρ)"
        path = DEFAULT_DENOISER_PATH
        if not path.exists():
            return None, f"no denoiser: {path.name} is not installed"
    else:
        path = Path(denoiser)
    model, meta = read_denoiser(path)
    ok, why = usable_for(meta, region)
    if ok:
        return model, why
    if denoiser == "auto":
        return None, f"no denoiser: {why}"
    raise MechanismError(f"denoiser {path}: {why}; a city is never denoised by a model trained on it")


def band_denoiser(denoiser: str, region: Region, *, bands: bool, grid: int,
                  ) -> tuple[object, tuple[float, float, bool]] | None:
    """The shipped specialist that may replace the general denoiser on this region, with its band
    (lowest signal, highest signal, record level only); None where there is none. Public inputs only:
    the default (``denoiser="auto"`` with ``bands``) at the grid the specialist was measured at, and
    only a model not trained on the region."""
    if denoiser != "auto" or not bands or grid != DENOISER_GRID:
        return None
    path = BAND_DENOISER_PATH
    if not path.exists():
        return None
    model, meta = read_denoiser(path)
    band = trained_band(meta)
    if band is None or not usable_for(meta, region)[0]:
        return None
    return model, band
