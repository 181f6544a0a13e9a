"""Bad private data in the Prefect form: what the Prefect UI shows (flow and task run state messages,
their results, logs and artifacts, read back through the Prefect client of the session's real server)
names what is wrong and never a count of private rows, a row's number or its values; the same input
in the in-process form (the operator's own terminal) shows them. Counts are computed here from the
written file, so the tests fail if the detail leaks anywhere or vanishes everywhere."""

from __future__ import annotations

import re
import time
import uuid

import numpy as np
import pandas as pd
import pytest

from dpcore.data.inputs import DataError
from dpcore.geo import city_region
from tests.cli_runner import run_geodp

NYC = city_region("new-york")
DASK_WORKERS = 1  # the session's one-worker cluster (tests/conftest.py): its flows need no second worker


def _frame(n: int, users: int = 997) -> pd.DataFrame:
    """n valid check-ins of ``users`` people inside New York's region, over the hours of 2024-01-01."""
    rng = np.random.default_rng(n)
    return pd.DataFrame({
        "user_id": (np.arange(n) % users).astype("int64"),
        "timestamp": pd.Timestamp("2024-01-01", tz="UTC") + pd.to_timedelta(np.arange(n) % 24, unit="h"),
        "lat": NYC.center_lat + rng.uniform(-0.05, 0.05, n),
        "lon": NYC.center_lon + rng.uniform(-0.05, 0.05, n),
    })


def _forms(n: int) -> list[str]:
    """How a count may be printed: 131071 and 131,071."""
    return [str(n), f"{n:,}"]


def _leaks(text: str, secrets: list[str]) -> list[str]:
    """The secrets that occur in text as whole tokens (not inside a longer number, id or word)."""
    return [s for s in secrets if re.search(rf"(?<![\w.])(?<!\d,){re.escape(s)}(?!\w|[,.]\d)", text)]


def _shown_in_prefect(flow_run_id, must_contain: str) -> str:
    """Everything the Prefect UI shows of one flow run: its and its task runs' state names, messages
    and state data, every log line (waiting until ``must_contain`` has arrived, so the task runs' logs
    from the Dask workers are there) and every artifact."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    from tasks.runtime import _drain_logs

    _drain_logs()
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60
        while True:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            text = "\n".join(entry.message for entry in logs)
            if must_contain in text or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert must_contain in text, f"the run's logs never showed {must_contain!r}:\n{text[-3000:]}"
        run = client.read_flow_run(flow_run_id)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        parts = [text, run.name, run.state.model_dump_json()]
        for t in tasks:
            parts += [t.name, t.state.model_dump_json() if t.state else ""]
        parts += [f"{a.key} {a.description} {a.data}" for a in artifacts]
    assert any(t.state and t.state.is_failed() for t in tasks) or run.state.is_completed()
    return "\n".join(parts)


def _run_flow(params):
    """The release flow as Prefect runs it; its final state (a failure is returned, not raised)."""
    from flows.release import release_flow

    return release_flow(params, return_state=True)


def _params(data, store, dask_address: str, **kw):
    """Release parameters on the session's Dask cluster (tests/conftest.py: dask_cluster)."""
    from tasks.config import ReleaseParams

    return ReleaseParams(data=str(data), cities=["new-york"], epsilon=1.0, store=str(store),
                         dataset=f"priv-{uuid.uuid4().hex[:8]}", max_points_per_user=5, dask_address=dask_address,
                         **{"publish_anyway": True, **kw})  # these small releases: the verdict would refuse them


