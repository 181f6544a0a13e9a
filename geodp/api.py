"""The analyst's Python entry: :func:`open_store`, :class:`Store` (its releases), :class:`Release`
(answers as DataFrames, the released grid as xarray)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcore.mechanisms import adopt_noise_model
from dpcore.queries.answers import BOX_COLUMNS, answer_table
from dpcore.synopsis.base import Synopsis, load_synopsis
from tasks.storage.manifest import Manifest
from tasks.storage.store import ReleaseRef, ReleaseStore, StoreError

if TYPE_CHECKING:
    import pandas as pd


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """A release store to read: a local folder, ``file:///path`` or ``s3://bucket/prefix`` (S3 endpoint and
    credentials as for the CLI: GEODP_S3_ENDPOINT_URL, AWS_* variables, or ``storage_options``)."""
    store = ReleaseStore(url, storage_options, create=False)
    if not _holds_releases(store):
        raise StoreError(f"{url} holds no releases/ folder: not a geodp release store")
    return Store(store)


def _holds_releases(store: ReleaseStore) -> bool:
    return store.exists("releases") or bool(store.listdir("releases"))


def is_store(url: str, storage_options: dict[str, Any] | None = None) -> bool | None:
    """Whether ``url`` is a release store's root (it holds a releases/ folder): False for a missing local
    folder or anything else that is no store; None when a remote store cannot be opened (an unreachable
    endpoint, a missing bucket), which the command that reads it then reports."""
    try:
        return _holds_releases(ReleaseStore(url, storage_options, create=False))
    except StoreError:
        return None if "://" in str(url) and not str(url).startswith("file://") else False


def place_of(target: str, storage_options: dict[str, Any] | None = None) -> tuple[str, str, str | None] | None:
    """(store URL, dataset, city or None) when ``target`` is a dataset's or a place's folder in a store,
    STORE/releases/DATASET[/CITY]; None for a store itself, a version folder or anything else.

    Decided by what the folders hold, not by the path's words alone: a store may sit in a folder named
    ``releases`` (``--out releases/nyc-demo``), and a dataset may be named ``releases``."""
    t = str(target).rstrip("/")
    if is_store(t, storage_options) is not False:  # a store, or one that cannot be opened: not a place
        return None
    parts = t.split("/")
    for i, part in enumerate(parts):
        tail = parts[i + 1:]
        if part != "releases" or not 1 <= len(tail) <= 2 or not all(tail) or ("://" in t and i < 3):
            continue  # a URL's bucket is no store's releases/ folder
        root = "/".join(parts[:i]) or ("/" if t.startswith("/") else ".")
        found = is_store(root, storage_options)
        if found is None:
            return None
        if found:
            return root, tail[0], tail[1] if len(tail) == 2 else None
    return None


@dataclass
class Store:
    """The committed releases of one store (a version without a manifest does not exist)."""

    store: ReleaseStore

    def releases(self, dataset: str | None = None, city: str | None = None,
                 period: str | None = None) -> list[Release]:
        """Every committed version, optionally of one dataset, city and period."""
        return [Release(self.store, m) for m in self.store.list_releases(dataset, city, period)]

    def table(self, dataset: str | None = None, city: str | None = None) -> pd.DataFrame:
        """One row per committed version: dataset, city, period, version, mechanism, ε, k, privacy unit."""
        import pandas as pd

        rows = [{"dataset": r.manifest.dataset, "city": r.manifest.city, "period": r.manifest.period,
                 "version": r.manifest.version, "mechanism": r.manifest.mechanism, "epsilon": r.manifest.epsilon,
                 "max_points_per_user": r.manifest.max_points_per_user, "privacy_unit": r.manifest.privacy_unit,
                 "url": r.url} for r in self.releases(dataset, city)]
        return pd.DataFrame(rows, columns=["dataset", "city", "period", "version", "mechanism", "epsilon",
                                           "max_points_per_user", "privacy_unit", "url"])

    def series(self, dataset: str, city: str) -> list[Release]:
        """The newest committed version of every period of one dataset and city, in time order."""
        newest: dict[str, Release] = {}
        for r in self.releases(dataset, city):
            if r.manifest.period not in newest or r.manifest.version > newest[r.manifest.period].manifest.version:
                newest[r.manifest.period] = r
        return sorted(newest.values(), key=lambda r: (r.window_s()[0] is None, r.window_s()[0] or 0, r.manifest.period))

    def in_window(self, dataset: str, city: str, period: str | None,
                  ) -> tuple[list[tuple[Release, tuple[int, int] | None]], list[str]]:
        """The releases of one place in ``period`` (A..B; None: all), each with the part of its own window to
        ask (None: all of it), and the periods left out: 2-D releases that reach past ``period``."""
        window = None
        if period is not None:
            from tasks.config import parse_window

            window = parse_window(period)
        chosen, left_out = [], []
        for r in self.series(dataset, city):
            start, end = r.window_s()
            if window is not None and (start is None or end <= window[0] or start >= window[1]):
                continue
            ask = None
            if window is not None and (start < window[0] or end > window[1]):
                if not hasattr(r.synopsis, "window_intervals"):
                    left_out.append(r.manifest.period)
                    continue
                ask = (max(start, window[0]), min(end, window[1]))
            chosen.append((r, ask))
        return chosen, left_out

    def query_range(self, dataset: str, city: str, boxes, period: str | None = None,
                    level: float = 0.95) -> pd.DataFrame:
        """Every committed release of ``dataset``/``city`` in ``period`` (A..B; default: all of them): one
        answer table per period (a ``period`` column first), then one row per box with the sum over the
        window and its combined interval (``period`` = 'sum A..B'; dpcore/queries/series.py). A
        spatio-temporal release that reaches past the window is asked the part inside it; a 2-D release
        that does is left out (``attrs['left_out']``)."""
        import pandas as pd

        from dpcore.queries.series import sum_method, sum_rows

        frames = []
        chosen, left_out = self.in_window(dataset, city, period)
        arr = _boxes(boxes)
        for r, ask in chosen:
            table = r._noted(answer_table(r.synopsis, arr, level=level, window_s=ask), arr)
            table.insert(0, "period", r.manifest.period)
            frames.append(table)
        if not frames:
            where = f" in {period}" if period else ""
            raise StoreError(f"no committed release of {dataset}/{city}{where} in {self.store.url}")
        per_period = pd.concat(frames, ignore_index=True)
        label = period or f"{frames[0]['period'].iloc[0]}..{frames[-1]['period'].iloc[0]}"
        noise = [(h.below, h.above) for h in (f.attrs["noise_halfwidths"] for f in frames)]
        total = sum_rows(per_period, label, noise)
        if "note" in per_period.columns:  # the sum carries the note of any period it adds up
            noted = per_period[per_period["note"].notna()]
            first = noted.groupby(noted.index % len(total)).first()
            total["note"] = [f"{first.at[i, 'period']}: {first.at[i, 'note']}" if i in first.index else None
                             for i in range(len(total))]
        out = pd.concat([per_period, total], ignore_index=True)
        out.attrs.update({"level": level, "left_out": left_out, "periods": len(frames),
                          "interval_method": frames[0].attrs["interval_method"],
                          "sum_method": sum_method(str(total["interval_covers"].iloc[0]))})
        return out

    def latest(self, dataset: str, city: str, period: str) -> Release:
        """The newest committed version of one dataset, city and period."""
        found = self.releases(dataset, city, period)
        if not found:
            raise StoreError(f"no committed release of {dataset}/{city}/{period} in {self.store.url}")
        return max(found, key=lambda r: r.manifest.version)


@dataclass
class Release:
    """One committed release version. Its files are fetched and verified on first use."""

    store: ReleaseStore
    manifest: Manifest
    _synopsis: Synopsis | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.store.url_of(self.ref.rel)

    @property
    def ref(self) -> ReleaseRef:
        m = self.manifest
        return ReleaseRef(m.dataset, m.city, m.period, m.version)

    @property
    def synopsis(self) -> Synopsis:
        """The released synopsis, every file's sha256 and size checked against the manifest."""
        if self._synopsis is None:
            tmp = tempfile.mkdtemp(prefix="geodp-release-")
            try:
                self.store.fetch(self.ref.rel, tmp)
                self._synopsis = adopt_noise_model(load_synopsis(tmp))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return self._synopsis

    def window_s(self) -> tuple[int | None, int | None]:
        """The release's period as [start, end) UTC seconds ((None, None) for a release of all the input)."""
        import pandas as pd

        w = self.manifest.window or {}
        if w.get("start") and w.get("end"):
            return int(pd.Timestamp(w["start"]).timestamp()), int(pd.Timestamp(w["end"]).timestamp())
        from tasks.config import parse_period

        p = parse_period(self.manifest.period.replace("_", ".."))
        return p.start_s, p.end_s

    @property
    def unit(self) -> str:
        """What the answers count: full points, bounded points or people."""
        return self.synopsis.unit().label

    def query(self, boxes: Iterable[Iterable[float]] | np.ndarray | pd.DataFrame, period: str | None = None,
              level: float = 0.95) -> pd.DataFrame:
        """Estimates of boxes (min_lat, min_lon, max_lat, max_lon: rows of an array, tuples, or a DataFrame
        with those columns) with their ``level`` interval: columns min_lat, min_lon, max_lat, max_lon,
        estimate, lower, upper, unit, interval_covers (lower/upper NaN where the release has no interval;
        ``attrs['interval_method']`` says why). ``period``: a time window (A..B) of a spatio-temporal release."""
        arr = _boxes(boxes)
        window = None
        if period is not None:
            from tasks.config import parse_window

            window = parse_window(period)
            check_window(self.synopsis, window, f"period={period!r}")
        return self._noted(answer_table(self.synopsis, arr, level=level, window_s=window), arr)

    def _noted(self, table: pd.DataFrame, boxes_ll: np.ndarray) -> pd.DataFrame:
        """``table`` with a ``note`` column when a box falls in a band this release is expected to serve worse
        than a blank map (its manifest's verdict)."""
        from tasks.release_verdict import band_note_codes

        codes, words = band_note_codes(self.manifest.quality, self.synopsis.region.box_latlon_to_m(boxes_ll))
        if words:
            table["note"] = np.array([*words, None], dtype=object)[codes]
        return table

    def to_xarray(self):
        """The released values on their grid as an ``xarray.DataArray``: dims (x, y) or (x, y, time), cell
        centres in the release's local metre frame (x east, y north of the region's centre) with latitude
        and longitude as 2-D coordinates; attrs: unit, mechanism, ε, k, privacy unit, release URL."""
        import pandas as pd
        import xarray as xr

        syn = self.synopsis
        values = released_values(syn)
        region = syn.region
        xmin, ymin, xmax, ymax = region.bounds_m
        nx, ny = values.shape[:2]
        x = xmin + (np.arange(nx) + 0.5) * (xmax - xmin) / nx
        y = ymin + (np.arange(ny) + 0.5) * (ymax - ymin) / ny
        xx, yy = np.meshgrid(x, y, indexing="ij")
        lat, lon = region.unproject(xx, yy)
        coords: dict[str, Any] = {"x": ("x", x), "y": ("y", y), "lat": (("x", "y"), lat), "lon": (("x", "y"), lon)}
        dims = ["x", "y"]
        if values.ndim == 3:
            dims.append("time")
            start, slot = getattr(syn, "window_start_s", None), getattr(syn, "slot_seconds", None)
            if start is not None and slot:
                coords["time"] = ("time", pd.to_datetime(start + slot * np.arange(values.shape[2]), unit="s"))
        m = self.manifest
        attrs = {"unit": syn.unit().label, "mechanism": m.mechanism, "epsilon": m.epsilon,
                 "max_points_per_user": m.max_points_per_user, "privacy_unit": m.privacy_unit,
                 "release": self.url, "crs": "local azimuthal frame of the region (metres), see dpcore/geo.py"}
        return xr.DataArray(values, dims=dims, coords=coords, name="released", attrs=attrs)


