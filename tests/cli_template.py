"""A process that has imported the CLI's modules and forks one child per `geodp` command (tests/cli_runner.py).

Importing the CLI and what a release uses (pandas, pydantic, matplotlib, the mechanisms) is most of a
short command's CPU (bench/bench_startup.py). A child forked from here skips it and is
otherwise the command run as ``python -m flows.cli ARGS``: its own process with the request's
environment, working directory, argv, stdout and stderr files, signals, exit status and interpreter
shutdown (atexit). The runner uses a template only when the variables read at import time (DASK_*,
FSSPEC_*, MPL*, PYTHON*, PREFECT_*, thread counts, locale) are the ones this process started with; one started
under a Prefect server (PREFECT_API_URL, the session's harness) has imported Prefect and Dask's distributed too.

Protocol, one JSON object per line: {"ready"} on the fd given as argv[2] once the modules are imported;
then per request {"argv", "env", "path", "cwd", "out", "err", "sitecustomize"} on argv[1], answered on argv[2]
with {"pid"} once forked and {"status"} (the wait status) when the child is done.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys


def _preload() -> None:
    # what a short command imports on first use: a child that imports it again pays it every time
    # (an s3:// store or input: s3fs and botocore, 0.4 CPU-s a command)
    import dask.dataframe  # noqa: F401 - the user-level data pass over several files
    import matplotlib.pyplot  # noqa: F401 - release previews (a Figure), evaluation plots (pyplot)
    import s3fs  # noqa: F401
    from PIL import Image

    import dpcore.mechanisms.identity
    import dpcore.privacy.scaling
    import dpcore.queries.range  # noqa: F401
    import flows.cli
    import flows.release
    import geodp.api  # noqa: F401
    import tasks.release_plan
    import tasks.release_usefulness  # noqa: F401

    Image.init()  # the image plugins a preview's PNG loads on first use

    for name in ("release", "query", "ledger", "dataset", "data", "cities"):  # the commands tests run most
        flows.cli.load(name)

    # Prefect and distributed read their settings (PREFECT_API_URL, PREFECT_HOME…) from the environment
    # when imported: a command that runs a flow must import them under its own
    stale = sorted(m for m in ("prefect", "distributed") if m in sys.modules)
    if stale:
        raise SystemExit(f"the CLI's modules imported {stale}: a template would hold their start-up settings")
    if os.environ.get("PREFECT_API_URL"):
        _preload_prefect()


def _preload_prefect() -> None:
    """Under a configured Prefect server (the session's harness), the libraries a flow run imports: ~1.3 CPU-s
    of every Prefect-form command. They read their settings here, so the runner gives this template only
    commands whose PREFECT_* (and DASK_*) variables are this process's. The project's own flows and tasks
    are not made here: a fault site patches their functions in the child before they are."""
    import distributed  # noqa: F401
    import prefect
    import prefect.artifacts
    import prefect.cache_policies
    import prefect.client.orchestration
    import prefect.deployments
    import prefect.flow_engine
    import prefect.runtime
    import prefect.task_engine  # noqa: F401
    import prefect_dask  # noqa: F401


def _become_command(request: dict) -> None:
    """In the forked child: the request's fds, environment and path, then ``python -m flows.cli ARGV``."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # Ctrl-C as a terminal delivers it, whatever the test process inherited or set (a SIGINT ignored there
    # is ignored in every process it starts, and a command's Ctrl-C test then waits out its pause)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request["cwd"])  # the template imported its modules from the repository root
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:0] = request["path"]  # PYTHONPATH entries this process did not start with (the fault site)
    import numpy as np

    # numpy's legacy global generator starts from fresh entropy in a new process, not from the template's
    np.random.seed()  # noqa: NPY002
    if request["sitecustomize"]:  # what Python runs at start-up when that folder is on PYTHONPATH
        runpy.run_path(request["sitecustomize"], run_name="sitecustomize")
    sys.argv = ["flows.cli", *request["argv"]]
    runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)


def serve(requests_fd: int, answers_fd: int) -> None:
    requests = os.fdopen(requests_fd, "r")
    answers = os.fdopen(answers_fd, "w")
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            answers.close()
            _become_command(request)
            return  # the command returned without sys.exit: the child exits 0, with normal shutdown
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"status": status}) + "\n")
        answers.flush()
    os._exit(0)  # the runner closed its end: the test session is over


if __name__ == "__main__":
    _preload()
    # the imported modules' objects move to the permanent generation: a child's collections and its
    # interpreter shutdown then leave their pages alone instead of copying every page the template
    # shares with it (a ledger command: 0.6 CPU-s of copy-on-write page faults without this, 0.15 with)
    gc.collect()
    gc.freeze()
    serve(int(sys.argv[1]), int(sys.argv[2]))
