"""``ptrace`` through ctypes (Linux, glibc): a test runs a child one instruction at a time.

The child calls :func:`trace_me` and stops itself (SIGSTOP); the test, its parent,
then calls :func:`single_step` until the child stops on a signal of its own again.
"""

from __future__ import annotations

import ctypes
import os
import signal

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long
_TRACEME = 0
_SINGLESTEP = 9


def _ptrace(request: int, pid: int) -> None:
    if _libc.ptrace(request, pid, None, None) == -1:
        number = ctypes.get_errno()
        raise OSError(number, f"ptrace({request}): {os.strerror(number)}")


def trace_me() -> None:
    """Make this process's parent its tracer: a signal it gets then stops it for the parent.

    Raises:
        OSError: ptrace is not allowed here (a seccomp filter, Yama).
    """
    _ptrace(_TRACEME, 0)


def single_step(pid: int) -> bool:
    """Run the traced, stopped child ``pid`` for one instruction (any signal it had is
    dropped); True when it stopped after that instruction, False when it stopped on a
    signal of its own (or ended) instead.

    Raises:
        OSError: the child is not traced by this process, or the machine cannot step.
    """
    _ptrace(_SINGLESTEP, pid)
    _, status = os.waitpid(pid, 0)
    return os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP


def wait_stopped(pid: int) -> None:
    """Wait for the traced child ``pid`` to stop (after it called :func:`trace_me` and
    stopped itself).

    Raises:
        ChildProcessError: it ended instead.
    """
    _, status = os.waitpid(pid, 0)
    if not os.WIFSTOPPED(status):
        raise ChildProcessError(f"child {pid} ended (status {status:#x}) instead of stopping")
