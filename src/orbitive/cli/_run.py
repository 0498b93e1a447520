"""``orbit run [--lock NAME] [--ttl S] [--wait S] [--store URL] -- CMD ...``: flock(1) with leases.

Holds the named lock while CMD runs, renewing it every ``ttl / 3`` seconds, with the
fencing token exported as ``ORBIT_FENCING_TOKEN`` (and the name as
``ORBIT_LOCK_NAME``). Exits with CMD's status (128 + N when CMD died of signal N),
after releasing the lock. SIGTERM, SIGINT and SIGHUP are passed on to CMD; the
lock is released once CMD has exited. Busy lock, no ``--wait`` (or the wait ran
out): exit 75 (``EX_TEMPFAIL``) with a message naming the holder (none with
``--quiet``).

CMD never outlives ``orbit run``: it starts with ``PR_SET_PDEATHSIG`` = SIGKILL
(Linux ``prctl``, set in the child before exec), so the kernel kills it the moment
``orbit run`` dies, SIGKILL included. The lease of an ``orbit run`` that was killed
cannot be released by anyone but ``orbit force-release``; it lapses at its TTL.

A lost lease (a renewal found it force-released, expired or taken) is reported on
stderr with its cause (orbitive's warnings are shown while CMD runs), signals CMD as
``--on-lost`` says (default ``term``: SIGTERM) and ``orbit run`` then exits 76 once
CMD has ended; with ``ignore`` CMD keeps running and its own status is returned.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from .._core._errors import LockTimeout
from ..store import Lock, Store, open_store
from ._store_commands import UsageError, add_store_option

#: Exit status when the lock is held elsewhere (sysexits.h EX_TEMPFAIL).
EXIT_BUSY: Final = 75
#: Exit status when the lease was lost while CMD ran (``--on-lost term`` or ``kill``).
EXIT_LOST: Final = 76
#: Exit statuses for a command that cannot be run, as in POSIX shells.
EXIT_NOT_FOUND: Final = 127
EXIT_NOT_EXECUTABLE: Final = 126
#: Lease length when ``--ttl`` is not given, in seconds.
DEFAULT_TTL_S: Final = 30.0
_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: What ``--on-lost`` sends to CMD (None: nothing).
_ON_LOST: Final[dict[str, signal.Signals | None]] = {
    "term": signal.SIGTERM,
    "kill": signal.SIGKILL,
    "ignore": None,
}
_PR_SET_PDEATHSIG: Final = 1

_DESCRIPTION: Final = f"""\
Hold the named lock while CMD runs, with the fencing token in ORBIT_FENCING_TOKEN
(and the name in ORBIT_LOCK_NAME); release it when CMD exits and exit with CMD's
status (128+N if CMD died of signal N). SIGTERM/SIGINT/SIGHUP are passed to CMD.

The lease lasts --ttl seconds (default {DEFAULT_TTL_S:g}) and is renewed every TTL/3
(every {DEFAULT_TTL_S / 3:g} s by default), so two renewals in a row may fail before it
lapses. The TTL is also how long the lock stays held if orbit run itself is killed
(SIGKILL, power cut): nothing can release it then, except orbit force-release. CMD is
killed the moment orbit run dies (PR_SET_PDEATHSIG), so it never runs unlocked.

exit status: CMD's own; 75 the lock is busy (no --wait, or the wait ran out);
76 the lock was lost while CMD ran (--on-lost term or kill); 126/127 CMD cannot
be run; 2 bad usage; 1 the store failed.

In a crontab, write orbit's full path: cron's PATH is /usr/bin:/bin, which an
orbit installed in a virtual environment is not on. For this orbit:

  30 2 * * *  {{orbit}} run --quiet --lock reports/nightly --ttl 120 -- /opt/reports/nightly.sh || [ $? -eq 75 ]"""  # noqa: E501


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit run`` to ``orbit``."""
    cmd = subparsers.add_parser(
        "run",
        help="run a command while holding a named lock (like flock(1), with leases)",
        description=_DESCRIPTION.format(orbit=orbit_path()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("--lock", required=True, metavar="NAME", help="the lock name")
    cmd.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="S",
        help=f"lease length in seconds, renewed every S/3 (default {DEFAULT_TTL_S:g})",
    )
    cmd.add_argument(
        "--wait",
        type=_wait_seconds,
        default=None,
        metavar="S",
        help="wait up to S s for the lock (default: no wait)",
    )
    add_store_option(cmd)
    cmd.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing when the lock is busy (the exit status 75 still says so); for cron",
    )
    cmd.add_argument(
        "--on-lost",
        choices=tuple(_ON_LOST),
        default="term",
        help="when the lease is lost while CMD runs: SIGTERM CMD (term, the default) or "
        "SIGKILL it (kill), then exit 76; or let it run on (ignore) and exit with its status",
    )
    cmd.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    cmd.set_defaults(func=cmd_run)


