"""How often one `geodp release run ... --mechanism auto --out DIR` opens the store and the ledger, reads
the ledger's log and plans the release (issue 46: the release path, traced). Prints one line of counts.
With ``--backfill``, one `geodp release backfill ... --period 2024-03-01..2024-03-02` (two days, two
cities, through Prefect and a one-worker Dask cluster), counted in the command's process.

    python bench/release_path_counts.py [--backfill] [DATA]   (default: a small synthetic parquet, two cities)
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

COUNTS: collections.Counter = collections.Counter()


def _count(module, owner: str, name: str, label: str) -> None:
    cls = getattr(module, owner) if owner else module
    real = getattr(cls, name)

    def counted(*args, **kwargs):
        COUNTS[label] += 1
        return real(*args, **kwargs)

    setattr(cls, name, counted)


def _instrument() -> None:
    import tasks.config
    import tasks.release_plan
    import tasks.storage.ledger
    import tasks.storage.store

    _count(tasks.storage.store, "ReleaseStore", "__init__", "store opened")
    _count(tasks.storage.ledger, "DatasetLedger", "__init__", "ledger opened")
    _count(tasks.storage.ledger, "DatasetLedger", "entries", "ledger log read")
    real_plan = tasks.release_plan.plan_release

    def plan(*args, **kwargs):
        COUNTS["plan_release"] += 1
        return real_plan(*args, **kwargs)

    tasks.release_plan.plan_release = plan
    import flows.release
    flows.release.plan_release = plan
    real_period = tasks.config.parse_period

    def period(*args, **kwargs):
        COUNTS["parse_period"] += 1
        return real_period(*args, **kwargs)

    tasks.config.parse_period = period
    for name in ("tasks.release_plan", "tasks.release_request"):  # where the plan parses it, before and after
        try:
            module = __import__(name, fromlist=["_"])
        except ImportError:
            continue
        if hasattr(module, "parse_period"):
            module.parse_period = period
    import dpcore.data.inputs
    import dpcore.mechanisms

    _count(dpcore.data.inputs, "", "resolve_input", "input listed")
    import tasks.release_city_plan

    _count(dpcore.mechanisms, "", "get_mechanism", "mechanism built")
    _count(tasks.release_city_plan, "", "get_mechanism", "mechanism built")
    requesters = [__import__(name, fromlist=["_"]) for name in ("tasks.release_request", "tasks.release_plan")]
    for module in requesters:  # wherever it is called from
        _count(module, "", "release_request", "request checked")
    planners = [__import__(name, fromlist=["_"]) for name in ("tasks.release_plan", "flows.backfill")]
    for module in planners:  # both imported first: each holds the real one when it is wrapped
        if hasattr(module, "plan_days"):
            _count(module, "", "plan_days", "plan_days")
    import flows.cli.release

    if hasattr(flows.cli.release, "_prevalidate"):
        _count(flows.cli.release, "", "_prevalidate", "CLI _prevalidate")


def main() -> None:
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    tmp = Path(tempfile.mkdtemp(prefix="geodp-counts-"))
    args = [a for a in sys.argv[1:] if a != "--backfill"]
    backfill = "--backfill" in sys.argv[1:]
    data = args[0] if args else None
    if data is None:
        data = str(tmp / "checkins.parquet")
        generate_checkins(city_region("boston"), n_users=200, days=2, seed=3, start="2024-03-01").to_parquet(data)
    _instrument()
    from flows.cli import main as cli

    if backfill:
        rc = cli(["release", "backfill", data, "--cities", "boston,chicago", "--period", "2024-03-01..2024-03-02",
                  "--epsilon", "1", "--mechanism", "ug", "--store", str(tmp / "store"), "--workers", "1",
                  "--publish-anyway", "--json", str(tmp / "summary.json")])
        print(f"rc={rc} " + " ".join(f"{k}={v}" for k, v in sorted(COUNTS.items())))
        return
    rc = cli(["release", "run", data, "--cities", "boston,chicago", "--period", "2024-03-01", "--epsilon", "1",
              "--mechanism", "auto", "--out", str(tmp / "out"), "--json", str(tmp / "summary.json")])
    print(f"rc={rc} " + " ".join(f"{k}={v}" for k, v in sorted(COUNTS.items())))


if __name__ == "__main__":
    main()
