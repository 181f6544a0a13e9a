"""The `geodp` command line: a noun-verb tree on typer.

    geodp release run|backfill|list|show     geodp query range|hotspot|forecast
    geodp eval range|st|heatmap|sparse1d     geodp paramselect predict|train    geodp denoiser train
    geodp ledger    geodp dataset create|show|policy|void    geodp data check    geodp cities    geodp synth
    geodp serve

`geodp release DATA …` and `geodp query RELEASE --box …` (no verb) run `release run` and `query range`;
the older command names (evaluate, evaluate-st, evaluate-heatmap, sparse1d, hotspot, forecast, backfill,
releases, paramselect train-denoiser) still work and are hidden from the help.

Bad input of any kind is one `error:` line on stderr and exit status 2. Each command's module loads only
when the command is named (`geodp --help` lists them from :data:`LAZY` without loading any): a command
pays for its own imports only (pydantic models, scipy, pandas, Prefect, plotting), not for every other's.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from typing import NamedTuple

import typer

from flows.cli import _env  # noqa: F401 - before anything imports Prefect
from flows.cli.common import STDOUT, loading, pause_gc_while_loading, validation_text


def _finite_float_options() -> None:
    """Every float option refuses inf and nan as it is parsed (one usage error line, before any work):
    typer validates options with pydantic, whose float takes 'inf' and 'nan' unless told otherwise."""
    from typing import Annotated

    from pydantic import Field, TypeAdapter
    from typer import _adapters

    plain = getattr(_adapters, "_build_number_adapter", None)
    if plain is None or getattr(plain, "finite", False):
        return

    def build(number_class, *, min, max, clamp):
        if number_class is not float or clamp:
            return plain(number_class, min=min, max=max, clamp=clamp)
        bounds = {k: v for k, v in (("ge", min), ("le", max)) if v is not None}
        return TypeAdapter(Annotated[float, Field(allow_inf_nan=False, **bounds)])

    build.finite = True
    _adapters._build_number_adapter = build


class Lazy(NamedTuple):
    """A command whose module loads when the command is named: ``module.attr`` (a typer app, or a function
    made a one-command app); ``help`` is its line in `geodp --help` (a test checks it is the loaded
    command's own); ``also``: modules that add verbs to it when imported; ``own_help``: the loaded command
    shows ``help`` instead of its docstring (the older names say which command they stand for)."""

    module: str
    attr: str
    help: str
    hidden: bool = False
    also: tuple[str, ...] = ()
    own_help: bool = False


#: Every command of the tree, by name.
LAZY: dict[str, Lazy] = {
    "release": Lazy("flows.cli.release", "app", "Make DP releases into a release store; list and show committed "
                    "ones.", also=("flows.cli.export",)),
    "releases": Lazy("flows.cli.release", "releases_app", "Same as `geodp release list|show`.", True,
                     also=("flows.cli.export",)),
    "backfill": Lazy("flows.cli.release", "backfill", "same as `geodp release backfill`", True, own_help=True),
    "query": Lazy("flows.cli.query", "app", "Answers from a committed release: range counts, hotspots, forecasts "
                  "(no budget spent)."),
    "hotspot": Lazy("flows.cli.query", "hotspot", "same as `geodp query hotspot`", True, own_help=True),
    "forecast": Lazy("flows.cli.query", "forecast", "same as `geodp query forecast`", True, own_help=True),
    "eval": Lazy("flows.cli.heatmap", "app", "Accuracy of mechanisms on a dataset: range counts, spatio-temporal, "
                 "heatmaps, sparse 1-D."),
    "ledger": Lazy("flows.cli.ledger", "ledger", "Per dataset: the privacy policy and the most any one person can "
                   "have lost."),
    "dataset": Lazy("flows.cli.ledger", "app", "A dataset's privacy policy: create, show, change; give back a "
                    "stale charge."),
    "paramselect": Lazy("flows.cli.paramselect", "app", "Choose grid width ρ, k and mechanism from public data "
                        "(spends no budget)."),
    "denoiser": Lazy("flows.cli.paramselect", "denoiser_app", "SNH's pyramid denoiser, trained on public data."),
    "data": Lazy("flows.cli.data", "app", "Check an input table in this terminal (counts of private rows: never "
                 "published)."),
    "cities": Lazy("flows.cli.misc", "cities", "The city catalog: slugs, centres and the side of their square "
                   "regions."),
    "synth": Lazy("flows.cli.misc", "synth", "Write synthetic check-ins (hotspot skew, power-law users, weekly "
                  "rhythm) for trying geodp."),
    "serve": Lazy("flows.cli.misc", "serve", "Serve the release, backfill and evaluate deployments, with the "
                  "nightly schedule of the config."),
    "evaluate": Lazy("flows.cli.evaluate", "range_counts", "same as `geodp eval range`", True),
    "evaluate-st": Lazy("flows.cli.evaluate", "spatio_temporal", "same as `geodp eval st`", True),
    "evaluate-heatmap": Lazy("flows.cli.heatmap", "heatmap", "same as `geodp eval heatmap`", True),
    "sparse1d": Lazy("flows.cli.heatmap", "sparse1d", "same as `geodp eval sparse1d`", True),
}


#: The order of `geodp --help`: the two main commands first, then reading, accounting, tuning, helpers.
ORDER = ["release", "query", "eval", "ledger", "dataset", "paramselect", "denoiser", "data", "cities", "synth",
         "serve"]


class Interrupted(Exception):
    """Ctrl-C (SIGINT) during a command: typer turns a KeyboardInterrupt into a silent exit 130, so the
    root group re-raises it as this, which :func:`main` prints as one line."""


class RootGroup(typer.core.TyperGroup):
    """The top of the tree, loading the LAZY commands on first use (help lists them without loading)."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted() from exc

    def list_commands(self, ctx: typer.Context) -> list[str]:
        found = [*super().list_commands(ctx), *(n for n in LAZY if n not in self.commands)]
        return sorted(found, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))

    def get_command(self, ctx: typer.Context, name: str):
        if name in LAZY and name not in self.commands:
            lazy = LAZY[name]
            if getattr(ctx, "_geodp_listing", False):  # `geodp --help`: a stub with the help line
                return typer.core.TyperCommand(name=name, help=lazy.help, hidden=lazy.hidden)
            with loading():
                self.commands[name] = load(name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        ctx._geodp_listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            ctx._geodp_listing = False


app = typer.Typer(cls=RootGroup, rich_markup_mode=None, add_completion=False, no_args_is_help=True,
                  help="Differentially private releases of location data with a user-level guarantee.")


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="print the version and exit"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show the Prefect and Dask logs of flows"),
) -> None:
    """Differentially private releases of location data with a user-level guarantee."""
    if version:
        from dpcore import __version__

        print(__version__)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(2)


