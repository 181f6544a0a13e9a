#!/usr/bin/env bash
# The whole test suite (lint + tests). Creates .venv and installs everything on first use.
# Two pytest workers (GEODP_TEST_WORKERS), one test module per worker at a time: many tests wait on
# servers and subprocesses, so two workers keep both cores busy. Each worker has its own session
# fixtures (one Prefect test server, one moto S3 server).
source "$(dirname "$0")/_env.sh"
ruff check .
python -m pytest -q -ra -n "${GEODP_TEST_WORKERS:-2}" --dist loadfile --durations=15 "$@"
