"""The shares behind the profile's typical count (dpcore/synopsis/profile_verdict.py): for a square of side s
centred on each point, a(s) = the share of its person's other points inside it and c(s) = the share of
everyone else's points, per period (medians and spread over periods), on Gowalla NYC (`new-york` box), the
Gowalla sample's Austin and San Francisco and the suite's synthetic check-ins. Public data; prints a table
and the constants fitted on the held-out rows: the geometric mean of the sample's Austin and San Francisco
weeks (NYC, on which the verdict is judged, is not used; the sample's days hold 16–18 points, too few).

    python bench/bench_concentration.py            # about 2 CPU-minutes
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.spatial import cKDTree

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
SIDES = (62.5, 550.0, 3000.0)


def shares(x: np.ndarray, y: np.ndarray, user: np.ndarray) -> tuple[float, list[tuple[float, float]]]:
    """(m = Σn²/Σn, per side (a, c))."""
    tree = cKDTree(np.c_[x, y])
    _, inv, cnt = np.unique(user, return_inverse=True, return_counts=True)
    own = cnt[inv]
    out = []
    for s in SIDES:
        near = tree.query_ball_point(np.c_[x, y], s / 2, p=np.inf)
        same = np.array([np.sum(inv[v] == inv[i]) for i, v in enumerate(near)], float)
        total = np.array([len(v) for v in near], float)
        out.append(((same - 1).sum() / max((own - 1).sum(), 1), (total - same).sum() / max((len(x) - own).sum(), 1)))
    return float((cnt ** 2).sum() / cnt.sum()), out


def table(name: str, raw: pd.DataFrame, city: str, freq: str, groups: int) -> list[tuple[float, float]]:
    from dpcore.geo import city_region

    region = city_region(city)
    x, y = region.project(raw.lat.to_numpy(), raw.lon.to_numpy())
    inside = (np.abs(x) < region.half_m) & (np.abs(y) < region.half_m)
    d = pd.DataFrame({"x": x[inside], "y": y[inside], "u": raw.user_id.to_numpy()[inside],
                      "t": raw.timestamp.to_numpy()[inside]})
    rows = []
    for _, g in d.groupby(pd.Grouper(key="t", freq=freq)):
        if len(g) >= 5 and len(rows) < groups:
            rows.append((len(g), *shares(g.x.to_numpy(), g.y.to_numpy(), g.u.to_numpy())))
    n = np.array([r[0] for r in rows])
    cells, medians = [], []
    for i in range(len(SIDES)):
        a = np.array([r[2][i][0] for r in rows])
        c = np.array([r[2][i][1] for r in rows])
        cells.append(f"{np.median(a):.3f} / {np.median(c):.4f}")
        medians.append((float(np.median(a)), float(np.median(c))))
    print(f"| {name} {city} | {freq} | {len(rows)} | {np.median(n):.0f} | {np.median([r[1] for r in rows]):.1f} | "
          + " | ".join(cells) + " |")
    return medians


def main() -> None:
    nyc = pd.read_csv(DATA / "gowalla_nyc_checkins.tsv.gz", sep="\t", header=None,
                      names=["user_id", "timestamp", "lat", "lon", "venue"])
    nyc["timestamp"] = pd.to_datetime(nyc["timestamp"], utc=True)
    sample = pd.read_parquet(DATA / "gowalla_sample_1000users.parquet")
    print("| data | period | periods | median N | median m | a / c at " + " | ".join(f"{s:g} m" for s in SIDES) + " |")
    print("|---|---|---:|---:|---:|" + "---|" * len(SIDES))
    table("Gowalla", nyc[nyc.timestamp >= "2010-05-01"], "new-york", "D", 40)
    table("Gowalla", nyc[nyc.timestamp >= "2010-05-01"], "new-york", "7D", 8)
    held_out = []
    for city in ("austin", "san-francisco"):
        table("sample", sample, city, "D", 60)
        held_out.append(table("sample", sample, city, "7D", 30))
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    synthetic = generate_checkins(city_region("new-york"), n_users=400, start="2024-01-01", days=14, seed=3)
    table("synthetic", synthetic, "new-york", "D", 14)
    fit = np.exp(np.mean(np.log(np.array(held_out)), axis=0))  # per side (a, c)
    print("held-out fit (Austin and San Francisco weeks): OWN_SHARE = ("
          + ", ".join(f"{a:.3g}" for a, _ in fit) + "), OTHERS_SHARE = (" + ", ".join(f"{c:.3g}" for _, c in fit) + ")")
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU-seconds: {use.ru_utime + use.ru_stime:.0f}")


if __name__ == "__main__":
    main()