def load(name: str) -> typer.core.TyperCommand | typer.core.TyperGroup:
    """The command ``name`` of :data:`LAZY`, its module imported."""
    lazy = LAZY[name]
    _finite_float_options()  # before the command's options are built (pydantic: not for `geodp --help`)
    for module in lazy.also:
        importlib.import_module(module)
    target = getattr(importlib.import_module(lazy.module), lazy.attr)
    if isinstance(target, typer.Typer):  # a noun: a group even when it has one verb (`geodp data check`)
        command = typer.main.get_group(target)
    else:
        single = typer.Typer(rich_markup_mode=None, add_completion=False)
        single.command(name, hidden=lazy.hidden, help=lazy.help if lazy.own_help else None)(target)
        command = typer.main.get_command(single)
    command.hidden = lazy.hidden
    return command


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``kill PID``, a scheduler stopping a job) into SystemExit, so ``finally`` blocks run:
    the local Prefect server and Dask cluster a command started are stopped instead of left orphaned."""

    def _exit(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def _optional_json_value(argv: list[str]) -> list[str]:
    """`--json` with no PATH after it (the end, or another option next) means stdout."""
    out: list[str] = []
    for i, token in enumerate(argv):
        out.append(token)
        if token == "--json":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or (nxt.startswith("-") and nxt != STDOUT):
                out.append(STDOUT)
    return out


def _quiet_flow_logs(argv: list[str]) -> None:
    """Keep Prefect's console log (run states, tracebacks of failed tasks) off stderr unless --verbose is
    given before the command: the command prints its own progress and one line per error. The logs still
    reach the Prefect API, so the UI shows them."""
    for token in argv:
        if token in ("--verbose", "-v"):
            return
        if not token.startswith("-"):
            break
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_FLOW_RUNS_LEVEL", "CRITICAL")
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_TASK_RUNS_LEVEL", "CRITICAL")
    os.environ.setdefault("GEODP_DASK_LOG_LEVEL", "CRITICAL")  # tasks/runtime.py: Dask workers' own logs


class _NoOrphanedTaskErrors(logging.Filter):
    """asyncio logs "Task exception was never retrieved" with a traceback when s3fs's event loop drops a
    request that failed after the command gave up on the store (an S3 outage): the command's own error
    line already says what failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Task exception was never retrieved", "Unclosed"))