@pytest.mark.slow
def test_no_valid_rows_names_the_problem_in_prefect_and_the_counts_in_the_terminal(prefect_harness, dask_cluster, tmp_path):
    missing_user, bad_lat = 131_071, 104_729
    df = _frame(missing_user + bad_lat)
    df["user_id"] = df["user_id"].astype("object")
    df.loc[: missing_user - 1, "user_id"] = None
    df.loc[missing_user:, "lat"] = 95.0
    path = tmp_path / "all_bad.parquet"
    df.to_parquet(path)
    secrets = [s for n in (missing_user, bad_lat, missing_user + bad_lat) for s in _forms(n)]

    state = _run_flow(_params(path, tmp_path / "store", dask_cluster))
    assert state.is_failed()
    with pytest.raises(DataError) as failed:
        state.result()
    message = str(failed.value)
    assert "has no valid rows" in message and "geodp data check" in message and not _leaks(message, secrets)
    shown = _shown_in_prefect(state.state_details.flow_run_id, "has no valid rows")
    assert not _leaks(shown, secrets), _leaks(shown, secrets)

    # the operator's terminal: the in-process form and `geodp data check` show every count
    proc = run_geodp("release", "run", path, "--city", "new-york", "--epsilon", "1", "--out", tmp_path / "out",
                     ok=False)
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1
    assert set(_leaks(proc.stderr, secrets)) >= {f"{n:,}" for n in (missing_user, bad_lat, missing_user + bad_lat)}
    check = run_geodp("data", "check", path, ok=False)
    assert check.returncode == 2 and len(_leaks(check.stderr, secrets)) == 3

    # the Prefect form of the CLI: one error line, exit 2, no counts, nothing charged
    store = tmp_path / "cli-store"
    proc = run_geodp("release", "run", path, "--cities", "new-york", "--epsilon", "1", "--store", store,
                     "--dask-address", dask_cluster, "--dataset", "cliform", ok=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("error:")]
    assert "has no valid rows" in line and not _leaks(proc.stderr, secrets), proc.stderr[-2000:]
    assert not (store / "datasets" / "cliform" / "ledger").exists() or not any(
        (store / "datasets" / "cliform" / "ledger").iterdir())


def test_strict_names_the_option_in_prefect_and_the_row_in_the_terminal(prefect_harness, dask_cluster, tmp_path):
    first_bad, n = 100_003, 160_000
    df = _frame(n)
    df.loc[first_bad - 1, ["user_id", "lat"]] = (987_654_321, 123.456)  # row numbers are 1-based
    df.loc[first_bad + 10:, "lon"] = 200.0  # more bad rows after it: the strict error names the first
    path = tmp_path / "one_bad.parquet"
    df.to_parquet(path)
    secrets = [*_forms(first_bad), "987654321", "123.456"]

    state = _run_flow(_params(path, tmp_path / "store", dask_cluster, strict=True))
    assert state.is_failed()
    with pytest.raises(DataError, match="--strict") as failed:
        state.result()
    assert not _leaks(str(failed.value), secrets)
    shown = _shown_in_prefect(state.state_details.flow_run_id, "--strict")
    assert not _leaks(shown, secrets), _leaks(shown, secrets)

    proc = run_geodp("release", "run", path, "--city", "new-york", "--epsilon", "1", "--out", tmp_path / "out",
                     "--strict", ok=False)
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1
    assert {"100003", "987654321"} <= set(_leaks(proc.stderr, secrets)), proc.stderr


def test_a_release_with_some_bad_rows_shows_no_counts_in_prefect(prefect_harness, dask_cluster, tmp_path):
    good, bad = 150_001, 120_007
    df = _frame(good + bad)
    df.loc[good:, "lon"] = 200.0
    path = tmp_path / "some_bad.parquet"
    df.to_parquet(path)
    secrets = [s for v in (good, bad, good + bad) for s in _forms(v)]

    state = _run_flow(_params(path, tmp_path / "store", dask_cluster))
    assert state.is_completed(), state.message
    # the run's wall time grows with the private row count: the summary artifact leaves it out
    secrets.append(str(state.result()["seconds"]))
    shown = _shown_in_prefect(state.state_details.flow_run_id, "to release")
    assert "release-" in shown  # the summary artifacts were read
    assert not _leaks(shown, secrets), _leaks(shown, secrets)

    proc = run_geodp("release", "run", path, "--city", "new-york", "--epsilon", "1", "--out", tmp_path / "out",
                     "--publish-anyway")
    assert set(_leaks(proc.stderr, secrets)) >= {f"{v:,}" for v in (good, bad, good + bad)}, proc.stderr


def test_a_cluster_worker_keeps_the_row_of_a_strict_failure_to_itself(tmp_path):
    """The worker logs a failed Dask task's exception and the scheduler shows it on the dashboard the
    run links: on a worker only the public part is raised; the local threaded scheduler (the
    in-process form) keeps the detail."""
    from distributed import Client, LocalCluster

    from dpcore.data.chunks import GridSpec, file_counts
    from dpcore.data.inputs import resolve_input
    from tasks.dask_path import _read_file

    df = _frame(5_000)
    df.loc[4_321, ["user_id", "lat"]] = (987_654_321, 123.456)
    path = tmp_path / "one_bad.parquet"
    df.to_parquet(path)
    inp = resolve_input(str(path), "auto", (None, None))
    secrets = ["4322", "987654321", "123.456"]
    specs, window = [GridSpec("new-york", city_region("new-york"), 8)], (None, None)
    with pytest.raises(DataError) as local:
        _read_file(file_counts, inp, inp.files[0], None, True, specs, window)
    # the record-level read leaves the user column unread when its statistics prove it valid
    assert set(_leaks(str(local.value), secrets)) >= {"4322", "123.456"}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        with pytest.raises(DataError, match="--strict") as remote:
            client.submit(_read_file, file_counts, inp, inp.files[0], None, True, specs, window).result()
    assert not _leaks(repr(remote.value), secrets) and not _leaks(str(remote.value), secrets)


