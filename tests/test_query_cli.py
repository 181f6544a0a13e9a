"""`geodp query` as an analyst types it: every --box answered, CSV output, a --period outside the release
refused in one line, a forecast with its interval, and the README's batch example run as written."""

import io
import json
import re

import numpy as np
import pandas as pd
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

BOX_A, BOX_B, BOX_C = "40.70,-74.02,40.72,-74.00", "40.74,-73.99,40.76,-73.97", "40.60,-74.10,40.80,-73.90"


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("q")
    data = tmp / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=400, start="2024-01-01", days=14, seed=3).to_parquet(data)
    grid, st = tmp / "grid", tmp / "st"
    run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--param", "cell_width_m=500", "--out", grid)
    run_geodp("release", data, "--city", "new-york", "--period", "2024-01-01..2024-01-14", "--epsilon", "1",
              "--mechanism", "identity3d", "--param", "grid_size=16", "--slot", "1d", "--max-points-per-user", "20",
              "--out", st, "--no-prefect")
    return {"data": data, "grid": grid, "st": st}


def test_every_repeated_box_is_answered_in_order(releases):
    r = run_geodp("query", "range", releases["grid"], "--box", BOX_A, "--box", BOX_B, "--box", BOX_C, "--json")
    rows = json.loads(r.stdout)
    assert [r["box"] for r in rows] == [[float(v) for v in b.split(",")] for b in (BOX_A, BOX_B, BOX_C)]
    single = [json.loads(run_geodp("query", "range", releases["grid"], "--box", b, "--json").stdout)[0]["estimate"]
              for b in (BOX_A, BOX_B, BOX_C)]
    assert [r["estimate"] for r in rows] == pytest.approx(single)
    assert all(r["lower"] <= r["estimate"] <= r["upper"] for r in rows)


def test_csv_output_is_the_answer_table(releases, tmp_path):
    r = run_geodp("query", "range", releases["grid"], "--box", BOX_A, "--box", BOX_C, "--csv")
    table = pd.read_csv(io.StringIO(r.stdout))
    assert list(table.columns) == ["min_lat", "min_lon", "max_lat", "max_lon", "estimate", "lower", "upper", "unit",
                                   "interval_covers"]
    as_json = json.loads(run_geodp("query", "range", releases["grid"], "--box", BOX_A, "--box", BOX_C,
                                   "--json").stdout)
    assert table["estimate"].to_numpy() == pytest.approx([r["estimate"] for r in as_json], rel=1e-5)
    assert table["lower"].to_numpy() == pytest.approx([r["lower"] for r in as_json], rel=1e-5)
    assert set(table["unit"]) == {as_json[0]["unit"]} and table["min_lat"].tolist() == [40.70, 40.60]
    out = tmp_path / "answers.csv"
    run_geodp("query", "range", releases["grid"], "--box", BOX_A, "--format", "csv", "--out", out)
    assert pd.read_csv(out)["estimate"].to_numpy() == pytest.approx(table["estimate"].to_numpy()[:1], rel=1e-5)


def test_json_states_the_interval_method_once_in_its_first_record(releases, tmp_path):
    # the method was on stderr alone: a --json FILE did not say how its intervals were computed
    out = tmp_path / "a.json"
    r = run_geodp("query", "range", releases["grid"], "--box", BOX_A, "--box", BOX_B, "--box", BOX_C, "--json", out)
    rows = json.loads(out.read_text())
    stated = re.search(r"^intervals: (.*)$", r.stderr, re.M).group(1)
    assert rows[0]["interval_method"] == stated and "exact noise law" in stated
    assert all("interval_method" not in row for row in rows[1:])
    assert [sorted(set(row) - {"interval_method"}) for row in rows] == [
        ["box", "estimate", "interval", "interval_covers", "lower", "unit", "upper"]] * 3


def test_csv_and_json_writers_match_pandas_row_for_row():
    # the writers format every row at once (Arrow kernels); pandas formatted each cell in Python, 10 CPU-s for
    # 1 M boxes: the same table must come out, numbers to the same digits (the 10th decimal may round the other way), quoting and NaN as pandas wrote them
    from flows.cli.answer_text import csv_bytes, json_bytes

    rng = np.random.default_rng(4)
    n = 500
    t = pd.DataFrame(np.round(rng.uniform(40.5, 40.9, (n, 4)), 6), columns=["min_lat", "min_lon", "max_lat", "max_lon"])
    t.insert(0, "period", np.where(np.arange(n) % 3, "2024-01-01", "sum 2024-01-01..2024-01-02"))
    t["estimate"] = rng.normal(0, 1, n) * 10.0 ** rng.integers(-6, 9, n)
    t["lower"], t["upper"] = t["estimate"] - rng.uniform(0, 50, n), t["estimate"] + 7.0
    t.loc[::7, ["lower", "upper"]] = np.nan
    t.loc[::11, "estimate"] = 3.0
    t["unit"] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), ["full points"])
    t["interval_covers"] = pd.Categorical.from_codes((np.arange(n) % 2).astype(np.int8),
                                                     ["none", 'noise, "bias" and spread'])
    t["note"] = np.where(np.arange(n) % 5, "", "worse than a blank map, at 25–100 m")
    t.attrs["level"] = 0.95
    ours = pd.read_csv(io.BytesIO(b"".join(csv_bytes(t))))
    theirs = pd.read_csv(io.StringIO(t.to_csv(index=False, float_format="%.6g")))
    for c in ["period", "estimate", "lower", "upper", "unit", "interval_covers", "note"]:
        pd.testing.assert_series_equal(ours[c], theirs[c])
    assert np.array_equal(ours[["min_lat", "min_lon", "max_lat", "max_lon"]].to_numpy(),
                          t[["min_lat", "min_lon", "max_lat", "max_lon"]].to_numpy())  # as read, not to 6 digits
    rec = t[["period", "estimate", "lower", "upper", "unit", "interval_covers"]].copy()
    rec.insert(1, "box", t[["min_lat", "min_lon", "max_lat", "max_lon"]].to_numpy().tolist())
    rec["interval"], rec["note"] = "95%", t["note"]
    expected = json.loads(rec.to_json(orient="records", double_precision=10))
    got = json.loads(b"".join(json_bytes(t, {"interval_method": "m"})))
    assert got[0].pop("interval_method") == "m"
    assert [list(r) for r in got] == [list(r) for r in expected]
    for g, e in zip(got, expected, strict=True):
        assert g["box"] == e["box"] and {k: g[k] for k in g if isinstance(g[k], str)} == \
            {k: e[k] for k in e if isinstance(e[k], str)}
        for k in ("estimate", "lower", "upper"):
            assert (g[k] is None) == (e[k] is None) and (g[k] is None or g[k] == pytest.approx(e[k], rel=1e-15, abs=1.1e-10))
            assert type(g[k]) is type(e[k])  # 3.0 stays a float


