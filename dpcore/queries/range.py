"""Query workloads and exact answers.

Query centres are drawn from the evaluated data by default (``WorkloadSpec``): an evaluation reads the
private data for the truth anyway and is never published.

A workload is an array of boxes (q, 4) = [xmin, ymin, xmax, ymax] in region metres. Truth is the
exact count over *all* points of the region (not the bounded sample that the mechanism saw).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcore import GeoDPError
from dpcore.geo import Region

#: The default workloads: (min side, max side) in metres. 25–100 m is the SNH paper's setting.
DEFAULT_QUERY_SIDES_M: tuple[tuple[float, float], ...] = ((25.0, 100.0), (100.0, 1000.0), (1000.0, 5000.0))


class QueryError(GeoDPError, ValueError):
    pass


def parse_query_sides(text: str) -> list[tuple[float, float]]:
    """'25:100,100:1000' → [(25, 100), (100, 1000)]."""
    out = []
    for part in text.split(","):
        try:
            a, b = (float(v) for v in part.split(":"))
        except ValueError as exc:
            raise QueryError(f"query sides must look like 25:100,100:1000 (metres), got {part!r}") from exc
        if not (0 < a <= b):
            raise QueryError(f"query side range {part!r} must satisfy 0 < min ≤ max")
        out.append((a, b))
    return out


#: Where the evaluation's query centres come from (``--workload``): ``data`` (the default): a uniformly
#: drawn point of the evaluated data, so queries are asked where people are (the SNH paper's test
#: protocol); ``uniform``: uniform over the region; ``public:PATH``: a uniformly drawn point of a public
#: point file (read with dpcore.data.points.load_points, only its points inside the region).
WORKLOAD_KINDS = ("data", "uniform", "public")
DEFAULT_WORKLOAD = "data"


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    path: str | None = None

    def __str__(self) -> str:
        return f"public:{self.path}" if self.kind == "public" else self.kind

    def describe(self) -> str:
        return {"data": "centres: uniformly drawn points of the evaluated data (where people are)",
                "uniform": "centres: uniform over the region",
                "public": f"centres: uniformly drawn points of the public file {self.path} inside the region",
                }[self.kind]


def parse_workload(text: str | WorkloadSpec) -> WorkloadSpec:
    """'data' | 'uniform' | 'public:PATH' → WorkloadSpec (the file is read later, by workload_centres)."""
    if isinstance(text, WorkloadSpec):
        return text
    t = str(text).strip()
    if t in ("data", "uniform"):
        return WorkloadSpec(t)
    if t.startswith("public:") and t[len("public:"):].strip():
        return WorkloadSpec("public", t[len("public:"):].strip())
    raise QueryError(f"workload must be data, uniform or public:PATH, got {text!r}")


Centres = tuple[np.ndarray, np.ndarray]


def workload_centres(spec: str | WorkloadSpec, region: Region, data_x: np.ndarray | None = None,
                     data_y: np.ndarray | None = None) -> Centres | None:
    """The points query centres are drawn from (region metres), or None for uniform centres.

    ``data`` uses the evaluated data's in-region points (the caller's ``data_x``, ``data_y``);
    ``public:PATH`` reads only that file, keeping its points inside the region."""
    spec = parse_workload(spec)
    if spec.kind == "uniform":
        return None
    if spec.kind == "data":
        if data_x is None or data_y is None:
            raise QueryError("the data workload needs the evaluated points")
        cx, cy = np.asarray(data_x, dtype=np.float64), np.asarray(data_y, dtype=np.float64)
    else:
        from dpcore.data.points import clip_to_region, load_points

        _, cx, cy = clip_to_region(load_points(spec.path).points, region)
    if cx.size == 0:
        raise QueryError(f"the {spec} workload has no points inside region {region.name} to centre queries on")
    return cx, cy


def square_workload(region: Region, n_queries: int, side_min_m: float, side_max_m: float,
                    rng: np.random.Generator, centres: Centres | None = None) -> np.ndarray:
    """Squares with side ~ U[side_min, side_max], centred uniformly at random in the region, or, with
    ``centres`` (see :func:`workload_centres`), each on a point of ``centres`` drawn uniformly (with
    replacement), so the queries follow that point set's distribution."""
    if n_queries < 1:
        raise QueryError("n_queries must be ≥ 1")
    side = rng.uniform(side_min_m, side_max_m, n_queries)
    cx, cy = centre_draw(region, n_queries, rng, centres)
    return np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], axis=1)