@pytest.mark.slow
def test_the_evaluate_flow_shows_no_n_users_or_psi_in_prefect(prefect_harness, dask_cluster, tmp_path):
    from flows.evaluate_flow import run_evaluate
    from tasks.config import EvaluateParams, STEvaluateOptions

    n, users = 54_321, 12_345
    path = tmp_path / "eval.parquet"
    _frame(n, users).to_parquet(path)
    st = STEvaluateOptions(window="2024-01-01/2024-01-02", slot="1h", mechanisms=["identity3d"], epsilons=[1.0],
                           max_points_per_user=5, queries=50, hotspot_queries=10, hotspot_grid=16,
                           forecast_queries=2, image_slots=2, forecast_plots=1, image_cells=16)
    out = run_evaluate(EvaluateParams(
        data=str(path), cities=["new-york"], mechanisms=["identity"], epsilons=[1.0], queries=50, trials=1,
        query_sides_m=[(1000, 5000)], spatio_temporal=st, dask_address=dask_cluster,
        mechanism_params={"identity": {"cell_width_m": 1000}, "identity3d": {"grid_size": 16}}))
    # the operator's side (the flow's return value) has the truth; the UI does not
    city = out["cities"]["new-york"]
    st_city = out["spatio_temporal"]["cities"]["new-york"]
    assert (city["n_points"], city["n_users"], st_city["n_points"]) == (n, users, n)
    secrets = [*_forms(n), *_forms(users), f"{city['psi']:g}", repr(city["psi"]), f"{st_city['psi']:g}"]
    shown = _shown_in_prefect(out["flow_run_id"], "evaluate-st")
    assert "OPERATOR ONLY" in shown and not _leaks(shown, secrets), _leaks(shown, secrets)


def test_tasks_that_return_private_data_never_persist_it(prefect_harness, tmp_path):
    """Even where a deployment turns result persistence on by default, the data pass's result (counts,
    the validation report) is not written to result storage, which the Prefect API serves."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import (
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_RESULTS_PERSIST_BY_DEFAULT,
        temporary_settings,
    )

    from tasks.release_tasks import load_and_validate

    path = tmp_path / "d.parquet"
    _frame(1_234).to_parquet(path)

    @task
    def control() -> int:  # an ordinary task: persisted under this setting, so the check can fail
        return 1

    @flow
    def reads() -> None:
        control()
        load_and_validate(str(path))

    with temporary_settings({PREFECT_RESULTS_PERSIST_BY_DEFAULT: True,
                             PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        state = reads(return_state=True)
    assert state.is_completed()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    persisted = {r.name.rsplit("-", 1)[0]: r.state.data is not None for r in runs}
    assert persisted == {"control": True, "load-and-validate": False}


def _flow_run_of(dataset: str):
    """The id of the (one) release flow run of ``dataset`` on the session's Prefect server."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs(limit=200)
                if dataset in str(r.parameters.get("params", {}))]
    assert len(runs) == 1, [r.name for r in runs]
    return runs[0].id


def test_a_library_error_quoting_private_data_shows_only_its_type_in_prefect(prefect_harness, tmp_path):
    """A failure that is not a DataError while the data pass reads private data (a library's KeyError
    naming a user id, with a note and a cause quoting a latitude; tests/faults.py makes each file's
    validation fail so, on the Dask worker): the Prefect UI (state messages, logs with their
    tracebacks) and the CLI's Prefect form name its type and the check command only; the in-process
    form shows the operator what it quotes."""
    from tests.faults import quote_data_env

    df = _frame(2_000)
    df["user_id"] = "u" + df["user_id"].astype(str)
    df.loc[0, ["user_id", "lat"]] = ("SECRET-USER-4242", 40.123456789)
    path = tmp_path / "quoted.parquet"
    df.to_parquet(path)
    secrets = ["SECRET-USER-4242", "40.123456789"]
    env = quote_data_env()

    proc = run_geodp("release", "run", path, "--cities", "new-york", "--epsilon", "1", "--store", tmp_path / "s",
                     "--workers", "1", "--dataset", "quoted", ok=False, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("error:")]
    assert "KeyError" in line and "geodp data check" in line, proc.stderr[-3000:]
    assert not _leaks(proc.stderr + proc.stdout, secrets), proc.stderr[-3000:]
    shown = _shown_in_prefect(_flow_run_of("quoted"), "KeyError")
    assert not _leaks(shown, secrets), [shown[max(0, shown.find(s) - 1500):shown.find(s) + 200] for s in secrets
                                        if s in shown]

    # the operator's own terminal: the in-process form shows what the error quotes
    proc = run_geodp("release", "run", path, "--city", "new-york", "--epsilon", "1", "--out", tmp_path / "out",
                     ok=False, env=env)
    assert proc.returncode != 0 and "SECRET-USER-4242" in proc.stderr, proc.stderr[-3000:]


