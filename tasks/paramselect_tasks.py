"""Prefect task for ParamSelect training: the error table of one PUBLIC dataset (cached on disk)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.data.points import clip_to_region, load_points
from dpcore.geo import city_region
from dpcore.paramselect import PublicProfile, training_rows
from tasks.lazy_task import task
from tasks.runtime import ProgressClock, environment, run_logger

# bump when training_rows or the evaluation protocol it uses changes (v2: scaling floor; v3: query
# centres drawn from the data)
ROWS_VERSION = 3


def dataset_points(spec: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, user) of a public dataset spec inside its city box, subsampled by users when asked.

    spec: {"name", "group", "city", "source": path | "synthetic", "fraction", "seed", "n_users"?}.
    """
    region = city_region(spec["city"])
    if spec["source"] == "synthetic":
        from dpcore.data.synthetic import generate_checkins

        df = generate_checkins(region, n_users=int(spec.get("n_users", 3000)), seed=int(spec["seed"]),
                               n_hotspots=int(spec.get("n_hotspots", 60)))
        x, y = region.project(df["lat"].to_numpy(), df["lon"].to_numpy())
        user = df["user_id"].to_numpy()
        inside = region.contains_m(x, y)
        x, y, user = x[inside], y[inside], user[inside]
    else:
        pts = load_points(spec["source"]).points
        idx, x, y = clip_to_region(pts, region)
        user = pts.user[idx]
    fraction = float(spec.get("fraction", 1.0))
    if fraction < 1.0:
        rng = np.random.default_rng(int(spec.get("seed", 0)))
        users = np.unique(user)
        chosen = rng.choice(users, size=max(1, int(round(fraction * users.size))), replace=False)
        keep = np.isin(user, chosen)
        x, y, user = x[keep], y[keep], user[keep]
    return x, y, user


def cache_key(spec: dict, config: dict) -> str:
    blob = json.dumps({"spec": spec, "config": config, "v": ROWS_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@task(name="paramselect-rows", retries=0)
def dataset_rows(spec: dict, config: dict, cache_dir: str) -> dict:
    """Rows for one public dataset (record-level and user-level), read from the cache when present.

    ``environment`` is the one the rows were computed in (:func:`tasks.runtime.environment`), recorded
    beside them; None for rows cached before geodp recorded it."""
    path = Path(cache_dir) / f"rows-{spec['name']}-{cache_key(spec, config)}.csv"
    profile_path = path.with_suffix(".profile.json")
    env_path = path.with_suffix(".env.json")
    if path.exists() and profile_path.exists():
        env = json.loads(env_path.read_text()) if env_path.exists() else None
        return {"rows": str(path), "profile": json.loads(profile_path.read_text()), "cached": True,
                "environment": env}
    region = city_region(spec["city"])
    x, y, user = dataset_points(spec)
    profile = PublicProfile.from_points(x, y, user, region, source=spec["name"])
    rows = []
    mechs = tuple(config["mechanisms"])
    logger, clock = run_logger(), ProgressClock()  # a dataset with SNH rows runs for 10+ minutes

    def progress(done: int, total: int, what: str) -> None:
        if clock.due(final=done == total):
            logger.info("%s [%s]: %d/%d configurations, %.0f s (%s)", spec["name"], ",".join(mechs), done, total,
                        clock.elapsed_s, what)

    common = dict(epsilons=tuple(config["epsilons"]), n_queries=int(config["n_queries"]),
                  trials=int(config["trials"]), seed=int(config["seed"]),
                  bands=tuple(tuple(b) for b in config["bands"]), rhos=tuple(config["rhos"]),
                  mechanism_params=config.get("mechanism_params"), progress=progress)
    rows += training_rows(spec["name"], spec["group"], x, y, user, region, profile, privacy_unit="record",
                          mechanisms=mechs, **common)
    if config.get("user_ks"):
        rows += training_rows(spec["name"], spec["group"], x, y, user, region, profile, privacy_unit="user",
                              ks=tuple(config["user_ks"]), mechanisms=mechs, **common)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False)
    profile_path.write_text(json.dumps(profile.to_dict()))
    env = environment()
    env_path.write_text(json.dumps(env, indent=1))
    tmp.replace(path)  # the CSV appears only when complete, so a crashed run never caches half a table
    return {"rows": str(path), "profile": profile.to_dict(), "cached": False, "environment": env}
