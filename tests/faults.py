"""Test-only fault injection: production modules carry no fault hooks; these patch them in the process
where the fault must happen, and leave evidence there that it did.

- :func:`slow_down` makes a module-level function sleep before each call, in the process it runs in (a
  Dask worker, through ``client.run``). Each slowed call first creates a mark file named after the
  function and the process id, so a test knows which worker process is inside the slowed step right
  now and can check that the patch reached the workers at all.
- :func:`kill_at_store_write` SIGKILLs the process right before its N-th store write
  (``ReleaseStore.create``), as a power cut or ``kill -9`` would. A CLI subprocess gets it through
  ``fault_site/sitecustomize.py`` (see :func:`kill_at_write_env`), and logs every write it counted.

Patch targets are functions looked up in their module's namespace at call time, so a task whose
function was pickled elsewhere and unpickled on the worker still calls the patched one.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULT_SITE = Path(__file__).resolve().parent / "fault_site"

#: (module, function) that each step of a release calls while it runs on a worker: a file read inside
#: the data pass, and the privatize task's fit input (built before any noise is drawn). A task's function
#: reaches the worker pickled by value or by reference, so a name it calls may be looked up where it is
#: defined or where a module imported it: :func:`slow_down` patches every loaded module that holds it
#: (a package's re-export included), and modules imported afterwards take the patched one from them.
READ = ("dpcore.data.chunks", "read_part")
PRIVATIZE = ("dpcore.mechanisms.inputs", "input_for")

KILL_AT_WRITE = "GEODP_TEST_KILL_AT_WRITE"
QUOTE_AT_CHECK = "GEODP_TEST_QUOTE_AT_CHECK"
KILL_IN_WORKERS_ONLY = "GEODP_TEST_KILL_IN_WORKERS_ONLY"
KILL_ONCE = "GEODP_TEST_KILL_ONCE"
PAUSE_AT_WRITE = "GEODP_TEST_PAUSE_AT_WRITE"
FAULT_LOG = "GEODP_TEST_FAULT_LOG"


def slow_down(module: str, name: str, seconds: float, marks: str) -> int:
    """In this process, make ``module.name`` sleep ``seconds`` before each call, creating
    ``marks/<name>-<pid>-<id>`` first. Returns this process's id. Patching twice keeps one wrapper."""
    mod = importlib.import_module(module)
    original = getattr(getattr(mod, name), "__fault_original__", getattr(mod, name))

    @functools.wraps(original)
    def slowed(*args, **kwargs):
        (Path(marks) / f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()
        time.sleep(seconds)
        return original(*args, **kwargs)

    slowed.__fault_original__ = original
    for holder in _holders(name, original):
        setattr(holder, name, slowed)
    return os.getpid()


def _holders(name: str, value: object) -> list:
    """The loaded modules whose attribute ``name`` is ``value`` (where it is defined, and re-exports)."""
    return [m for m in list(sys.modules.values()) if m is not None and getattr(m, name, None) is value]


def is_slowed(module: str, name: str) -> bool:
    return hasattr(getattr(importlib.import_module(module), name), "__fault_original__")


def restore(module: str, name: str) -> bool:
    """Undo :func:`slow_down` in this process; False when it was not patched here."""
    mod = importlib.import_module(module)
    slowed = getattr(mod, name)
    original = getattr(slowed, "__fault_original__", None)
    if original is None:
        return False
    for holder in _holders(name, slowed):
        setattr(holder, name, original)
    return True


def marked_pids(marks: str | Path, name: str) -> list[int]:
    """Process ids that entered the slowed ``name``, in the order the marks were made."""
    files = sorted(Path(marks).glob(f"{name}-*"), key=lambda p: p.stat().st_mtime_ns)
    return [int(p.name.split("-")[-2]) for p in files]


def write_name(rel: str) -> str:
    """A store write's name as the kill points give it: its path inside its attempt folder
    (``inner/grid.npz``), else its last part (``_CLAIM.json``)."""
    m = re.search(r"/v\d+/a-[^/]+/(.+)$", rel)
    return m.group(1) if m else rel.rsplit("/", 1)[-1]


def kill_at_store_write(n: int | str | tuple[int | str, ...], log: str, workers_only: bool = False, once: str | None = None) -> None:
    """SIGKILL this process right before its ``n``-th ``ReleaseStore.create``; every counted write
    (and the kill) is appended to ``log`` first. With ``workers_only`` only a process that
    multiprocessing started (a LocalCluster's Dask worker) counts and dies; the CLI's own does not.
    ``n`` may be several write numbers or file names (:func:`write_name`); with ``once`` (a path) each
    of them kills only the first process to reach it (which creates ``once.N``): a worker started in a
    dead one's place runs past the writes that killed its predecessors and dies at the next point. Names
    stay put where numbers shift (a retry skips the claim it already made), so a list of every name kills
    one worker right before each write of a task in turn."""
    import multiprocessing

    from tasks.storage.store import ReleaseStore

    original = ReleaseStore.create
    count = [0]
    points = {n} if isinstance(n, (int, str)) else set(n)

    def create(self, rel: str, data: bytes) -> None:
        if workers_only and multiprocessing.parent_process() is None:
            return original(self, rel, data)
        count[0] += 1
        # a point is a write number, or a file's name (its path inside an attempt, else its last part)
        name = write_name(rel)
        point = count[0] if count[0] in points else name if name in points else None
        dies = point is not None
        if dies and once is not None:
            try:
                os.close(os.open(f"{once}.{str(point).replace('/', '_')}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                dies = False
        with open(log, "a") as f:
            f.write(f"{os.getpid()} write {count[0]} {rel}\n")
            if dies:
                f.write(f"{os.getpid()} kill at write {count[0]}\n")
        if dies:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, rel, data)

    ReleaseStore.create = create


def pause_at_store_write(n: int | str, mark: str) -> None:
    """Right before this process's ``n``-th ``ReleaseStore.create`` (or its write named ``n``, as
    :func:`write_name` gives it: a Dask worker's persist writes ``_CLAIM.json`` after the charge), create
    ``mark`` (holding this process's id and the path about to be written) and wait until the test deletes
    it (having cut the storage meanwhile); then the write goes ahead."""
    from tasks.storage.store import ReleaseStore

    original = ReleaseStore.create
    count = [0]

    def create(self, rel: str, data: bytes) -> None:
        count[0] += 1
        if n in (count[0], write_name(rel)):
            tmp = Path(f"{mark}.{os.getpid()}")
            tmp.write_text(f"{os.getpid()} {rel}")
            tmp.rename(mark)  # whole: a test that sees the mark reads the id
            deadline = time.monotonic() + 120
            while Path(mark).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return original(self, rel, data)

    ReleaseStore.create = create


def stall_at_write(name: str, mark: str, then_die: bool = False) -> int:
    """In this process (a Dask worker, through ``client.run``): the first ``ReleaseStore.create`` of a file
    named ``name`` (:func:`write_name`) among the processes sharing ``mark`` creates ``mark`` (this
    process's id and the path) and waits until the test deletes it; then the write goes ahead and, with
    ``then_die``, the process is SIGKILLed right after it (before the writer can look at its seal).
    Returns this process's id; :func:`restore_create` undoes it."""
    from tasks.storage.store import ReleaseStore

    original = getattr(ReleaseStore.create, "__fault_original__", ReleaseStore.create)

    def create(self, rel: str, data: bytes) -> None:
        if write_name(rel) != name:
            return original(self, rel, data)
        try:
            os.close(os.open(f"{mark}.taken", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return original(self, rel, data)  # another process stalled here already
        tmp = Path(f"{mark}.{os.getpid()}")
        tmp.write_text(f"{os.getpid()} {rel}")
        tmp.rename(mark)
        deadline = time.monotonic() + 600
        while Path(mark).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        original(self, rel, data)
        if then_die:
            os.kill(os.getpid(), signal.SIGKILL)

    create.__fault_original__ = original
    ReleaseStore.create = create
    return os.getpid()


def restore_create() -> bool:
    """Undo :func:`stall_at_write` in this process; False when it was not patched here."""
    from tasks.storage.store import ReleaseStore

    original = getattr(ReleaseStore.create, "__fault_original__", None)
    if original is not None:
        ReleaseStore.create = original
    return original is not None


def quote_data_at_check() -> None:
    """Make each file's validation (dpcore.data.chunks.check_part, right after its read) fail as a
    library's error does when it quotes the data it choked on: a KeyError naming the file's first user
    id, with a note quoting the first row's latitude, raised from a ValueError that quotes it too."""
    from dpcore.data import chunks

    def check_part(part):
        user = part.uniques[part.codes[0]] if part.codes is not None else part.user_int[0]
        try:
            raise ValueError(f"could not convert latitude {float(part.lat[0])!r}")
        except ValueError as exc:
            failed = KeyError(str(user))
            failed.add_note(f"while checking user {user} at latitude {float(part.lat[0])!r}")
            raise failed from exc

    chunks.check_part = check_part


def quote_data_env() -> dict[str, str]:
    """The environment that makes a CLI subprocess and its Dask workers fail as :func:`quote_data_at_check`."""
    path = os.pathsep.join(p for p in (str(FAULT_SITE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {QUOTE_AT_CHECK: "1", "PYTHONPATH": path}


def pause_at_write_env(n: int | str, mark: Path) -> dict[str, str]:
    """The environment that makes a CLI subprocess pause at its ``n``-th store write (see above)."""
    path = os.pathsep.join(p for p in (str(FAULT_SITE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {PAUSE_AT_WRITE: str(n), FAULT_LOG: str(mark), "PYTHONPATH": path}


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (host, port) that a test can cut (every
    connection closed, new ones refused, as when an S3 endpoint goes down) and restore on the same port."""

    def __init__(self, target: tuple[str, int]):
        import socket

        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._conns: list = []
        self._server = None
        self.restore()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        import socket
        import threading

        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        self._server.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self._conns.clear()

    def _accept(self, server) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass


def kill_at_write_env(n: int | str | tuple[int | str, ...], log: Path, workers_only: bool = False,
                      once: Path | None = None) -> dict[str, str]:
    """The environment that makes a Python subprocess (a CLI run) die at its ``n``-th store write; with
    ``workers_only``, each of its Dask worker processes at its own ``n``-th write instead (the flow's
    LocalCluster is then made of processes: by default its workers are threads of the flow's process);
    several numbers with ``once``: see :func:`kill_at_store_write`."""
    path = os.pathsep.join(p for p in (str(FAULT_SITE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    numbers = str(n) if isinstance(n, (int, str)) else ",".join(map(str, n))
    workers = {KILL_IN_WORKERS_ONLY: "1", "GEODP_DASK_WORKERS": "processes"} if workers_only else {}
    return {KILL_AT_WRITE: numbers, FAULT_LOG: str(log), "PYTHONPATH": path, **workers,
            **({KILL_ONCE: str(once)} if once else {})}


def ledger_and_committed(store: str | Path, env: dict | None = None) -> tuple[float, float]:
    """Through the CLI, as an operator checks: the lifetime loss `geodp ledger --json` reports (summed
    over the store's datasets) and the sum of ε over the committed releases `geodp releases list` shows."""
    import json

    from tests.cli_runner import run_geodp

    ledger = json.loads(run_geodp("ledger", store, "--json", env=env).stdout)
    releases = json.loads(run_geodp("releases", "list", store, "--json", env=env).stdout)
    return (sum(row["loss"]["lifetime"] for row in ledger),
            sum(r["epsilon"] for r in releases))


def attempt_files(store_url: str) -> dict[str, list[str]]:
    """Every attempt folder in the store (any release key) → the files in it that may hold noise, for
    the attempts no manifest names."""
    from tasks.storage.store import ReleaseRef, ReleaseStore

    store = ReleaseStore(store_url)
    out = {}
    for ds in store.listdir("releases"):
        for city in store.listdir(f"releases/{ds}"):
            for period in store.listdir(f"releases/{ds}/{city}"):
                for n in store.versions(ds, city, period):
                    ref = ReleaseRef(ds, city, period, n)
                    m = store.manifest(ref)
                    committed = m.attempt if m is not None else None
                    for attempt in store.attempts(ref):
                        if attempt != committed:
                            out[f"{ref.rel}/{attempt}"] = store.attempt_data(ref, attempt)
    return out
