"""The preview image of a release: its RELEASED density (post-processing; the true map is never rendered)
on latitude/longitude axes, with a colour bar in the release's own unit and cell size."""

from __future__ import annotations

import io

import numpy as np

from dpcore.synopsis.base import Synopsis

#: Largest number of cells per side a preview draws; finer releases are resampled (mass kept).
MAX_PREVIEW_CELLS = 200


def preview_grid(synopsis: Synopsis, pixels: int = MAX_PREVIEW_CELLS) -> tuple[np.ndarray, float, bool]:
    """(density [ix, iy], cell width in metres, resampled?): the release's own grid when it has one of at
    most ``pixels`` cells per side, else the density resampled to ``pixels``."""
    shape = getattr(synopsis, "shape", None)
    native = int(shape[0]) if shape is not None and len(shape) >= 2 and shape[0] == shape[1] else None
    n = native if native is not None and native <= pixels else pixels
    return np.clip(synopsis.density(n, n), 0.0, None), synopsis.region.side_m / n, native != n


def colour_bar_label(synopsis: Synopsis, cell_m: float, resampled: bool) -> str:
    """'released <unit> per <w> m cell', from the release's unit and its cells (or the preview's pixels)."""
    size = f"{cell_m / 1000:.3g} km" if cell_m >= 1000 else f"{cell_m:.0f} m"
    where = f"{size} pixel (resampled)" if resampled else f"{size} cell"
    return f"released {synopsis.unit().description} per {where}"


def render_heatmap_png(synopsis: Synopsis, title: str, pixels: int = 128, note: str = "") -> bytes:
    """PNG of the released density on latitude/longitude axes (the release's equirectangular frame keeps
    cells rectangular in degrees; the aspect is set so a km is as long east as north), a colour bar in the
    release's unit per cell, and ``note`` (how much of it is noise) under the map."""
    # a Figure of its own, drawn by the Agg canvas that savefig picks for PNG: pyplot (its figure manager,
    # widgets and backend selection) is not needed to draw one image, and not importing it saves CPU
    from matplotlib.figure import Figure

    dens, cell_m, resampled = preview_grid(synopsis, max(pixels, MAX_PREVIEW_CELLS) if pixels else MAX_PREVIEW_CELLS)
    r = synopsis.region
    lat0, lon0, lat1, lon1 = r.bbox_latlon()
    fig = Figure(figsize=(4.4, 4.0), dpi=90)
    ax = fig.subplots()
    # density is [ix, iy] (x east, y north): transpose for imshow's [row, col] with north up.
    img = ax.imshow(np.log1p(dens.T), origin="lower", cmap="magma", extent=(lon0, lon1, lat0, lat1),
                    aspect=1.0 / np.cos(np.radians(r.center_lat)))
    bar = fig.colorbar(img, ax=ax, shrink=0.8)
    ticks = bar.get_ticks()
    bar.set_ticks(ticks)
    bar.set_ticklabels([f"{np.expm1(t):.3g}" for t in ticks])
    bar.set_label(colour_bar_label(synopsis, cell_m, resampled), fontsize=7)
    ax.set_title(f"{title}\n{r.side_km:g} km square around {r.center_lat:.4f}, {r.center_lon:.4f}", fontsize=7)
    ax.set_xlabel("longitude (°E)", fontsize=7)
    ax.set_ylabel("latitude (°N)", fontsize=7)
    ax.tick_params(labelsize=6)
    if note:
        fig.text(0.02, 0.01, note, fontsize=6, wrap=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