def centre_draw(region: Region, n: int, rng: np.random.Generator, centres: Centres | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """n centres: uniform over the region (x then y), or uniformly drawn points of ``centres``."""
    if centres is None:
        xmin, ymin, xmax, ymax = region.bounds_m
        return rng.uniform(xmin, xmax, n), rng.uniform(ymin, ymax, n)
    idx = rng.integers(0, centres[0].size, n)
    return centres[0][idx], centres[1][idx]


def true_counts(x: np.ndarray, y: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Exact number of points with xmin ≤ x < xmax and ymin ≤ y < ymax for each box.

    Points are sorted by x once; each box scans only its x-slab (searchsorted), so the cost is the
    total slab size rather than points × queries.
    """
    b = np.atleast_2d(np.asarray(boxes, dtype=np.float64))
    order = np.argsort(x, kind="stable")
    xs = np.asarray(x, dtype=np.float64)[order]
    ys = np.asarray(y, dtype=np.float64)[order]
    lo = np.searchsorted(xs, b[:, 0], side="left")
    hi = np.searchsorted(xs, b[:, 2], side="left")
    out = np.empty(b.shape[0], dtype=np.int64)
    for i in range(b.shape[0]):  # per-query slab scan is vectorised inside; queries are few (≤ 1e4)
        seg = ys[lo[i]:hi[i]]
        out[i] = np.count_nonzero((seg >= b[i, 1]) & (seg < b[i, 3]))
    return out


def read_boxes_csv(path: str) -> np.ndarray:
    """A CSV with columns min_lat,min_lon,max_lat,max_lon (header optional) → (q, 4) lat/lon boxes.

    Read by Arrow's CSV reader where every coordinate is a plain number (a tenth of pandas' time for a
    million rows, and no pandas import); anything else is read by pandas, whose result or error it is."""
    boxes = _read_boxes_arrow(path)
    return boxes if boxes is not None else _read_boxes_pandas(path)


def _read_boxes_arrow(path: str) -> np.ndarray | None:
    """The boxes where Arrow reads the four columns as numbers, every one finite; else None."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    cols = ["min_lat", "min_lon", "max_lat", "max_lon"]
    try:
        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False),
                               convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(cols, pa.float64())))
        if not all(c in table.column_names for c in cols):
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False,
                                                                        autogenerate_column_names=True))
            cols = table.column_names[:4]
    except (pa.ArrowException, OSError, ValueError):
        return None
    if len(cols) < 4 or table.num_rows == 0:
        return None
    parts = []
    for c in cols:
        col = table.column(c)
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)) or col.null_count:
            return None
        # from the buffers of each chunk cast to float64: to_numpy() imports pandas (0.4 CPU-s)
        chunks = [pc.cast(c, pa.float64()) for c in col.chunks]
        parts.append(np.concatenate([np.frombuffer(c.buffers()[1], np.float64, c.offset + len(c))[c.offset:]
                                     for c in chunks]))
    arr = np.column_stack(parts)
    return arr if np.isfinite(arr).all() else None


def _read_boxes_pandas(path: str) -> np.ndarray:
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except Exception as exc:
        raise QueryError(f"cannot read boxes CSV {path}: {exc}") from exc
    cols = ["min_lat", "min_lon", "max_lat", "max_lon"]
    if all(c in df.columns for c in cols):
        arr = df[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    else:
        df = pd.read_csv(path, header=None)
        if df.shape[1] < 4:
            raise QueryError(f"{path}: need 4 columns min_lat,min_lon,max_lat,max_lon")
        arr = df.iloc[:, :4].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    if not np.isfinite(arr).all():
        raise QueryError(f"{path}: non-numeric box coordinates")
    return arr


def parse_box(text: str) -> np.ndarray:
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError as exc:
        raise QueryError(f"--box must be MINLAT,MINLON,MAXLAT,MAXLON, got {text!r}") from exc
    if len(vals) != 4:
        raise QueryError(f"--box must have 4 numbers MINLAT,MINLON,MAXLAT,MAXLON, got {text!r}")
    if not (-90 <= vals[0] <= 90 and -90 <= vals[2] <= 90 and -180 <= vals[1] <= 180 and -180 <= vals[3] <= 180):
        raise QueryError(f"--box coordinates out of range: {text!r}")
    return np.array([vals], dtype=np.float64)
