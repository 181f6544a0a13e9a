"""The `geodp` command line. Subcommands live in the modules of COMMAND_MODULES; each defines
``register(subparsers)`` and sets ``func(args) -> int`` on its parsers."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

# Keep the order stable: it is the order of `geodp --help`.
COMMAND_MODULES = [
    "flows.cli_core",
    "flows.cli_platform",
    "flows.cli_ledger",
    "flows.cli_st",
    "flows.cli_heatmap",
    "flows.cli_snh",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geodp",
        description="Differentially private releases of location data with a user-level guarantee.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``kill PID``, a scheduler stopping a job) into SystemExit, so ``finally`` blocks run:
    the local Prefect server and Dask cluster a command started are stopped instead of left orphaned."""

    def _exit(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if __name__ == "__main__" or argv is None:  # the console script; not when a test calls main([...])
        exit_on_sigterm()
    from dpcore import GeoDPError, __version__

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GeoDPError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `geodp cities | head`
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
