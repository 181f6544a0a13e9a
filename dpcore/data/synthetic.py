"""Synthetic check-ins with the skew of real location data, for the embedded demo and tests.

What makes it realistic enough to exercise the mechanisms:
- spatial skew: a few dozen hotspots with Zipf popularity and lognormal spread (50 m – 1 km),
  concentrated towards the centre, plus a thin uniform background;
- power-law users: points per user ~ discrete Pareto (most users have a handful, a few have
  hundreds), each user favouring 1–4 hotspots of their own;
- weekly rhythm: hour-of-week intensity with lunch and evening peaks and busier Fri/Sat.
The generator is deterministic given its seed and needs no data files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.geo import Region


def hour_of_week_weights() -> np.ndarray:
    """168 weights, Monday 00:00 first."""
    hours = np.arange(24)
    day_profile = (0.15 + np.exp(-0.5 * ((hours - 12.5) / 1.5) ** 2)
                   + 1.3 * np.exp(-0.5 * ((hours - 19.5) / 2.0) ** 2) + 0.4 * np.exp(-0.5 * ((hours - 8.5) / 1.0) ** 2))
    day_weight = np.array([0.85, 0.9, 0.95, 1.0, 1.25, 1.4, 1.1])  # Mon..Sun
    w = (day_weight[:, None] * day_profile[None, :]).ravel()
    return w / w.sum()


def generate_checkins(region: Region, n_users: int = 3000, start: str = "2024-01-01", days: int = 28,
                      n_hotspots: int = 60, pareto_shape: float = 1.3, max_points_per_user_raw: int = 1500,
                      seed: int = 0) -> pd.DataFrame:
    """A point table in the standard schema (user_id, timestamp, lat, lon) inside ``region``."""
    rng = np.random.default_rng(seed)
    layout = _layout(rng, region, n_hotspots)
    return _users(rng, region, layout, 0, n_users, start, days, pareto_shape, max_points_per_user_raw)


def generate_checkin_chunks(region: Region, n_users: int = 3000, start: str = "2024-01-01", days: int = 28,
                            n_hotspots: int = 60, pareto_shape: float = 1.3, max_points_per_user_raw: int = 1500,
                            seed: int = 0, chunk_users: int = 250_000) -> Iterator[pd.DataFrame]:
    """The same kind of table in blocks of ``chunk_users`` users (one city layout for all blocks), so
    that hundreds of millions of points can be written with bounded memory. With one block the rows
    equal :func:`generate_checkins`' for the same arguments."""
    rng = np.random.default_rng(seed)
    layout = _layout(rng, region, n_hotspots)
    for i, first in enumerate(range(0, n_users, chunk_users)):
        block_rng = rng if i == 0 else np.random.default_rng([seed, i])
        yield _users(block_rng, region, layout, first, min(chunk_users, n_users - first), start, days,
                     pareto_shape, max_points_per_user_raw)


def _layout(rng: np.random.Generator, region: Region, n_hotspots: int) -> tuple[np.ndarray, ...]:
    """Hotspots: Zipf popularity, centres pulled towards the middle of the region."""
    h = region.half_m
    centres = np.clip(rng.normal(0.0, region.side_m / 5, size=(n_hotspots, 2)), -0.95 * h, 0.95 * h)
    popularity = 1.0 / np.arange(1, n_hotspots + 1) ** 1.1
    popularity /= popularity.sum()
    spread = np.exp(rng.uniform(np.log(50.0), np.log(1000.0), n_hotspots))
    return centres, popularity, spread


