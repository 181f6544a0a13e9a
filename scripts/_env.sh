# Sourced by the entry scripts: creates .venv on first use and installs geodp into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_UI_ENABLED="${PREFECT_UI_ENABLED:-false}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
STAMP="$VENV/.geodp-installed"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[geodp] creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
# Reinstall when pyproject.toml or constraints.txt (the exact versions) changed since the last install.
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ constraints.txt -nt "$STAMP" ]; then
    echo "[geodp] installing torch==2.13.0 (CPU) then geodp[test] into .venv" >&2
    # This machine's pip config lists local mirrors that may be absent; drop those warnings only.
    pipq() { "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 | grep -v "is ignored: it is neither" >&2 || true; \
             return "${PIPESTATUS[0]}"; }
    pipq --upgrade "pip>=24"
    # torch first, pinned: a range would let pip fetch a newer build with CUDA packages.
    pipq "torch==2.13.0"
    pipq -c constraints.txt -e ".[test]"
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
