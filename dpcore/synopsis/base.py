"""What a mechanism returns: a synopsis that answers range counts, renders densities, saves and loads.

Everything a synopsis does is post-processing of noisy output, so it costs no budget. A synopsis
carries its privacy metadata (mechanism, parameters, ε, charges, sensitivity, privacy unit, noise
source) so that a release manifest can state exactly what was spent and how.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dpcore import GeoDPError
from dpcore.geo import Region
from dpcore.grid.histogram import answer_boxes, prefix_sums, resample_grid

SYNOPSIS_META = "synopsis.json"


class SynopsisError(GeoDPError, ValueError):
    pass


@dataclass
class PrivacyInfo:
    """The privacy statement of a synopsis, copied verbatim into release manifests. ``epsilon`` is the
    pure-ε budget, or None for a ρ-zCDP release (``rho``)."""

    mechanism: str
    params: dict[str, Any]
    epsilon: float | None
    charges: list[dict]
    privacy_unit: str
    sensitivity: float
    max_points_per_user: int | None
    noise_source: str
    notes: list[str] = field(default_factory=list)
    rho: float | None = None

    def to_dict(self) -> dict:
        out = {"mechanism": self.mechanism, "params": self.params, "epsilon": self.epsilon,
               "charges": self.charges,
               "epsilon_spent": float(sum(c.get("epsilon") or 0.0 for c in self.charges)),
               "privacy_unit": self.privacy_unit, "sensitivity": self.sensitivity,
               "max_points_per_user": self.max_points_per_user, "noise_source": self.noise_source,
               "notes": list(self.notes)}
        if self.rho is not None:
            out["rho"] = self.rho
            out["rho_spent"] = float(sum(c.get("rho") or 0.0 for c in self.charges))
        return out

    @classmethod
    def from_dict(cls, d: dict) -> PrivacyInfo:
        return cls(d["mechanism"], dict(d["params"]), None if d["epsilon"] is None else float(d["epsilon"]),
                   list(d["charges"]), d["privacy_unit"], float(d["sensitivity"]), d.get("max_points_per_user"),
                   d["noise_source"], list(d.get("notes", [])), d.get("rho"))


class Synopsis(ABC):
    """Base class of every released structure.

    Subclasses implement :meth:`answer`, :meth:`density`, :meth:`_save_arrays` and
    :meth:`_load_arrays`; ``kind`` names the class for loading (``module:Class``).
    """

    region: Region
    privacy: PrivacyInfo
    kind: ClassVar[str]

    @abstractmethod
    def answer(self, boxes: np.ndarray) -> np.ndarray:
        """Estimated counts for (q, 4) boxes [xmin, ymin, xmax, ymax] in region metres (vectorised)."""

    @abstractmethod
    def density(self, nx: int, ny: int | None = None) -> np.ndarray:
        """Estimated counts on an (nx, ny) grid over the region (x east, y north)."""

    @abstractmethod
    def _save_arrays(self, directory: Path) -> list[str]:
        """Write the data files into directory; return their names."""

    @classmethod
    @abstractmethod
    def _load_arrays(cls, directory: Path, meta: dict, region: Region, privacy: PrivacyInfo) -> Synopsis:
        """Rebuild from files written by :meth:`_save_arrays`."""

    def extra_meta(self) -> dict:
        """Subclass-specific JSON-able metadata stored in synopsis.json."""
        return {}

    def caveats(self) -> list[str]:
        """What a reader of this release's answers should know about their bias (shown by `geodp query`)."""
        return []

    def answer_latlon(self, boxes_latlon: np.ndarray) -> np.ndarray:
        return self.answer(self.region.box_latlon_to_m(boxes_latlon))

    def save(self, directory: str | Path) -> list[str]:
        """Write data files then synopsis.json; returns every file name written (meta last)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files = self._save_arrays(d)
        meta = {"kind": f"{type(self).__module__}:{type(self).__qualname__}", "region": self.region.to_dict(),
                "privacy": self.privacy.to_dict(), "extra": self.extra_meta(), "files": files}
        (d / SYNOPSIS_META).write_text(json.dumps(meta, indent=2, default=json_default))
        return [*files, SYNOPSIS_META]


def json_default(o: Any) -> Any:
    """``json.dumps(default=...)`` for numpy scalars and arrays in metadata and manifests."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def load_synopsis(directory: str | Path) -> Synopsis:
    """Load any synopsis saved by :meth:`Synopsis.save`."""
    d = Path(directory)
    meta_path = d / SYNOPSIS_META
    if not meta_path.exists():
        raise SynopsisError(f"{d} holds no {SYNOPSIS_META}: not a geodp synopsis directory")
    meta = json.loads(meta_path.read_text())
    module_name, _, cls_name = meta["kind"].partition(":")
    if not module_name.startswith("dpcore."):
        raise SynopsisError(f"refusing to load synopsis kind {meta['kind']!r} from outside dpcore")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls._load_arrays(d, meta, Region.from_dict(meta["region"]), PrivacyInfo.from_dict(meta["privacy"]))


class GridSynopsis(Synopsis):
    """A 2-D grid of (post-processed, noisy) counts over the region; the common output of grid methods.

    Range queries use prefix sums with the uniformity assumption inside partly covered cells.
    ``arrays`` holds public structure a mechanism releases beside the grid (e.g. PrivTree's leaves);
    it is saved in the same grid.npz, and a release saved without any loads with none.
    """

    kind = "grid"

    def __init__(self, values: np.ndarray, region: Region, privacy: PrivacyInfo, extra: dict | None = None,
                 arrays: dict[str, np.ndarray] | None = None):
        self.values = np.asarray(values, dtype=np.float64)
        if self.values.ndim != 2:
            raise SynopsisError("GridSynopsis values must be 2-D")
        if arrays and "values" in arrays:
            raise SynopsisError("'values' is the grid itself, not an extra array name")
        self.region = region
        self.privacy = privacy
        self._extra = dict(extra or {})
        self.arrays = {k: np.asarray(v) for k, v in (arrays or {}).items()}
        self._prefix = prefix_sums(self.values)

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape  # type: ignore[return-value]

    def answer(self, boxes: np.ndarray) -> np.ndarray:
        return answer_boxes(self._prefix, self.region.bounds_m, boxes)

    def density(self, nx: int, ny: int | None = None) -> np.ndarray:
        ny = nx if ny is None else ny
        if (nx, ny) == self.values.shape:
            return self.values.copy()
        return resample_grid(self.values, nx, ny)

    def extra_meta(self) -> dict:
        return {**self._extra, "shape": list(self.values.shape)}

    def _save_arrays(self, directory: Path) -> list[str]:
        np.savez_compressed(directory / "grid.npz", values=self.values, **self.arrays)
        return ["grid.npz"]

    @classmethod
    def _load_arrays(cls, directory: Path, meta: dict, region: Region, privacy: PrivacyInfo) -> GridSynopsis:
        with np.load(directory / "grid.npz") as z:
            values = z["values"]
            arrays = {k: z[k] for k in z.files if k != "values"}
        extra = {k: v for k, v in meta.get("extra", {}).items() if k != "shape"}
        return cls(values, region, privacy, extra, arrays)