def _users(rng: np.random.Generator, region: Region, layout: tuple[np.ndarray, ...], first_user: int,
           n_users: int, start: str, days: int, pareto_shape: float, max_points_per_user_raw: int) -> pd.DataFrame:
    centres, popularity, spread = layout
    n_hotspots = popularity.size
    h = region.half_m
    per_user = np.minimum(np.floor(rng.pareto(pareto_shape, n_users) * 4 + 1).astype(np.int64),
                          max_points_per_user_raw)
    n = int(per_user.sum())
    user = np.repeat(np.arange(n_users), per_user)
    # Each user's favourite hotspots: 1–4 draws by popularity; a point picks one of them, or (20%)
    # any hotspot, or (5%) the uniform background.
    n_fav = rng.integers(1, 5, n_users)
    favs = rng.choice(n_hotspots, size=(n_users, 4), p=popularity)
    pick = rng.integers(0, n_fav[user])
    hotspot = favs[user, pick]
    roam = rng.random(n) < 0.20
    hotspot[roam] = rng.choice(n_hotspots, size=int(roam.sum()), p=popularity)
    x = centres[hotspot, 0] + rng.normal(0, 1, n) * spread[hotspot]
    y = centres[hotspot, 1] + rng.normal(0, 1, n) * spread[hotspot]
    background = rng.random(n) < 0.05
    x[background] = rng.uniform(-h, h, int(background.sum()))
    y[background] = rng.uniform(-h, h, int(background.sum()))
    inside = (np.abs(x) < h) & (np.abs(y) < h)
    x, y, user = x[inside], y[inside], user[inside]
    n = x.size

    start_ts = pd.Timestamp(start, tz="UTC")
    weeks = int(np.ceil((days + start_ts.day_of_week) / 7))
    w = np.tile(hour_of_week_weights(), weeks)
    offset_h = start_ts.day_of_week * 24
    w = w[offset_h: offset_h + days * 24]
    hour_idx = rng.choice(w.size, size=n, p=w / w.sum())
    seconds = (hour_idx * 3600 + rng.integers(0, 3600, n)).astype(np.int64)
    ts = pd.to_datetime(int(start_ts.timestamp()) + seconds, unit="s", utc=True)
    lat, lon = region.unproject(x, y)
    df = pd.DataFrame({"user_id": user.astype(np.int64) + first_user, "timestamp": ts, "lat": lat, "lon": lon})
    return df.sort_values("timestamp", kind="stable").reset_index(drop=True)


def write_partitioned(chunks: Iterable[pd.DataFrame], out: str | Path, start: str, days: int,
                      partitions: str | int) -> dict:
    """Write check-in blocks as a Parquet dataset under the folder ``out``.

    ``partitions="day"``: hive-partitioned by UTC day, ``out/date=YYYY-MM-DD/part-0.parquet``.
    ``partitions=N``: N files ``out/part-00000.parquet`` …, file i holding the i-th of N equal time
    slices of the period (as hourly or daily exports would). Each block's rows go to every output
    they touch, so a user's points spread over many files. Returns counts: rows, users, files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    t0 = int(pd.Timestamp(start, tz="UTC").timestamp())
    span = int(days) * 86400
    if partitions == "day":
        n_out, edges = int(days), t0 + 86400 * np.arange(int(days) + 1)
    else:
        n_out = int(partitions)
        if not 1 <= n_out <= span:
            raise ValueError(f"partitions must be 'day' or 1..{span}, got {partitions!r}")
        edges = t0 + (span * np.arange(n_out + 1)) // n_out

    def path_of(i: int) -> Path:
        if partitions == "day":
            day = pd.Timestamp(int(edges[i]), unit="s").strftime("%Y-%m-%d")
            return out / f"date={day}" / "part-0.parquet"
        return out / f"part-{i:05d}.parquet"

    schema = pa.schema([("user_id", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
                        ("lat", pa.float64()), ("lon", pa.float64())])
    writers: dict[int, pq.ParquetWriter] = {}
    rows = users = 0
    try:
        for df in chunks:
            secs = df["timestamp"].to_numpy(dtype="datetime64[s]").astype(np.int64)
            which = np.searchsorted(edges, secs, side="right") - 1
            rows += len(df)
            users += int(df["user_id"].nunique())
            # Rows are sorted by time, so each output's rows are one contiguous run.
            bounds = np.searchsorted(which, np.arange(n_out + 1))
            for i in np.flatnonzero(np.diff(bounds)):
                if i not in writers:
                    path_of(int(i)).parent.mkdir(parents=True, exist_ok=True)
                    writers[i] = pq.ParquetWriter(path_of(int(i)), schema)
                piece = df.iloc[bounds[i]: bounds[i + 1]]
                writers[i].write_table(pa.Table.from_pandas(piece, schema=schema, preserve_index=False))
    finally:
        for w in writers.values():
            w.close()
    return {"rows": rows, "users": users, "files": len(writers)}
