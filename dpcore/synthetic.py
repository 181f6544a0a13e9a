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
    h = region.half_m
    # Hotspots: Zipf popularity, centres pulled towards the middle of the region.
    centres = np.clip(rng.normal(0.0, region.side_m / 5, size=(n_hotspots, 2)), -0.95 * h, 0.95 * h)
    popularity = 1.0 / np.arange(1, n_hotspots + 1) ** 1.1
    popularity /= popularity.sum()
    spread = np.exp(rng.uniform(np.log(50.0), np.log(1000.0), n_hotspots))

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
    df = pd.DataFrame({"user_id": user.astype(np.int64), "timestamp": ts, "lat": lat, "lon": lon})
    return df.sort_values("timestamp", kind="stable").reset_index(drop=True)
