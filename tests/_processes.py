"""Start child processes (fork, spawn or a fresh interpreter) and reap them whatever happens.

A child runs ``target(channel, *args)`` where ``channel`` is its end of a duplex
pipe to the test. An exception in the child is sent back and re-raised in the
test as :class:`ChildFailed` with the child's traceback. :class:`Processes`
SIGKILLs and joins every child it started when it closes, even one that is
stopped or blocked, so a failing test never leaves a process behind.

Targets must be importable module-level functions (spawn pickles them by
name); they live in ``tests/_children.py``, which imports no test framework.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import Any

START_METHODS = ("fork", "spawn")
ROOT = Path(__file__).resolve().parent.parent
#: Generous bound for a child's answer; reached only when something is broken.
REPLY_TIMEOUT = 30.0

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


def _entry(conn: Connection, target: Target, args: tuple[object, ...]) -> None:
    channel = Channel(conn)
    try:
        target(channel, *args)
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(_Failure(traceback.format_exc()))
        raise


class Child:
    """A started child process and the test's end of its channel."""

    def __init__(self, process: BaseProcess, channel: Channel) -> None:
        self.process = process
        self.channel = channel

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None
        return pid

    def send(self, message: object) -> None:
        self.channel.send(message)

    def recv(self, timeout: float = REPLY_TIMEOUT) -> Any:
        return self.channel.recv(timeout)

    def wait(self, timeout: float = REPLY_TIMEOUT) -> int:
        """Join the child and return its exit code (negative: killed by that signal)."""
        self.process.join(timeout)
        code = self.process.exitcode
        if code is None:
            raise TimeoutError(f"child {self.pid} still running after {timeout} s")
        return code

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

    def start(self, target: Target, *args: object) -> Child:
        parent_end, child_end = self.context.Pipe()
        process = self.context.Process(  # type: ignore[attr-defined]  # BaseContext lacks it
            target=_entry, args=(child_end, target, args), daemon=True
        )
        process.start()
        child_end.close()
        child = Child(process, Channel(parent_end))
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
