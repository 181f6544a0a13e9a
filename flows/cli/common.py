"""What every `geodp` command shares: the one-line error type, options built from the flows' own models
(so a default lives in one place), `--param`, `--json [PATH]`, `--period`, data loading and progress."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer

from dpcore import GeoDPError

T = TypeVar("T")

#: The value `--json` takes when no PATH follows it: stdout.
STDOUT = "-"


class CLIError(GeoDPError, ValueError):
    """Bad input to a command: printed as one `error:` line, exit status 2."""


# ---- loading a command's modules -------------------------------------------------------------------------

#: Set by flows.cli.main in the `geodp` process itself (not when a test calls main([...])): there the
#: modules load with the cyclic garbage collector paused (:func:`loading`).
_gc_pause = {"on": False, "depth": 0}


def pause_gc_while_loading() -> None:
    """The `geodp` process loads its modules with the garbage collector paused, until :func:`loading` ends."""
    _gc_pause["on"] = True
    gc.disable()


@contextmanager
def loading() -> Iterator[None]:
    """Load modules (a command's, the libraries its work needs) with Python's cyclic garbage collector
    paused, in the `geodp` process only. Nearly every object a module creates stays alive, yet the
    collector scans the young ones every 700 new objects and, as they pile up, all of them: 0.07 of the
    ~1 CPU-s of a 1,000-point release. When the outermost ``loading`` ends, what is loaded is set aside
    for good (gc.freeze: no scan visits it again) and the collector resumes for the command's work."""
    if not _gc_pause["on"]:
        yield
        return
    _gc_pause["depth"] += 1
    gc.disable()
    try:
        yield
    finally:
        _gc_pause["depth"] -= 1
        if _gc_pause["depth"] == 0:
            gc.freeze()
            gc.enable()


# ---- options from the models the flows and deployments use --------------------------------------------


def field_default(model: type, name: str) -> Any:
    """The default of field ``name`` of a pydantic model or a dataclass (its factory called)."""
    fields = getattr(model, "model_fields", None)
    if fields is not None:
        info = fields[name]
        return info.default_factory() if info.default_factory is not None else info.default
    f = {f.name: f for f in dataclasses.fields(model)}[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def field_help(model: type, name: str) -> str:
    fields = getattr(model, "model_fields", None)
    return (fields[name].description or "") if fields is not None else ""


def comma(values: Any) -> str:
    """A list default as the comma-separated text the option takes: [0.1, 0.4] → '0.1,0.4'."""
    def one(v: Any) -> str:
        if isinstance(v, list | tuple):
            return ":".join(one(x) for x in v)
        return f"{v:g}" if isinstance(v, float) else str(v)
    return ",".join(one(v) for v in values)


def model_option(model: type, name: str, *decls: str, help: str | None = None,
                 fmt: Callable[[Any], Any] | None = None, **kw: Any) -> Any:
    """A typer option whose default (and, unless ``help`` is given, help text) is field ``name`` of
    ``model``; ``fmt`` turns a list default into the text the option takes."""
    default = field_default(model, name)
    if fmt is not None and default is not None:
        default = fmt(default)
    text = help if help is not None else field_help(model, name)
    return typer.Option(default, *decls, help=text, show_default=default is not None, **kw)


# ---- mechanism parameters ------------------------------------------------------------------------------


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE items → {KEY: VALUE}; VALUE is read as JSON when it parses (numbers, true, lists)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise CLIError(f"--param must be KEY=VALUE or MECH.KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if not k.strip():
            raise CLIError(f"--param has no key: {item!r}")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def params_by_mechanism(items: list[str] | None, mechanisms: list[str]) -> dict[str, dict[str, Any]]:
    """`--param KEY=VALUE` applies to every mechanism of the command; `--param MECH.KEY=VALUE` to MECH only."""
    out: dict[str, dict[str, Any]] = {}
    shared: dict[str, Any] = {}
    for key, value in parse_params(items).items():
        if "." not in key:
            shared[key] = value
            continue
        mech, k = key.split(".", 1)
        if mech not in mechanisms:
            raise CLIError(f"--param {key}=… names mechanism {mech!r}, which this command does not run "
                           f"(it runs {', '.join(mechanisms) or 'none'})")
        out.setdefault(mech, {})[k] = value
    for m in mechanisms:
        if shared:
            out[m] = {**shared, **out.get(m, {})}
    return out


def mechanism_capability(name: str, capability: str) -> bool:
    """Whether mechanism ``name``'s tags declare ``capability`` (e.g. supports_weights): the one place the
    CLI asks a mechanism class what it can do (dpcore.mechanisms.tags.MechanismTags)."""
    from dpcore.mechanisms import get_mechanism_class

    return bool(getattr(get_mechanism_class(name).tags, capability))


def check_mechanism(name: str, params: dict[str, Any]) -> None:
    """Build mechanism ``name`` with ``params`` and check their values, before data is read or budget
    charged; a value of the wrong type is an error line like any other bad value (a release's own
    check: tasks.release_city_plan.build_mechanism)."""
    from tasks.release_city_plan import build_mechanism

    build_mechanism(name, params)


# ---- names, numbers and time windows --------------------------------------------------------------------


def names(text: str | None) -> list[str]:
    return [v.strip() for v in str(text or "").split(",") if v.strip()]


def parse_epsilons(text: str, what: str = "--epsilon") -> list[float]:
    try:
        values = [float(v) for v in names(text)]
    except ValueError as exc:
        raise CLIError(f"{what} must be a number or a comma-separated list, got {text!r}") from exc
    if not values:
        raise CLIError(f"{what} is empty")
    from tasks.config import ConfigError, check_budget_value

    try:
        return [check_budget_value(v) for v in values]
    except ConfigError as exc:
        raise CLIError(str(exc)) from None


def numbers(text: str, what: str, kind: type = float, minimum: float | None = None,
            maximum: float | None = None) -> list:
    try:
        vals = [kind(v) for v in names(text)]
    except ValueError as exc:
        raise CLIError(f"{what} must be comma-separated {'integers' if kind is int else 'numbers'}, "
                       f"got {text!r}") from exc
    if not all(math.isfinite(v) for v in vals):
        raise CLIError(f"{what} must list finite numbers, got {text!r}")
    if minimum is not None and any(v < minimum for v in vals):
        raise CLIError(f"{what} must list values ≥ {minimum:g}, got {text!r}")
    if maximum is not None and any(v > maximum for v in vals):
        raise CLIError(f"{what} must list values ≤ {maximum:g}, got {text!r}")
    return vals


def at_least(value: int | float, minimum: int | float, what: str) -> None:
    if not value >= minimum:  # NaN too
        raise CLIError(f"{what} must be ≥ {minimum}, got {value}")


def parse_window(text: str, what: str = "--period") -> tuple[int, int]:
    """A command's time window (tasks.config.parse_window, the one parser) → [start_s, end_s) in UTC
    seconds; the older START/END form is read with a note."""
    from tasks.config import ConfigError
    from tasks.config import parse_window as parse

    t = str(text).strip()
    if "/" in t and ".." not in t:
        eprint(f"note: {what} {t}: START/END is the older form (END exclusive); every command takes A..B")
    try:
        return parse(t)
    except ConfigError as exc:
        raise CLIError(f"{what}: {exc}") from exc


def window_text(t0: int, t1: int) -> str:
    """[t0, t1) as the START/END text the flows' models store."""
    import pandas as pd

    iso = lambda s: pd.Timestamp(s, unit="s", tz="UTC").isoformat()  # noqa: E731
    return f"{iso(t0)}/{iso(t1)}"


# ---- output ---------------------------------------------------------------------------------------------


def eprint(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def emit_json(obj: Any, dest: str | None, indent: int | None = 2) -> None:
    """`--json` without PATH: to stdout; `--json PATH`: into the file (folders made), noted on stderr."""
    text = json.dumps(obj, indent=indent, default=_json_default)
    if dest in (None, STDOUT):
        print(text)
        return
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    eprint(f"wrote {out}")


def _json_default(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def human_out(json_dest: str | None):
    """Where the human-readable table goes: stderr when the JSON takes stdout, else stdout."""
    return sys.stderr if json_dest == STDOUT else sys.stdout


class StepProgress:
    """A rich progress bar on stderr for a long step, fed by dpcore's ``progress(done, total, what)``."""

    def __init__(self, label: str):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.label = label
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[what]}"),
                                 console=Console(stderr=True), transient=False)
        self.task = self.progress.add_task(label, total=None, what="")

    def __call__(self, done: int, total: int, what: str) -> None:
        self.progress.update(self.task, completed=done, total=total, what=what)

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


@contextmanager
def working(what: str) -> Iterator[None]:
    """A spinner on stderr while a flow runs (its own logs show with `geodp --verbose`)."""
    from rich.console import Console

    from tasks.progress import shown_in

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with console.status(what) as status, shown_in(lambda line: status.update(f"{what} {line}")):
        yield


def validated(build: Callable[[], T], what: str = "parameters") -> T:
    """Build a flow's pydantic parameters; a validation error becomes one CLI error line."""
    from pydantic import ValidationError

    try:
        return build()
    except ValidationError as exc:
        raise CLIError(f"bad {what}: {validation_text(exc)}") from exc


def validation_text(exc: Any) -> str:
    err = exc.errors()[0]
    where = ".".join(map(str, err["loc"]))
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.1f}s"


# ---- the command tree -----------------------------------------------------------------------------------


class DefaultGroup(typer.core.TyperGroup):
    """A noun whose first verb is also its default: `geodp release DATA …` runs `geodp release run DATA …`
    and `geodp query RELEASE --box …` runs `geodp query range …`, as scripts written before the verbs did."""

    default_command = ""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


def noun(name: str, help: str, default: str | None = None, **kw: Any) -> typer.Typer:
    """A typer group for one noun; with ``default``, that verb runs when no verb is named."""
    cls = type(f"{name.title()}Group", (DefaultGroup,), {"default_command": default}) if default else None
    return typer.Typer(name=name, help=help, cls=cls, no_args_is_help=True, rich_markup_mode=None,
                       add_completion=False, **kw)
