"""`geodp serve`: serve the release (nightly cron + manual), backfill and evaluate deployments.

Parameters are pydantic models (tasks.config), so the Prefect UI shows a typed form. Schedules and
default parameters come from the platform config file (deploy/geodp.toml by default). The process
serves until interrupted; point PREFECT_API_URL at a Prefect server first (see README, "Running at
scale").
"""

from __future__ import annotations

from typing import Any

from flows.backfill import backfill_flow
from flows.evaluate_flow import evaluate_flow
from flows.release import release_flow
from tasks.config import ConfigError, ReleaseParams, load_platform_config
from tasks.runtime import dask_task_runner


def build_deployments(config: dict) -> list[Any]:
    """The deployments to serve: release/nightly (cron), release/release, backfill/backfill, evaluate/evaluate."""
    nightly = config.get("nightly", {})
    try:
        nightly_params = ReleaseParams(**nightly.get("release", {})) if nightly.get("release") else None
    except ValueError as exc:
        raise ConfigError(f"[nightly.release] in the config is invalid: {exc}") from exc
    address = nightly_params.dask_address if nightly_params else None
    runner = dask_task_runner(address, nightly_params.n_workers if nightly_params else 2)
    release = release_flow.with_options(task_runner=runner)
    deployments = [release.to_deployment(name="release", description="manual release (typed parameters)")]
    if nightly_params is not None:
        deployments.append(release.to_deployment(
            name="nightly", cron=nightly.get("cron", "30 2 * * *"),
            parameters={"params": nightly_params.model_dump(mode="json")},
            description="nightly release of yesterday's data"))
    deployments.append(backfill_flow.with_options(task_runner=runner).to_deployment(
        name="backfill", description="one release per day; skips committed days"))
    deployments.append(evaluate_flow.with_options(task_runner=runner).to_deployment(
        name="evaluate", description="evaluation harness, one task per (city, mechanism, ε); with "
        "spatio_temporal also the spatio-temporal harness (slot images, forecast plots); training curves"))
    return deployments


def serve_from_config(path: str | None = None) -> None:
    from prefect import serve

    deployments = build_deployments(load_platform_config(path))
    serve(*deployments)
