"""What an analyst reads off a release, against a blank map: the mean relative error of its answers
on data-centred squares of real check-ins, beside answering 0 (tests of shipped configurations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def gowalla_days(path: Path, first: str, end: str) -> pd.DataFrame:
    """The Gowalla NYC check-ins from ``first`` up to (not including) ``end``, UTC."""
    raw = pd.read_csv(path, sep="\t", header=None, names=["user_id", "timestamp", "lat", "lon", "venue"])
    raw["timestamp"] = pd.to_datetime(raw["timestamp"], utc=True)
    return raw[(raw.timestamp >= first) & (raw.timestamp < end)].drop(columns="venue")


def error_against_blank_map(release, points: pd.DataFrame, n: int = 300, sides_m: tuple[float, float] = (1000, 5000),
                            seed: int = 7) -> tuple[float, float]:
    """(the release's mean relative error, answering 0's) over ``n`` squares of side in ``sides_m``
    centred on points inside the release's grid; the truth counts every point (full counts)."""
    g = release.to_xarray()
    inside = points[(points.lat >= float(g.lat.min())) & (points.lat <= float(g.lat.max()))
                    & (points.lon >= float(g.lon.min())) & (points.lon <= float(g.lon.max()))]
    rng = np.random.default_rng(seed)
    centres = inside.iloc[rng.integers(0, len(inside), n)]
    dlat = rng.uniform(*sides_m, len(centres)) / 2 / 111_320
    dlon = dlat / np.cos(np.radians(centres.lat.to_numpy()))
    boxes = pd.DataFrame({"min_lat": centres.lat.to_numpy() - dlat, "min_lon": centres.lon.to_numpy() - dlon,
                          "max_lat": centres.lat.to_numpy() + dlat, "max_lon": centres.lon.to_numpy() + dlon})
    lat, lon = inside.lat.to_numpy()[:, None], inside.lon.to_numpy()[:, None]
    truth = ((lat >= boxes.min_lat.to_numpy()) & (lat < boxes.max_lat.to_numpy())
             & (lon >= boxes.min_lon.to_numpy()) & (lon < boxes.max_lon.to_numpy())).sum(axis=0)
    floor = max(1.0, len(inside) / 1000)
    released = float(np.mean(np.abs(release.query(boxes).estimate.to_numpy() - truth) / np.maximum(truth, floor)))
    return released, float(np.mean(truth / np.maximum(truth, floor)))
