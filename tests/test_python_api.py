"""The `geodp` Python package: docs/python-api.md's example runs as written, its answers are the CLI's,
it reads local and s3:// stores, and it refuses a release whose files do not match their sha256."""

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

ROOT = Path(__file__).resolve().parents[1]
BOXES = [(40.700, -74.020, 40.720, -74.000), (40.740, -73.990, 40.760, -73.970)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    data = tmp / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, start="2024-01-01", days=5, seed=4).to_parquet(data)
    out = tmp / "geodp-store"
    run_geodp("release", data, "--city", "new-york", "--epsilon", "1", "--param", "cell_width_m=500", "--out", out)
    return out


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def test_the_documented_example_runs_and_answers_as_the_cli_does(store, capsys):
    text = (ROOT / "docs" / "python-api.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    scope: dict = {}
    with _cwd(store.parent):
        exec(compile(code, "docs/python-api.md", "exec"), scope)
    answers, grid = scope["answers"], scope["grid"]
    assert list(answers.columns) == ["min_lat", "min_lon", "max_lat", "max_lon", "estimate", "lower", "upper",
                                     "unit", "interval_covers"]
    cli = json.loads(run_geodp("query", "range", store, "--box", ",".join(map(str, BOXES[0])), "--box",
                               ",".join(map(str, BOXES[1])), "--json").stdout)
    assert answers["estimate"].to_numpy() == pytest.approx([r["estimate"] for r in cli])
    assert answers["lower"].to_numpy() == pytest.approx([r["lower"] for r in cli])
    assert list(answers["unit"]) == [r["unit"] for r in cli]
    # the grid holds the released values: summing it is the whole region's answer
    release = scope["release"]
    xmin, ymin, xmax, ymax = release.synopsis.region.bounds_m
    assert float(grid.sum()) == pytest.approx(float(release.synopsis.answer(np.array([[xmin, ymin, xmax, ymax]]))[0]))
    # cell centres carry their latitude and longitude, north up and east right
    assert float(grid.lat[0, -1]) > float(grid.lat[0, 0]) and float(grid.lon[-1, 0]) > float(grid.lon[0, 0])
    lat0, lon0, lat1, lon1 = release.synopsis.region.bbox_latlon()
    assert lat0 < float(grid.lat.min()) < float(grid.lat.max()) < lat1
    assert grid.attrs["unit"] == answers["unit"].iloc[0] and grid.attrs["unit"] in capsys.readouterr().out


def test_a_tampered_file_is_refused(store, tmp_path):
    import geodp
    from tasks.storage.store import IntegrityError

    copy = tmp_path / "s"
    shutil.copytree(store, copy)
    (grid,) = copy.rglob("grid.npz")
    grid.write_bytes(grid.read_bytes() + b"x")
    release = geodp.open_store(str(copy)).releases()[0]
    with pytest.raises(IntegrityError, match="integrity check failed"):
        release.query(BOXES)


def test_an_s3_store_answers_like_the_local_one(store, moto_s3):
    import fsspec

    import geodp
    from tests.conftest import new_s3_store

    url = new_s3_store(moto_s3)
    fs = fsspec.filesystem("s3", client_kwargs={"endpoint_url": moto_s3})
    for f in store.rglob("*"):
        if f.is_file():
            fs.pipe(f"{url[len('s3://'):]}/{f.relative_to(store).as_posix()}", f.read_bytes())
    remote = geodp.open_store(url).releases()
    local = geodp.open_store(str(store)).releases()
    assert [r.manifest.release_key for r in remote] == [r.manifest.release_key for r in local]
    assert remote[0].url.startswith("s3://")
    a, b = remote[0].query(BOXES), local[0].query(BOXES)
    assert a["estimate"].to_numpy() == pytest.approx(b["estimate"].to_numpy())
    assert a["upper"].to_numpy() == pytest.approx(b["upper"].to_numpy())


def test_bad_boxes_and_a_missing_store_are_errors(store, tmp_path):
    import geodp
    from tasks.storage.store import StoreError

    release = geodp.open_store(str(store)).releases()[0]
    with pytest.raises(ValueError, match="4 finite numbers"):
        release.query([(40.7, -74.0, 40.71)])
    with pytest.raises(StoreError):
        geodp.open_store(str(tmp_path / "nothing-here"))
