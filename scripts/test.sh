#!/usr/bin/env bash
# The whole test suite (lint + tests). Creates .venv and installs everything on first use.
# Two pytest workers (GEODP_TEST_WORKERS), one test module per worker at a time: many tests wait on
# servers and subprocesses, so two workers keep both cores busy. Each worker has its own session
# fixtures (one Prefect test server, one moto S3 server).
source "$(dirname "$0")/_env.sh"
ruff check .
# One OpenMP/BLAS thread per process: the two workers already keep both cores busy, and torch's threads on
# top of them wait for a core by spinning (the SNH denoiser test: 60 CPU-s with two threads under load, 20 with one).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m pytest -q -ra -n "${GEODP_TEST_WORKERS:-2}" --dist loadfile --durations=15 "$@"
