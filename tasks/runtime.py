"""Where flows run: a Dask task runner (LocalCluster or a scheduler address) and, for local commands,
one Prefect API server shared by the flow process and every Dask worker process.

Without PREFECT_API_URL, Prefect starts an *ephemeral* server per process; Dask worker processes
would each start their own (slow, and several writers on one SQLite file). ``local_prefect`` serves
one from the command's own process and exports its URL, so worker processes inherit it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tasks.lazy_task import task

if TYPE_CHECKING:
    from prefect_dask import DaskTaskRunner


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The task run's logger inside Prefect; a module logger when a task function runs bare (``.fn``)."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("geodp.tasks")


class ProgressClock:
    """When a long task should log progress: every ``every_s`` seconds, and always at the end, so a
    10-minute task shows it is moving without a line per step."""

    def __init__(self, every_s: float = 30.0):
        self.every_s = float(every_s)
        self.started = self._last = time.monotonic()

    def due(self, final: bool = False) -> bool:
        now = time.monotonic()
        if final or now - self._last >= self.every_s:
            self._last = now
            return True
        return False

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


#: Packages :func:`environment` names the versions of. The neural rows are sensitive to the environment:
#: with the same cache key and seeds, snh rows computed under other package versions or another CPU
#: differ, so each row set records where it was computed (docs/decisions/0004-snh-public-denoiser.md).
REPORTED_PACKAGES = ("torch", "numpy", "scipy", "scikit-learn", "pandas", "prefect", "dask")


def _cpu_model() -> str:
    import platform

    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def environment() -> dict[str, str]:
    """What a computed result may depend on beyond its inputs: Python's and :data:`REPORTED_PACKAGES`'
    versions ("not installed" where absent), the CPU model and the vector instructions torch's CPU kernels
    use (which kernels run, and so how they round, depends on it; a neural fit follows the rounding)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in REPORTED_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    out["machine"] = platform.machine()
    out["cpu"] = _cpu_model()
    try:
        import torch

        out["torch_cpu_capability"] = str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError):
        out["torch_cpu_capability"] = "unknown"
    return out


#: Environment variable naming the log level of a LocalCluster's Dask loggers (default WARNING).
DASK_LOG_LEVEL = "GEODP_DASK_LOG_LEVEL"
#: Environment variable choosing what a flow's own LocalCluster is made of: "threads" (the default: worker
#: threads in the flow's process) or "processes" (one process per worker).
DASK_WORKERS = "GEODP_DASK_WORKERS"


def worker_processes() -> bool:
    """Whether a flow's own LocalCluster runs its workers as processes (GEODP_DASK_WORKERS=processes).

    Threads are the default: on one machine a release's data pass then bounds every user's rows where it
    reads them, with no shuffle between processes, and no worker process imports the project (a
    release on SF cabs costs 2-3.5x less CPU this way: bench/results/2026-11-29-served-cost-4.md).
    Processes keep a crashing or memory-hungry task away from the flow's process and let a task be
    retried on another worker when one is lost; a cluster spanning machines is named by its address."""
    value = os.environ.get(DASK_WORKERS, "threads").strip().lower()
    if value not in ("threads", "processes"):
        from tasks.config import ConfigError

        raise ConfigError(f"{DASK_WORKERS} must be threads or processes, not {value!r}")
    return value == "processes"


def workers_stop_with_run(address: str | None) -> bool:
    """Whether closing the run's cluster stops every task of the run: a LocalCluster of processes (their
    nannies end them). Not a cluster the run did not start (``address``), nor one of threads: a thread
    inside a task cannot be stopped, and closing the cluster waits for it only up to a timeout."""
    return not address and worker_processes()


def dask_task_runner(address: str | None = None, n_workers: int = 2, processes: bool = True) -> DaskTaskRunner:
    """A DaskTaskRunner on an existing scheduler (``address``) or a LocalCluster of ``n_workers`` worker
    processes, or with ``processes`` False worker threads in this process (the release flows' default:
    :func:`dask_for_run`).

    The LocalCluster serves the Dask dashboard (task stream, progress) on a free loopback port, whose link
    the run log prints: a fixed :8787 collides when two flows or a flow and a test run at once, and
    ``dashboard_address=None`` still binds the scheduler's bare HTTP server to 8787."""
    from prefect_dask import DaskTaskRunner

    # A city's fit receives its fine count grid (tens of MB at fine cells) as one task argument: distributed
    # warns "Sending large graph" on every release, though the grid goes to one worker once either way
    # (scattered first, it would move the same bytes).
    warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_kwargs={
        "n_workers": int(n_workers), "threads_per_worker": 1, "processes": bool(processes),
        "dashboard_address": "127.0.0.1:0",
        # the CLI keeps worker logs ("Compute Failed … Traceback") off its terminal unless --verbose:
        # a failed task's error reaches the user as the command's one error line
        "silence_logs": logging.getLevelName(os.environ.get(DASK_LOG_LEVEL, "WARNING").upper()),
    })


