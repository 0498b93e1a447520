"""The SHM table's readiness descriptor, shared by the blocking waiters of one process.

The descriptor is one per process (``LockTable.fileno``) and a drain clears it
for every thread. Were each waiting thread to drain and poll it on its own, a
thread that drained a release's signal would take it from a thread already
polling: the kernel wakes that poller, which then finds the descriptor empty and
sleeps again until its pause ends (measured with three waiter threads of one
process: 18 of 45 wakes came from the pause, up to 0.15 s after the release).

So one waiter at a time polls the descriptor (the poller) and the others wait on
a condition; every drain that finds a signal counts it and wakes them all, so a
signal drained by any thread ends every wait that began before it. A waiter
drains before its attempt only while no poller watches (the poller drains what
arrives). The asyncio form's reader (``_shm_async``) drains through
:meth:`SharedReadiness.drain` too, which wakes the waiters on the condition; a
poller whose signal it took waits out its pause, which ``poll_cap_s`` bounds.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable

from .._core import _fork


class SharedReadiness:
    """One process's use of the table's readiness by its blocking waiters.

    Args:
        fileno: the readiness descriptor (raises ``StoreError`` once closed).
        drain: clears it; returns the coalesced count of signals it held.
    """

    def __init__(self, fileno: Callable[[], int], drain: Callable[[], int]) -> None:
        self._fileno = fileno
        self._drain = drain
        self._changed = threading.Condition()
        self._signals = 0  # drains in this process that found a signal
        self._polling = False
        _fork.register(self)

    def look(self) -> int:
        """Before an attempt: drain, unless a poller watches; the count to wait past.

        Raises:
            StoreError: as ``drain`` raises (the store is closed).
        """
        with self._changed:
            if not self._polling:
                self._take()
            return self._signals

    def drain(self) -> None:
        """Clear the descriptor now (the asyncio reader), waking the waiters if it
        held a signal.

        Raises:
            StoreError: as ``drain`` raises (the store is closed).
        """
        with self._changed:
            self._take()

    def wait(self, seen: int, pause: float) -> None:
        """Until a signal drained after :meth:`look` returned ``seen``, or ``pause`` seconds.

        Raises:
            StoreError: as ``fileno`` and ``drain`` raise (the store is closed).
        """
        fd = self._fileno()
        deadline = time.monotonic() + pause
        with self._changed:
            while self._signals == seen:
                left = deadline - time.monotonic()
                if left <= 0.0:
                    return
                if self._polling:
                    self._changed.wait(left)
                    continue
                self._polling = True
                self._changed.release()
                try:
                    poller = select.poll()
                    poller.register(fd, select.POLLIN)
                    ready = poller.poll(left * 1000.0)
                finally:
                    self._changed.acquire()
                    self._polling = False
                    self._changed.notify_all()  # the poller's place is free
                if ready:
                    self._take()

    def _take(self) -> None:
        """Drain (condition held); a signal found wakes every waiter."""
        if self._drain():
            self._signals += 1
            self._changed.notify_all()

    def _after_fork_in_child(self) -> None:
        # The parent's poller and waiters are not in the child; the condition may have
        # been held by one of them at fork.
        self._changed = threading.Condition()
        self._polling = False