def test_a_period_outside_the_release_is_one_error_line(releases):
    bad = run_geodp("query", "range", releases["st"], "--box", BOX_C, "--period", "2025-03-01..2025-03-05", ok=False)
    assert bad.returncode == 2 and "outside this release's window" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and bad.stdout == ""
    flat = run_geodp("query", "range", releases["grid"], "--box", BOX_C, "--period", "2024-01-02..2024-01-03", ok=False)
    assert flat.returncode == 2 and "no time axis" in flat.stderr
    hot = run_geodp("query", "hotspot", releases["st"], "--at", "40.713,-74.006", "--threshold", "5",
                    "--period", "2023-01-01..2023-01-02", ok=False)
    assert hot.returncode == 2 and "outside this release's window" in hot.stderr
    inside = json.loads(run_geodp("query", "range", releases["st"], "--box", BOX_C, "--period",
                                  "2024-01-02..2024-01-03", "--json").stdout)[0]
    assert inside["lower"] <= inside["estimate"] <= inside["upper"] and inside["estimate"] != 0.0


def test_forecast_comes_with_an_interval(releases):
    r = run_geodp("query", "forecast", releases["st"], "--box", BOX_C, "--horizon", "3", "--json")
    out = json.loads(r.stdout)
    fc, lo, hi = (np.array(out[k]) for k in ("forecast", "lower", "upper"))
    assert fc.shape == lo.shape == hi.shape == (3,)
    assert np.all(lo < fc) and np.all(fc < hi) and out["interval"] == "95%"
    # the interval is as wide as the released series wobbles, not a token width
    history = np.array(out["history"])
    assert np.median(hi - lo) > 0.5 * np.std(history)
    text = run_geodp("query", "forecast", releases["st"], "--box", BOX_C, "--horizon", "2")
    assert len(re.findall(r"95% \[", text.stdout)) == 2


def test_a_boxes_csv_reads_as_pandas_read_it(tmp_path):
    """`--boxes CSV` is read by Arrow where every coordinate is a plain number (no pandas import); the
    boxes must be pandas' own, and anything Arrow cannot read as numbers gets pandas' result or error."""
    from dpcore.queries.range import QueryError, _read_boxes_arrow, _read_boxes_pandas, read_boxes_csv

    header = "min_lat,min_lon,max_lat,max_lon\n"
    cases = {"header": header + "40.7,-74.01,40.71,-74.0\n40.70001,-73.99999,40.8,-73.9\n",
             "headerless": "40.7,-74.01,40.71,-74.0\n40,-74,41,-73\n",
             "reordered, extra column": "id,max_lon,min_lat,max_lat,min_lon\n1,-74.0,40.7,40.71,-74.01\n",
             "integers": header + "40,-74,41,-73\n"}
    for name, text in cases.items():
        p = tmp_path / f"{len(text)}.csv"
        p.write_text(text)
        assert _read_boxes_arrow(str(p)) is not None, name
        assert np.array_equal(read_boxes_csv(str(p)), _read_boxes_pandas(str(p))), name
    for bad in (header + "40.7,-74.01,north,-74.0\n", header + "40.7,-74.01,,-74.0\n", "40.7,-74.01\n", ""):
        p = tmp_path / "bad.csv"
        p.write_text(bad)
        with pytest.raises(QueryError) as ours:
            read_boxes_csv(str(p))
        with pytest.raises(QueryError) as theirs:
            _read_boxes_pandas(str(p))
        assert str(ours.value) == str(theirs.value)


def test_a_csv_whose_last_column_is_a_number_ends_each_row_there():
    # the writer joins each row in one pass, its newline carried by the last column: a number there too
    from flows.cli.answer_text import csv_bytes

    rng = np.random.default_rng(5)
    t = pd.DataFrame(np.round(rng.uniform(40.5, 40.9, (300, 4)), 6), columns=["min_lat", "min_lon", "max_lat", "max_lon"])
    t["unit"] = pd.Categorical.from_codes(np.zeros(300, dtype=np.int8), ["full points"])
    t["estimate"] = rng.normal(0, 1, 300) * 10.0 ** rng.integers(-3, 7, 300)
    text = b"".join(csv_bytes(t)).decode()
    assert text.endswith("\n") and text.count("\n") == 301
    ours = pd.read_csv(io.StringIO(text))
    theirs = pd.read_csv(io.StringIO(t.to_csv(index=False, float_format="%.6g")))
    pd.testing.assert_series_equal(ours["estimate"], theirs["estimate"])
    assert np.array_equal(ours.iloc[:, :4].to_numpy(), t.iloc[:, :4].to_numpy())
