"""`geodp query range|hotspot|forecast`: answers from a committed release (no budget: they read only
the released, noisy synopsis)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import typer

from flows.cli.common import STDOUT, CLIError, at_least, emit_json, eprint, noun, parse_window
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


Format = Annotated[str, typer.Option("--format", help="output: text, json or csv")]
CsvFlag = Annotated[bool, typer.Option("--csv", help="CSV output (the same as --format csv)")]
Out = Annotated[str | None, typer.Option("--out", metavar="PATH", help="write the table into PATH instead of stdout")]


@app.command("range")
def range_counts(
    release: Release,
    box: list[str] | None = typer.Option(None, "--box", metavar="MINLAT,MINLON,MAXLAT,MAXLON",
                                         help="a box (repeatable)"),
    boxes: str | None = typer.Option(None, "--boxes", metavar="CSV",
                                     help="a CSV of boxes: min_lat,min_lon,max_lat,max_lon rows"),
    period: Period = None,
    time: OldTime = None,
    json_out: Json = None,
    fmt: Format = "text",
    csv_flag: CsvFlag = False,
    out: Out = None,
    dataset: str | None = typer.Option(None, "--dataset", help="with a store: the dataset whose releases to ask"),
    city: str | None = typer.Option(None, "--city", help="with a store: the city whose releases to ask"),
) -> int:
    """Estimated counts in boxes, with 95% intervals where the mechanism has them (all boxes at once).
    Given a store with --dataset and --city (or a path …/releases/DATASET/CITY), every committed release
    in --period: one row per period, and their sum with its combined interval."""
    from dpcore.queries.answers import Words, answers
    from dpcore.queries.range import parse_box, read_boxes_csv

    if bool(box) == (boxes is not None):
        raise CLIError("give --box MINLAT,MINLON,MAXLAT,MAXLON (repeatable) or --boxes CSV, not both or neither")
    fmt = "csv" if csv_flag else ("json" if json_out is not None else fmt)
    if fmt not in ("text", "json", "csv"):
        raise CLIError(f"--format must be text, json or csv, got {fmt!r}")
    boxes_ll = np.concatenate([parse_box(b) for b in box]) if box else read_boxes_csv(boxes)
    window = _window(period, time)
    series = _series_target(release, dataset, city)
    if series is not None:
        _range_series(*series, boxes_ll, window, fmt, json_out if fmt == "json" and json_out not in (None, STDOUT)
                      else out)
        return 0
    times = parse_window(window) if window is not None else None
    from tasks.release_verdict import band_note_codes

    with fetch_release(release) as (manifest, synopsis):
        if times is not None:
            _check_window(synopsis, times)
        table = answers(synopsis, boxes_ll, window_s=times)
        codes, words = band_note_codes(manifest.quality, synopsis.region.box_latlon_to_m(boxes_ll))
        if words:  # a band the release is expected to serve worse than a blank map
            table.columns["note"] = Words(codes, words)
        for caveat in synopsis.caveats():
            eprint(f"note: {caveat}")
        region_bbox = synopsis.region.bbox_latlon()
    _note_odd_boxes(boxes_ll, region_bbox)
    write_answers(table, fmt, json_out if fmt == "json" and json_out not in (None, STDOUT) else out)
    return 0


def _series_target(target: str, dataset: str | None, city: str | None) -> tuple[str, str, str] | None:
    """(store URL, dataset, city) when the target names several releases of one place: a store with
    --dataset and --city, or a path STORE/releases/DATASET[/CITY]; None for one release (a version
    folder, or a store holding one release, wherever it sits)."""
    from geodp.api import place_of

    place = place_of(target)
    if place is not None:
        root, in_path, city_in_path = place
        if (dataset and dataset != in_path) or (city and city_in_path and city != city_in_path):
            raise CLIError(f"{target} is {in_path}/{city_in_path or '*'}; --dataset/--city name another")
        dataset, city = in_path, city or city_in_path
    elif dataset is None and city is None:
        return None
    else:
        root = target
    if not dataset or not city:
        raise CLIError("a time series needs both the dataset and the city: --dataset D --city C, or a path "
                       "STORE/releases/DATASET/CITY")
    return root, dataset, city


def _range_series(root: str, dataset: str, city: str, boxes_ll: np.ndarray, window: str | None, fmt: str,
                  dest: str | None) -> None:
    from geodp.api import open_store

    table = open_store(root).query_range(dataset, city, boxes_ll, period=window)
    if table.attrs["left_out"]:
        eprint(f"note: left out {', '.join(table.attrs['left_out'])}: their periods reach past --period and a "
               "2-D release cannot be split in time")
    eprint(f"{table.attrs['periods']} releases of {dataset}/{city}; the sum's interval: {table.attrs['sum_method']}")
    write_answers(table, fmt, dest)


def _forecast_series(root: str, dataset: str, city: str, box_ll: np.ndarray, horizon: int, period: str | None,
                     json_out: str | None) -> int:
    """Forecast past a store's releases of one place: the series is one released answer per period."""
    from dpcore.queries.forecast import check_forecastable, forecast_interval, noise_sd_from
    from dpcore.queries.series import SUM_PERIOD
    from dpcore.queries.spatiotemporal import season_period
    from geodp.api import open_store

    table = open_store(root).query_range(dataset, city, box_ll, period=period)
    rows = table[~table["period"].astype(str).str.startswith(SUM_PERIOD)]
    labels = rows["period"].astype(str).tolist()
    days = all(len(p) == 10 for p in labels)  # daily releases: a weekly season
    check_forecastable(len(labels), 86400 if days else None, what=f"the series of {dataset}/{city}")
    fc, lower, upper, method = forecast_interval(rows["estimate"].to_numpy(), horizon,
                                                 season_period(86400) if days else None,
                                                 noise_sd_from(rows["lower"].to_numpy(), rows["upper"].to_numpy()))
    out = {"periods": labels, "history": rows["estimate"].tolist(), "forecast": fc.tolist(),
           "lower": _finite(lower), "upper": _finite(upper), "interval": "95%", "interval_method": method,
           "unit": str(rows["unit"].iloc[0])}
    if json_out is not None:
        emit_json(out, json_out, indent=None)
        return 0
    eprint(f"released series ({len(labels)} periods {labels[0]}..{labels[-1]}): "
           + " ".join(f"{v:.0f}" for v in out["history"]))
    for h, v in enumerate(fc):
        print(f"+{h + 1}\t{v:.1f}\t{_band(lower[h], upper[h])}")
    eprint(f"intervals: {method}")
    return 0


