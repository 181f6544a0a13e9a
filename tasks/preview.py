"""The preview image of a release: its RELEASED density (post-processing; the true map is never rendered)
on latitude/longitude axes, with a colour bar in the release's own unit and cell size. Pillow draws it from
a shipped colour table (tasks/colormap.py): matplotlib's import and layout cost a one-file release more CPU
than the rest of the release did (bench/results/2026-11-28-startup.md)."""

from __future__ import annotations

import io
import math
import textwrap

import numpy as np

from dpcore.synopsis.base import Synopsis
from tasks.colormap import LUT

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


#: Side of the drawn map in screen pixels (about): each cell is a block of round(MAP_PX / cells) pixels.
MAP_PX = 360
#: Characters Pillow's default font lacks, spelled with ones it has.
PLAIN = str.maketrans({"ε": "eps", "ρ": "rho", "≈": "~", "−": "-", "–": "-", "—": "-", "µ": "u", "μ": "u",
                       "²": "^2", "±": "+/-", "≤": "<=", "≥": ">=", "×": "x"})


def nice_ticks(lo: float, hi: float, n: int = 5) -> np.ndarray:
    """At most about ``n`` + 1 round values (steps of 1, 2 or 5 times a power of ten) in [lo, hi]."""
    if not hi > lo:
        return np.array([lo])
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return np.arange(first, hi + step * 1e-9, step)


def map_pixels(dens: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(RGB uint8 [row, col, 3], lowest, highest log1p value): ``dens`` [ix, iy] (x east, y north) on a
    log1p scale from its lowest to its highest value through the colour table, north up (row 0 is the
    northern edge), each cell a square block of pixels."""
    v = np.log1p(dens.T[::-1])
    lo, hi = float(v.min()), float(v.max())
    level = np.zeros(v.shape, dtype=np.intp) if hi <= lo else np.clip(((v - lo) / (hi - lo) * 256).astype(np.intp), 0, 255)
    k = max(1, round(MAP_PX / max(v.shape)))
    return LUT[level].repeat(k, axis=0).repeat(k, axis=1), lo, hi


def render_heatmap_png(synopsis: Synopsis, title: str, pixels: int = 128, note: str = "") -> bytes:
    """PNG of the released density, north up, on latitude/longitude axes (the region is a square in km, so
    the map is square), a colour bar in the release's unit per cell (log scale, labelled in the unit), and
    ``note`` (how much of it is noise) under the map."""
    from PIL import Image, ImageDraw, ImageFont

    dens, cell_m, resampled = preview_grid(synopsis, max(pixels, MAX_PREVIEW_CELLS) if pixels else MAX_PREVIEW_CELLS)
    rgb, lo, hi = map_pixels(dens)
    r = synopsis.region
    lat0, lon0, lat1, lon1 = r.bbox_latlon()
    font = ImageFont.load_default(11)
    line = 14
    side = rgb.shape[0]
    left, top, bar_w = 78, 2 * line + 12, 14
    bar_x = left + side + 14
    notes = textwrap.wrap(note.translate(PLAIN), 80)
    width, height = bar_x + bar_w + 70, top + side + 2 * line + 14 + line * len(notes) + 6
    img = Image.new("RGB", (width, height), "white")
    img.paste(Image.fromarray(rgb), (left, top))
    bar = LUT[np.arange(255, -1, -1)].repeat(bar_w, axis=0).reshape(256, bar_w, 3)
    img.paste(Image.fromarray(np.ascontiguousarray(bar)).resize((bar_w, side), Image.Resampling.NEAREST), (bar_x, top))
    d = ImageDraw.Draw(img)
    d.rectangle((left - 1, top - 1, left + side, top + side), outline="black")
    d.rectangle((bar_x - 1, top - 1, bar_x + bar_w, top + side), outline="black")
    heading = [title.translate(PLAIN), f"{r.side_km:g} km square around {r.center_lat:.4f}, {r.center_lon:.4f}"]
    for i, text in enumerate(heading):
        d.text((left + side / 2, 4 + i * line), text, fill="black", font=font, anchor="ma")
    for lon in nice_ticks(lon0, lon1, 4):
        x = left + (lon - lon0) / (lon1 - lon0) * side
        d.line((x, top + side, x, top + side + 4), fill="black")
        d.text((x, top + side + 6), f"{lon:.2f}", fill="black", font=font, anchor="ma")
    for lat in nice_ticks(lat0, lat1, 6):
        y = top + side - (lat - lat0) / (lat1 - lat0) * side
        d.line((left - 5, y, left - 1, y), fill="black")
        d.text((left - 7, y), f"{lat:.2f}", fill="black", font=font, anchor="rm")
    # the lowest and highest released values label the bar's ends; round values between them, apart from both
    ys = {lo: top + side, hi: top} if hi > lo else {lo: top + side}
    for t in nice_ticks(lo, hi, 6):
        y = top + side - (t - lo) / (hi - lo) * side if hi > lo else top + side
        if min(abs(y - e) for e in ys.values()) >= line:
            ys[float(t)] = y
    for t, y in ys.items():
        d.line((bar_x + bar_w, y, bar_x + bar_w + 4, y), fill="black")
        d.text((bar_x + bar_w + 6, y), f"{np.expm1(t):.3g}", fill="black", font=font, anchor="lm")
    d.text((left + side / 2, top + side + line + 8), "longitude (°E)", fill="black", font=font, anchor="ma")
    _vertical(img, "latitude (°N)", font, (4, top + side / 2))
    _vertical(img, colour_bar_label(synopsis, cell_m, resampled).translate(PLAIN), font, (width - line - 2, top + side / 2))
    for i, text in enumerate(notes):
        d.text((6, top + side + 2 * line + 14 + i * line), text, fill="black", font=font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _vertical(img, text: str, font, at: tuple[float, float]) -> None:
    """Writes ``text`` reading bottom to top, its left edge at x = at[0], centred on y = at[1]."""
    from PIL import Image, ImageDraw

    w = int(font.getlength(text)) + 2
    label = Image.new("L", (w, 14), 255)
    ImageDraw.Draw(label).text((1, 0), text, fill=0, font=font)
    label = label.transpose(Image.Transpose.ROTATE_90)
    img.paste(Image.new("RGB", label.size, "black"), (int(at[0]), int(at[1] - w / 2)), Image.eval(label, lambda p: 255 - p))
