"""A release's cells in the formats GIS tools and notebooks read: GeoParquet, GeoJSON, GeoTIFF, CSV.

The release grid is in the region's local metre frame (dpcore/geo.py), an equirectangular projection
about the region's centre: x = Δlon·(metres per degree of longitude at the centre), y = Δlat·(metres per
degree of latitude). Its cell edges are therefore lines of constant longitude and latitude, and every cell
is exactly a WGS84 (EPSG:4326) rectangle: vector formats carry those polygons, a GeoTIFF the regular
lon/lat grid with its geotransform. Each cell carries the released value, its noise sd (the release's
noise model, NaN where it has none) and the unit; the manifest's key facts go in the file's metadata.

Exports keep the release's own resolution: a release of leaves of several sizes (PrivTree's, AG's) is
exported leaf by leaf, one polygon each (its raster of ~10 m cells would be millions of rows that say no
more), and only a uniform grid is written as a GeoTIFF, at its own cell size. The rows a format would
hold are counted before anything is written: past ``MAX_ROWS`` the export refuses.
Everything here is post-processing of the release.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpcore import GeoDPError
from dpcore.synopsis.spread import leaf_squares

if TYPE_CHECKING:
    from geodp.api import Release

FORMATS = ("geoparquet", "geojson", "geotiff", "csv")
SUFFIX = {"geoparquet": ".parquet", "geojson": ".geojson", "geotiff": ".tif", "csv": ".csv"}
#: Metadata key of the release facts (Parquet schema metadata, GeoJSON member, GeoTIFF tag, CSV comment).
META_KEY = "geodp"
#: The most rows (cells or leaves, × slots) a format is written with: about 1 GB of GeoJSON text, a few
#: hundred MB of Parquet or CSV, a 1 GB GeoTIFF.
MAX_ROWS = {"geojson": 2_000_000, "geoparquet": 20_000_000, "csv": 20_000_000, "geotiff": 60_000_000}


class ExportError(GeoDPError, ValueError):
    """An export the release's shape or size does not allow (nothing is written)."""


def release_facts(release: Release) -> dict:
    """The manifest's key facts, as every export carries them."""
    m, syn = release.manifest, release.synopsis
    return {"release": release.url, "dataset": m.dataset, "city": m.city, "period": m.period, "version": m.version,
            "mechanism": m.mechanism, "epsilon": m.epsilon, "rho": m.rho, "max_points_per_user": m.max_points_per_user,
            "privacy_unit": m.privacy_unit, "noise_source": m.noise_source, "unit": syn.unit().label,
            "region": syn.region.to_dict(), "crs": "EPSG:4326", "committed_at": m.committed_at,
            "code_version": m.code_version}


def _grid(synopsis):
    """The grid synopsis under any scaling wrappers (``inner``), or None for a release without one."""
    inner = synopsis
    while hasattr(inner, "inner") and hasattr(inner, "factor"):
        inner = inner.inner
    return inner if getattr(inner, "values", None) is not None else None


def _leaves(synopsis):
    """(x0, y0, side) of the release's leaves in region metres, None where it is a uniform grid."""
    inner = _grid(synopsis)
    return None if inner is None or np.ndim(inner.values) != 2 else leaf_squares(inner)


def export_rows(release: Release) -> int:
    """Rows an export of the release holds: leaves, or cells (× slots), without building them."""
    leaves = _leaves(release.synopsis)
    if leaves is not None:
        return int(leaves[0].size)
    inner = _grid(release.synopsis)
    shape = np.shape(inner.values) if inner is not None else (256, 256)
    return int(np.prod(shape))


def cell_table(release: Release) -> pd.DataFrame:
    """One row per cell (and time slot of a spatio-temporal release): ix, iy (x east, y north), [slot,
    time], min_lat, min_lon, max_lat, max_lon, lat, lon (centre), value, noise_sd, unit; for a release of
    leaves of several sizes one row per leaf: leaf, side_m, then the same columns from min_lat."""
    from geodp.api import released_values

    syn = release.synopsis
    leaves = _leaves(syn)
    if leaves is not None:
        return _leaf_table(syn, *leaves)
    values = released_values(syn)
    region = syn.region
    nx, ny = values.shape[:2]
    xmin, ymin, xmax, ymax = region.bounds_m
    xe, ye = np.linspace(xmin, xmax, nx + 1), np.linspace(ymin, ymax, ny + 1)
    _, lon_e = region.unproject(xe, np.zeros(nx + 1))  # cell edges: constant longitude and latitude
    lat_e, _ = region.unproject(np.zeros(ny + 1), ye)
    ix, iy = np.meshgrid(np.arange(nx), np.arange(ny), indexing="ij")
    ix, iy = ix.ravel(), iy.ravel()
    boxes = np.stack([xe[ix], ye[iy], xe[ix + 1], ye[iy + 1]], axis=1)
    sd = _cell_sd(syn, boxes, values.ndim == 3)
    base = pd.DataFrame({"ix": ix, "iy": iy, "min_lat": lat_e[iy], "min_lon": lon_e[ix], "max_lat": lat_e[iy + 1],
                         "max_lon": lon_e[ix + 1]})
    base["lat"], base["lon"] = (base.min_lat + base.max_lat) / 2, (base.min_lon + base.max_lon) / 2
    unit = syn.unit().label
    if values.ndim == 2:
        return base.assign(value=values[ix, iy], noise_sd=sd, unit=unit)
    frames = []
    start, slot_s = getattr(syn, "window_start_s", None), getattr(syn, "slot_seconds", None)
    for t in range(values.shape[2]):
        when = pd.Timestamp(start + t * slot_s, unit="s", tz="UTC") if start is not None and slot_s else pd.NaT
        frames.append(base.assign(slot=t, time=when, value=values[ix, iy, t], noise_sd=sd, unit=unit))
    return pd.concat(frames, ignore_index=True)


