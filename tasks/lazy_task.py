"""Prefect tasks made on first use.

Importing Prefect costs about 0.7 s of CPU, and the in-process commands (`geodp release --out` or
`--no-prefect`, `release plan`) only ever call a task's plain function (``.fn``). :func:`task` keeps
the function and Prefect's options, and makes the real ``prefect.Task`` the first time anything else
is asked of it (``submit``, a call inside a flow, ``with_options``, ``name``…): a flow run gets the same
Prefect task it always did, and a process that never runs a flow never imports Prefect.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

#: ``cache_policy=NO_CACHE`` without importing ``prefect.cache_policies`` (part of Prefect's import).
NO_CACHE = "no-cache"


class LazyTask:
    """A Prefect task whose ``prefect.Task`` is made on first use; ``.fn`` is the plain function."""

    def __init__(self, fn: Callable, options: dict[str, Any]):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._options = options
        self._task = None

    def prefect_task(self):
        """The ``prefect.Task`` (made now if it was not yet)."""
        if self._task is None:
            from prefect import task
            from prefect.cache_policies import NO_CACHE as PREFECT_NO_CACHE

            options = dict(self._options)
            if options.get("cache_policy") == NO_CACHE:
                options["cache_policy"] = PREFECT_NO_CACHE
            self._task = task(**options)(self.fn)
        return self._task

    def __call__(self, *args, **kwargs):
        return self.prefect_task()(*args, **kwargs)

    def __getattr__(self, name: str):
        # only attributes this object lacks reach here; private and dunder names (pickle's probes,
        # copy's) are not Prefect's task API and must not make one
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.prefect_task(), name)

    def __repr__(self) -> str:
        return f"LazyTask({self.__qualname__})"


def task(**options: Any) -> Callable[[Callable], LazyTask]:
    """``prefect.task(**options)``, made on first use (see the module's docstring)."""
    return lambda fn: LazyTask(fn, options)


class _SchemaOnFirstUse:
    """A flow's parameter schema, built the first time anything reads it."""

    def __init__(self, build: Callable, fn: Callable):
        self._build, self._fn, self._schema = build, fn, None

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._schema is None:
            self._schema = self._build(self._fn)
        return getattr(self._schema, name)


def flow(fn: Callable, **options: Any):
    """``prefect.flow(**options)(fn)`` whose parameter schema (``Flow.parameters``) is built on first use.

    Prefect builds it when a flow is made, for the UI's form; a run never reads it, and a deployment
    builds its own (``RunnerDeployment.from_flow``). For a release it is JSON schemas of ReleaseParams
    and of every mechanism's parameters, which imports every mechanism: about 0.6 CPU-s of a
    Prefect-form release that runs one (bench/results/2026-11-29-served-cost-5.md)."""
    import prefect.flows as prefect_flows

    build = prefect_flows.parameter_schema
    prefect_flows.parameter_schema = lambda f: _SchemaOnFirstUse(build, f)
    try:
        return prefect_flows.flow(**options)(fn)
    finally:
        prefect_flows.parameter_schema = build
