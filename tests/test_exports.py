"""`geodp release export`: each format read back with the field's own readers (geopandas/pyogrio,
rasterio, pandas) holds the release's values at the release's positions, its noise sd and unit, and the
manifest's facts; previews label the release's own unit and cell size on latitude/longitude axes."""

import io
import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import rasterio

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import Region, city_region
from dpcore.privacy.noise import discrete_laplace_variance
from tests.cli_runner import run_geodp


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A record-level identity release, ε = 1 on 1 km cells: every cell carries DLap(1/ε) noise."""
    import geodp

    tmp = tmp_path_factory.mktemp("exp")
    data = tmp / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, days=3, seed=6).to_parquet(data)
    out = tmp / "store"
    run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--privacy-unit", "record",
              "--param", "cell_width_m=1000", "--out", out)
    (rel,) = geodp.open_store(str(out)).releases()
    return {"store": out, "release": rel, "tmp": tmp}


def _check_cells(table: pd.DataFrame, rel) -> None:
    """Each exported cell: its polygon is the release's cell (its released count is the answer for that
    lat/lon box) and its noise sd is the cells' discrete Laplace sd."""
    syn = rel.synopsis
    assert len(table) == syn.values.size == 400
    boxes = table[["min_lat", "min_lon", "max_lat", "max_lon"]].to_numpy()
    assert table["value"].to_numpy() == pytest.approx(syn.answer_latlon(boxes), abs=1e-6)
    assert table["value"].to_numpy() == pytest.approx(syn.values[table.ix, table.iy])
    assert table["noise_sd"].to_numpy() == pytest.approx(np.sqrt(discrete_laplace_variance(1.0)))
    lat0, lon0, lat1, lon1 = syn.region.bbox_latlon()
    assert table.min_lat.min() == pytest.approx(lat0) and table.max_lon.max() == pytest.approx(lon1)
    assert set(table["unit"]) == {"full points"}


def test_geoparquet_and_geojson_read_back_with_geopandas(release, tmp_path):
    rel = release["release"]
    for fmt in ("geoparquet", "geojson"):
        out = tmp_path / f"cells.{fmt}"
        run_geodp("release", "export", release["store"], "--format", fmt, "--out", out)
        gdf = gpd.read_parquet(out) if fmt == "geoparquet" else gpd.read_file(out, engine="pyogrio")
        assert gdf.crs.to_epsg() == 4326
        bounds = gdf.geometry.bounds  # the polygons are the cells: west, south, east, north
        assert bounds.minx.to_numpy() == pytest.approx(gdf.min_lon.to_numpy())
        assert bounds.maxy.to_numpy() == pytest.approx(gdf.max_lat.to_numpy())
        _check_cells(pd.DataFrame(gdf.drop(columns="geometry")), rel)
        facts = (json.loads(pq.read_schema(out).metadata[b"geodp"]) if fmt == "geoparquet"
                 else json.loads(out.read_text())["geodp"])
        assert facts["mechanism"] == rel.manifest.mechanism and facts["epsilon"] == 1.0
        assert facts["privacy_unit"] == "record" and facts["release"] == rel.url


def test_geotiff_reads_back_with_rasterio_at_the_cells_positions(release, tmp_path):
    rel = release["release"]
    syn = rel.synopsis
    out = tmp_path / "cells.tif"
    run_geodp("release", "export", release["store"], "--format", "geotiff", "--out", out)
    with rasterio.open(out) as src:
        assert src.crs.to_epsg() == 4326 and src.count == 2 and src.descriptions == ("value", "noise_sd")
        assert json.loads(src.tags()["geodp"])["dataset"] == rel.manifest.dataset
        # sample at the centre of every cell: the released value of that cell
        region: Region = syn.region
        xmin, ymin, xmax, ymax = region.bounds_m
        ix, iy = np.meshgrid(np.arange(20), np.arange(20), indexing="ij")
        cx, cy = xmin + (ix.ravel() + 0.5) * 1000.0, ymin + (iy.ravel() + 0.5) * 1000.0
        lat, lon = region.unproject(cx, cy)
        sampled = np.array([v for v in src.sample(list(zip(lon, lat, strict=True)))])
    assert sampled[:, 0] == pytest.approx(syn.values[ix.ravel(), iy.ravel()])
    assert sampled[:, 1] == pytest.approx(np.sqrt(discrete_laplace_variance(1.0)))


def test_csv_export_carries_the_facts_and_cells(release, tmp_path):
    out = tmp_path / "cells.csv"
    run_geodp("release", "export", release["store"], "--format", "csv", "--out", out)
    first = out.read_text().splitlines()[0]
    assert first.startswith("# geodp: ") and json.loads(first[len("# geodp: "):])["max_points_per_user"] is None
    _check_cells(pd.read_csv(out, comment="#"), release["release"])
    bad = run_geodp("release", "export", release["store"], "--format", "shapefile", ok=False)
    assert bad.returncode == 2 and "--format must be one of" in bad.stderr


