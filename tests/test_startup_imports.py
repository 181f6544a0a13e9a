"""Issue 46 item 3: a command imports only what it uses. Before, every `geodp` command imported every
command's module (`geodp --help` loaded scipy and pydantic), and a 1,000-point in-process release imported
dask.dataframe for a one-partition shuffle, scipy for a 0/1 matrix product in the ledger check and pyplot
for one preview image: 2.7 CPU-s, 85-90% of it imports (bench/bench_startup.py prints the CPU figures).

Each command runs as ``python -X importtime -m flows.cli ARGS`` in a fresh process (not the test
template, which has imported everything already); the import log names every module it loaded."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import ROOT

#: What no command below needs: the Prefect and Dask forms, the neural mechanisms, evaluation plots.
NEVER = {"prefect", "distributed", "dask", "dask.dataframe", "torch", "sklearn", "matplotlib.pyplot"}


def _imported(*args) -> tuple[set[str], subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "flows.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", proc.stderr, flags=re.M)), proc


def test_help_imports_no_command_module():
    """`geodp --help` lists the commands from their help lines in flows.cli.LAZY without importing their
    modules; each line is the one the loaded command gives itself."""
    import typer

    from flows.cli import LAZY, load

    mods, proc = _imported("--help")
    loaded = mods & (NEVER | {"numpy", "pandas", "scipy", "pydantic", "flows.cli.release", "flows.cli.query"})
    assert loaded == set()
    listed = [line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert set(listed) == {name for name, lazy in LAZY.items() if not lazy.hidden}
    for name in listed:
        stub = typer.core.TyperCommand(name=name, help=LAZY[name].help)
        assert stub.get_short_help_str(1000) == load(name).get_short_help_str(1000), name


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory):
    p = tmp_path_factory.mktemp("small") / "points.csv"
    generate_checkins(city_region("new-york"), n_users=100, days=7, seed=3).head(1000).to_csv(p, index=False)
    return p


def test_a_small_release_and_its_reads_import_only_what_they_use(small_csv, tmp_path):
    """A one-file release in this process runs its data pass without dask, checks the ledger without scipy
    and draws its preview with Pillow, not matplotlib (its import and two-pass tight layout were 0.65-0.75
    CPU-s of a ~1.9 CPU-s release); querying and listing it load no release machinery."""
    out = tmp_path / "out"
    mods, proc = _imported("release", "run", small_csv, "--city", "new-york", "--epsilon", "1", "--out", out,
                            "--publish-anyway")  # 1,000 points: the profile's verdict refuses it (tested elsewhere)
    assert "release written to" in proc.stdout
    assert mods & (NEVER | {"scipy", "matplotlib"}) == set()
    (release,) = out.glob("releases/*/new-york/all/v1")
    assert (release / "_MANIFEST.json").exists() and list(release.glob("*/preview.png"))

    mods, proc = _imported("query", "range", release, "--box", "40.70,-74.02,40.72,-74.00")
    assert proc.stdout.strip()
    assert mods & (NEVER | {"scipy", "matplotlib", "flows.release", "flows.cli.release"}) == set()
    # answers of a CSV of boxes, as CSV: read and written by Arrow, without pandas (0.4 CPU-s of imports)
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("min_lat,min_lon,max_lat,max_lon\n40.70,-74.02,40.72,-74.00\n40.71,-74.01,40.73,-73.99\n")
    mods, proc = _imported("query", "range", release, "--boxes", boxes, "--csv")
    assert len(proc.stdout.splitlines()) == 3
    assert mods & (NEVER | {"scipy", "matplotlib", "pandas", "flows.release", "flows.cli.release"}) == set()

    mods, proc = _imported("release", "list", out)
    assert "new-york" in proc.stdout
    assert mods & (NEVER | {"scipy", "matplotlib", "pandas", "flows.release"}) == set()



#: Runs `geodp ARGS` as `python -m flows.cli` does, counting garbage collections once flows.cli is loaded:
#: during the release's work (flows.release.release_cities on the stack) or before it, while loading.
GC_DRIVER = r"""
import atexit, gc, json, runpy, sys
seen = {"loading": 0, "work": 0}
def collecting(phase, info):
    cli = sys.modules.get("flows.cli")
    if phase != "start" or not hasattr(cli, "main"):
        return
    f = sys._getframe(0)
    while f is not None and f.f_code.co_name != "release_cities":
        f = f.f_back
    seen["loading" if f is None else "work"] += 1
gc.callbacks.append(collecting)
atexit.register(lambda: print(json.dumps({**seen, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}),
                              file=sys.stderr))
sys.argv = ["geodp", *sys.argv[1:]]
runpy.run_module("flows.cli", run_name="__main__")
"""


def test_a_release_loads_its_modules_without_the_garbage_collector(small_csv, tmp_path):
    """The `geodp` process loads a command's modules with the cyclic garbage collector paused and resumes it
    for the work, the loaded objects set aside (gc.freeze). Before, a 1,000-point release ran 207 collections
    between loading the CLI and starting its work (nearly every object a module makes stays alive, and the
    collector rescans them), 0.07 of its ~1 CPU-s."""
    import json

    proc = subprocess.run([sys.executable, "-c", GC_DRIVER, "release", "run", str(small_csv), "--city", "new-york",
                           "--epsilon", "1", "--out", str(tmp_path / "out"), "--publish-anyway"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "release written to" in proc.stdout
    seen = json.loads(proc.stderr.strip().splitlines()[-1])
    assert seen["loading"] <= 3  # the command, the mechanisms, pandas and flows.release loaded without it
    assert seen["work"] > 0 and seen["enabled"]  # the work runs with the collector, as always
    assert seen["frozen"] > 100_000  # what loaded is out of its scans
