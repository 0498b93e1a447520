"""``orbit demo``'s child processes: deaf to the terminal's Ctrl-C, and ended by the demo.

A Ctrl-C at a terminal goes to the whole foreground process group. The children
are started with SIGINT blocked (the signal mask is inherited across ``fork`` and
``execve``), so only the demo sees it; it then ends them itself and removes its
fleet, instead of every child printing its own ``KeyboardInterrupt``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess


def start(process: BaseProcess) -> None:
    """Start ``process`` with SIGINT blocked in it (never in the caller for longer
    than the start: a Ctrl-C meanwhile is delivered once it returns)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def end(processes: Sequence[BaseProcess], wait_s: float) -> None:
    """Wait up to ``wait_s`` seconds in all for ``processes`` to exit, then SIGKILL the
    rest and reap them (0: at once). Processes never started are skipped."""
    started = [process for process in processes if process.pid is not None]
    deadline = time.monotonic() + wait_s
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in started:
        if process.is_alive():
            process.kill()
            process.join()
