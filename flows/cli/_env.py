"""The environment every `geodp` command sets before Prefect is imported.

Analytics are off unless the operator turns them on: the server's PREFECT_SERVER_ANALYTICS_ENABLED, and
the SDK's, which follows DO_NOT_TRACK only (it prints a first-run telemetry banner on a terminal and
sends usage events whatever the server setting says)."""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
if os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"].strip().lower() in ("false", "0", "no", "off"):
    os.environ.setdefault("DO_NOT_TRACK", "1")
