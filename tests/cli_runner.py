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
