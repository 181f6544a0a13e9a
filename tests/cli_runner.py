"""Run the `geodp` CLI as a user would: a process of its own running ``python -m flows.cli ARGS`` from the
repository root, with its own environment, exit status and output.

The process is forked from a template that has already imported the CLI's modules
(tests/cli_template.py), which makes a command 3-8 times cheaper in CPU; it is a real
``python -m flows.cli`` subprocess instead when GEODP_TEST_FRESH_CLI=1, or when the command's
environment differs from the template's in what is read at import time."""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULT_SITE = Path(__file__).resolve().parent / "fault_site"
#: Environment variables that modules read when imported (so a template imported them under its own).
#: PREFECT_*: a template made under a Prefect server (the session's harness) has imported Prefect.
IMPORT_TIME = ("DASK_", "FSSPEC_", "S3FS_", "AIOHTTP_", "YARL_", "MULTIDICT_", "FROZENLIST_", "PROPCACHE_", "MPL",
               "PYTHON", "OMP_", "OPENBLAS_", "MKL_", "ARROW_", "NUMEXPR_", "LANG", "LC_", "PREFECT_")


def run_geodp(*args, ok: bool = True, env: dict | None = None, timeout: float = 300,
              cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``geodp ARGS`` in ``cwd`` (default: the repository root); with ``ok`` the exit status must be 0 (stderr
    is shown otherwise)."""
    full_env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    cmd = [sys.executable, "-m", "flows.cli", *map(str, args)]
    cwd = str(cwd or ROOT)
    template = None if os.environ.get("GEODP_TEST_FRESH_CLI") == "1" else _Template.idle_one(full_env)
    if template is None:
        # the repository root stays importable from another folder, as it is in the template
        fresh_env = {**full_env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), full_env.get("PYTHONPATH"))
                                                                if p)} if cwd != str(ROOT) else full_env
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=fresh_env, timeout=timeout,
                              preexec_fn=_terminal_signals)
    else:
        try:
            proc = template.run(cmd, full_env, timeout, cwd)
        except BaseException:
            template.close()  # a command may still be in flight: its answers must not reach the next one
            raise
        _Template.give_back(template)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _terminal_signals() -> None:
    """In a command's process before it starts: Ctrl-C and SIGTERM as a terminal delivers them (an ignored
    SIGINT is inherited, and Python then installs no KeyboardInterrupt for it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _template_env() -> dict:
    """The environment a new template starts with: this process's."""
    return {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _import_time_view(env: dict) -> tuple[dict, list[str]]:
    """(the variables read at import time but PYTHONPATH, PYTHONPATH's entries)."""
    view = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k != "PYTHONPATH"}
    return view, [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


class _Template:
    """One template process (tests/cli_template.py); it runs one command at a time."""

    _idle: list[_Template] = []
    _lock = threading.Lock()
    _broken = False  # a template failed to start: every command runs as a fresh subprocess

    def __init__(self):
        env = _template_env()  # never a command's own
        self.view, self.path = _import_time_view(env)
        req_r, self._req_w = os.pipe()
        self._ans_r, ans_w = os.pipe()
        self._log = tempfile.NamedTemporaryFile(prefix="geodp-cli-template-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.cli_template", str(req_r), str(ans_w)], cwd=ROOT,
                                     env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     pass_fds=(req_r, ans_w))
        os.close(req_r)
        os.close(ans_w)
        self._buffer = b""
        atexit.register(self.close)

    def fits(self, env: dict) -> bool:
        """The command's environment agrees with the template's on what is read at import time (its
        PYTHONPATH may add the fault site and the repository root, which the child puts on sys.path)."""
        view, path = _import_time_view(env)
        return view == self.view and set(path) - set(self.path) <= {str(FAULT_SITE), str(ROOT)}

    @classmethod
    def idle_one(cls, env: dict) -> _Template | None:
        """An idle template that fits ``env`` (a new one when all are busy), or None (a fresh subprocess)."""
        with cls._lock:
            if cls._broken:
                return None
            # a template made before this process's environment changed (the session's Prefect server
            # started, a test set a DASK_ variable) fits none of its commands any more: a new one replaces it
            now = _import_time_view(_template_env())
            stale = [t for t in cls._idle if (t.view, t.path) != now]
            cls._idle = [t for t in cls._idle if t not in stale]
            idle = cls._idle.pop(0) if cls._idle else None
        for t in stale:
            t.close()
        if idle is not None:
            return idle if idle.fits(env) else cls.give_back(idle)
        template = cls()
        try:
            template._answer(120)  # ready: it has imported the CLI's modules
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            cls._broken = True
            print(f"CLI template unusable, running fresh subprocesses: {exc}", file=sys.stderr)
            template.close()
            return None
        return template if template.fits(env) else cls.give_back(template)

    @classmethod
    def give_back(cls, template: _Template) -> None:
        """Return ``template`` to the idle ones (None, for :meth:`idle_one`)."""
        with cls._lock:
            if template.proc.poll() is None:
                cls._idle.append(template)

    def run(self, cmd: list[str], env: dict, timeout: float, cwd: str) -> subprocess.CompletedProcess:
        _, path = _import_time_view(env)
        extra = [p for p in path if p not in self.path]
        with tempfile.TemporaryDirectory(prefix="geodp-cli-") as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            request = {"argv": cmd[3:], "env": env, "out": str(out), "err": str(err), "path": extra, "cwd": cwd,
                       "sitecustomize": str(FAULT_SITE / "sitecustomize.py") if str(FAULT_SITE) in extra else None}
            os.write(self._req_w, (json.dumps(request) + "\n").encode())
            pid = self._answer(60)["pid"]
            try:
                status = self._answer(timeout)["status"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._answer(60)
                raise subprocess.TimeoutExpired(cmd, timeout, _text(out), _text(err)) from None
            return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), _text(out), _text(err))

    def _answer(self, timeout: float) -> dict:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._ans_r], [], [], timeout)
            chunk = os.read(self._ans_r, 4096) if ready else None
            if chunk is None:
                raise subprocess.TimeoutExpired("geodp", timeout)
            if not chunk:
                raise RuntimeError(f"the CLI template exited: {Path(self._log.name).read_text()[-3000:]}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self._req_w < 0:
            return
        os.close(self._req_w)  # the template reads end-of-file and exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._ans_r)
        os.unlink(self._log.name)
        self._req_w = -1


def _text(path: Path) -> str:
    """What ``subprocess.run(text=True)`` makes of the bytes: the locale's encoding, universal newlines."""
    data = path.read_bytes() if path.exists() else b""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def bounded_total(release: str, region) -> float:
    """The release's noisy count of the k-bounded points over the whole region (a release scaled to
    full counts by its contribution profile holds them as its inner synopsis)."""
    import shutil

    from dpcore.synopsis.base import load_synopsis
    from tasks.storage.store import fetch_to_temp

    _, folder = fetch_to_temp(release)
    try:
        synopsis = load_synopsis(folder)
        synopsis = getattr(synopsis, "inner", synopsis)
        return float(synopsis.answer(region.box_latlon_to_m([region.bbox_latlon()]))[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def local_prefect_api(pid: int) -> str | None:
    """The URL of the Prefect API that process ``pid`` serves itself (a command with no PREFECT_API_URL
    serves a one-off one on a loopback port: tasks.runtime.local_prefect), once it answers; else None."""
    import urllib.request

    import psutil

    try:
        ports = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1"}
    except psutil.Error:
        return None
    for port in sorted(ports):
        url = f"http://127.0.0.1:{port}/api"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200 and answer.read().strip() == b"true":
                    return url
        except OSError:
            continue
    return None


def answers(api_url: str) -> bool:
    """Whether a Prefect API answers at ``api_url``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2):
            return True
    except OSError:
        return False
