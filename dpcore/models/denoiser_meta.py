"""What is known about a public denoiser without loading it: its grid, files and training regions.

No torch here, so ParamSelect and release planning can ask whether the shipped denoiser applies to a
region without importing the network (dpcore.models.pyramid_denoiser).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dpcore.geo import Region

#: The denoiser's grid: the finest pyramid level it works on (156 m cells on a 20 km city).
DENOISER_GRID = 128
#: Where the shipped model lives (weights .npz + metadata .json).
DEFAULT_DENOISER_PATH = Path(__file__).with_name("snh_denoiser.npz")
#: A specialist shipped beside it: trained on record-level releases whose signal n·ε/s lies in one band
#: (``train-denoiser --record-only --signal-range``); snh's default applies it in place of the general
#: model to exactly those releases (:func:`trained_band`).
BAND_DENOISER_PATH = Path(__file__).with_name("snh_denoiser_band.npz")

def region_record(region: Region) -> dict:
    return {"name": region.name, "center_lat": region.center_lat, "center_lon": region.center_lon,
            "side_km": region.side_km}


def regions_overlap(a: dict, b: dict) -> bool:
    """Whether two square regions (centre + side) overlap (equirectangular; fine at city scale)."""
    half = (float(a["side_km"]) + float(b["side_km"])) / 2.0
    dy = abs(float(a["center_lat"]) - float(b["center_lat"])) * 111.32
    dx = abs(float(a["center_lon"]) - float(b["center_lon"])) * 111.32 * math.cos(
        math.radians((float(a["center_lat"]) + float(b["center_lat"])) / 2.0))
    return dx < half and dy < half


def model_fingerprint(path: str | Path = DEFAULT_DENOISER_PATH) -> str:
    """A short hash of a denoiser's weights ("none" without one): cached results that used it key on it."""
    import hashlib

    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else "none"


def load_meta(path: str | Path) -> dict:
    """A denoiser's metadata (training regions, report) without its weights."""
    path = Path(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    if int(meta.get("grid", -1)) != DENOISER_GRID:
        raise ValueError(f"denoiser {path} was trained on a {meta.get('grid')} grid, this code uses {DENOISER_GRID}")
    return meta


def trained_band(meta: dict) -> tuple[float, float, bool] | None:
    """(lowest signal, highest signal, record level only) of the releases a band denoiser was trained on,
    from its metadata; None for a general one (trained on ε drawn from a range, not on a signal band)."""
    config = meta.get("report", {}).get("config", {})
    band = config.get("signal_range")
    if band is None:
        return None
    return float(band[0]), float(band[1]), bool(config.get("record_only", False))


def shipped_denoiser_usable(region: Region, path: str | Path = DEFAULT_DENOISER_PATH) -> tuple[bool, str]:
    """Whether snh's default (``denoiser="auto"``) applies the shipped model to ``region``, and why:
    the file is installed and none of its training regions overlaps the region."""
    path = Path(path)
    if not path.exists():
        return False, f"{path.name} is not installed"
    return usable_for(load_meta(path), region)


def usable_for(meta: dict, region: Region) -> tuple[bool, str]:
    """A model may denoise ``region`` only if none of its training regions overlaps it."""
    here = region_record(region)
    for r in meta.get("training_regions", []):
        if regions_overlap(here, r):
            return False, f"the public denoiser was trained on data of {r['name']}, which overlaps {region.name}"
    return True, f"public denoiser trained on {', '.join(sorted({r['name'] for r in meta['training_regions']}))}"
