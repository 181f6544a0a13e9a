"""Every shell and Python block of README.md and docs/*.md runs as written (issue 45 item 1), so the docs
cannot drift from the code: the README's worked example broke at its first query (`geodp query range
releases/nyc-demo` read the folder as a store's dataset), and the test meant to cover those lines swapped
the path out.

Each page runs in a fresh folder of its own, its ```bash and ```python blocks in order, with the data they
create; every command must exit 0. Conventions, so that a page stays runnable and cheap:

- ``geodp …`` lines (with optional ``NAME=VALUE`` prefixes) run through the forked CLI runner
  (tests/cli_runner.py) in that folder; any other line, or one with pipes, redirections or ``$(…)``, runs
  in bash with ``geodp`` as ``python -m flows.cli``. ``source .venv/bin/activate`` is a no-op (the harness
  already runs in the project's environment); ``export NAME=VALUE`` holds for the page's later lines.
- ``../shared/data/NAME`` is a small synthetic stand-in of the real file, in its format (STANDINS).
- Commands that run a Prefect flow use the session's test server (PREFECT_API_URL), as a served platform
  would, instead of each starting its own.
- ``<!-- docs-run: skip (WHY; tests/test_x.py) -->`` right above a block skips it; WHY must name an
  existing test that covers what the block shows (servers, S3, training, benchmarks).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import run_geodp

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-run:\s*skip\s*\((.*?)\)\s*-->\s*\Z", re.S)
SHELL, PYTHON = {"bash", "sh", "shell"}, {"python", "py"}
#: Tokens that need a real shell.
SHELL_SYNTAX = {"|", "||", "&", "&&", ";", "<", ">", ">>", "(", ")"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's shell and Python blocks, each with the skip comment right above it, if any."""
    text, out, end = page.read_text(), [], 0
    for m in FENCE.finditer(text):
        lang = m.group(1).lower()
        before = text[end:m.start()]
        end = m.end()
        if lang not in SHELL | PYTHON:
            continue
        skip = SKIP.search(before)
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, lang, m.group(2),
                         skip.group(1).strip() if skip else None))
    return out


def shell_lines(text: str) -> list[str]:
    """A block's commands: continuations joined, blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.skip is None]


def command_count(page: Path) -> int:
    """Command lines the harness runs for a page (a Python block counts as one)."""
    return sum(len(shell_lines(b.text)) if b.lang in SHELL else 1 for b in runnable(page))


# -- stand-ins for ../shared/data -------------------------------------------------------------------------
def _checkins(city: str, start: str, days: int, users: int, seed: int):
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    table = generate_checkins(city_region(city), n_users=users, start=start, days=days, seed=seed)
    # venues: one id per ~100 m cell, so venues repeat as real check-ins' do
    table["venue_id"] = (np.floor(table["lat"] * 1000).astype(np.int64) * 7919
                         + np.floor(table["lon"] * 1000).astype(np.int64)) % 6_000_000
    return table


def _gowalla_nyc(path: Path) -> None:
    """Headerless SNAP TSV: user, time, lat, lon, location id (gzip)."""
    t = _checkins("new-york", "2010-05-01", 14, 600, 1)  # eval heatmap samples up to 500 people
    t["timestamp"] = t["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    t[["user_id", "timestamp", "lat", "lon", "venue_id"]].to_csv(path, sep="\t", header=False, index=False,
                                                                 compression="gzip")


def _gowalla_sample(path: Path) -> None:
    import pandas as pd

    parts = [_checkins(city, "2010-05-01", 28, 150, seed) for seed, city in enumerate(("austin", "san-francisco"))]
    parts[1]["user_id"] += 1_000_000
    pd.concat(parts, ignore_index=True).to_parquet(path)


STANDINS = {"gowalla_nyc_checkins.tsv.gz": _gowalla_nyc, "gowalla_sample_1000users.parquet": _gowalla_sample}


def _prepare(blocks_: list[Block], work: Path) -> None:
    """The stand-ins a page's blocks read from ../shared/data."""
    names = {n for b in blocks_ for n in re.findall(r"\.\./shared/data/([\w.-]+)", b.text)}
    unknown = names - set(STANDINS)
    assert not unknown, f"no stand-in for ../shared/data/{sorted(unknown)}: add one to STANDINS"
    shared = work.parent / "shared" / "data"
    shared.mkdir(parents=True, exist_ok=True)
    for name in sorted(names):
        STANDINS[name](shared / name)


