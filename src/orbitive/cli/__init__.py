"""The ``orbit`` command: a thin formatter over library calls.

Each command module exposes ``register(subparsers)``, adding its sub-commands
with a ``func(args) -> int`` default; :func:`main` parses and dispatches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from .._core._errors import OrbitError
from . import _commands
from ._store_commands import UsageError

#: Exit status for bad usage (argparse's own, or an argument the library refuses), and
#: for any other OrbitError raised by a command.
EXIT_USAGE = 2
EXIT_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    """The full ``orbit`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="orbit",
        description="Inspect and drive orbitive fleets: leases, pools and named locks.",
    )
    parser.add_argument("--version", action="version", version=f"orbit (orbitive) {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for module in _commands.MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orbit`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except UsageError as error:
        _complain(args.subcommand, error)
        return EXIT_USAGE
    except OrbitError as error:
        _complain(args.subcommand, error)
        # A bad argument is a usage error, as argparse's own are.
        return EXIT_USAGE if isinstance(error, (ValueError, TypeError)) else EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return status


def _complain(subcommand: str, error: Exception) -> None:
    """One line on stderr, even for a driver's multi-line message (libpq's hints)."""
    print(f"orbit {subcommand}: {' '.join(str(error).split())}", file=sys.stderr)


__all__ = ["build_parser", "main"]
