"""Test-only start-up hook: Python imports ``sitecustomize`` when this folder is on PYTHONPATH
(tests/faults.py puts it there for the crash tests' CLI subprocesses). It patches nothing unless
GEODP_TEST_KILL_AT_WRITE, GEODP_TEST_PAUSE_AT_WRITE or GEODP_TEST_QUOTE_AT_CHECK is set; with Dask workers
from a forkserver, it waits for that server at exit."""

import os

if os.environ.get("GEODP_TEST_KILL_AT_WRITE"):
    from tests.faults import FAULT_LOG, KILL_AT_WRITE, KILL_IN_WORKERS_ONLY, KILL_ONCE, kill_at_store_write

    points = tuple(int(v) if v.isdigit() else v for v in os.environ[KILL_AT_WRITE].split(","))
    kill_at_store_write(points[0] if len(points) == 1 else points, os.environ[FAULT_LOG],
                        workers_only=bool(os.environ.get(KILL_IN_WORKERS_ONLY)), once=os.environ.get(KILL_ONCE))

if os.environ.get("GEODP_TEST_PAUSE_AT_WRITE"):
    from tests.faults import FAULT_LOG, PAUSE_AT_WRITE, pause_at_store_write

    point = os.environ[PAUSE_AT_WRITE]
    pause_at_store_write(int(point) if point.isdigit() else point, os.environ[FAULT_LOG])

if os.environ.get("GEODP_TEST_QUOTE_AT_CHECK"):
    from tests.faults import quote_data_at_check

    quote_data_at_check()

if os.environ.get("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD") == "forkserver":
    # Dask workers forked from a server process (tests/test_release_lost_worker.py): the server outlives this
    # process unless stopped, and then nobody waits for it, so its CPU and its workers' would count nowhere
    # (not in this process's children, not in the test's). Registered first, this runs last, once the
    # cluster is closed: the server stops when its "alive" pipe closes, and this process reaps it.
    import atexit

    def _reap_forkserver() -> None:
        from multiprocessing import forkserver

        forkserver._forkserver._stop()

    atexit.register(_reap_forkserver)
