"""Prefect tasks for SNH's public denoiser: prepare one PUBLIC dataset; train and save the model."""

from __future__ import annotations

from pathlib import Path

from dpcore.geo import city_region
from dpcore.models.pyramid_denoiser import (
    DenoiserTrainConfig,
    PublicDataset,
    region_record,
    save_denoiser,
    train_denoiser,
)
from tasks.lazy_task import task
from tasks.paramselect_tasks import dataset_points
from tasks.runtime import ProgressClock, run_logger


@task(name="denoiser-dataset", retries=0)
def prepare_dataset(spec: dict) -> PublicDataset:
    """Points of one public dataset spec (tasks.paramselect_tasks.dataset_points) → pyramid counts."""
    x, y, user = dataset_points(spec)
    if x.size == 0:
        raise ValueError(f"public dataset {spec['name']} has no points in {spec['city']}")
    return PublicDataset.from_points(spec["name"], x, y, user, city_region(spec["city"]), seed=int(spec.get("seed", 0)))


@task(name="denoiser-train", retries=0)
def train_and_save(datasets: list[PublicDataset], config: DenoiserTrainConfig, path: str) -> dict:
    logger, clock = run_logger(), ProgressClock()

    def progress(step: int, loss: float) -> None:
        if clock.due(final=step == config.steps - 1):
            logger.info("denoiser step %d/%d, mean relative error (last 50 steps) %.4f, %.0f s",
                        step + 1, config.steps, loss, clock.elapsed_s)

    model, report = train_denoiser(datasets, config, progress)
    regions = {d.region.name: region_record(d.region) for d in datasets}
    meta = {"training_datasets": [{"name": d.name, "points": d.n_points} for d in datasets],
            "training_regions": list(regions.values()), "report": report}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_denoiser(path, model, meta)
    return meta
