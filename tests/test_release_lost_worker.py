"""A release's noise is drawn once per attempt: a Dask worker lost at a store write of its persist task
ends in a commit with one charge. A Prefect-form release (through the CLI) loses its worker right
after its first noisy file reached the attempt, and the worker the nanny starts in its place, which
runs the task again and uploads the same noisy bytes the flow holds, is lost too, right before the
manifest; a third commits. On the code before, the retry fitted afresh and collided with the dead
worker's file (a second draw under one charge, and a failed release). The ledger is compared to the
committed releases afterwards."""

import pytest

from tests.cli_runner import run_geodp
from tests.faults import attempt_files, kill_at_write_env, ledger_and_committed
from tests.test_store_faults import RELEASE, small  # noqa: F401 - the module's data fixture

#: The persist task's store writes, in order: the store id (its cache key), the claim, the charge
#: reference, the noisy files (a user-level identity release, scaled by its profile), the seal, the commit.
WRITES = ["_STORE_ID", "_CLAIM.json", "charge.json", "inner/grid.npz", "inner/synopsis.json", "synopsis.json",
          "preview.png", "_STAGED.json", "_MANIFEST.json"]


@pytest.mark.slow
# the retried task finds its claim made, so its writes are numbered one lower from the claim on
@pytest.mark.parametrize(("points", "before"), [((5, 8), ["inner/synopsis.json", "_MANIFEST.json"])],
                         ids=["after-the-first-noisy-file-then-before-the-manifest"])
def test_workers_lost_mid_upload_end_in_one_commit_with_one_charge(points, before, prefect_harness, small, tmp_path):  # noqa: F811
    store, log = tmp_path / "s", tmp_path / "kills.log"
    env = {**kill_at_write_env(points, log, workers_only=True, once=tmp_path / "killed"),
           "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(len(WRITES) + 1)}
    run_geodp("release", small, *RELEASE, "--store", store, "--workers", "1", env=env)
    lines = log.read_text().splitlines()
    died_before = [lines[i - 1].split()[3] for i, ln in enumerate(lines) if " kill at write " in ln]
    assert [w.split("/v1/")[-1].split("/", 1)[-1] if "/a-" in w else w.rsplit("/", 1)[-1]
            for w in died_before] == before, died_before
    charged, committed = ledger_and_committed(store)
    assert charged == pytest.approx(committed) == pytest.approx(0.1)
    assert all(files == [] for files in attempt_files(str(store)).values())
