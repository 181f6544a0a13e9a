"""Run the `geodp` CLI as a user would: a subprocess of this interpreter, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_geodp(*args, ok: bool = True, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``geodp ARGS``; with ``ok`` the exit status must be 0 (stderr is shown otherwise)."""
    full_env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=full_env, timeout=timeout)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def bounded_total(release: str, region) -> float:
    """The release's noisy count of the k-bounded points over the whole region (a release scaled to
    full counts by its contribution profile holds them as its inner synopsis)."""
    import shutil

    from dpcore.synopsis.base import load_synopsis
    from tasks.storage.store import fetch_to_temp

    _, folder = fetch_to_temp(release)
    try:
        synopsis = load_synopsis(folder)
        synopsis = getattr(synopsis, "inner", synopsis)
        return float(synopsis.answer(region.box_latlon_to_m([region.bbox_latlon()]))[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
