"""Public numbers a release takes are refused in the plan, before the ledger is charged: a public total
that is not a finite positive count, and an ε or ρ too small for its noise to be represented."""

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp
from tests.test_store_faults import one_line_error


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    generate_checkins(city_region("new-york"), n_users=80, days=2, seed=4).to_parquet(p)
    return p


@pytest.mark.parametrize("args", [("--epsilon", "0.5", "--public-total", "-5"),
                                  ("--epsilon", "0.5", "--public-total", "nan"),
                                  ("--epsilon", "0.5", "--public-total", "inf"),
                                  ("--epsilon", "1e-300"),
                                  ("--rho", "1e-300")])
def test_unrepresentable_numbers_are_refused_before_the_charge(args, small, tmp_path):
    store = tmp_path / "s"
    if "--rho" in args:
        run_geodp("dataset", "create", store, "small", "--source", small, "--budget", "1", "--accounting", "zcdp")
    r = run_geodp("release", small, "--city", "new-york", "--mechanism", "identity", "--param", "cell_width_m=2000",
                  *args, "--out", store, ok=False)
    one_line_error(r)
    assert not list(store.glob("datasets/*/ledger/*.json"))  # nothing charged
    assert not list(store.glob("releases/**/_MANIFEST.json"))


@pytest.fixture(scope="module")
def release_url(small, tmp_path_factory):
    store = tmp_path_factory.mktemp("q") / "s"
    run_geodp("release", small, "--city", "new-york", "--mechanism", "identity", "--param", "cell_width_m=2000",
              "--epsilon", "0.5", "--out", store)
    (version,) = store.glob("releases/*/*/*/v1")
    return str(version)


def test_a_boxes_csv_with_a_non_numeric_cell_is_one_line(release_url, tmp_path):
    csv = tmp_path / "boxes.csv"
    csv.write_text("min_lat,min_lon,max_lat,max_lon\n40.70,-74.02,40.72,-74.00\n40.70,x,40.72,-74.00\n")
    one_line_error(run_geodp("query", release_url, "--boxes", csv, ok=False), "non-numeric")


def test_a_forecast_horizon_is_bounded(release_url):
    line = one_line_error(run_geodp("query", "forecast", release_url, "--box", "40.70,-74.02,40.72,-74.00",
                                    "--horizon", "100000000", ok=False))
    assert "--horizon" in line


@pytest.mark.parametrize("args,words", [(("--max-points-per-user", "100000000000000000000"), "--max-points-per-user"),
                                        (("--mechanisms", "identity", "--param", "cell_width_m=0.001"), "does not fit")])
def test_eval_options_out_of_range_are_one_line(args, words, small):
    one_line_error(run_geodp("eval", "range", small, "--city", "new-york", *args, ok=False), words)


def test_snap_lines_with_extra_fields_are_counted_as_dropped_and_fail_strict(tmp_path):
    lines = [f"{u}\t2010-05-02T10:00:00Z\t40.71\t-74.01\t{u}" for u in range(10)]
    lines += [f"{u}\t2010-05-02T10:00:00Z\t40.71\t-74.01\t{u}\textra" for u in range(3)]
    snap = tmp_path / "checkins.txt"
    snap.write_text("\n".join(lines) + "\n")
    r = run_geodp("data", "check", snap)
    assert "10 of 13 rows valid" in r.stdout + r.stderr
    one_line_error(run_geodp("data", "check", snap, "--strict", ok=False), "invalid")


def test_timestamps_outside_a_sane_range_are_flagged(tmp_path):
    lines = [f"{u}\t2010-05-02T10:00:00Z\t40.71\t-74.01\t{u}" for u in range(10)]
    lines += [f"{u}\t{t}\t40.71\t-74.01\t{u}" for u, t in enumerate(["1900-05-02T10:00:00Z", "2999-05-02T10:00:00Z"])]
    snap = tmp_path / "checkins.txt"
    snap.write_text("\n".join(lines) + "\n")
    r = run_geodp("data", "check", snap)
    assert "10 of 12 rows valid" in r.stdout + r.stderr and "timestamp_out_of_range: 2" in r.stdout + r.stderr


def test_an_unreadable_file_in_the_dask_form_is_one_line(small, tmp_path, prefect_harness):
    folder = tmp_path / "input"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(small.read_bytes())
    (folder / "b.parquet").write_bytes(b"not a parquet file " * 200)
    r = run_geodp("release", folder, "--city", "new-york", "--epsilon", "0.1", "--mechanism", "identity",
                  "--param", "cell_width_m=2000", "--period", "2024-01-01", "--store", tmp_path / "s",
                  "--workers", "1", ok=False)  # one worker reads both files: the second is a spawn for nothing
    one_line_error(r, "cannot read")
    assert "Compute Failed" not in r.stderr