def check_window(synopsis: Synopsis, times: tuple[int, int], asked: str = "period") -> bool:
    """Raise ValueError unless the window ``times`` (UTC seconds, [start, end)) meets the release's own: it
    needs a spatio-temporal release, and outside its window every count would read 0. True when the
    window reaches past the release's (only the part inside it is counted)."""
    from dpcore.synopsis.spatiotemporal import SpatioTemporalSynopsis

    if not isinstance(synopsis, SpatioTemporalSynopsis):
        from dpcore.mechanisms import mechanism_names

        st = ", ".join(mechanism_names(lambda tags: tags.input_type.needs_time_slots))
        raise ValueError(f"{asked} needs a spatio-temporal release (mechanism {st}); this release has no time "
                         "axis: ask it without a period, or ask a store's releases of one place over a period "
                         "(Store.query_range; in the CLI, STORE/releases/DATASET/CITY)")
    if synopsis.window_start_s is None or synopsis.slot_seconds is None:
        raise ValueError(f"this release records no time window; {asked} cannot be placed in it")
    start = int(synopsis.window_start_s)
    end = start + int(synopsis.slot_seconds) * int(synopsis.n_slots)
    if times[1] <= start or times[0] >= end:
        def day(t: int) -> str:
            import pandas as pd

            return pd.Timestamp(t, unit="s", tz="UTC").isoformat()

        raise ValueError(f"{asked} ({day(times[0])}..{day(times[1])}) lies outside this release's window "
                         f"{day(start)}..{day(end)}")
    return times[0] < start or times[1] > end


