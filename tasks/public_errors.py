"""What a Prefect run may say when the private data is bad.

A task's exception becomes its run's state message, its traceback goes into the run's logs, and the
flow run fails with the same message: all of it is shown in the Prefect UI, to whoever can see the
workspace. A DataError's own message is written for the operator's terminal and may carry counts of
private rows, a row's number or its values (dpcore.data.points.ValidationReport.summary, --strict),
so the tasks that read private data raise, in its place, a DataError built from its ``public`` part
only, with a pointer to the command that shows the detail in the operator's own terminal.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TypeVar

from dpcore.data.inputs import DataError

T = TypeVar("T")


def check_command(data: object, columns: str | None = None, fmt: str = "auto", strict: bool = False) -> str:
    """The local command that prints the input's validation report to the operator's terminal."""
    cmd = ["geodp", "data", "check", str(data)]
    if columns:
        cmd += ["--columns", columns]
    if fmt and fmt != "auto":
        cmd += ["--format", fmt]
    if strict:
        cmd.append("--strict")
    return " ".join(shlex.quote(c) for c in cmd)


def public_data_error(exc: DataError, data: object, columns: str | None = None, fmt: str = "auto",
                      strict: bool = False) -> DataError:
    """A DataError that says what is wrong from public facts only, and where to see the detail."""
    what = exc.public or f"the data pass over {data} failed on the data's content"
    message = (f"{what} (counts and rows are not shown here: they describe private data; "
               f"run `{check_command(data, columns, fmt, strict)}` in your own terminal to see them)")
    return DataError(message, public=message)


def without_private_detail(run: Callable[[], T], data: object, columns: str | None = None, fmt: str = "auto",
                           strict: bool = False) -> T:
    """``run()``; a DataError it raises is replaced by :func:`public_data_error`'s.

    The replacement is raised outside the ``except`` block, so it has no ``__context__``: the
    traceback Prefect logs cannot print the private message as "during handling of ..."."""
    try:
        return run()
    except DataError as exc:
        failed = exc
    raise public_data_error(failed, _shown(data), columns, fmt, strict)


def _shown(data: object) -> str:
    """The input's public locator; an in-memory table (a backfill's one read) names its source."""
    source = getattr(data, "source", None)
    return str(source if source is not None else data)


def retry_unless_refused(task, task_run, state) -> bool:
    """A task's retry condition: retry storage hiccups, never a refusal (budget, policy, bad input or
    configuration: a GeoDPError other than a StoreError), which no retry can change."""
    from dpcore import GeoDPError
    from tasks.storage.store import IntegrityError, StoreError

    try:
        state.result()
    except GeoDPError as exc:
        return isinstance(exc, StoreError) and not isinstance(exc, IntegrityError)
    except Exception:
        return True
    return False
