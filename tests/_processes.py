"""Start child processes (fork, spawn or a fresh interpreter) and reap them whatever happens.

A child runs ``target(channel, *args)`` where ``channel`` is its end of a duplex
pipe to the test. An exception in the child is sent back and re-raised in the
test as :class:`ChildFailed` with the child's traceback. :class:`Processes`
SIGKILLs and joins every child it started when it closes, even one that is
stopped or blocked, so a failing test never leaves a process behind.

A forked child starts only once no thread of the test process is exiting
(:func:`settle_threads`): a thread just joined may still be tearing itself down,
holding an allocator lock (AddressSanitizer's, under ``scripts/sanitize``) that
the child would inherit held and wait on for ever. A child that does not answer
within :data:`DIAGNOSE_AFTER` seconds or more is diagnosed before the wait fails
(:func:`diagnose`): the timeout's message holds what each of its threads is doing.

Targets must be importable module-level functions (spawn pickles them by
name); they live in ``tests/_children.py``, which imports no test framework.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from orbitive._core._readiness_futex import _SYS_FUTEX as SYS_FUTEX

START_METHODS = ("fork", "spawn")
ROOT = Path(__file__).resolve().parent.parent
#: Generous bound for a child's answer; reached only when something is broken.
REPLY_TIMEOUT = 30.0
#: A wait for a child of this many seconds or more is reached only when something is
#: broken: when it runs out, the child is diagnosed (shorter waits may run out on purpose).
DIAGNOSE_AFTER = 5.0
#: The signal on which a child writes its threads' Python stacks (faulthandler).
DUMP_SIGNAL = signal.SIGUSR2
#: How long a fork waits for a thread that is not a live Python thread to exit, in
#: seconds; one that outlives it is a long-lived foreign thread, not waited for again.
SETTLE_S = 2.0
#: How long a diagnosis waits for a child's stacks, in seconds.
DUMP_WAIT_S = 2.0

Target = Callable[..., object]


class ChildFailed(AssertionError):
    """A child raised, or exited without answering; the message is its traceback."""


@dataclass(frozen=True)
class _Failure:
    text: str


class Channel:
    """One end of the pipe between a test and a child."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, message: object) -> None:
        self._conn.send(message)

    def recv(self, timeout: float | None = REPLY_TIMEOUT) -> Any:
        """The next message (None timeout: wait for ever).

        Raises:
            ChildFailed: the other side reported a failure or closed the pipe.
            TimeoutError: nothing arrived within ``timeout`` seconds.
        """
        if not self._conn.poll(timeout):
            raise TimeoutError(f"no message within {timeout} s")
        try:
            message = self._conn.recv()
        except EOFError:
            raise ChildFailed("the other side exited without answering") from None
        if isinstance(message, _Failure):
            raise ChildFailed(message.text)
        return message

    def close(self) -> None:
        self._conn.close()


#: The file a child's threads' stacks are written to on DUMP_SIGNAL (kept open for its life).
_dump: list[IO[str]] = []


def _entry(conn: Connection, stacks: str, target: Target, args: tuple[object, ...]) -> None:
    _dump.append(open(stacks, "w"))  # noqa: SIM115 - open for the child's whole life
    faulthandler.register(DUMP_SIGNAL, file=_dump[0], all_threads=True)
    channel = Channel(conn)
    try:
        target(channel, *args)
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(_Failure(traceback.format_exc()))
        raise


_long_lived: set[int] = set()  # foreign threads that outlived SETTLE_S once