def _cell_boxes(region, nx: int, ny: int, ix: np.ndarray, iy: np.ndarray) -> np.ndarray:
    """(q, 4) metre boxes of cells (ix, iy) of an nx × ny grid over the region."""
    xmin, ymin, xmax, ymax = region.bounds_m
    w, h = (xmax - xmin) / nx, (ymax - ymin) / ny
    return np.column_stack([xmin + ix * w, ymin + iy * h, xmin + (ix + 1) * w, ymin + (iy + 1) * h])


def _qualifying_intervals(syn, boxes_m: np.ndarray, times: tuple[float, float] | None, factor: float = 1.0):
    """The 95% interval of each qualifying cell's released count over the window (what made it a
    hotspot), from the release's own noise model: (lower, upper, method)."""
    if len(boxes_m) == 0:
        return np.empty(0), np.empty(0), ""
    if times is not None and hasattr(syn, "window_intervals"):
        n = len(boxes_m)
        _, iv = syn.window_intervals(boxes_m, np.full(n, float(times[0])), np.full(n, float(times[1])))
    else:
        _, iv = syn.intervals(boxes_m)
    return iv.lower * factor, iv.upper * factor, iv.method


def _hotspot_fields(row: dict, lower: float, upper: float, method: str, threshold: float) -> None:
    """The uncertainty of the count that qualified a hotspot: its interval and whether the threshold lies
    inside it (then the cell may not truly reach it)."""
    known = bool(np.isfinite(lower) and np.isfinite(upper))
    row.update({"count_lower": float(lower) if known else None, "count_upper": float(upper) if known else None,
                "interval": "95%", "interval_method": method,
                "qualifies": ("unknown" if not known else "surely" if lower >= threshold else "maybe")})


