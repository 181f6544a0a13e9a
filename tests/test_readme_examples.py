"""The README's one-day `geodp release run` examples, with their own options, beat a blank map on
data-centred 1–5 km squares of a real day of check-ins (issue 35 item 5): they were identity at 100 m
cells with k = 20, 44–80 times worse than answering 0 on Gowalla NYC days (bench/results/2026-11-26-readme-examples.md, "README
examples on real check-ins"). The options are read from README.md and docs/*.md (where the README's
platform examples moved), so the test follows the text."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.blank_map import error_against_blank_map, gowalla_days
from tests.cli_runner import run_geodp

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Options that say where data comes from and goes to, not what is released.
PLACE = {"--cities", "--city", "--store", "--out", "--workers", "--period", "--dataset"}


def one_day_examples() -> list[list[str]]:
    """The release options of every `geodp release run` command of the README and docs pages whose
    --period is one UTC day, each set once (the same options in another order are one example)."""
    text = "\n".join(page.read_text() for page in DOCS).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if "geodp release run" not in line or "`" in line:
            continue
        words = shlex.split(line.split("geodp release run", 1)[1].split("#", 1)[0])
        pairs = dict(zip(words[1::2], words[2::2], strict=False))
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", pairs.get("--period", "")):
            continue
        options, i = [], 1
        while i < len(words):
            if words[i] in PLACE:
                i += 2
                continue
            options.append(words[i])
            i += 1
        if sorted(options) not in [sorted(o) for o in out]:
            out.append(options)
    return out


def test_the_readme_has_one_day_examples() -> None:
    assert one_day_examples()


@pytest.mark.slow
@pytest.mark.parametrize("options", one_day_examples(), ids=" ".join)
def test_a_one_day_readme_example_beats_a_blank_map_on_1_to_5_km(options, tmp_path, gowalla_nyc_path):
    day = gowalla_days(gowalla_nyc_path, "2010-05-01", "2010-05-02")
    data = tmp_path / "day.parquet"
    day.to_parquet(data)
    out = tmp_path / "rel"
    run_geodp("release", "run", data, "--cities", "new-york", "--period", "2010-05-01", *options, "--seed", "1",
              "--out", out)
    import geodp

    released, blank = error_against_blank_map(geodp.open_store(str(out)).releases()[0], day)
    assert released < blank, (options, released, blank)
