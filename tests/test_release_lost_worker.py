"""A release's noise is drawn once per attempt: a Dask worker lost at any store write of its persist task
ends in a commit with one charge. One Prefect-form release (through the CLI) loses a worker right before
each of the task's nine writes in turn; each rerun uploads the same noisy bytes the flow holds, and the
tenth run commits. On the code before 6f2e8ee, the rerun after the first noisy file fitted afresh and
collided with the dead worker's file (a second draw under one charge, and a failed release). The
ledger is compared to the committed releases afterwards.

The cluster has one worker per write point and one more, so each lost worker's task moves to a live one
at once, whether or not its nanny starts a worker in its place: with one or two workers the release
stalled now and then after two to eight losses with no worker left (a nanny that did not restart its
worker closed; not diagnosed further) and the command hung until its timeout."""

import pytest

from tests.cli_runner import run_geodp
from tests.faults import attempt_files, kill_at_write_env, ledger_and_committed, write_name
from tests.test_store_faults import RELEASE, small  # noqa: F401 - the module's data fixture

#: The persist task's store writes, in order: the store id (its cache key), the claim, the charge
#: reference, the noisy files (a user-level identity release, scaled by its profile), the seal, the commit.
WRITES = ["_STORE_ID", "_CLAIM.json", "charge.json", "inner/grid.npz", "inner/synopsis.json", "synopsis.json",
          "preview.png", "_STAGED.json", "_MANIFEST.json"]


@pytest.mark.slow
def test_a_worker_lost_at_every_write_point_ends_in_one_commit_with_one_charge(prefect_harness, small, tmp_path):  # noqa: F811
    # each write point kills the first worker to reach it: the task's k-th run goes past the points its
    # predecessors died at and dies right before the k-th write; the tenth run commits
    store, log = tmp_path / "s", tmp_path / "kills.log"
    env = {**kill_at_write_env(tuple(WRITES), log, workers_only=True, once=tmp_path / "killed"),
           "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(len(WRITES) + 1),
           # ten workers and one in place of each lost one: forked from a server process that has imported
           # distributed, numpy and pandas once, instead of each a fresh interpreter importing them
           # (the fault hook is loaded there too, and counts only in the forked workers)
           "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "forkserver"}
    run_geodp("release", small, *RELEASE, "--store", store, "--workers", str(len(WRITES) + 1), env=env)
    lines = [ln.split() for ln in log.read_text().splitlines()]
    killed = [(pid, write_name(lines[i - 1][3])) for i, (pid, what, *_) in enumerate(lines) if what == "kill"]
    assert [name for _, name in killed] == WRITES, killed
    assert len({pid for pid, _ in killed}) == len(WRITES)  # each point lost another worker
    charged, committed = ledger_and_committed(store)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)
    assert all(files == [] for files in attempt_files(str(store)).values())