def _boxes(boxes) -> np.ndarray:
    """(q, 4) lat/lon boxes from rows of an array, tuples, or a DataFrame with the box columns."""
    import pandas as pd

    if isinstance(boxes, pd.DataFrame):
        arr = boxes[BOX_COLUMNS].to_numpy(dtype=np.float64)
    else:
        arr = np.asarray(list(boxes) if not isinstance(boxes, np.ndarray) else boxes, dtype=np.float64)
        arr = np.atleast_2d(arr)
    if arr.ndim != 2 or arr.shape[1] != 4 or not np.isfinite(arr).all():
        raise ValueError("boxes must be rows of 4 finite numbers: min_lat, min_lon, max_lat, max_lon")
    return arr


def released_values(synopsis: Synopsis) -> np.ndarray:
    """The released grid (2-D, or 3-D with time) in the answers' unit: a scaled release's inner grid times
    its factor; a synopsis without a grid (a net) rendered on 256² cells."""
    factor, inner = 1.0, synopsis
    while hasattr(inner, "inner") and hasattr(inner, "factor"):
        factor *= float(inner.factor)
        inner = inner.inner
    values = getattr(inner, "values", None)
    if values is not None and np.ndim(values) in (2, 3):
        return np.asarray(values, dtype=np.float64) * factor
    return np.asarray(synopsis.density(256), dtype=np.float64)