def orbit_path() -> str:
    """The full path of this installation's ``orbit`` script (for a crontab line).

    The script that runs, else the one in the interpreter's scripts folder (the
    virtual environment's ``bin``) when it is there, else a placeholder.
    """
    running = Path(sys.argv[0])
    if running.name == "orbit":
        return str(running.absolute())
    beside = Path(sysconfig.get_path("scripts")) / "orbit"
    return str(beside) if beside.is_file() else "/path/to/venv/bin/orbit"


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
        raise UsageError("no command given (--lock NAME --ttl S -- CMD ...)")
    supervisor = _Supervisor(_ON_LOST[args.on_lost])
    with _warnings_to_stderr(), open_store(args.store) as store:
        lock = _acquire(store, args, supervisor.lost)
        if lock is None:
            return EXIT_BUSY
        with lock:
            status = supervisor.run(command, lock)
    if supervisor.was_lost and supervisor.signum is not None:
        return EXIT_LOST
    return status


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Show orbitive's warnings on stderr while the command runs: a lost lock's cause (its
    TTL ran out, the store could not be reached, it was force-released) and the store
    going away and coming back, each line prefixed ``orbit run:``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("orbit run: %(message)s"))
    logger = logging.getLogger("orbitive")
    level = logger.level
    logger.addHandler(handler)
    if level == logging.NOTSET or level > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _acquire(
    store: Store, args: argparse.Namespace, on_lost: Callable[[Lock], None]
) -> Lock | None:
    owner = f"orbit-run:{socket.gethostname()}:{os.getpid()}"
    name = args.lock
    try:
        return store.lock(name, owner, ttl=args.ttl, timeout=args.wait or 0.0, on_lost=on_lost)
    except LockTimeout:
        if args.quiet:
            return None
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


class _Supervisor:
    """CMD's life under the lock: started to die with us, signalled when the lease is lost."""

    def __init__(self, signum: signal.Signals | None) -> None:
        self.signum = signum
        self.was_lost = False
        self._child: subprocess.Popen[bytes] | None = None
        self._mutex = threading.Lock()

    def lost(self, lock: Lock) -> None:
        """The lock's ``on_lost`` callback (the renewer thread): warn, then signal CMD."""
        action = "keeps running" if self.signum is None else f"gets {self.signum.name}"
        print(
            f"orbit run: lost lock {lock.name!r} (fencing token {lock.fencing_token}); "
            f"the command {action}",
            file=sys.stderr,
        )
        with self._mutex:
            self.was_lost = True
            child = self._child
        if child is not None:
            self._signal(child)

    def _signal(self, child: subprocess.Popen[bytes]) -> None:
        if self.signum is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(self.signum)

    def run(self, command: list[str], lock: Lock) -> int:
        """Start CMD, wait for it with signals forwarded; its status (128 + N for signal N)."""
        env = dict(
            os.environ, ORBIT_FENCING_TOKEN=str(lock.fencing_token), ORBIT_LOCK_NAME=lock.name
        )
        try:
            # preexec_fn with threads running: it only calls prctl and getppid before exec.
            child = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent())  # noqa: PLW1509
        except FileNotFoundError:
            print(f"orbit run: command not found: {command[0]!r}", file=sys.stderr)
            return EXIT_NOT_FOUND
        except OSError as error:
            print(f"orbit run: cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
            return EXIT_NOT_EXECUTABLE
        with self._mutex:
            self._child = child
            self.was_lost = self.was_lost or lock.lost
            lost = self.was_lost
        if lost:  # lost between the grant and the start
            self._signal(child)
        with _forwarding(child):
            status = child.wait()
        return status if status >= 0 else 128 - status


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when this process dies.

    Facts: ``PR_SET_PDEATHSIG`` survives ``execve`` (not for set-user-ID programs)
    and fires when the *thread* that forked exits, here the main thread, which
    lives as long as the process. A parent that died before the ``prctl`` took
    effect is caught by comparing ``getppid()`` after it. None where ``prctl`` is
    missing (not Linux): CMD then outlives a killed ``orbit run``.
    """
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(EXIT_LOST)

    return preexec


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