def _leaf_table(syn, x0: np.ndarray, y0: np.ndarray, w: np.ndarray) -> pd.DataFrame:
    """One row per leaf: its square's lat/lon corners, released count (in the answers' unit) and noise sd."""
    region = syn.region
    boxes = np.stack([x0, y0, x0 + w, y0 + w], axis=1)
    lat0, lon0 = region.unproject(x0, y0)
    lat1, lon1 = region.unproject(x0 + w, y0 + w)
    table = pd.DataFrame({"leaf": np.arange(x0.size), "side_m": w, "min_lat": lat0, "min_lon": lon0,
                          "max_lat": lat1, "max_lon": lon1})
    table["lat"], table["lon"] = (table.min_lat + table.max_lat) / 2, (table.min_lon + table.max_lon) / 2
    return table.assign(value=syn.answer(boxes), noise_sd=_cell_sd(syn, boxes, False), unit=syn.unit().label)


def _cell_sd(synopsis, boxes: np.ndarray, spatio_temporal: bool) -> np.ndarray:
    """Noise sd of each released cell (one slot of it for a spatio-temporal release): the noise model's,
    NaN where the release has none."""
    model = synopsis.noise_model()
    if spatio_temporal:
        law = getattr(model, "law", None)
        factor = float(getattr(model, "factor", 1.0))
        slot_factor = int(getattr(model, "slot_factor", 1))
        if law is None:
            return np.full(len(boxes), np.nan)
        return np.full(len(boxes), np.sqrt(law.variance) * factor / slot_factor)
    return np.asarray(model.sd(boxes), dtype=np.float64)


def export_release(release: Release, fmt: str, out: str | Path) -> Path:
    """Write the release's cells as ``fmt`` into ``out``; returns the path."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    rows = export_rows(release)
    if fmt == "geotiff" and _leaves(release.synopsis) is not None:
        raise ExportError(f"a GeoTIFF needs a uniform grid, and this release's {rows} leaves are of several sizes: "
                          "export them as polygons (--format geoparquet, geojson or csv)")
    if rows > MAX_ROWS[fmt]:
        raise ExportError(f"this release holds {rows:,} {'leaves' if _leaves(release.synopsis) is not None else 'cells'}"
                          f", more than the {MAX_ROWS[fmt]:,} a {fmt} export is written with: export "
                          f"{'geoparquet or csv' if fmt == 'geojson' else 'a coarser release'}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    facts = release_facts(release)
    if fmt == "geotiff":
        return _geotiff(release, out, facts)
    table = cell_table(release)
    if fmt == "csv":
        with out.open("w") as f:
            f.write(f"# {META_KEY}: {json.dumps(facts, default=str)}\n")
            table.to_csv(f, index=False)
        return out
    import geopandas as gpd
    from shapely import box

    geom = box(table.min_lon.to_numpy(), table.min_lat.to_numpy(), table.max_lon.to_numpy(), table.max_lat.to_numpy())
    gdf = gpd.GeoDataFrame(table, geometry=geom, crs="EPSG:4326")
    if fmt == "geoparquet":
        import pyarrow.parquet as pq

        gdf.to_parquet(out)
        t = pq.read_table(out)
        pq.write_table(t.replace_schema_metadata({**(t.schema.metadata or {}),
                                                   META_KEY.encode(): json.dumps(facts, default=str).encode()}), out)
        return out
    doc = json.loads(gdf.to_json(na="null", drop_id=True))
    doc[META_KEY] = facts
    out.write_text(json.dumps(doc, default=str))
    return out


def _geotiff(release: Release, out: Path, facts: dict) -> Path:
    """Bands: the released value, then its noise sd (a spatio-temporal release: one band per slot, then
    the sd); rows north to south, columns west to east, on the exact lon/lat grid of the cells."""
    import rasterio
    from rasterio.transform import from_bounds

    from geodp.api import released_values

    syn = release.synopsis
    values = released_values(syn)
    nx, ny = values.shape[:2]
    lat0, lon0, lat1, lon1 = syn.region.bbox_latlon()
    xmin, ymin, xmax, ymax = syn.region.bounds_m
    xe, ye = np.linspace(xmin, xmax, nx + 1), np.linspace(ymin, ymax, ny + 1)
    ix, iy = np.meshgrid(np.arange(nx), np.arange(ny), indexing="ij")
    boxes = np.stack([xe[ix.ravel()], ye[iy.ravel()], xe[ix.ravel() + 1], ye[iy.ravel() + 1]], axis=1)
    sd = _cell_sd(syn, boxes, values.ndim == 3).reshape(nx, ny)
    layers = [values] if values.ndim == 2 else [values[:, :, t] for t in range(values.shape[2])]
    names = ["value"] if values.ndim == 2 else [f"value slot {t}" for t in range(values.shape[2])]
    bands = [np.flipud(a.T) for a in [*layers, sd]]  # [ix, iy] → [row from north, column from west]
    profile = {"driver": "GTiff", "height": ny, "width": nx, "count": len(bands), "dtype": "float64",
               "crs": "EPSG:4326", "transform": from_bounds(lon0, lat0, lon1, lat1, nx, ny), "nodata": np.nan}
    with rasterio.open(out, "w", **profile) as dst:
        for i, (band, name) in enumerate(zip(bands, [*names, "noise_sd"], strict=True), start=1):
            dst.write(band, i)
            dst.set_band_description(i, name)
        dst.update_tags(**{META_KEY: json.dumps(facts, default=str), "unit": facts["unit"]})
    return out
