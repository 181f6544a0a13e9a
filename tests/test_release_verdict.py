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


def _refused_first_try(args: list, stores: list) -> tuple[object, object]:
    """Run ``args`` into each store in turn until one is refused: (the refused run, its store)."""
    for store in stores:
        refused = run_geodp(*args, "--out", store, ok=False)
        if refused.returncode != 0:
            break
    return refused, store


def test_an_empty_period_is_refused_having_spent_only_its_profile(data, tmp_path):
    """Bug: a period with no data at all was released and charged in full (its verdict only said the profile
    could not tell it from an empty one): the profile-only rule bounded each band's typical count by N̂'s 99th
    percentile, about 100 points that could all sit in one small square. Now each band's typical count is
    modelled from N̂ and the points per person (dpcore.synopsis.profile_verdict), and an empty period at ε 0.5
    with 250 m cells is refused before the rest of its ε, naming what would help."""
    store = tmp_path / "store"
    plan = run_geodp("release", "plan", data, "--city", "new-york", "--param", "cell_width_m=250",
                     "--period", "2024-02-01", "--epsilon", "1", "--out", store)
    assert "the run's verdict comes from the contribution profile it pays (ε = 0.1 of its ε), charged alone before the rest" in plan.stdout
    # noise alone makes an empty profile look like a few hundred points in about 1% of draws: a second try
    refused, store = _refused_first_try([*RUN[:2], data, *RUN[2:], "--period", "2024-02-01", "--epsilon", "0.5"],
                                        [tmp_path / "store", tmp_path / "store-2"])
    (line,) = [ln for ln in refused.stderr.splitlines() if "error" in ln]
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == line
    assert line.startswith("error: new-york: expected worse than a blank map at every band")
    assert "cannot tell this period from an empty one" in line and "only its contribution profile was charged" in line
    assert re.search(r"would help: .*(ε ≥|cells of \d+ m|-day period)", line)
    assert _ledger(store) == [("profile", 0.05)] and not list(store.rglob("_MANIFEST.json"))


def test_a_first_day_worse_than_a_blank_map_is_refused_and_a_good_release_published(data, tmp_path):
    """Bug: the issue's weak example (one day at ε 0.25 with 250 m cells: on Gowalla NYC 5–56 times worse than
    a blank map at every band) was published in full, since a profile alone left every square possibly
    holding all of N̂. Now it is refused having spent only its profile; a release of the fortnight with 1 km
    cells, which beats a blank map, is still published and charged in full."""
    store = tmp_path / "store"
    weak = run_geodp(*RUN[:2], data, *RUN[2:], "--period", "2024-01-02", "--epsilon", "0.25", "--out", store,
                     ok=False)
    assert weak.returncode == 2, weak.stdout
    line = weak.stderr.splitlines()[-1]
    assert line.startswith("error: new-york: expected worse than a blank map at every band")
    assert "of a blank map's error" in line and "only its contribution profile was charged (ε = 0.025)" in line
    assert _ledger(store) == [("profile", 0.025)] and not list(store.rglob("_MANIFEST.json"))

    good = run_geodp(*RUN[:2], data, "--city", "new-york", "--no-prefect", "--param", "cell_width_m=1000",
                     "--period", "2024-01-01..2024-01-14", "--epsilon", "1", "--out", store)
    assert "informative for squares of" in next(ln for ln in good.stdout.splitlines() if "verdict:" in ln)
    assert sorted(_ledger(store)) == [("profile", 0.025), ("profile", 0.1), ("release", 0.9)]
    manifest = json.loads(next(store.rglob("_MANIFEST.json")).read_text())
    assert manifest["quality"]["plan"]["useless"] is False and manifest["quality"]["plan"]["published_anyway"] is False


def test_a_refused_release_published_anyway_shows_its_verdict_everywhere(data, tmp_path):
    """Bug: a release whose manifest said "worse than a blank map" committed with nothing on the terminal,
    in `release list` or on its answers; `release plan` exited 0 when it would refuse."""
    store = tmp_path / "store"
    run_geodp(*RUN[:2], data, *RUN[2:], "--epsilon", "4", "--out", store)  # the region's published basis
    # the refusal names the period that would help: at ε 0.02 30–90 days (draws of the basis); at 0.01 it took
    # 365 days, the longest tried, in 7 of 52 draws, at the edge of naming none (bench/results/2026-11-29-verdict-5.md)
    args = [*RUN[:2], data, *RUN[2:], "--period", "2024-01-02", "--epsilon", "0.02", "--out", store]
    plan = run_geodp("release", "plan", data, "--city", "new-york", "--param", "cell_width_m=250",
                     "--period", "2024-01-02", "--epsilon", "0.02", "--out", store, ok=False)
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

    from flows.release_summary import summary_markdown
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
    assert re.search(r"would help: .*(ε ≥|cells of \d+ m|-day period)", line)
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