def main(argv: list[str] | None = None) -> int:
    """Run `geodp ARGV`; returns the exit status (0 ok, 2 bad input, 130 interrupted)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if __name__ == "__main__" or argv is None:  # the console script; not when a test calls main([...])
        exit_on_sigterm()
        pause_gc_while_loading()
        # pydantic looks for plugins by reading every installed package's entry points (0.03 CPU-s) when it
        # builds its first model; geodp uses none. PYDANTIC_DISABLE_PLUGINS= (empty) lets them load.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from typer._click.exceptions import NoArgsIsHelpError, UsageError

    from dpcore import GeoDPError

    args = list(sys.argv[1:] if argv is None else argv)
    _quiet_flow_logs(args)
    logging.getLogger("asyncio").addFilter(_NoOrphanedTaskErrors())
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=_optional_json_value(args), prog_name="geodp", standalone_mode=False)
        return int(rv or 0)
    except NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        return 2
    except UsageError as exc:
        where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
        return _error(where + exc.format_message())
    except GeoDPError as exc:
        return _error(str(exc))
    except BrokenPipeError:  # e.g. `geodp cities | head`
        return 0
    except OSError as exc:  # a full disk or an unreadable path outside the store: one line, no traceback
        from tasks.storage.store import short_error

        where = getattr(exc, "filename", None)
        return _error(short_error(exc) + (f": {where}" if where else ""))
    except (Interrupted, KeyboardInterrupt, typer.Abort) as exc:
        # what became of the charges of unfinished releases (flows.release.give_back_interrupted)
        note = getattr(exc.__cause__ if isinstance(exc, Interrupted) else exc, "geodp_note", None)
        _error(INTERRUPTED.replace(":", f" ({note}):", 1) if note else INTERRUPTED)
        return 130
    except Exception as exc:
        if _is_validation_error(exc):
            return _error(validation_text(exc))
        from tasks.storage.store import short_error, storage_errors

        if isinstance(exc, storage_errors()):  # an S3 endpoint down or refusing, met outside the store
            return _error(short_error(exc))
        raise


#: The line Ctrl-C prints. A release gives back the charge of a city it did not commit (the Prefect form
#: once its cluster is closed) and says so; a charge it cannot give back stays held, and the next run of
#: the release takes it over (docs/operations.md), so running the command again finishes it.
INTERRUPTED = "interrupted (Ctrl-C); nothing unfinished was published: run the command again to finish it"


def _is_validation_error(exc: Exception) -> bool:
    """A pydantic ValidationError (a model's own check), without importing pydantic for commands that never
    load it: such an error can only come from a command that did."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(exc, pydantic.ValidationError)


def _error(message: str) -> int:
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    return 2
