"""What a Prefect run may say when the private data is bad.

A task's exception becomes its run's state message, its traceback goes into the run's logs, and the
flow run fails with the same message: all of it is shown in the Prefect UI, to whoever can see the
workspace. A DataError's own message is written for the operator's terminal and may carry counts of
private rows, a row's number or its values (dpcore.data.points.ValidationReport.summary, --strict),
so the tasks that read private data raise, in its place, a DataError built from its ``public`` part
only, with a pointer to the command that shows the detail in the operator's own terminal.

Any other exception raised there (pandas, pyarrow, numpy or dask failing on an unusual input, a
KeyError or ValueError whose message quotes an id, a value or a count) is replaced likewise, by a
:class:`PrivateDataFailure` that names only its type. geodp's other refusals (GeoDPError: a store, a
policy, a bad configuration) pass as they are: their messages are built from public facts. The
in-process form (``--no-prefect``, ``--out``) calls the steps' functions directly and shows every
detail in the operator's terminal.
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


class PrivateDataFailure(RuntimeError):
    """A step that reads private data failed with an exception that is not geodp's (its type only).

    Not a GeoDPError: a task may retry it (a lost worker, a storage hiccup inside a library), which
    :func:`retry_unless_refused` refuses only for geodp's refusals."""


def public_failure(exc: BaseException, data: object, columns: str | None = None, fmt: str = "auto",
                   strict: bool = False, step: str = "the data pass", hint: str | None = None) -> PrivateDataFailure:
    """A one-line failure naming ``exc``'s type only: its message and traceback may quote private data.
    ``hint`` says where the operator sees it (default: the check command, or --no-prefect)."""
    hint = hint or f"run `{check_command(data, columns, fmt, strict)}`, or the same command with --no-prefect,"
    return PrivateDataFailure(f"{step} over {data} failed with {type(exc).__name__} (its message is not shown "
                              f"here: it may quote private data; {hint} in your own terminal to see it)")


def without_private_detail(run: Callable[[], T], data: object, columns: str | None = None, fmt: str = "auto",
                           strict: bool = False, step: str = "the data pass", hint: str | None = None) -> T:
    """``run()``; a DataError it raises is replaced by :func:`public_data_error`'s, any other exception
    but geodp's public refusals (a GeoDPError) by :func:`public_failure`'s.

    The replacement is raised outside the ``except`` block, so it has no ``__context__`` or
    ``__cause__``: the traceback Prefect logs cannot print the private message as "during handling
    of ...", and the original's frames, notes and chain are dropped with it."""
    from dpcore import GeoDPError

    try:
        return run()
    except DataError as exc:
        failed: Exception = public_data_error(exc, _shown(data), columns, fmt, strict)
    except (GeoDPError, PrivateDataFailure):  # public already (a worker's read made the latter)
        raise
    except Exception as exc:
        failed = public_failure(exc, _shown(data), columns, fmt, strict, step, hint)
    raise failed


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