def test_a_date_python_cannot_hold_outside_the_charged_day_neither_fails_nor_leaks(prefect_harness, dask_cluster, tmp_path):
    """A Parquet timestamp past year 9999 once made reading the row back for --strict's message raise
    OverflowError ("date value out of range"), whose text told the Prefect UI why that private row was bad.
    A release now validates only its charged days' rows (issue 42 item 5), so a one-day --strict release
    neither reads that row back nor fails on it, in both forms, and nothing about it reaches the Prefect UI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = _frame(5_000)
    ts = df["timestamp"].dt.tz_convert(None).to_numpy().astype("datetime64[s]").astype(np.int64)
    ts[4_320] = 4242 * 10**9  # year 5325, in row 4321
    pq.write_table(pa.table({"user_id": pa.array("u" + df["user_id"].astype(str)),
                             "timestamp": pa.array(ts, type=pa.timestamp("s")),
                             "lat": df["lat"], "lon": df["lon"]}), path := tmp_path / "far.parquet")
    secrets = ["4321", "5325", "out of range", "OverflowError"]

    proc = run_geodp("release", "run", path, "--cities", "new-york", "--epsilon", "1", "--store", tmp_path / "s",
                     "--dask-address", dask_cluster, "--dataset", "farstrict", "--period", "2024-01-01", "--strict",
                     "--publish-anyway")
    assert not _leaks(proc.stdout + proc.stderr, secrets), _leaks(proc.stdout + proc.stderr, secrets)
    assert list((tmp_path / "s").glob("releases/farstrict/**/_MANIFEST.json"))
    shown = _shown_in_prefect(_flow_run_of("farstrict"), "fits")
    assert not _leaks(shown, secrets), _leaks(shown, secrets)

    proc = run_geodp("release", "run", path, "--city", "new-york", "--epsilon", "1", "--out", tmp_path / "out",
                     "--period", "2024-01-01", "--strict", "--publish-anyway")
    assert "OverflowError" not in proc.stderr and list((tmp_path / "out").glob("**/_MANIFEST.json"))


def test_a_step_keeps_geodp_refusals_and_replaces_every_other_exception():
    """without_private_detail: a store's refusal (public) passes as it is; a library's ValueError quoting
    a value becomes a PrivateDataFailure naming its type, with no cause, context or notes to log, which a
    task still retries (it is not a refusal)."""
    from types import SimpleNamespace

    from tasks.public_errors import PrivateDataFailure, retry_unless_refused, without_private_detail
    from tasks.storage.store import StoreError

    refusal = StoreError("cannot reach s3://bucket/p")

    def refuse():
        raise refusal

    with pytest.raises(StoreError) as kept:
        without_private_detail(refuse, "d.parquet")
    assert kept.value is refusal

    def quote():
        try:
            raise KeyError("SECRET-USER-4242")
        except KeyError as exc:
            failed = ValueError("could not convert '40.123456789'")
            failed.add_note("user SECRET-USER-4242")
            raise failed from exc

    with pytest.raises(PrivateDataFailure) as replaced:
        without_private_detail(quote, "d.parquet", step="the fit")
    exc = replaced.value
    assert exc.__cause__ is None and exc.__context__ is None and not getattr(exc, "__notes__", None)
    assert "ValueError" in str(exc) and "geodp data check d.parquet" in str(exc)
    assert not _leaks(str(exc), ["SECRET-USER-4242", "40.123456789"])

    def state_of(e):
        def result():
            raise e
        return SimpleNamespace(result=result)

    assert retry_unless_refused(None, None, state_of(exc)) is True
    assert retry_unless_refused(None, None, state_of(DataError("bad", public="bad"))) is False
