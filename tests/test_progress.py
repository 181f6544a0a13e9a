"""Progress of long work (issue 45 item 5): the data pass reports files read and the fits cities fitted, as
bars (with rows read) on the operator's terminal (in-process form) and as log lines in the Prefect UI,
where a count of private rows must never appear. Before tasks/progress.py neither form showed any."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import uuid

import pandas as pd

from tests.cli_runner import ROOT
from tests.test_platform_private_errors import _flow_run_of, _frame, _leaks, _shown_in_prefect

ROWS = (1_733, 1_291)  # two files; their sum and each count are private


def _two_files(folder) -> str:
    folder.mkdir()
    for i, n in enumerate(ROWS):
        _frame(n).to_parquet(folder / f"part-{i}.parquet")
    return str(folder)


def _on_a_terminal(args: list[str], env: dict | None = None, timeout: float = 180,
                   clear: bool = False) -> tuple[int, str]:
    """``geodp ARGS`` with stdout and stderr on a pseudo-terminal, as an operator runs it: (status, output).
    With ``clear``, ``env`` is the whole environment."""
    leader, follower = pty.openpty()
    base = {} if clear else dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *map(str, args)], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, env={**base, **(env or {}), "COLUMNS": "160"})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: the command exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=timeout), b"".join(chunks).decode("utf-8", "replace")


def test_the_in_process_data_pass_draws_a_bar_with_files_and_rows_on_a_terminal(tmp_path):
    data = _two_files(tmp_path / "in")
    status, shown = _on_a_terminal(["release", "run", data, "--city", "new-york", "--epsilon", "1",
                                    "--out", tmp_path / "out", "--max-points-per-user", "5"])
    assert status == 0, shown[-3000:]
    assert "data pass" in shown and "2/2" in shown and f"{sum(ROWS):,} rows" in shown, shown[-3000:]
    assert "fits" in shown and "1/1" in shown and "cities" in shown, shown[-3000:]


def test_the_prefect_form_shows_progress_on_its_terminal_and_logs_no_rows(prefect_harness, tmp_path):
    data = _two_files(tmp_path / "in")
    dataset = f"progress-{uuid.uuid4().hex[:8]}"
    # a 10 m grid: the fit's task argument is 30 MiB, which made distributed warn "Sending large graph"
    # on every such release before (issue 45 item 5); its verdict (10 m cells on 3,000 rows) would refuse it
    status, terminal = _on_a_terminal(["release", "run", data, "--cities", "new-york", "--epsilon", "1", "--store",
                                       tmp_path / "s", "--workers", "1", "--dataset", dataset,
                                       "--max-points-per-user", "5", "--mechanism", "identity",
                                       "--param", "cell_width_m=10", "--publish-anyway"])
    assert status == 0 and "Traceback" not in terminal and "large graph" not in terminal, terminal[-3000:]
    # the operator's terminal: the spinner follows the workers' file reads, rows included, and the fits
    assert f"data pass: 2/2 files ({sum(ROWS):,} rows)" in terminal, terminal[-3000:]
    assert "fits: 1/1 cities (new-york)" in terminal, terminal[-3000:]
    shown = _shown_in_prefect(_flow_run_of(dataset), "data pass: 2/2 files")
    assert "fits: 1/1 cities (new-york)" in shown, shown[-3000:]
    secrets = [s for n in (*ROWS, sum(ROWS)) for s in (str(n), f"{n:,}")]
    assert not _leaks(shown, secrets), _leaks(shown, secrets)
    assert pd.read_parquet(data).shape[0] == sum(ROWS)


def test_a_vdr_release_shows_its_training_steps_on_a_terminal(tmp_path):
    """VDR's VQ-VAE trains for minutes at its defaults and showed nothing (issue 45 item 5: SNH reported
    its epochs, VDR did not): its steps are a row of the fits' bar now, the loss beside them."""
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    data = tmp_path / "checkins.parquet"
    generate_checkins(city_region("new-york"), n_users=300, start="2024-01-01", days=2, seed=5).to_parquet(data)
    status, shown = _on_a_terminal(["release", "run", data, "--city", "new-york", "--epsilon", "1", "--mechanism", "vdr",
                                    "--period", "2024-01-01..2024-01-02", "--out", tmp_path / "out",
                                    "--param", "steps=30", "--param", "batch_size=2", "--param", "crop=16",
                                    "--param", "hidden=8", "--param", "n_codes=8", "--param", "code_dim=4"])
    assert status == 0, shown[-3000:]
    assert "new-york vdr training" in shown and "30/30" in shown and "steps" in shown, shown[-3000:]
    assert "VQ-VAE loss" in shown, shown[-3000:]  # on the operator's own terminal only
    assert "fits" in shown and "1/1" in shown, shown[-3000:]