def _hotspot_text(row: dict) -> str:
    ci = (f" 95% [{row['count_lower']:.1f}, {row['count_upper']:.1f}]" if row.get("count_lower") is not None
          else " (no interval)")
    maybe = "; the threshold lies inside its interval" if row.get("qualifies") == "maybe" else ""
    return f"count {row['released_count']:.1f}{ci}{maybe}"


def _hotspot_series(root: str, dataset: str, city: str, points: np.ndarray, threshold: float, extent_km: float,
                    period: str | None, json_out: str | None) -> int:
    """The nearest hotspot around each location in every release of one place in ``period`` (a
    spatio-temporal release: over the slots inside it)."""
    from dpcore.queries.spatiotemporal import cell_centres, nearest_hotspot
    from geodp.api import open_store, released_values

    chosen, left_out = open_store(root).in_window(dataset, city, period)
    if not chosen:
        raise CLIError(f"no committed release of {dataset}/{city}{f' in {period}' if period else ''} in {root}")
    rows = []
    for r, ask in chosen:
        syn = r.synopsis
        values = released_values(syn)
        if values.ndim == 3:
            t0, t1 = syn.slots_for_times(*ask) if ask is not None else (0, values.shape[2])
            values = values[:, :, t0:t1].sum(axis=2)
        x, y = syn.region.project(points[:, 0], points[:, 1])
        ans = nearest_hotspot(values[:, :, None], syn.region, np.column_stack([x, y]), threshold,
                              extent_km * 1000.0, np.array([[0, 1]]))
        cx, cy = cell_centres(syn.region, *values.shape)
        found = np.flatnonzero(ans.ix >= 0)
        lo, hi, method = _qualifying_intervals(
            syn, _cell_boxes(syn.region, *values.shape, ans.ix[found], ans.iy[found]),
            ask if ask is not None and hasattr(syn, "window_intervals") else None)
        at = {int(q): i for i, q in enumerate(found)}
        for q in range(len(points)):
            row = {"period": r.manifest.period, "at": points[q].tolist(), "found": bool(ans.ix[q] >= 0)}
            if row["found"]:
                lat, lon = syn.region.unproject(cx[ans.ix[q]], cy[ans.iy[q]])
                row.update({"cell_lat": float(lat), "cell_lon": float(lon), "distance_m": float(ans.distance_m[q]),
                            "released_count": float(values[ans.ix[q], ans.iy[q]]), "unit": syn.unit().label})
                _hotspot_fields(row, lo[at[q]], hi[at[q]], method, threshold)
            rows.append(row)
    if left_out:
        eprint(f"note: left out {', '.join(left_out)}: their periods reach past --period")
    if json_out is not None:
        emit_json(rows, json_out, indent=None)
        return 0
    for row in rows:
        where = f"{row['period']}\t{row['at'][0]:.5f},{row['at'][1]:.5f}"
        print(f"{where}\thotspot at {row['cell_lat']:.5f},{row['cell_lon']:.5f}\t{row['distance_m']:.0f} m\t"
              + _hotspot_text(row) if row["found"] else
              f"{where}\tno cell with count ≥ {threshold:g} within {extent_km:g} km")
    return 0


def write_answers(table, fmt: str, dest: str | None) -> None:
    """The answer table (an Answers or a DataFrame) as text lines, JSON records (legacy keys box, estimate,
    lower, upper) or CSV."""
    import sys
    from pathlib import Path

    from flows.cli.answer_text import BOX, columns_of, csv_bytes, json_bytes, texts_of

    cols, attrs = columns_of(table)
    method = attrs["interval_method"]
    data: list = []
    if fmt == "csv":
        data = csv_bytes(table)
    elif fmt == "json":
        # one record per box (keys box, estimate, lower, upper, unit, interval_covers, interval); how the
        # intervals were computed is stated once, in the first record (docs/decisions/0023-json-answers-method-once.md)
        data = json_bytes(table, {"interval_method": method})
    else:
        b = np.column_stack([cols[c] for c in BOX])
        est, lo, hi = (cols[c] for c in ("estimate", "lower", "upper"))
        period = texts_of(cols["period"]) if "period" in cols else None
        notes = texts_of(cols["note"]) if "note" in cols else None
        lines = []
        for q in range(len(table)):
            ci = f"\t95% [{lo[q]:.1f}, {hi[q]:.1f}]" if np.isfinite(lo[q]) else ""
            when = f"{period[q]}\t" if period is not None else ""
            note = f"\tnote: {notes[q]}" if notes is not None and notes[q] else ""
            lines.append(f"{when}{b[q, 0]:.5f},{b[q, 1]:.5f},{b[q, 2]:.5f},{b[q, 3]:.5f}\t{est[q]:.1f}{ci}{note}")
        text = "\n".join(lines) + "\n"
        data = [text.encode()]
    if dest is None:
        sys.stdout.flush()
        for piece in data:
            if hasattr(sys.stdout, "buffer"):  # bytes straight through: no decode of a large table
                sys.stdout.buffer.write(piece)
            else:
                sys.stdout.write(bytes(piece).decode())
        sys.stdout.flush()
    else:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            f.writelines(data)
        eprint(f"wrote {dest}")
    if "unit_words" in attrs:
        eprint(attrs["unit_words"])
    eprint(f"intervals: {method}")


