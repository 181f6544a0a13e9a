"""`snh-denoiser-train`: train SNH's pyramid denoiser on PUBLIC datasets and save it.

The datasets are prepared in parallel (Dask), then one task trains the model (dpcore.models.
pyramid_denoiser) and writes the weights and a JSON file with the training regions and loss curve.
``exclude_cities`` keeps cities out of training (the benchmark city, by default New York), and the
saved model is never applied to a region that overlaps one it was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from dpcore.models.pyramid_denoiser import DEFAULT_DENOISER_PATH, DenoiserTrainConfig
from flows.paramselect_flow import synthetic_spec
from tasks.denoiser_tasks import prepare_dataset, train_and_save
from tasks.runtime import dask_task_runner

#: Gowalla-sample cities with ≥ 15k points (the others have 1.3–4.4k: too sparse to teach density).
DENOISER_GOWALLA_CITIES = ("austin", "san-francisco", "new-york")


@dataclass
class DenoiserParams:
    shared_data: str = "../shared/data"
    model_path: str = str(DEFAULT_DENOISER_PATH)
    exclude_cities: list[str] = field(default_factory=lambda: ["new-york"])
    cab_fractions: list[float] = field(default_factory=lambda: [0.04, 0.01, 0.005])
    synthetic_seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6])
    steps: int = 1500
    #: Record-level releases only, and each release's signal n·ε/s drawn from this range instead of ε
    #: (dpcore.models.pyramid_denoiser.DenoiserTrainConfig); the shipped model uses neither.
    record_only: bool = False
    signal_range: list[float] | None = None
    #: Width of the U-Net (its first level's channels; the second has twice as many).
    channels: int = 32
    seed: int = 0
    dask_address: str | None = None
    n_workers: int = 2


def denoiser_datasets(p: DenoiserParams) -> list[dict]:
    """Public dataset specs (tasks.paramselect_tasks.dataset_points format), excluded cities left out."""
    root = Path(p.shared_data)
    specs: list[dict] = []
    sample = root / "gowalla_sample_1000users.parquet"
    nyc = root / "gowalla_nyc_checkins.tsv.gz"
    for city in DENOISER_GOWALLA_CITIES:
        source = nyc if city == "new-york" else sample
        if source.exists():
            specs.append({"name": f"gowalla-{city}", "city": city, "source": str(source), "seed": p.seed})
    cabs = root / "sf_cabs.parquet"
    if cabs.exists():
        # Taxis at several densities: a user fraction of the fleet (537 cabs, ~10 M points in the box).
        for f in p.cab_fractions:
            specs.append({"name": f"sf-cabs-{f:g}", "city": "san-francisco", "source": str(cabs), "fraction": f,
                          "seed": p.seed})
    specs += [synthetic_spec(s) for s in p.synthetic_seeds]  # the same synthetic cities as ParamSelect's
    return [s for s in specs if s["city"] not in set(p.exclude_cities)]


@flow(name="snh-denoiser-train", log_prints=True)
def denoiser_train_flow(params: DenoiserParams) -> dict:
    specs = denoiser_datasets(params)
    if not specs:
        raise FileNotFoundError(f"no public training data for the denoiser under {params.shared_data}")
    datasets = [f.result() for f in [prepare_dataset.submit(s) for s in specs]]
    print(f"denoiser: {len(datasets)} public datasets: " + ", ".join(f"{d.name} ({d.n_points:,})" for d in datasets))
    config = DenoiserTrainConfig(steps=params.steps, seed=params.seed, record_only=params.record_only,
                                 channels=params.channels,
                                 signal_range=tuple(params.signal_range) if params.signal_range else None)
    meta = train_and_save(datasets, config, params.model_path)
    rep = meta["report"]
    create_markdown_artifact(
        f"# SNH public denoiser\n\n{len(datasets)} public datasets, {rep['steps']} steps in {rep['seconds']:.0f} s; "
        f"mean relative error of the last 100 training batches {rep['loss_last_100']:.4f}.\n\nTraining regions: "
        + ", ".join(r["name"] for r in meta["training_regions"]) + "\n",
        key="snh-denoiser-train", description="SNH denoiser training")
    print(f"denoiser saved to {params.model_path} (loss {rep['loss_last_100']:.4f})")
    return meta


def run_denoiser_train(params: DenoiserParams) -> dict:
    return denoiser_train_flow.with_options(task_runner=dask_task_runner(params.dask_address, params.n_workers))(params)