def test_preview_labels_the_releases_own_cells_and_unit(release):
    from tasks.preview import colour_bar_label, preview_grid, render_heatmap_png

    syn = release["release"].synopsis
    dens, cell_m, resampled = preview_grid(syn)
    assert dens.shape == (20, 20) and cell_m == pytest.approx(1000.0) and not resampled
    assert colour_bar_label(syn, cell_m, resampled) == "released points per 1 km cell"
    assert render_heatmap_png(syn, "t").startswith(b"\x89PNG")
    from dpcore.heatmap.quadtree import HeatmapSynopsis

    heat = HeatmapSynopsis(np.ones((512, 512)), syn.region, syn.privacy, {})
    d, w, r = preview_grid(heat)
    assert d.shape == (200, 200) and r
    assert colour_bar_label(heat, w, r) == "released people (each person counts 1 in total) per 100 m pixel (resampled)"


def test_preview_draws_north_up_without_matplotlib(release):
    """The preview is drawn with Pillow from a shipped colour table (matplotlib's import and layout were most
    of a small release's CPU): cell [ix, iy] = [east-most, north-most] is the map's top-right block, in the
    table's top colour, and the rest is its bottom colour (a log1p scale from the lowest to the highest)."""
    from PIL import Image

    from tasks.colormap import LUT
    from tasks.preview import MAP_PX, map_pixels, render_heatmap_png

    corner = np.zeros((20, 20))
    corner[-1, -1] = 50.0
    rgb, lo, hi = map_pixels(corner)
    k = MAP_PX // 20
    assert rgb.shape == (20 * k, 20 * k, 3) and (lo, hi) == pytest.approx((0.0, np.log1p(50.0)))
    assert (rgb[:k, -k:] == LUT[255]).all()
    rest = np.ones(rgb.shape[:2], dtype=bool)
    rest[:k, -k:] = False
    assert (rgb[rest] == LUT[0]).all()
    png = render_heatmap_png(release["release"].synopsis, "new-york all (released, ε=1)", note="noise ≈ 1")
    with Image.open(io.BytesIO(png)) as im:
        assert im.format == "PNG" and im.width > 20 * k and im.height > 20 * k


def test_an_adaptive_release_exports_its_leaves_and_refuses_a_raster(release):
    """Issue 43 item 6: a PrivTree release exported its ~10 m raster (4 M rows for New York); now one polygon
    per leaf with the leaf's released count, and a GeoTIFF (a raster only at a uniform grid's own cell size)
    is one error line, exit 2, nothing written."""
    import geodp

    tmp = release["tmp"]
    store = tmp / "tree-store"
    run_geodp("release", tmp / "checkins.parquet", "--city", "new-york", "--epsilon", "1", "--privacy-unit",
              "record", "--mechanism", "privtree", "--out", store)
    (rel,) = geodp.open_store(str(store)).releases()
    leaves = rel.synopsis.arrays["leaf_depth"].size
    out = tmp / "tree.parquet"
    run_geodp("release", "export", rel.url, "--format", "geoparquet", "--out", out)
    table = gpd.read_parquet(out)
    assert len(table) == leaves < 100_000  # the raster has 2048² cells
    assert table["value"].sum() == pytest.approx(rel.synopsis.values.sum(), rel=1e-6)
    assert set(np.round(table["side_m"] * 2 ** np.round(np.log2(20000 / table["side_m"])))) == {20000.0}
    tif = tmp / "tree.tif"
    bad = run_geodp("release", "export", rel.url, "--format", "geotiff", "--out", tif, ok=False)
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "uniform grid" in bad.stderr
    assert not tif.exists()


def test_an_export_too_large_for_its_format_is_refused_before_writing(release):
    """A 10 m identity grid of New York is 4 M cells: GeoJSON of it is refused in one line (exit 2) before
    anything is written."""
    tmp = release["tmp"]
    store = tmp / "fine-store"
    run_geodp("release", tmp / "checkins.parquet", "--city", "new-york", "--epsilon", "1", "--privacy-unit",
              "record", "--mechanism", "identity", "--param", "cell_width_m=10", "--out", store)
    import geodp

    (rel,) = geodp.open_store(str(store)).releases()
    out = tmp / "fine.geojson"
    bad = run_geodp("release", "export", rel.url, "--format", "geojson", "--out", out, ok=False)
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "4,000,000 cells" in bad.stderr
    assert not out.exists()