def _check_window(synopsis, times: tuple[int, int]) -> None:
    """A --period must meet the release's time window: outside it, every count would read 0."""
    from geodp.api import check_window

    try:
        past = check_window(synopsis, times, "--period")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if past:
        eprint("note: --period reaches past this release's window; only the part inside it is counted")


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
    dataset: str | None = typer.Option(None, "--dataset", help="with a store: the dataset whose releases to ask"),
    city: str | None = typer.Option(None, "--city", help="with a store: the city whose releases to ask"),
) -> int:
    """The nearest cell whose released count over the window is ≥ V, around each location. Given a store
    with --dataset and --city (or a path …/releases/DATASET/CITY): in every committed release in --period."""
    from dpcore.queries.spatiotemporal import cell_centres, nearest_hotspot

    if not extent_km > 0:
        raise CLIError("--extent-km must be > 0")
    points = np.array([_latlon(a) for a in at])
    window = _window(period, time)
    series_target = _series_target(release, dataset, city)
    if series_target is not None:
        return _hotspot_series(*series_target, points, threshold, extent_km, window, json_out)
    times = parse_window(window) if window is not None else None
    with fetch_release(release) as (_, synopsis):
        syn, factor = _spatio_temporal(synopsis)
        if times is not None:
            _check_window(syn, times)
    x, y = syn.region.project(points[:, 0], points[:, 1])
    t0, t1 = syn.slots_for_times(*times) if times is not None else (0, syn.n_slots)
    values = syn.values * factor
    ans = nearest_hotspot(values, syn.region, np.column_stack([x, y]), threshold, extent_km * 1000.0,
                          np.array([[t0, t1]]))
    nx, ny = values.shape[:2]
    cx, cy = cell_centres(syn.region, nx, ny)
    window_counts = values[:, :, t0:t1].sum(axis=2)
    found = np.flatnonzero(ans.ix >= 0)
    span = None
    if syn.window_start_s is not None and syn.slot_seconds:
        span = (syn.window_start_s + t0 * syn.slot_seconds, syn.window_start_s + t1 * syn.slot_seconds)
    lo, hi, method = _qualifying_intervals(syn, _cell_boxes(syn.region, nx, ny, ans.ix[found], ans.iy[found]),
                                           span, factor)
    at = {int(q): i for i, q in enumerate(found)}
    rows = []
    for q in range(points.shape[0]):
        if ans.ix[q] < 0:
            rows.append({"at": points[q].tolist(), "found": False})
            continue
        lat, lon = syn.region.unproject(cx[ans.ix[q]], cy[ans.iy[q]])
        rows.append({"at": points[q].tolist(), "found": True, "cell_lat": float(lat), "cell_lon": float(lon),
                     "distance_m": float(ans.distance_m[q]),
                     "released_count": float(window_counts[ans.ix[q], ans.iy[q]]), "slots": [t0, t1]})
        _hotspot_fields(rows[-1], lo[at[q]], hi[at[q]], method, threshold)
    if json_out is not None:
        emit_json(rows, json_out, indent=None)
        return 0
    for r in rows:
        where = f"{r['at'][0]:.5f},{r['at'][1]:.5f}"
        if r["found"]:
            print(f"{where}\thotspot at {r['cell_lat']:.5f},{r['cell_lon']:.5f}\t{r['distance_m']:.0f} m\t"
                  + _hotspot_text(r))
        else:
            print(f"{where}\tno cell with count ≥ {threshold:g} within {extent_km:g} km")
    return 0


