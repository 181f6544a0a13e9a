"""`geodp query range|hotspot|forecast`: answers from a committed release (no budget: they read only
the released, noisy synopsis)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import typer

from flows.cli.common import CLIError, at_least, emit_json, eprint, noun, parse_window
from flows.cli.inputs import Json, Release, fetch_release, is_spatio_temporal

app = noun("query", "Answers from a committed release: range counts, hotspots, forecasts (no budget spent).", default="range")

Period = Annotated[str | None, typer.Option(
    "--period", metavar="A..B",
    help="time window of a spatio-temporal release: days A..B inclusive, times A..B (ISO, UTC), a day or a "
         "month; default: the whole release")]
OldTime = Annotated[str | None, typer.Option("--time", hidden=True)]


def _window(period: str | None, time: str | None) -> str | None:
    if period is not None and time is not None:
        raise CLIError("give --period A..B (or the older --time START/END), not both")
    return period if period is not None else time


@app.command("range")
def range_counts(
    release: Release,
    box: str | None = typer.Option(None, "--box", metavar="MINLAT,MINLON,MAXLAT,MAXLON", help="one box"),
    boxes: str | None = typer.Option(None, "--boxes", metavar="CSV",
                                     help="a CSV of boxes: min_lat,min_lon,max_lat,max_lon rows"),
    period: Period = None,
    time: OldTime = None,
    json_out: Json = None,
) -> int:
    """Estimated counts in boxes (full points, bounded points or people: each answer says which), with 95%
    intervals where the mechanism has them."""
    from dpcore.queries.range import parse_box, read_boxes_csv
    from dpcore.synopsis.estimand import answer_unit, honest_intervals, interval_covers, unit_words

    if (box is None) == (boxes is None):
        raise CLIError("give exactly one of --box MINLAT,MINLON,MAXLAT,MAXLON and --boxes CSV")
    boxes_ll = parse_box(box) if box is not None else read_boxes_csv(boxes)
    window = _window(period, time)
    times = parse_window(window) if window is not None else None
    with fetch_release(release) as (_, synopsis):
        boxes_m = synopsis.region.box_latlon_to_m(boxes_ll)
        if times is not None:
            from dpcore.synopsis.uncertainty import spatio_temporal_intervals

            if not is_spatio_temporal(synopsis):
                raise CLIError("--period needs a spatio-temporal release (e.g. mechanism identity3d or vdr)")
            t0, t1 = np.full(len(boxes_m), times[0]), np.full(len(boxes_m), times[1])
            est = synopsis.answer_st_time(boxes_m, t0, t1)
            lower, upper, method = spatio_temporal_intervals(synopsis, boxes_m, t0, t1)
        else:
            from dpcore.synopsis.uncertainty import query_intervals

            est = synopsis.answer(boxes_m)
            lower, upper, method = query_intervals(synopsis, boxes_m)
        for caveat in synopsis.caveats():
            eprint(f"note: {caveat}")
        region_bbox = synopsis.region.bbox_latlon()
        lower, upper, method = honest_intervals(synopsis, lower, upper, method)
        unit, covers, unit_line = answer_unit(synopsis), interval_covers(synopsis, lower), unit_words(synopsis)
    _note_odd_boxes(boxes_ll, region_bbox)
    if json_out is not None:
        num = lambda v: float(v) if np.isfinite(v) else None  # noqa: E731 - JSON has no NaN
        emit_json([{"box": list(map(float, b)), "estimate": num(e), "lower": num(lo), "upper": num(hi),
                    "unit": unit, "interval_covers": c, "interval": "95%", "interval_method": method}
                   for b, e, lo, hi, c in zip(boxes_ll, est, lower, upper, covers, strict=True)], json_out,
                  indent=None)
        return 0
    for b, e, lo, hi in zip(boxes_ll, est, lower, upper, strict=True):
        ci = f"\t95% [{lo:.1f}, {hi:.1f}]" if np.isfinite(lo) else ""
        print(f"{b[0]:.5f},{b[1]:.5f},{b[2]:.5f},{b[3]:.5f}\t{e:.1f}{ci}")
    eprint(f"{unit_line}\nintervals: {method}")
    return 0


def _note_odd_boxes(boxes_ll: np.ndarray, region_bbox: tuple[float, float, float, float]) -> None:
    """A note on stderr for boxes that were typed inverted or reach outside the released region."""
    b = np.atleast_2d(boxes_ll)
    inverted = int(np.sum((b[:, 0] > b[:, 2]) | (b[:, 1] > b[:, 3])))
    lat0, lon0, lat1, lon1 = region_bbox
    outside = int(np.sum((b[:, 0] < lat0) | (b[:, 1] < lon0) | (b[:, 2] > lat1) | (b[:, 3] > lon1)))
    if inverted:
        eprint(f"note: {inverted} box(es) had min above max; read as the box between the two corners")
    if outside:
        eprint(f"note: {outside} box(es) reach outside the released region {lat0:.4f},{lon0:.4f},"
               f"{lat1:.4f},{lon1:.4f}; the release counts nothing there")


def _spatio_temporal(synopsis):
    """(inner spatio-temporal synopsis, count factor) of a release, through wrappers such as scaling."""
    from dpcore.mechanisms import mechanism_names
    from dpcore.privacy.scaling import ScaledSynopsis

    inner, factor = synopsis, 1.0
    while isinstance(inner, ScaledSynopsis):  # scaled to a public total: unwrap, keep the factor
        factor *= float(inner.factor)
        inner = inner.inner
    if not is_spatio_temporal(inner):
        st = ", ".join(mechanism_names(lambda tags: tags.input_type.needs_time_slots))
        raise CLIError(f"this command needs a spatio-temporal release (mechanism {st})")
    return inner, factor


def _latlon(text: str) -> tuple[float, float]:
    try:
        lat, lon = (float(v) for v in text.split(","))
    except ValueError as exc:
        raise CLIError(f"--at must be LAT,LON, got {text!r}") from exc
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise CLIError(f"--at out of range: {text!r}")
    return lat, lon


@app.command("hotspot")
def hotspot(
    release: Release,
    at: list[str] = typer.Option(..., "--at", metavar="LAT,LON", help="query location (repeatable)"),
    threshold: float = typer.Option(..., "--threshold", metavar="V", help="smallest released count of a hotspot"),
    extent_km: float = typer.Option(2.0, "--extent-km", help="search radius in km"),
    period: Period = None,
    time: OldTime = None,
    json_out: Json = None,
) -> int:
    """The nearest cell whose released count over the window is ≥ V, around each location."""
    from dpcore.queries.spatiotemporal import cell_centres, nearest_hotspot

    if not extent_km > 0:
        raise CLIError("--extent-km must be > 0")
    points = np.array([_latlon(a) for a in at])
    window = _window(period, time)
    times = parse_window(window) if window is not None else None
    with fetch_release(release) as (_, synopsis):
        syn, factor = _spatio_temporal(synopsis)
    x, y = syn.region.project(points[:, 0], points[:, 1])
    t0, t1 = syn.slots_for_times(*times) if times is not None else (0, syn.n_slots)
    values = syn.values * factor
    ans = nearest_hotspot(values, syn.region, np.column_stack([x, y]), threshold, extent_km * 1000.0,
                          np.array([[t0, t1]]))
    nx, ny = values.shape[:2]
    cx, cy = cell_centres(syn.region, nx, ny)
    window_counts = values[:, :, t0:t1].sum(axis=2)
    rows = []
    for q in range(points.shape[0]):
        if ans.ix[q] < 0:
            rows.append({"at": points[q].tolist(), "found": False})
            continue
        lat, lon = syn.region.unproject(cx[ans.ix[q]], cy[ans.iy[q]])
        rows.append({"at": points[q].tolist(), "found": True, "cell_lat": float(lat), "cell_lon": float(lon),
                     "distance_m": float(ans.distance_m[q]),
                     "released_count": float(window_counts[ans.ix[q], ans.iy[q]]), "slots": [t0, t1]})
    if json_out is not None:
        emit_json(rows, json_out, indent=None)
        return 0
    for r in rows:
        where = f"{r['at'][0]:.5f},{r['at'][1]:.5f}"
        if r["found"]:
            print(f"{where}\thotspot at {r['cell_lat']:.5f},{r['cell_lon']:.5f}\t{r['distance_m']:.0f} m\t"
                  f"count {r['released_count']:.1f}")
        else:
            print(f"{where}\tno cell with count ≥ {threshold:g} within {extent_km:g} km")
    return 0


@app.command("forecast")
def forecast(
    release: Release,
    box: str = typer.Option(..., "--box", metavar="MINLAT,MINLON,MAXLAT,MAXLON", help="the box to forecast"),
    horizon: int = typer.Option(..., "--horizon", metavar="H", help="slots to forecast past the release"),
    json_out: Json = None,
) -> int:
    """Forecast a box's counts past the release window (ThetaModel on the released series)."""
    from dpcore.queries.range import parse_box
    from dpcore.queries.spatiotemporal import forecast_theta, season_period

    at_least(horizon, 1, "--horizon")
    box_ll = parse_box(box)
    with fetch_release(release) as (_, synopsis):
        syn, factor = _spatio_temporal(synopsis)
    series = syn.series(syn.region.box_latlon_to_m(box_ll)) * factor
    fc = forecast_theta(series, horizon, season_period(syn.slot_seconds))[0]
    start = None
    if syn.window_start_s is not None and syn.slot_seconds:
        start = syn.window_start_s + syn.n_slots * syn.slot_seconds
    out = {"history": series[0].tolist(), "forecast": fc.tolist(), "slot_seconds": syn.slot_seconds,
           "forecast_start_s": start}
    if json_out is not None:
        emit_json(out, json_out, indent=None)
        return 0
    eprint(f"released series ({syn.n_slots} slots): " + " ".join(f"{v:.0f}" for v in series[0]))
    for h, v in enumerate(fc):
        when = ""
        if start is not None:
            import pandas as pd

            when = pd.Timestamp(start + h * syn.slot_seconds, unit="s", tz="UTC").isoformat() + "\t"
        print(f"{when}{v:.1f}")
    return 0