# -- running a block --------------------------------------------------------------------------------------
def _fail(block: Block, line: str, proc: subprocess.CompletedProcess) -> str:
    return (f"{block.where}: `{line}` exited {proc.returncode}\n--- stdout\n{proc.stdout[-1500:]}\n"
            f"--- stderr\n{proc.stderr[-3000:]}")


def _run_shell_line(block: Block, line: str, work: Path, env: dict) -> None:
    if line == "source .venv/bin/activate":
        return
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    if len(words) > 1 and words[0] == "export" and all(ASSIGNMENT.match(w) for w in words[1:]):
        env.update(w.split("=", 1) for w in words[1:])
        return
    prefix = {}
    while words and ASSIGNMENT.match(words[0]):
        k, v = words.pop(0).split("=", 1)
        prefix[k] = v
    if words and words[0] == "geodp" and not SHELL_SYNTAX & set(words) and "$" not in line and "`" not in line:
        proc = run_geodp(*words[1:], ok=False, env={**env, **prefix}, cwd=work)
    else:
        script = f'geodp() {{ "{sys.executable}" -m flows.cli "$@"; }}\nset -e -o pipefail\n{line}\n'
        proc = subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(
                                  p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    assert proc.returncode == 0, _fail(block, line, proc)


def _run_python(block: Block, work: Path, env: dict, monkeypatch) -> dict:
    monkeypatch.chdir(work)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    scope = {"__name__": "__main__"}
    exec(compile(block.text, block.where, "exec"), scope)  # the docs' own example, run as a reader would
    return scope


def _answers_real_counts(scope: dict) -> None:
    """docs/python-api.md asks its release boxes inside the release's region (issue 45 item 6: its first
    release was Boston and its boxes New York, so every answer was 0)."""
    lat0, lon0, lat1, lon1 = scope["release"].synopsis.region.bbox_latlon()
    boxes = np.asarray(scope["boxes"], dtype=float)
    assert ((boxes[:, 0] >= lat0) & (boxes[:, 2] <= lat1) & (boxes[:, 1] >= lon0) & (boxes[:, 3] <= lon1)).all()
    assert (scope["answers"]["upper"] > 0).all()


def _needs_prefect(blocks_: list[Block]) -> bool:
    """A release or backfill into `--store` runs the Prefect flow (one with `--out` runs in-process)."""
    return any(ln.startswith("geodp release") and "--store" in ln
               for b in blocks_ if b.lang in SHELL for ln in shell_lines(b.text))


RUN_PAGES = [p for p in PAGES if runnable(p)]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_the_page_runs_as_written(page, tmp_path, request, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    todo = runnable(page)
    _prepare(todo, work)
    if _needs_prefect(todo):
        request.getfixturevalue("prefect_harness")  # exports PREFECT_API_URL
    env: dict[str, str] = {}
    for block in todo:
        if block.lang in PYTHON:
            scope = _run_python(block, work, env, monkeypatch)
            if page.name == "python-api.md" and "answers" in scope:
                _answers_real_counts(scope)
            continue
        for line in shell_lines(block.text):
            _run_shell_line(block, line, work, env)


def test_every_skipped_block_names_the_test_that_covers_it():
    skipped = [b for p in PAGES for b in blocks(p) if b.skip is not None]
    assert skipped  # the serve example at least
    for b in skipped:
        named = re.findall(r"tests/test_\w+\.py", b.skip)
        assert named, f"{b.where}: a skip must name the test that covers the block: {b.skip!r}"
        for name in named:
            assert (ROOT / name).exists(), f"{b.where}: {name} does not exist"


def test_the_harness_reads_every_block_of_the_readme():
    """The worked example's lines are among those run, as written (the query on releases/nyc-demo included)."""
    lines = [ln for b in runnable(ROOT / "README.md") if b.lang in SHELL for ln in shell_lines(b.text)]
    assert "geodp query range releases/nyc-demo --box 40.708,-74.012,40.717,-74.000" in lines
    assert sum(command_count(p) for p in PAGES) >= 30
