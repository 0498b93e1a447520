"""One renewer thread per process: every auto-renewed lock of every store, in due order.

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
  retried well before the window closes (:func:`renew_retry_s`); past it, the
  lease is reported lost.
* **Callbacks.** ``on_lost`` runs in the renewer thread, shared by every lock of
  the process: keep it short. An exception it raises is reported through
  ``threading.excepthook`` and stops nothing else.
* **Fork.** A forked child has no renewer thread and none of the parent's
  locks to renew: its renewer starts empty, with the child's first lock.

The schedule is one FIFO queue per ttl (locks of one ttl come due in the order
they were queued) plus a small heap of retries, so queueing a lock is an append
and a release one flag on the lock (``_renew_at = 0``). A released lock leaves
its queue when it reaches the front as the thread wakes, or when released locks
outnumber the rest (and number :data:`COMPACT_MIN`). The thread is woken only
for a lock due before the time it sleeps until, which a lock taken and released
in a loop at one ttl is not: the thread wakes about once per third of the ttl.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import sys
import threading
import time
from typing import Final, Protocol

from .._core import _fork
from .._core._errors import StoreError

#: A renewer that cannot reach the engine retries at least this often, in seconds.
_RETRY_MIN_S: Final = 0.01
#: Released locks the queues keep before they are rebuilt (and at most half of them):
#: a lock taken and released in a loop then rebuilds them only now and then.
COMPACT_MIN: Final = 64


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

    #: ``time.monotonic()`` of its next renewal; 0 once it is not to be renewed.
    _renew_at: float

    def remaining(self) -> float:
        """Seconds left in the window, measured locally."""

    def _renew(self, ttl: float) -> bool:
        """One renewal; False once lost (reported) or released."""

    def _mark_lost(self, *, unreachable: bool) -> None:
        """Report the lease lost (``lost``, the loss count, ``on_lost``); ``unreachable``:
        the engine could not be reached in time (else the window closed unrenewed)."""


class Renewer:
    """The process's renewer (see the module docstring); use :data:`RENEWER`."""

    def __init__(self) -> None:
        self._start_fresh()
        _fork.register(self)

    def _start_fresh(self) -> None:
        self._mutex = threading.Lock()  # the schedule's; the callers' side takes it bare
        self._wake = threading.Condition(self._mutex)
        self._queues: dict[float, collections.deque[tuple[Renewable, float]]] = {}
        self._retries: list[tuple[float, int, Renewable, float]] = []
        self._order = itertools.count()
        self._queued = self._released = 0
        #: When the thread wakes by itself (inf: it waits to be notified, or it runs).
        self._sleeping_until = math.inf
        self._thread: threading.Thread | None = None

    def add(self, lock: Renewable, ttl: float) -> None:
        """Renew ``lock`` every ``ttl / 3`` seconds from now, until :meth:`cancel`."""
        due = lock._renew_at = time.monotonic() + ttl / 3.0
        with self._mutex:
            queue = self._queues.get(ttl)
            if queue is None:
                queue = self._queues[ttl] = collections.deque()
            queue.append((lock, ttl))
            self._queued += 1
            if due < self._sleeping_until:
                self._wake_up()

    def cancel(self, lock: Renewable) -> None:
        """Renew ``lock`` no more (a renewal in flight still completes)."""
        lock._renew_at = 0.0
        self._released += 1  # a hint for the rebuild: races only make it late or early
        if self._released > max(self._queued // 2, COMPACT_MIN):
            with self._mutex:
                self._compact()

    def thread(self) -> threading.Thread | None:
        """The renewer thread of this process, once a lock started it."""
        return self._thread

    def _wake_up(self) -> None:
        """Wake the thread, or start it (lock held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="orbitive-renewer", daemon=True)
            self._thread.start()
        else:
            self._wake.notify()

    def _compact(self) -> None:
        """Drop every released lock from the queues (lock held)."""
        for ttl, queue in list(self._queues.items()):
            kept = [item for item in queue if item[0]._renew_at]
            if kept:
                self._queues[ttl] = collections.deque(kept)
            else:
                del self._queues[ttl]
        self._queued = sum(len(queue) for queue in self._queues.values())
        self._released = 0

    def _next(self) -> tuple[Renewable, float, bool]:
        """The next lock that comes due, its ttl, and whether it is a retry (lock held).

        Released locks at the fronts are dropped as the thread wakes. With nothing
        left it sleeps until the latest dropped lock would have been due (a lock
        queued since at the same ttl comes due after that: no need to wake it),
        then until notified.
        """
        while True:
            due, queue, dropped = math.inf, None, 0.0
            for ttl, candidate in list(self._queues.items()):
                while candidate and not candidate[0][0]._renew_at:
                    dropped = max(dropped, candidate.popleft()[1] / 3.0)
                    self._queued -= 1
                if not candidate:
                    del self._queues[ttl]
                elif candidate[0][0]._renew_at < due:
                    due, queue = candidate[0][0]._renew_at, candidate
            retry = self._retries[0][0] if self._retries else math.inf
            soonest = min(due, retry)
            now = time.monotonic()
            if soonest <= now:
                if queue is not None and due <= retry:
                    lock, ttl = queue.popleft()
                    self._queued -= 1
                    return lock, ttl, False
                _, _, lock, ttl = heapq.heappop(self._retries)
                if lock._renew_at:
                    return lock, ttl, True
                continue
            if soonest == math.inf and dropped:
                soonest = now + dropped  # as late as any lock queued since, at most
            self._sleeping_until = soonest
            self._wake.wait(None if soonest == math.inf else soonest - now)
            self._sleeping_until = math.inf

    def _run(self) -> None:
        while True:
            with self._wake:
                lock, ttl, _ = self._next()
            again, retry = self._renew(lock, ttl)
            if again is None:
                continue
            with self._mutex:
                if not lock._renew_at:  # released meanwhile
                    continue
                lock._renew_at = again
                if retry:
                    heapq.heappush(self._retries, (again, next(self._order), lock, ttl))
                else:  # due after everything queued at this ttl: its queue stays in order
                    self._queues.setdefault(ttl, collections.deque()).append((lock, ttl))
                    self._queued += 1

    @staticmethod
    def _renew(lock: Renewable, ttl: float) -> tuple[float | None, bool]:
        """Renew ``lock`` once: when to renew it next (None: no more), and if as a retry."""
        try:
            if lock.remaining() <= 0.0:  # fell behind: the window closed unrenewed
                lock._mark_lost(unreachable=False)
                return None, False
            try:
                if lock._renew(ttl):
                    return time.monotonic() + ttl / 3.0, False
                return None, False  # lost (reported by _renew), or released meanwhile
            except StoreError:
                retry = renew_retry_s(ttl, lock.remaining())
                if retry is not None:
                    return time.monotonic() + retry, True
                lock._mark_lost(unreachable=True)
                return None, False
        except Exception:  # an on_lost that raised: report it, keep renewing the others
            kind, error, trace = sys.exc_info()
            assert kind is not None
            threading.excepthook(
                threading.ExceptHookArgs((kind, error, trace, threading.current_thread()))
            )
            return None, False

    def _after_fork_in_child(self) -> None:
        self._start_fresh()  # the parent's thread and locks are the parent's


#: The process's renewer.
RENEWER: Final = Renewer()
