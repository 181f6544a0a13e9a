"""`geodp release export RELEASE --format geoparquet|geojson|geotiff|csv [--out FILE]`: a committed
release's cells in a GIS or notebook format (WGS84), with their noise sd, unit and the manifest's facts."""

from __future__ import annotations

import typer

from flows.cli.common import CLIError, eprint
from flows.cli.inputs import Release
from flows.cli.release import app


@app.command("export")
def export(
    release: Release,
    fmt: str = typer.Option(..., "--format", help="geoparquet, geojson, geotiff or csv"),
    out: str | None = typer.Option(None, "--out", metavar="FILE",
                                   help="output file (default: <dataset>-<city>-<period>-v<N> with the format's suffix)"),
) -> int:
    """Write a committed release's cells: WGS84 polygons (or a GeoTIFF on the cells' lon/lat grid) with
    the released value, its noise sd and unit; the manifest's key facts as metadata. No budget spent."""
    from geodp.api import Release as ReleaseView
    from geodp.export import FORMATS, SUFFIX, export_release
    from tasks.storage.store import resolve_release

    if fmt not in FORMATS:
        raise CLIError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    store, rel = resolve_release(release)
    view = ReleaseView(store, store.read_manifest(rel))
    m = view.manifest
    path = out or f"{m.dataset}-{m.city}-{m.period}-v{m.version}{SUFFIX[fmt]}"
    written = export_release(view, fmt, path)
    eprint(f"wrote {written} ({fmt}, unit: {view.unit})")
    return 0
