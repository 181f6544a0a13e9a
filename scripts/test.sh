#!/usr/bin/env bash
# The whole test suite (lint + tests). Creates .venv and installs everything on first use.
source "$(dirname "$0")/_env.sh"
ruff check .
python -m pytest -q -ra --durations=15 "$@"