def _stray_threads() -> set[int]:
    """The threads of this process that are not live Python threads (nor known long-lived)."""
    live = {thread.native_id for thread in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - live - _long_lived


def settle_threads() -> None:
    """Return once no thread of this process is exiting: every thread the kernel lists
    is a live Python thread, or a foreign one that has lived longer than SETTLE_S.

    ``Thread.join`` returns before the thread's native teardown ends (its stack and
    thread-local storage freed, under the allocator's locks); the thread leaves
    ``/proc/self/task`` only once it ran its last instruction.
    """
    deadline = time.monotonic() + SETTLE_S
    while strays := _stray_threads():
        if time.monotonic() >= deadline:
            _long_lived.update(strays)
            return
        time.sleep(0.001)


def proc_threads(pid: int) -> list[str]:
    """One line per thread of ``pid``: its id, name, scheduler state and kernel wait."""
    lines = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            task = Path(f"/proc/{pid}/task/{tid}")
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                state = stat[stat.rindex(")") + 2 :].split()[0]
                name = (task / "comm").read_text().strip()
                wchan = (task / "wchan").read_text().strip() or "-"
                lines.append(f"  thread {tid} ({name}): state {state}, kernel wait {wchan}")
    return lines


def sleeps_in_futex_on(pid: int, path: Path) -> bool:
    """Whether a thread of ``pid`` sleeps in futex(2) on a word of the file ``path``, as
    mapped into that process (its ``/proc/PID/maps``, and each thread's system call in
    ``/proc/PID/task/TID/syscall``: the number, then the futex's address).

    Raises:
        OSError: this machine has no known futex system call number (not 64-bit Linux
            on x86_64 or aarch64), or ``pid`` is gone.
    """
    if SYS_FUTEX is None:
        raise OSError("no futex system call number known for this machine")
    mapped = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = fields[0].split("-")
            mapped.append(range(int(start, 16), int(end, 16)))
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            call = (task / "syscall").read_text().split()
            in_futex = len(call) > 1 and call[0] == str(SYS_FUTEX)
            if in_futex and any(int(call[1], 16) in where for where in mapped):
                return True
    return False


def _python_stacks(pid: int, stacks: Path) -> str:
    """The Python stacks of every thread of ``pid``, written by faulthandler on DUMP_SIGNAL."""
    if not stacks.exists():  # the child never reached _entry: the signal would kill it
        return "(none: the child never ran its entry point)"
    os.kill(pid, DUMP_SIGNAL)
    deadline = time.monotonic() + DUMP_WAIT_S
    while stacks.stat().st_size == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # the dump is written thread by thread
    return stacks.read_text() or f"(none within {DUMP_WAIT_S} s)"


def native_stacks(pid: int) -> str:
    """Every thread's native stack of ``pid`` (gdb, when installed)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(gdb is not installed)"
    # Not with the preloads meant for the interpreter under test: gdb with the ASan runtime
    # preloaded (scripts/sanitize) never finishes (measured: still silent after 40 s, 1.9 s
    # without it).
    environment = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    try:
        found = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
            capture_output=True, text=True, timeout=REPLY_TIMEOUT, check=False,
            env=environment,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"(gdb did not finish within {REPLY_TIMEOUT} s)"
    lines = [line for line in found.stdout.splitlines() if line.startswith(("#", "Thread"))]
    return "\n".join(lines) or found.stderr.strip()


def diagnose(pid: int, stacks: Path) -> str:
    """What each thread of child ``pid`` is doing: its state and kernel wait, its Python
    stack (faulthandler) and its native stack (gdb, when installed)."""
    return "\n".join(
        [
            f"child {pid}'s threads:",
            *(proc_threads(pid) or ["  (gone)"]),
            "their Python stacks:",
            _python_stacks(pid, stacks),
            "their native stacks:",
            native_stacks(pid),
        ]
    )


class Child:
    """A started child process and the test's end of its channel.

    ``stacks``: where the child writes its threads' stacks on DUMP_SIGNAL.
    """

    def __init__(self, process: BaseProcess, channel: Channel, stacks: Path) -> None:
        self.process = process
        self.channel = channel
        self.stacks = stacks

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None
        return pid

    def send(self, message: object) -> None:
        self.channel.send(message)

    def recv(self, timeout: float = REPLY_TIMEOUT) -> Any:
        """The child's next message (see :meth:`Channel.recv`).

        Raises:
            ChildFailed: the child reported a failure or exited.
            TimeoutError: nothing arrived within ``timeout`` seconds; from
                DIAGNOSE_AFTER on, the message holds the child's diagnosis.
        """
        try:
            return self.channel.recv(timeout)
        except TimeoutError as error:
            raise self._timed_out(str(error), timeout) from None

    def wait(self, timeout: float = REPLY_TIMEOUT) -> int:
        """Join the child and return its exit code (negative: killed by that signal).

        Raises:
            TimeoutError: it still runs after ``timeout`` seconds (diagnosed as :meth:`recv`).
        """
        self.process.join(timeout)
        code = self.process.exitcode
        if code is None:
            raise self._timed_out(f"still running after {timeout} s", timeout)
        return code

    def _timed_out(self, what: str, timeout: float) -> TimeoutError:
        if timeout < DIAGNOSE_AFTER or self.process.exitcode is not None:
            return TimeoutError(f"child {self.pid}: {what}")
        return TimeoutError(f"child {self.pid}: {what}\n{diagnose(self.pid, self.stacks)}")

    def kill(self) -> int:
        """SIGKILL the child (stopped or not), reap it and return its exit code."""
        if self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        return self.wait()


class Processes:
    """Starts children with one start method; closing kills and reaps all of them."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.context: BaseContext = multiprocessing.get_context(method)
        self._children: list[Child] = []
        self._stacks: tempfile.TemporaryDirectory[str] | None = None  # made by the first start

    def start(self, target: Target, *args: object) -> Child:
        """Start ``target(channel, *args)`` in a child (forked once no thread is exiting)."""
        if self._stacks is None:
            self._stacks = tempfile.TemporaryDirectory(prefix="orbit-test-stacks-")
        parent_end, child_end = self.context.Pipe()
        stacks = Path(self._stacks.name) / f"child-{len(self._children)}"
        process = self.context.Process(  # type: ignore[attr-defined]  # BaseContext lacks it
            target=_entry, args=(child_end, str(stacks), target, args), daemon=True
        )
        if self.method == "fork":
            settle_threads()
        process.start()
        child_end.close()
        child = Child(process, Channel(parent_end), stacks)
        self._children.append(child)
        return child

    def close(self) -> None:
        for child in self._children:
            if child.process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
            child.process.join(REPLY_TIMEOUT)
            child.channel.close()
        self._children.clear()
        if self._stacks is not None:
            self._stacks.cleanup()
            self._stacks = None

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def exec_program(args: list[str], *, close_fds: bool) -> Iterator[subprocess.Popen[bytes]]:
    """Run a program (fork + exec) for the block; SIGKILL and reap it afterwards."""
    program = subprocess.Popen(args, close_fds=close_fds)
    try:
        yield program
    finally:
        program.kill()
        program.wait(REPLY_TIMEOUT)


def sigint_default(argv: list[str]) -> list[str]:
    """``argv`` to run with SIGINT's default disposition, whatever the suite's is.

    A child inherits an ignored SIGINT (from a background job, ``nohup``, a test
    runner's worker), and a Python child then installs no ``KeyboardInterrupt``
    handler: Ctrl-C does nothing to it. A test of Ctrl-C runs its child through this
    reset, done in a fresh interpreter before ``exec`` (a ``preexec_fn`` may deadlock
    in a process with threads).
    """
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execvp(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *argv]


def run_interpreter(function: Target, *args: str, timeout: float = 60.0) -> str:
    """Run ``function(*args)`` in a fresh interpreter that exits normally; return its stdout.

    The interpreter is killed (and reaped) when it outlives ``timeout``.

    Raises:
        ChildFailed: it exited non-zero; the message holds its stderr.
    """
    module, name = function.__module__, function.__qualname__
    code = f"import sys; from {module} import {name}; {name}(*sys.argv[1:])"
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise ChildFailed(f"exit status {result.returncode}\n{result.stderr}")
    return result.stdout
