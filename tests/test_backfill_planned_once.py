"""`geodp release backfill` is planned once (issue 46): one request checked, the input listed once and one
store opened for all its days, and no check of the CLI's own before the plan (it had `_prevalidate`, the
plan's checks again, then planned each day with its own request, listing and store)."""

from __future__ import annotations

import json
import os

import dpcore.data.inputs
import tasks.release_plan
import tasks.storage.store
from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

DAYS = ("2024-03-01", "2024-03-02")


def test_a_backfill_is_planned_from_one_request_with_one_store(prefect_harness, tmp_path, monkeypatch):
    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("boston"), n_users=60, days=2, seed=3, start=DAYS[0]).to_parquet(data)
    os.utime(data, (1_710_000_000, 1_710_000_000))
    store = tmp_path / "store"
    release = ["--city", "boston", "--epsilon", "0.5", "--mechanism", "ug", "--publish-anyway"]
    for day in DAYS:  # each day released alone first: the backfill finds both committed, and starts no cluster
        run_geodp("release", "run", data, *release, "--period", day, "--out", store)

    counts = {"store opened": 0, "request checked": 0, "input listed": 0}

    def counted(owner, name: str, label: str) -> None:
        real = getattr(owner, name)

        def count(*args, **kwargs):
            counts[label] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, count)

    counted(tasks.storage.store.ReleaseStore, "__init__", "store opened")
    counted(tasks.release_plan, "release_request", "request checked")
    counted(dpcore.data.inputs, "resolve_input", "input listed")
    from flows.cli import main

    out = tmp_path / "backfill.json"
    rc = main(["release", "backfill", str(data), "--cities", "boston", "--period", f"{DAYS[0]}..{DAYS[1]}",
               "--epsilon", "0.5", "--mechanism", "ug", "--publish-anyway", "--store", str(store), "--json", str(out)])
    summary = json.loads(out.read_text())
    # the day keys the backfill plans from its one listing are the keys each day's own run committed
    assert rc == 0 and [(s["period"], [r["status"] for r in s["releases"]]) for s in summary["periods"]] == [
        (day, ["already committed"]) for day in DAYS]
    assert counts == {"store opened": 1, "request checked": 1, "input listed": 1}