#: The most slots `query forecast` looks ahead (ten years of hourly slots).
MAX_HORIZON = 87_600


def _finite(values: np.ndarray) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in values]


def _band(lower: float, upper: float) -> str:
    return f"95% [{lower:.1f}, {upper:.1f}]" if np.isfinite(lower) and np.isfinite(upper) else "no interval"


def _slot_noise_sd(syn, box_m: np.ndarray, factor: float) -> float | None:
    """The noise sd of one slot's answer for the box, from the release's own intervals (None without)."""
    from dpcore.queries.forecast import noise_sd_from

    if syn.window_start_s is None or not syn.slot_seconds:
        return None
    starts = syn.window_start_s + np.arange(syn.n_slots) * syn.slot_seconds
    boxes = np.repeat(np.atleast_2d(box_m), syn.n_slots, axis=0)
    _, iv = syn.window_intervals(boxes, starts, starts + syn.slot_seconds)
    return noise_sd_from(iv.lower * factor, iv.upper * factor)


@app.command("forecast")
def forecast(
    release: Release,
    box: str = typer.Option(..., "--box", metavar="MINLAT,MINLON,MAXLAT,MAXLON", help="the box to forecast"),
    horizon: int = typer.Option(..., "--horizon", metavar="H", help="slots to forecast past the release"),
    json_out: Json = None,
    dataset: str | None = typer.Option(None, "--dataset", help="with a store: the dataset whose releases to ask"),
    city: str | None = typer.Option(None, "--city", help="with a store: the city whose releases to ask"),
    period: Period = None,
) -> int:
    """Forecast a box's counts past the release window (ThetaModel on the released series), with a 95%
    interval. Given a store with --dataset and --city (or a path …/releases/DATASET/CITY): past its daily
    (or monthly) releases, the series being one answer per release in --period."""
    from dpcore.queries.forecast import check_forecastable, forecast_interval
    from dpcore.queries.range import parse_box
    from dpcore.queries.spatiotemporal import season_period

    at_least(horizon, 1, "--horizon")
    if horizon > MAX_HORIZON:  # the forecast's work and output grow with it: a typo must not run for hours
        raise CLIError(f"--horizon must be at most {MAX_HORIZON} slots, got {horizon}")
    box_ll = parse_box(box)
    series_target = _series_target(release, dataset, city)
    if series_target is not None:
        return _forecast_series(*series_target, box_ll, horizon, period, json_out)
    with fetch_release(release) as (_, synopsis):
        syn, factor = _spatio_temporal(synopsis)
    merged = int((syn.extra_meta().get("resolution") or {}).get("slot_factor") or 1)
    box_m = syn.region.box_latlon_to_m(box_ll)
    series = syn.series(box_m) * factor
    check_forecastable(syn.n_slots, syn.slot_seconds, merged)  # a one-line refusal (exit 2)
    fc, lower, upper, method = forecast_interval(series[0], horizon, season_period(syn.slot_seconds),
                                                 _slot_noise_sd(syn, box_m, factor))
    start = None
    if syn.window_start_s is not None and syn.slot_seconds:
        start = syn.window_start_s + syn.n_slots * syn.slot_seconds
    out = {"history": series[0].tolist(), "forecast": fc.tolist(), "lower": _finite(lower), "upper": _finite(upper),
           "interval": "95%", "interval_method": method, "unit": synopsis.unit().label,
           "slot_seconds": syn.slot_seconds, "forecast_start_s": start}
    if json_out is not None:
        emit_json(out, json_out, indent=None)
        return 0
    eprint(f"released series ({syn.n_slots} slots): " + " ".join(f"{v:.0f}" for v in series[0]))
    for h, v in enumerate(fc):
        when = ""
        if start is not None:
            import pandas as pd

            when = pd.Timestamp(start + h * syn.slot_seconds, unit="s", tz="UTC").isoformat() + "\t"
        print(f"{when}{v:.1f}\t{_band(lower[h], upper[h])}")
    eprint(f"intervals: {method}")
    return 0
