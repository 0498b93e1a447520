"""One renewer thread per process: every auto-renewed lock of every store, from a deadline heap.

``store.lock()`` hands its lock to :data:`RENEWER` instead of starting a thread
of its own, and the lock's release takes it back: taking or releasing a lock
starts and joins no thread (the one thread starts with the first lock of the
process and then sleeps until the earliest renewal is due). Each renewal is due
a third of its ttl after the grant or the last renewal, as before.

* **Falling behind.** A renewal that comes due after the lease's window closed
  (the process was stopped, or a renewal before it took too long) is not
  attempted: the lease is reported lost (``lost``, ``on_lost``) as it is, even
  when nobody took the name meanwhile (the store contract: a lapsed lease is lost).
* **A failing engine.** A renewal the engine cannot complete (``StoreError``) is
  retried well before the window closes (``renew_retry_s``); past it, the
  lease is reported lost.
* **Callbacks.** ``on_lost`` runs in the renewer thread, shared by every lock of
  the process: keep it short. An exception it raises is reported through
  ``threading.excepthook`` and stops nothing else.
* **Fork.** A forked child has no renewer thread and none of the parent's
  locks to renew: its renewer starts empty, with the child's first lock.

Cancelled entries stay in the heap until they come due or until they
outnumber the live ones, when the heap is rebuilt, so a release is one flag
and a lock churned at any rate keeps the heap small.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
from typing import Final, Protocol

from .._core import _fork
from .._core._errors import StoreError

#: A renewer that cannot reach the engine retries at least this often, in seconds.
_RETRY_MIN_S: Final = 0.01


def renew_retry_s(ttl: float, left: float) -> float | None:
    """When a renewer retries after a transient engine error, in seconds (None: too late).

    Well before the window closes: a quarter of what is ``left``, at most a third of
    the ``ttl``, at least :data:`_RETRY_MIN_S`.
    """
    if left <= 0.0:
        return None
    return max(min(ttl / 3.0, left / 4.0), _RETRY_MIN_S)


class Renewable(Protocol):
    """What the renewer asks of a lock (``_lock.Lock``)."""

    def remaining(self) -> float:
        """Seconds left in the window, measured locally."""

    def _renew(self, ttl: float) -> bool:
        """One renewal; False once lost (reported) or released."""

    def _mark_lost(self) -> None:
        """Report the lease lost (``lost``, the loss count, ``on_lost``)."""


class Entry:
    """One lock's place in the heap: renew it every ``ttl / 3`` until cancelled."""

    __slots__ = ("cancelled", "due", "generation", "lock", "queued", "ttl")

    def __init__(self, lock: Renewable, ttl: float, due: float) -> None:
        self.lock = lock
        self.ttl = ttl
        self.due = due
        self.cancelled = False
        self.queued = False  # in the heap (not being renewed)
        self.generation = _fork.generation


class Renewer:
    """The process's renewer (see the module docstring); use :data:`RENEWER`."""

    def __init__(self) -> None:
        self._start_fresh()
        _fork.register(self)

    def _start_fresh(self) -> None:
        self._wake = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Entry]] = []
        self._order = itertools.count()
        self._cancelled = 0
        self._thread: threading.Thread | None = None

    def add(self, lock: Renewable, ttl: float) -> Entry:
        """Renew ``lock`` every ``ttl / 3`` seconds from now, until :meth:`cancel`."""
        entry = Entry(lock, ttl, time.monotonic() + ttl / 3.0)
        with self._wake:
            self._push(entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="orbitive-renewer", daemon=True
                )
                self._thread.start()
        return entry

    def cancel(self, entry: Entry) -> None:
        """Renew ``entry``'s lock no more (a renewal in flight still completes)."""
        if entry.generation != _fork.generation:  # the parent's: not in this heap
            return
        with self._wake:
            if entry.cancelled:
                return
            entry.cancelled = True
            if not entry.queued:  # being renewed: it will not go back
                return
            self._cancelled += 1
            if self._cancelled > len(self._heap) // 2:
                self._heap = [item for item in self._heap if not item[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def thread(self) -> threading.Thread | None:
        """The renewer thread of this process, once a lock started it."""
        return self._thread

    def _push(self, entry: Entry) -> None:
        """Into the heap (lock held); wakes the thread when it sleeps past ``entry.due``."""
        head = self._heap[0][0] if self._heap else None
        entry.queued = True
        heapq.heappush(self._heap, (entry.due, next(self._order), entry))
        if head is None or entry.due < head:
            self._wake.notify()

    def _next(self) -> Entry:
        """The next entry that comes due (waits for it), lock held."""
        while True:
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
                self._cancelled -= 1
            if not self._heap:
                self._wake.wait()
                continue
            delay = self._heap[0][0] - time.monotonic()
            if delay <= 0.0:
                entry = heapq.heappop(self._heap)[2]
                entry.queued = False
                return entry
            self._wake.wait(delay)

    def _run(self) -> None:
        while True:
            with self._wake:
                entry = self._next()
            again = self._renew(entry)
            if again is not None:
                with self._wake:
                    if not entry.cancelled:
                        entry.due = again
                        self._push(entry)

    @staticmethod
    def _renew(entry: Entry) -> float | None:
        """Renew ``entry``'s lock once; when to renew it next (None: no more)."""
        lock, ttl = entry.lock, entry.ttl
        try:
            if lock.remaining() <= 0.0:  # fell behind: the window closed unrenewed
                lock._mark_lost()
                return None
            try:
                if lock._renew(ttl):
                    return time.monotonic() + ttl / 3.0
                return None  # lost (reported by _renew), or released meanwhile
            except StoreError:
                retry = renew_retry_s(ttl, lock.remaining())
                if retry is not None:
                    return time.monotonic() + retry
                lock._mark_lost()
                return None
        except Exception:  # an on_lost that raised: report it, keep renewing the others
            kind, error, trace = sys.exc_info()
            assert kind is not None
            threading.excepthook(
                threading.ExceptHookArgs((kind, error, trace, threading.current_thread()))
            )
            return None

    def _after_fork_in_child(self) -> None:
        self._start_fresh()  # the parent's thread and locks are the parent's


#: The process's renewer.
RENEWER: Final = Renewer()
