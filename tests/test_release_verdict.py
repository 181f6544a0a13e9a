"""Issue 43 items 4 and 5 through the CLI: every release gets a verdict, a first one from its paid contribution
profile; a hopeless release is refused before its charge and --publish-anyway is recorded; the verdict shows
on the terminal, in the Prefect summary, in `release list` and as a note on answers from a band the release is
expected to serve worse than a blank map."""

import json
import re

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
    assert "the run's verdict comes from the contribution profile it pays (ε = 0.1 of its ε), charged alone before the rest" in plan.stdout
    empty = run_geodp(*RUN[:2], data, *RUN[2:], "--period", "2024-02-01", "--epsilon", "1", "--out", store)
    line = next(ln for ln in empty.stdout.splitlines() if "verdict:" in ln)
    assert line.startswith("  verdict: ") and "informative" not in line
    manifest = json.loads(next(store.rglob("_MANIFEST.json")).read_text())
    plan_q = manifest["quality"]["plan"]
    assert "its contribution profile (ε = 0.1, paid alone before the rest of its ε)" in plan_q["basis"] and plan_q["bands"]
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
    # the same box asked of the store's series: the period's row and the sum over it carry the note
    series = json.loads(run_geodp("query", "range", store, "--dataset", row["dataset"], "--city", "new-york",
                                  "--box", box, "--json").stdout)
    by_period = {r["period"]: r for r in series}
    assert "worse than a blank map for squares of 25–100 m" in by_period["2024-01-02"]["note"]
    (total,) = [r for p, r in by_period.items() if p.startswith("sum")]
    assert total["note"].startswith("2024-01-02: this release is expected worse than a blank map")

    from flows.release import summary_markdown
    from tasks.storage.store import ReleaseStore

    summary = json.loads(run_geodp(*args, "--publish-anyway", "--json", "-").stdout)  # committed: a no-op
    st = ReleaseStore(str(store))
    md = summary_markdown(summary, {m.city: m for m in st.list_releases(period="2024-01-02")}, st)
    assert "**verdict: " in md and "published anyway" in md


HOPELESS = [*RUN[:2], "--city", "new-york", "--no-prefect", "--side-km", "2", "--param", "cell_width_m=5",
            "--max-points-per-user", "100", "--period", "2024-02-01", "--epsilon", "1"]


def _ledger(store) -> list[tuple[str, float]]:
    from tasks.storage.ledger import DatasetLedger
    from tasks.storage.store import ReleaseStore

    return [(h.charge.key.rsplit("/", 1)[-1] if "/" in h.charge.key else "release", round(h.charge.epsilon, 9))
            for h in DatasetLedger(ReleaseStore(str(store)), "c").held()]


def test_a_first_release_its_paid_profile_finds_hopeless_is_refused_having_spent_only_the_profile(data, tmp_path):
    """Bug: a first release was charged its whole ε before its verdict, so one its own profile found hopeless at
    every band (here an empty period, 5 m cells, k = 100) was published anyway; `release plan` exited 0 for it
    and a re-run drew a second profile. Now the profile is a release of its own: charged alone (ε 0.1), the run
    refuses before the rest of its ε, a re-run and the plan reuse that profile, and --publish-anyway pays the
    rest (ε 0.9) and records it."""
    # an empty profile's noise makes up a heavy bucket (N̂ up to 10⁹) in about 3% of draws, and then nothing
    # is hopeless: that store is left and the next tried (3 tries: a miss in about 3·10⁻⁵ runs)
    for attempt in range(3):
        store = tmp_path / f"store-{attempt}"
        args = [*HOPELESS[:2], data, *HOPELESS[2:], "--out", store]
        refused = run_geodp(*args, ok=False)
        if refused.returncode != 0:
            break
    (line,) = [ln for ln in refused.stderr.splitlines() if "error" in ln]
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == line
    assert line.startswith("error: new-york: expected worse than a blank map at every band")
    assert "only its contribution profile was charged (ε = 0.1)" in line and "would help:" in line
    assert re.search(r"cells of \d+ m", line) and "ε ≥" in line
    assert _ledger(store) == [("profile", 0.1)] and not list(store.rglob("_MANIFEST.json"))

    again = run_geodp(*args, ok=False)  # the same release: the recorded profile decides, nothing is drawn or charged
    assert again.returncode == 2 and "expected worse than a blank map at every band" in again.stderr
    assert "nothing was charged" in again.stderr and _ledger(store) == [("profile", 0.1)]
    plan = run_geodp("release", "plan", data, *HOPELESS[2:4], *HOPELESS[5:], "--out", store, ok=False)
    assert plan.returncode == 2 and plan.stderr.startswith("error: new-york: a release would be refused")
    assert "its contribution profile (ε = 0.1" in plan.stdout

    published = run_geodp(*args, "--publish-anyway")
    assert "published anyway" in next(ln for ln in published.stdout.splitlines() if "verdict:" in ln)
    assert _ledger(store) == [("profile", 0.1), ("release", 0.9)]
    manifest = json.loads(next(store.rglob("_MANIFEST.json")).read_text())
    assert manifest["epsilon"] == 1 and manifest["quality"]["plan"]["published_anyway"] is True
    (row,) = json.loads(run_geodp("ledger", store, "--json").stdout)
    assert row["loss"]["lifetime"] == pytest.approx(1.0)
