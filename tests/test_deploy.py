"""The container deployment: the image is built from deploy/Dockerfile, compose waits for Postgres and
tells the UI where the API is, the store lives on a volume; a non-editable install carries the default
config. `docker compose config` validates the file where the compose plugin is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from datetime import date
from pathlib import Path

import pytest
import yaml

from dpcore import __version__

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_builds_geodp_from_the_repository_and_waits_for_its_dependencies():
    services = _compose()["services"]
    ours = {name: s for name, s in services.items() if s.get("image") == f"geodp:{__version__}"}
    assert {"prefect-server", "serve", "dask-scheduler", "dask-worker"} <= set(ours)
    for s in ours.values():  # every geodp service can build the image itself, from this repository
        context = (COMPOSE.parent / s["build"]["context"]).resolve()
        assert context == ROOT and (context / s["build"]["dockerfile"]).is_file()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
    assert dockerfile[[ln.startswith("FROM") for ln in dockerfile].index(True)].split()[1] == "python:3.11.10-slim"
    runs = [ln for ln in dockerfile if ln.startswith("RUN pip install")]
    assert "download.pytorch.org/whl/cpu" in runs[0] and "torch==2.13.0" in runs[0]
    assert any("-c constraints.txt ." in r for r in runs[1:])
    # Postgres is waited for, not just started
    assert services["postgres"]["healthcheck"]["test"]
    assert services["prefect-server"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["serve"]["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    assert services["prefect-server"]["environment"]["PREFECT_UI_API_URL"].endswith("/api}")
    # the release store (MinIO's data) is on a named volume that outlives the containers
    volumes = _compose()["volumes"]
    assert any(v.split(":")[0] in volumes for v in services["minio"]["volumes"])
    assert services["serve"]["environment"]["GEODP_STORE"].startswith("s3://")


#: The first MinIO release pinned here that refuses a second `If-None-Match: *` PUT of one key with 412
#: (the store's create-only writes rest on it; minio/minio#19448, #20346).
MINIO_CONDITIONAL_WRITES = date(2024, 11, 7)


def test_every_image_is_pinned_and_minio_honours_conditional_writes():
    services = _compose()["services"]
    for name, s in services.items():
        repo, _, tag = s["image"].rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: {s['image']} is not pinned"
    for name in ("minio", "create-bucket"):
        tag = services[name]["image"].rpartition(":")[2]
        m = re.fullmatch(r"RELEASE\.(\d{4})-(\d{2})-(\d{2})T[\d-]+Z", tag)
        assert m, f"{name}: {tag} is not a MinIO release tag"
        assert date(*map(int, m.groups())) >= MINIO_CONDITIONAL_WRITES
    # the bucket the serving process releases into is the one the one-shot service creates
    bucket = services["serve"]["environment"]["GEODP_STORE"].removeprefix("s3://").split("/")[0]
    assert f"local/{bucket}" in services["create-bucket"]["entrypoint"]
    # the compose file says why MinIO is pinned and that the stack was validated, not started
    text = COMPOSE.read_text()
    assert "If-None-Match" in text and "not been started" in text


def _compose_command() -> list[str] | None:
    """`docker compose` (the plugin) where it works, else the standalone `docker-compose`, else None."""
    if shutil.which("docker") is not None:
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    return None


def test_docker_compose_config_validates_the_file():
    command = _compose_command()
    if command is None:
        pytest.skip("neither the docker compose plugin nor docker-compose is installed here")
    done = subprocess.run([*command, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # a broken file is refused: the check is real
    broken = COMPOSE.read_text().replace("services:", "services:\n  broken: {image: [not, a, string]}", 1)
    bad = Path(tempfile.mkdtemp()) / "docker-compose.yml"
    bad.write_text(broken)
    refused = subprocess.run([*command, "-f", str(bad), "config", "--quiet"], capture_output=True, text=True,
                             timeout=60, cwd=COMPOSE.parent)
    assert refused.returncode != 0


@pytest.mark.slow
def test_a_built_wheel_carries_the_default_config(tmp_path):
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("dpcore", "tasks", "flows"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("geodp-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert z.read("tasks/geodp.toml") == (ROOT / "tasks" / "geodp.toml").read_bytes()
