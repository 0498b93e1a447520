"""The ``orbit`` command: a thin formatter over library calls.

Each command module exposes ``register(subparsers)``, adding its sub-commands
with a ``func(args) -> int`` default; :func:`main` parses and dispatches.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

from .. import __version__
from .._core import _native
from .._core._errors import OrbitError
from . import _commands
from ._store_commands import UsageError

#: Exit status for bad usage (argparse's own, or an argument the library refuses), and
#: for any other OrbitError raised by a command.
EXIT_USAGE = 2
EXIT_ERROR = 1


def version_text() -> str:
    """What ``orbit --version`` prints: the version, the interpreter, each C module's state."""
    lines = [f"orbit (orbitive) {__version__}, Python {platform.python_version()}"]
    width = max(len(name) for name in _native.MODULES)
    for name, loaded in _native.loaded().items():
        lines.append(f"{name:<{width}}  {'loaded' if loaded else 'not built (Python steps run)'}")
    return "\n".join(lines) + "\n"


class _Version(argparse.Action):
    """``--version``: print :func:`version_text` on stdout and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show the version and which C modules are loaded, and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The full ``orbit`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="orbit",
        description="Inspect and drive orbitive fleets: leases, pools and named locks.",
    )
    parser.add_argument("--version", action=_Version)
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
