"""The ``orbit`` command: a thin formatter over library calls.

Each command module exposes ``register(subparsers)``, adding its sub-commands
with a ``func(args) -> int`` default; :func:`main` parses and dispatches.

``orbit`` never shows a user a traceback: an error is one line on stderr that
names its cause, a closed pipe ends the command quietly (:data:`EXIT_PIPE`), and
an exception nobody expected (a bug) is one line that says how to see where it
came from (``ORBIT_TRACEBACK=1``).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from .. import __version__
from .._core import _native
from .._core._errors import OrbitError
from . import _commands
from ._store_commands import NothingFound, UsageError

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

#: Exit status for bad usage (argparse's own, or an argument the library refuses).
EXIT_USAGE = 2
#: Exit status for nothing to show or remove, and for any other error of a command.
EXIT_ERROR = 1
#: Exit status when the reader of ``orbit``'s output went away (``orbit pool | head -1``):
#: 128 + SIGPIPE, what a shell reports for a writer that a closed pipe ended.
EXIT_PIPE = 141
#: Exit status on Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130
#: With this variable set (to anything but empty), an unexpected exception is raised
#: with its traceback instead of being one line.
TRACEBACK_VARIABLE = "ORBIT_TRACEBACK"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a closed pipe under ``--help`` is not hidden: :func:`main`
    ends with :data:`EXIT_PIPE`, as for any other output (argparse ignores the error)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        stream = file or sys.stderr
        if message and stream is not None:
            stream.write(message)


def version_text() -> str:
    """What ``orbit --version`` prints: the version, the interpreter, each C module's state."""
    lines = [f"orbit (orbitive) {__version__}, Python {platform.python_version()}"]
    states = {**_native.loaded(), **_native.extra_loaded()}
    width = max(len(name) for name in states)
    for name, loaded in states.items():
        state = "loaded" if loaded else "not built (Python steps run)"
        if loaded is None:
            state = f"not installed (the {_native.EXTRA_MODULES[name]} extra)"
        lines.append(f"{name:<{width}}  {state}")
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
    parser = _Parser(
        prog="orbit",
        description="Inspect and drive orbitive fleets: leases, pools and named locks.",
    )
    parser.add_argument("--version", action=_Version)
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for module in _commands.MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orbit`` console script; returns the exit status.

    Args:
        argv: the arguments after ``orbit`` (None: ``sys.argv[1:]``).

    Returns:
        The command's exit status; :data:`EXIT_USAGE` for arguments the library
        refuses, :data:`EXIT_ERROR` for any other error, :data:`EXIT_PIPE` when
        the reader of the output went away, :data:`EXIT_INTERRUPTED` on Ctrl-C.

    Raises:
        SystemExit: from argparse, for ``--help``, ``--version`` and bad usage
            (status 2, the usage and one error line on stderr).
    """
    _escape_unencodable()
    try:
        try:
            return _dispatch(list(sys.argv[1:] if argv is None else argv))
        finally:  # inside the try: a reader gone surfaces here, not at the interpreter's exit
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        _to_devnull(sys.stdout, sys.stderr)
        return EXIT_PIPE


def _dispatch(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except UsageError as error:
        _complain(args.subcommand, str(error))
        return EXIT_USAGE
    except NothingFound as error:
        _complain(args.subcommand, str(error))
        return EXIT_ERROR
    except OrbitError as error:
        _complain(args.subcommand, str(error))
        # A bad argument is a usage error, as argparse's own are.
        return EXIT_USAGE if isinstance(error, (ValueError, TypeError)) else EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise
    except OSError as error:  # the system refused (a missing /dev/shm, a descriptor limit)
        _complain(args.subcommand, str(error))
        return EXIT_ERROR
    except Exception as error:
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        command = shlex.join(["orbit", *argv])
        _complain(
            args.subcommand,
            f"unexpected {type(error).__name__}: {error} (a bug in orbitive {__version__}; "
            f"'{TRACEBACK_VARIABLE}=1 {command}' shows where it happened: please report it)",
        )
        return EXIT_ERROR
    return status


def _complain(subcommand: str, message: str) -> None:
    """One line on stderr, even for a driver's multi-line message (libpq's hints)."""
    print(f"orbit {subcommand}: {' '.join(message.split())}", file=sys.stderr)


def _escape_unencodable() -> None:
    """Print what the terminal's encoding lacks as escapes (a name in a Latin-1 locale)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def _to_devnull(*streams: TextIO | None) -> None:
    """Point the process's standard streams at ``/dev/null``: the interpreter flushes
    them once more at exit, and a closed pipe would raise again there."""
    for stream in streams:
        try:
            fd = stream.fileno() if stream is not None else -1
        except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush
            continue
        if fd >= 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)


__all__ = ["build_parser", "main"]
