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
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from dpcore import GeoDPError
from dpcore.geo import Region
from dpcore.grid.histogram import answer_boxes, prefix_sums, resample_grid

if TYPE_CHECKING:
    from dpcore.synopsis.noise import Intervals, NoiseModel
    from dpcore.synopsis.spread import CellSpread

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


#: How a release of distinct people per cell (`release --count people`) says so in its privacy notes.
PEOPLE_NOTE = "counts distinct people per cell (and slot), not points"


@dataclass(frozen=True)
class AnswerUnit:
    """What a release's answers count: ``points`` (every point of the data), ``bounded_points`` (the points
    left after each person was cut to ``k``) or ``people`` (distinct people, or a heatmap's user mass:
    each person's activity adds up to 1). ``label`` is the word answers carry."""

    kind: Literal["points", "bounded_points", "people"]
    k: int | None = None

    @property
    def label(self) -> str:
        return {"points": "full points", "bounded_points": "bounded points", "people": "people"}[self.kind]

    @property
    def description(self) -> str:
        """One phrase for axes and legends."""
        if self.kind == "bounded_points":
            return f"points, each person bounded to {self.k}" if self.k else "points, each person bounded"
        return {"points": "points", "people": "people (each person counts 1 in total)"}[self.kind]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "k": self.k, "label": self.label}

    @classmethod
    def of_privacy(cls, privacy: PrivacyInfo | None) -> AnswerUnit:
        """Unscaled counts: bounded points at user level, points at record level; people when the notes say
        the cells count distinct people (PEOPLE_NOTE)."""
        if privacy is not None and any(str(n).startswith(PEOPLE_NOTE) for n in privacy.notes):
            return cls("people")
        if privacy is not None and privacy.privacy_unit == "user":
            return cls("bounded_points", privacy.max_points_per_user)
        return cls("points")


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

    def unit(self) -> AnswerUnit:
        """What the answers count (subclasses that scale or normalise say so; a release that counts people
        records ``extra["count"] = "people"``)."""
        if (getattr(self, "_extra", None) or {}).get("count") == "people":
            return AnswerUnit("people")
        return AnswerUnit.of_privacy(getattr(self, "privacy", None))

    def noise_model(self) -> NoiseModel:
        """How the answers carry noise (built by the mechanism that drew it); NoInterval when unknown."""
        from dpcore.synopsis.noise import NoInterval

        return NoInterval("this release records no noise model")

    def spread_model(self) -> CellSpread | None:
        """How far spreading a cut cell's count evenly over a box may move an answer (None: the release
        has no cells whose count it spreads)."""
        return None

    def intervals(self, boxes_m: np.ndarray, level: float = 0.95, spread: bool = True) -> tuple[np.ndarray, Intervals]:
        """(estimates, intervals) of (q, 4) boxes in region metres, all boxes at once: the noise model's
        interval, widened by the spread inside partly covered cells where the release has cells (``spread``
        False: the noise model's alone, an interval of the noise-free answer)."""
        from dpcore.synopsis.spread import widen

        boxes = np.atleast_2d(np.asarray(boxes_m, dtype=np.float64))
        est = self.answer(boxes)
        iv = self.noise_model().intervals(boxes, est, level)
        return est, widen(iv, est, self.spread_model() if spread else None, boxes, level)

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

    def noise_model(self) -> NoiseModel:
        """The model the mechanism stored (``extra["noise_model"]``), built once per loaded release."""
        from dpcore.synopsis.noise import model_from_spec

        if getattr(self, "_noise_model", None) is None:
            self._noise_model = model_from_spec(self._extra.get("noise_model"), self,
                                                "this release was saved before releases stored their noise model")
        return self._noise_model

    def spread_model(self) -> CellSpread:
        """The released counts of the release's own cells (or leaves), built once per loaded release."""
        from dpcore.synopsis.spread import spread_of

        if getattr(self, "_spread", None) is None:
            self._spread = spread_of(self)
        return self._spread

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

