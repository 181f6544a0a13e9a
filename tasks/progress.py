"""Progress of long work (the data pass, fits, training epochs) where its operator can see it.

One reporter, :class:`Progress`, fed by dpcore's plain callbacks (``progress(done, total, what)``):

- in the operator's process with stderr on a terminal: a rich bar on stderr (counts shown);
- inside a Prefect run: a log line in the run's log (the Prefect UI) every ``every_s`` seconds and at the
  end, with the counts only when they are ``public`` (files, epochs, cities: the work's size, known
  before any private data is read); a count of private rows is never logged there, only the elapsed time;
- otherwise (a pipe, a log file): a line on stderr every ``every_s`` seconds, counts shown.

dpcore never imports this module: it takes a callable and calls it (dpcore is pure)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

#: Seconds between two log lines of one reporter (bars redraw continuously).
EVERY_S = 30.0

#: Where a command's own terminal status line is (the CLI's spinner while a flow runs in its process):
#: a reporter that cannot draw a bar of its own shows its counts there. Set by :func:`shown_in`.
_STATUS: list[Callable[[str], None]] = []
#: The rich bar drawn on this terminal now: a reporter opened inside another (a model's training inside the
#: fits) adds a row to it, since a terminal holds one live display at a time.
_LIVE: list[Any] = []


@contextlib.contextmanager
def shown_in(update: Callable[[str], None]) -> Iterator[None]:
    """While this context is open, reporters in this process show their line through ``update`` (e.g.
    rich's ``Status.update``) instead of drawing a bar: one live display on a terminal at a time."""
    _STATUS.append(update)
    try:
        yield
    finally:
        _STATUS.remove(update)


def _in_prefect_run() -> bool:
    if "prefect" not in sys.modules:  # the in-process form never imports Prefect
        return False
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() is not None or FlowRunContext.get() is not None


def _main_process() -> bool:
    """Not a Dask worker or other child: several processes drawing bars on one terminal garble it."""
    return multiprocessing.parent_process() is None


def on_terminal() -> bool:
    """Whether this process may draw a bar: its stderr is a terminal and it is the command's own process."""
    try:
        return sys.stderr.isatty() and _main_process()
    except (AttributeError, ValueError):
        return False


class Progress:
    """``with Progress("data pass", unit="files", total=n) as p: ... p(done)`` (or ``p.advance()``).

    ``public``: whether the counts may go into a published log (the Prefect UI); rows of private data
    are not public, files and epochs are. ``logger``: where log lines go inside a run (default: the
    Prefect run logger); ``log=False``: the terminal only (another process logs the same work)."""

    def __init__(self, label: str, total: int | None = None, unit: str = "", *, public: bool = True,
                 every_s: float = EVERY_S, logger: logging.Logger | logging.LoggerAdapter | None = None,
                 log: bool = True):
        self.label, self.unit, self.public = label, unit, public
        self.total, self.done, self.what = total, 0, ""
        self.every_s = float(every_s)
        self.started = self._last = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        self._logger = logger
        if log and logger is None and _in_prefect_run():
            from tasks.runtime import run_logger

            self._logger = run_logger()
        self._status = _STATUS[-1] if _STATUS and on_terminal() else None
        self._owner = False
        if on_terminal() and self._status is None and _LIVE:  # inside another reporter: a row of its bar
            self._bar = _LIVE[-1]
            self._task = self._bar.add_task(label, total=total, what="", unit=unit)
        elif on_terminal() and self._status is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TextColumn("{task.fields[what]}"),
                            console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task(label, total=total, what="", unit=unit)
            self._owner = True

    # -- feeding it ------------------------------------------------------------------------------------

    def __call__(self, done: int, total: int | None = None, what: str = "", private: str = "") -> None:
        """dpcore's callback shape: ``done`` of ``total`` finished, ``what`` the step just done;
        ``private`` (e.g. rows read) shows on a terminal bar only, never in a log line."""
        self.done = int(done)
        if total is not None:
            self.total = int(total)
        self.what = str(what or "")
        if self._bar is not None:
            shown = " ".join(t for t in (self.what, private) if t)
            self._bar.update(self._task, completed=self.done, total=self.total, what=shown)
        elif self._status is not None:  # the operator's terminal: private counts may show
            of = f"/{self.total}" if self.total is not None else ""
            shown = ", ".join(t for t in (self.what, private) if t)
            self._status(f"{self.label}: {self.done}{of} {self.unit}" + (f" ({shown})" if shown else ""))
        self._maybe_log()

    def advance(self, n: int = 1, what: str = "", private: str = "") -> None:
        self(self.done + n, None, what, private)

    def epochs(self, total: int | None = None):
        """An adapter for training loops that report ``progress(epoch, loss)``: an epoch count is public,
        a loss on private data is not, so the loss is shown on a terminal bar only."""
        if total is not None:
            self.total = int(total)

        def report(epoch: int, loss: float) -> None:
            self(epoch, None, "", f"loss {loss:.4g}")

        return report

    def steps(self):
        """An adapter for training loops that report ``progress(done, total, message)`` (VDR's VQ-VAE):
        the step count is public, the message (a loss on private data) shows on a terminal bar only."""

        def report(done: int, total: int | None = None, message: str = "") -> None:
            self(done, total, "", message)

        return report

    # -- showing it ------------------------------------------------------------------------------------

    def line(self) -> str:
        """The log line: counts when public, always the elapsed time."""
        elapsed = f"{time.monotonic() - self.started:.0f} s"
        if not self.public:
            return f"{self.label}: working, {elapsed} elapsed"
        of = f"/{self.total}" if self.total is not None else ""
        unit = f" {self.unit}" if self.unit else ""
        what = f" ({self.what})" if self.what else ""
        return f"{self.label}: {self.done}{of}{unit}{what}, {elapsed} elapsed"

    def _maybe_log(self, final: bool = False) -> None:
        if self._bar is not None and self._logger is None:
            return
        now = time.monotonic()
        if not final and now - self._last < self.every_s:
            return
        self._last = now
        if self._logger is not None:
            self._logger.info(self.line())
        elif self._bar is None and not final:  # the operator's pipe or log file: no closing line
            print(self.line(), file=sys.stderr, flush=True)

    def _stop_bar(self) -> None:
        if self._bar is not None and self._owner:
            self._bar.stop()
            if self._bar in _LIVE:
                _LIVE.remove(self._bar)
        self._bar = None  # a row of another reporter's bar stays, as it ended

    def close(self) -> None:
        self._stop_bar()
        self._maybe_log(final=True)

    def __enter__(self) -> Progress:
        if self._bar is not None and self._owner:
            self._bar.start()
            _LIVE.append(self._bar)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # a failure's own line says what happened; no closing progress line
            self._stop_bar()
            return
        self.close()