def test_a_first_day_at_eps_1_with_250_m_cells_is_refused_having_spent_only_its_profile(data, tmp_path):
    """Bug: one day at ε 1 with 250 m cells (on Gowalla NYC 1.6 / 13 / 12.5 times a blank map's error, 10 of 10
    days; on this synthetic day 1.7 / 15 / 30) was published: its 25–100 m squares, answered by spreading a
    250 m cell's count, were expected 1.4–1.7 of a blank map's error, under the margin of 2 every band needed.
    Now a band of squares inside the cells counts towards a refusal once it is expected worse than a blank map
    and its noise alone is at least half a blank map's error."""
    # the profile's noise leaves the small band's noise under half a blank map's in about 3% of draws: 3 tries
    refused, store = _refused_first_try([*RUN[:2], data, *RUN[2:], "--period", "2024-01-02", "--epsilon", "1"],
                                        [tmp_path / f"store-{i}" for i in range(3)])
    assert refused.returncode == 2, refused.stdout
    line = refused.stderr.splitlines()[-1]
    assert line.startswith("error: new-york: expected worse than a blank map at every band")
    assert re.search(r"25–100 m \(inside the cells: noise alone [\d.]+\): ≈ [\d.]+ of a blank map's error", line)
    assert "only its contribution profile was charged (ε = 0.1)" in line
    assert _ledger(store) == [("profile", 0.1)] and not list(store.rglob("_MANIFEST.json"))


def test_a_refusal_from_a_profile_that_sees_no_one_says_the_period_may_hold_more(data, tmp_path):
    """Bug: a period whose people each sit in a bucket under the profile's noise (the fortnight's 3,832 points at
    ε 0.1: 548 people a bucket are needed) was refused saying "N̂ ≈ 127 points, 1 per person of a point", as if
    the profile had counted them (the Gowalla sample's Austin, May 2010: N̂ 0–85 of 2,816 points). Now the
    line says what the profile sees and that the period may hold many more."""
    refused, store = _refused_first_try([*RUN[:2], data, *RUN[2:], "--epsilon", "0.1"],
                                        [tmp_path / "store", tmp_path / "store-2"])
    assert refused.returncode == 2, refused.stdout
    line = refused.stderr.splitlines()[-1]
    assert "the profile cannot tell this period from an empty one" in line
    assert re.search(r"so it sees N̂ ≈ \d+ points, [\d.]+ per person, where people under that noise may hold many "
                     r"more: the typical counts below are then too small and the errors too large", line)
    assert "per person of a point" not in line


def test_an_empty_period_published_at_the_daily_settings_says_the_profile_cannot_tell_it_from_empty(data, tmp_path):
    """Bug: an empty period at the daily settings (ε 1, `auto`, k 5) was published with a verdict line that did
    not say its profile could not tell it from an empty one. It is still published: its profile (ε 0.1) cannot
    tell it from a day of a few people, which these settings serve better than a blank map, and refusing one
    refuses the other nearly as often (ε_p-DP)."""
    out = run_geodp(*RUN[:2], data, "--city", "new-york", "--no-prefect", "--mechanism", "auto",
                    "--max-points-per-user", "5", "--period", "2024-02-01", "--epsilon", "1", "--out", tmp_path / "s")
    line = next(ln for ln in out.stdout.splitlines() if "verdict:" in ln)
    assert "its profile cannot tell the period from an empty one, where a blank map is exact" in line
    assert "informative" not in line


def test_answer_notes_mark_each_box_by_its_sides_band_without_a_loop_per_box():
    """Bug: notes were set one box at a time in Python (a million boxes in a bad band took a Python loop).
    The vectorised codes must give every box the note of the last bad band its side falls in, and none
    elsewhere, like a per-box reading of the bands does."""
    import numpy as np

    from tasks.release_verdict import band_note_codes, band_verdicts

    quality = {"plan": {"bands": [
        {"query_sides_m": [25, 100], "worse_than_blank_map": True},
        {"query_sides_m": [100, 1000], "worse_than_blank_map": False},
        {"query_sides_m": [1000, 5000], "worse_than_blank_map": True}]}}
    bad = [b["query_sides_m"] for b in band_verdicts(quality) if b["worse"]]
    assert len(bad) == 2
    rng = np.random.default_rng(0)
    side = np.concatenate([rng.uniform(5, 8000, 3000), [25.0, 100.0, 1000.0, 5000.0]])
    x0 = rng.uniform(-1e4, 1e4, side.size)
    boxes = np.column_stack([x0, x0, x0 + side, x0 + side])
    codes, words = band_note_codes(quality, boxes)
    got = np.array([*words, None], dtype=object)[codes]
    for s, note in zip(np.sqrt(side * side), got, strict=True):
        inside = [b for b in bad if b[0] <= s <= b[1]]
        if not inside:
            assert note is None
        else:
            lo, hi = inside[-1]
            assert note is not None and f"{lo:g}–{hi:g} m" in note
    assert words == sorted(words) and len(set(words)) == len(words)
