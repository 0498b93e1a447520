"""``orbit run --lock NAME --ttl S [--wait S] [--store URL] -- CMD ...``: flock(1) with leases.

Holds the named lock while CMD runs, renewing it every ``ttl / 3`` seconds, with the
fencing token exported as ``ORBIT_FENCING_TOKEN`` (and the name as
``ORBIT_LOCK_NAME``). Exits with CMD's status (128 + N when CMD died of signal N),
after releasing the lock. SIGTERM, SIGINT and SIGHUP are passed on to CMD; the
lock is released once CMD has exited. Busy lock, no ``--wait`` (or the wait ran
out): exit 75 (``EX_TEMPFAIL``) with a message naming the holder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Final

from .._errors import LockTimeout
from ..store import Lock, Store, open_store

#: Exit status when the lock is held elsewhere (sysexits.h EX_TEMPFAIL).
EXIT_BUSY: Final = 75
#: Exit statuses for a command that cannot be run, as in POSIX shells.
EXIT_NOT_FOUND: Final = 127
EXIT_NOT_EXECUTABLE: Final = 126
_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit run`` to ``orbit``."""
    cmd = subparsers.add_parser(
        "run",
        help="run a command while holding a named lock (like flock(1), with leases)",
        description=(
            "Hold the named lock while CMD runs (renewing every TTL/3), with the fencing "
            "token in ORBIT_FENCING_TOKEN; release it when CMD exits and exit with CMD's "
            "status. SIGTERM/SIGINT/SIGHUP are passed to CMD. Busy lock and no --wait "
            "(or the wait ran out): exit 75 naming the holder."
        ),
    )
    cmd.add_argument("--lock", required=True, metavar="NAME", help="the lock name")
    cmd.add_argument("--ttl", required=True, type=float, metavar="S", help="lease length, s")
    cmd.add_argument(
        "--wait",
        type=_wait_seconds,
        default=None,
        metavar="S",
        help="wait up to S s for the lock (default: no wait)",
    )
    cmd.add_argument(
        "--store", default=None, metavar="URL", help="store URL (default: the SQLite file)"
    )
    cmd.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    cmd.set_defaults(func=cmd_run)


def _wait_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"--wait must be a finite number >= 0, got {text}")
    return value


def cmd_run(args: argparse.Namespace) -> int:
    """Run ``args.command`` under the lock; returns the exit status."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("orbit run: no command given (--lock NAME --ttl S -- CMD ...)", file=sys.stderr)
        return 2
    with open_store(args.store) as store:
        lock = _acquire(store, args.lock, args.ttl, args.wait or 0.0)
        if lock is None:
            return EXIT_BUSY
        with lock:
            return _supervise(command, lock)


def _acquire(store: Store, name: str, ttl: float, wait: float) -> Lock | None:
    owner = f"orbit-run:{socket.gethostname()}:{os.getpid()}"
    try:
        return store.lock(name, owner, ttl=ttl, timeout=wait, on_lost=_warn_lost)
    except LockTimeout:
        holder = store.inspect(name)
    if holder is None:
        print(f"orbit run: lock {name!r} is busy", file=sys.stderr)
    else:
        print(
            f"orbit run: lock {name!r} is held by {holder.owner!r} (fencing token "
            f"{holder.fencing_token}, {holder.remaining_s:.1f} s left)",
            file=sys.stderr,
        )
    return None


def _warn_lost(lock: Lock) -> None:
    print(
        f"orbit run: lost lock {lock.name!r} (fencing token {lock.fencing_token}); "
        "the command keeps running",
        file=sys.stderr,
    )


def _supervise(command: list[str], lock: Lock) -> int:
    env = dict(os.environ, ORBIT_FENCING_TOKEN=str(lock.fencing_token), ORBIT_LOCK_NAME=lock.name)
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        print(f"orbit run: command not found: {command[0]!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as error:
        print(f"orbit run: cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
        return EXIT_NOT_EXECUTABLE
    with _forwarding(child):
        status = child.wait()
    return status if status >= 0 else 128 - status


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """Pass SIGTERM, SIGINT and SIGHUP on to ``child`` while the block runs."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