@contextlib.contextmanager
def dask_for_run(address: str | None = None, n_workers: int = 2) -> Iterator[DaskTaskRunner | None]:
    """Inside a flow run: send every task this run submits to a Dask cluster chosen by the run's own
    parameters (``address``, else a LocalCluster of ``n_workers`` threads, or processes:
    :func:`worker_processes`), and log its dashboard link.

    A served deployment reloads its flow from the entrypoint with Prefect's default runner, so a task
    runner set with ``with_options`` never reaches a served run; choosing it here, from the parameters,
    makes served runs, CLI runs and deployments run alike. A run already on Dask (a backfill's releases)
    keeps its cluster; outside a flow run (the in-process pipeline) nothing changes."""
    from prefect.context import FlowRunContext
    from prefect_dask import DaskTaskRunner

    ctx = FlowRunContext.get()
    if ctx is None or isinstance(ctx.task_runner, DaskTaskRunner):
        yield ctx.task_runner if ctx is not None else None
        return
    with dask_task_runner(address, n_workers, worker_processes()) as runner:
        link = dashboard_link(runner)
        if link:
            run_logger().info("Dask dashboard: %s", link)
        with ctx.model_copy(update={"task_runner": runner}):
            yield runner


def dashboard_link(runner: object | None = None) -> str | None:
    """The dashboard URL of ``runner`` (default: the current flow run's) when it is a Dask runner."""
    from prefect_dask import DaskTaskRunner

    if runner is None:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        runner = ctx.task_runner if ctx is not None else None
    if not isinstance(runner, DaskTaskRunner):
        return None
    try:
        return reachable_dashboard(runner.client.dashboard_link, runner.client.scheduler.address)
    except (RuntimeError, AttributeError):
        return None


def reachable_dashboard(link: str | None, scheduler_address: str) -> str | None:
    """The dashboard ``link`` Dask gives, on the loopback for a cluster of threads (an ``inproc://``
    scheduler): Dask names such a cluster by the machine's address, while :func:`dask_task_runner`'s
    dashboard listens on 127.0.0.1 only."""
    if not link or not str(scheduler_address).startswith("inproc://"):
        return link or None
    from urllib.parse import urlsplit

    parts = urlsplit(link)
    return parts._replace(netloc=f"127.0.0.1:{parts.port}").geturl()


@task(name="where-it-runs")
def where_it_runs() -> dict:
    """The Dask worker (address, process id) this task ran on; worker None outside Dask. The release
    flow submits one next to each city's tasks, so its summary shows where the work went."""
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):
        address = None
    return {"worker": address, "pid": os.getpid()}


def _api_url_configured() -> bool:
    if os.environ.get("PREFECT_API_URL"):
        return True
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())


@contextlib.contextmanager
def local_prefect(timeout: int = 120) -> Iterator[str | None]:
    """Use the configured Prefect API, or serve a one-off one from this process for this command and stop
    it after (:class:`ThreadServer`).

    Yields the API URL in use (None when an external one is configured and not known here).
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.core"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if _api_url_configured():
        yield os.environ.get("PREFECT_API_URL")
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = ThreadServer()
    try:  # a SIGTERM while the server is still starting must stop it too
        server.start(timeout=timeout)
        os.environ["PREFECT_API_URL"] = server.api_url
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            try:
                yield server.api_url
            finally:
                _drain_logs()
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


#: the name of the thread that serves a command's one-off Prefect API (in Python and in the OS)
SERVER_THREAD = "prefect-api"


class ThreadServer:
    """Prefect's one-off API server (its ephemeral app: no UI, no background services) served by uvicorn
    on a thread of this process, on a free loopback port that worker processes reach too.

    Prefect's own one-off server is a uvicorn child that imports Prefect and its server a second time:
    5.7-6 CPU-s to start, about as much as the rest of a release's Prefect form
    (bench/results/2026-11-29-served-cost-5.md). On a thread the server ends with the process however it
    ends (``kill -9`` included), and a Ctrl-C reaches the command only, which stops the server last."""

    def __init__(self) -> None:
        self._server = None
        self._thread = None
        self.port: int | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self, timeout: float = 120) -> None:
        import socket
        import threading

        import uvicorn
        from prefect.server.api.server import create_app

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        app = create_app(ephemeral=True, final=True)
        # uvicorn installs no signal handlers off the main thread: SIGTERM and Ctrl-C stay the command's
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
        self._thread = threading.Thread(target=self._serve, args=(sock,), name=SERVER_THREAD, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the local Prefect API server did not start on port {self.port}")
            time.sleep(0.05)

    def _serve(self, sock) -> None:
        # the thread's name in the OS too (/proc/PID/task/TID/comm), so a process tree's CPU can be split
        # between the server and the command (bench/bench_served_cost.py)
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None).prctl(15, SERVER_THREAD.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        self._server.run(sockets=[sock])

    def stop(self, timeout: float = 10) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def _drain_logs() -> None:
    """Send queued run logs before the server goes away (else the exit waits on failed retries)."""
    try:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)
    except Exception:
        pass
