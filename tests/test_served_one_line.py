"""Served-platform failures an operator meets, through the CLI (issue 45 item 4): one `error:` line, exit 2."""

from __future__ import annotations

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp
from tests.test_store_faults import one_line_error


def test_a_backfill_submitted_to_a_deployment_nobody_serves_is_one_line(prefect_harness, tmp_path):
    """Before: a 60-line traceback ending in prefect.exceptions.ObjectNotFound, exit 1 (a backfill
    submitted before `geodp serve` had registered its deployments)."""
    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=20, start="2010-05-01", days=1, seed=3).to_parquet(data)
    r = run_geodp("release", "backfill", data, "--cities", "new-york", "--period", "2010-05-01..2010-05-02",
                  "--epsilon", "1", "--store", tmp_path / "s", "--deployment", "backfill/nobody-serves-this", ok=False)
    # a name no test serves: the session's Prefect server may hold the served backfill/backfill of another test
    one_line_error(r, "no deployment 'backfill/nobody-serves-this'", "geodp serve")
