"""Issue 43 items 4 and 5 through the CLI: every release gets a verdict, a first one from its paid contribution
profile; a hopeless release is refused before its charge and --publish-anyway is recorded; the verdict shows
on the terminal, in the Prefect summary, in `release list` and as a note on answers from a band the release is
expected to serve worse than a blank map."""

import json

import pytest

from dpcore.data.synthetic import generate_checkins
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

RUN = ["release", "run", "--city", "new-york", "--no-prefect", "--param", "cell_width_m=250"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    p = tmp_path_factory.mktemp("verdict") / "c.parquet"
    generate_checkins(city_region("new-york"), n_users=400, start="2024-01-01", days=14, seed=3).to_parquet(p)
    return p


def test_a_first_release_gets_a_verdict_from_its_paid_profile(data, tmp_path):
    """Bug: a first release got no verdict (the plan predicted only from an earlier published release), and a
    period with no data at all was released and charged without a word."""
    store = tmp_path / "store"
    plan = run_geodp("release", "plan", data, "--city", "new-york", "--param", "cell_width_m=250",
                     "--period", "2024-02-01", "--epsilon", "1", "--out", store)
    assert "the run's verdict comes from the contribution profile it pays (ε = 0.1 of its ε)" in plan.stdout
    empty = run_geodp(*RUN[:2], data, *RUN[2:], "--period", "2024-02-01", "--epsilon", "1", "--out", store)
    line = next(ln for ln in empty.stdout.splitlines() if "verdict:" in ln)
    assert line.startswith("  verdict: ") and "informative" not in line
    manifest = json.loads(next(store.rglob("_MANIFEST.json")).read_text())
    plan_q = manifest["quality"]["plan"]
    assert "its contribution profile (ε = 0.1, paid with its charge)" in plan_q["basis"] and plan_q["bands"]
    assert "cannot tell this period from an empty one" in plan_q["statement"]
    # each band's typical count is bounded by the most points the profile leaves possible
    assert all(b["typical_count"] is None and b["typical_count_at_most"] > 0 for b in plan_q["bands"])


def test_a_refused_release_published_anyway_shows_its_verdict_everywhere(data, tmp_path):
    """Bug: a release whose manifest said "worse than a blank map" committed with nothing on the terminal,
    in `release list` or on its answers; `release plan` exited 0 when it would refuse."""
    store = tmp_path / "store"
    run_geodp(*RUN[:2], data, *RUN[2:], "--epsilon", "4", "--out", store)  # the region's published basis
    args = [*RUN[:2], data, *RUN[2:], "--period", "2024-01-02", "--epsilon", "0.01", "--out", store]
    plan = run_geodp("release", "plan", data, "--city", "new-york", "--param", "cell_width_m=250",
                     "--period", "2024-01-02", "--epsilon", "0.01", "--out", store, ok=False)
    assert plan.returncode == 2 and "would help: ε ≥" in plan.stderr
    refused = run_geodp(*args, ok=False)
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].startswith("error: new-york: expected worse")
    assert "a 7-day period" in refused.stderr or "-day period" in refused.stderr
    published = run_geodp(*args, "--publish-anyway")
    line = next(ln for ln in published.stdout.splitlines() if "verdict:" in ln)
    assert "published anyway" in line and "worse than a blank map" in line
    listed = run_geodp("release", "list", store, "--period", "2024-01-02")
    assert "verdict:" in listed.stdout and "published anyway" in listed.stdout
    (row,) = json.loads(run_geodp("release", "list", store, "--period", "2024-01-02", "--json").stdout)
    assert row["verdict"].startswith("verdict:") and "published anyway" in row["verdict"]

    version = store / "releases" / row["dataset"] / "new-york" / "2024-01-02" / "v1"
    box = "40.7110,-74.0070,40.7115,-74.0064"  # a 55 m square: in the 25–100 m band
    answers = json.loads(run_geodp("query", "range", version, "--box", box, "--json").stdout)
    assert "worse than a blank map for squares of 25–100 m" in answers[0]["note"]
    text = run_geodp("query", "range", version, "--box", box).stdout
    assert "note: this release is expected worse than a blank map" in text

    from flows.release import summary_markdown
    from tasks.storage.store import ReleaseStore

    summary = json.loads(run_geodp(*args, "--publish-anyway", "--json", "-").stdout)  # committed: a no-op
    st = ReleaseStore(str(store))
    md = summary_markdown(summary, {m.city: m for m in st.list_releases(period="2024-01-02")}, st)
    assert "**verdict: " in md and "published anyway" in md
