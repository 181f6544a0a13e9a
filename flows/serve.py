"""`geodp serve`: serve the release (nightly cron + manual), backfill and evaluate deployments.

Parameters are pydantic models (tasks.config), so the Prefect UI shows a typed form. Schedules, default
parameters and budget caps come from the platform settings (tasks.settings: --config, else GEODP_CONFIG,
else the packaged default), and every deployment passes the resolved file on to its runs, so the caps a
served run charges against are the ones this process was started with. Served runs pick their Dask
cluster from their own parameters (tasks.runtime.dask_for_run): `prefect.serve()` reloads each flow from
its entrypoint, which would drop a task runner set here.

The process needs a Prefect server it can share with the UI (PREFECT_API_URL); without one it refuses
to start, since a temporary server would be invisible to every UI and scheduler.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect.deployments.runner import EntrypointType

from flows.backfill import backfill_flow
from flows.evaluate_flow import evaluate_flow
from flows.release import release_flow
from tasks.config import ConfigError
from tasks.runtime import _api_url_configured
from tasks.settings import PlatformSettings, config_path, load_settings


def build_deployments(settings: PlatformSettings, path: str | os.PathLike | None = None) -> list[Any]:
    """The deployments to serve: release/nightly (cron), release/release, backfill/backfill,
    evaluate/evaluate. ``path`` (the config file the settings came from) becomes every release and
    backfill run's ``config_path`` parameter."""
    extra = {"config_path": str(Path(path).resolve())} if path else {}
    into = f"into {settings.store} unless the form names another store" if settings.store else \
        "into the store the form names (no store is configured)"
    # Entrypoints by module (flows.release.release_flow), not by file: a served run loads its flow under
    # its real module name, so the workers of a Dask scheduler the run did not start (dask_address) can
    # import its tasks; by file path the flow's module is named "release" and they cannot.
    by_module = {"entrypoint_type": EntrypointType.MODULE_PATH}
    deployments = [release_flow.to_deployment(name="release", parameters=dict(extra), **by_module,
                                              description=f"manual release (typed parameters) {into}")]
    if settings.nightly is not None:
        deployments.append(release_flow.to_deployment(
            name="nightly", cron=settings.nightly.cron, **by_module,
            parameters={"params": settings.nightly.release.model_dump(mode="json"), **extra},
            description="nightly release; a relative period counts from the run's scheduled start"))
    deployments.append(backfill_flow.to_deployment(name="backfill", parameters=dict(extra), **by_module,
                                                   description="one release per day; skips committed days"))
    deployments.append(evaluate_flow.to_deployment(
        name="evaluate", tags=["operator-only"], **by_module,
        description="OPERATOR ONLY (errors against the true counts, images of true counts): evaluation harness, "
        "one task per (city, mechanism, ε); with spatio_temporal also the spatio-temporal harness (slot "
        "images, forecast plots); training curves"))
    return deployments


def require_prefect_server() -> str:
    """The Prefect API URL to serve against; a one-line error when none is configured."""
    if not _api_url_configured():
        raise ConfigError("geodp serve needs a Prefect server that the UI and its scheduler share: start one "
                          "(`prefect server start`) and set PREFECT_API_URL, e.g. "
                          "PREFECT_API_URL=http://127.0.0.1:4200/api")
    from prefect.settings import PREFECT_API_URL

    return os.environ.get("PREFECT_API_URL") or str(PREFECT_API_URL.value())


def serve_from_config(path: str | None = None) -> None:
    from prefect import serve

    chosen = config_path(path)
    deployments = build_deployments(load_settings(chosen), chosen)
    api = require_prefect_server()
    print(f"serving {len(deployments)} deployments with config {chosen} against {api}", flush=True)
    serve(*deployments)
