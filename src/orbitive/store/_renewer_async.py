"""One renewer task per event loop: every auto-renewed ``AsyncLock`` of the loop, in due order.

The asyncio twin of :mod:`._renewer`, with the same rules and the same schedule
(one FIFO queue per ttl, a heap of retries, a release as one flag on the lock):
each renewal is due a third of the ttl after the grant or the last renewal; one
that comes due after the window closed is reported as a loss without being
attempted; a failing engine is retried well before the window closes
(``renew_retry_s``); ``on_lost`` runs in the loop. Taking or releasing a lock
creates no task of its own: the loop's renewer task starts with its first lock
and ends when it has none left.

Each renewal runs as a short task of its own, so a slow engine call delays no
other lock's renewal, and a release waits for the renewal of its lock in flight
(:meth:`LoopRenewer.settle`) and so acts on the latest grant. A cancellation of
the release during that wait leaves the lock held and releasable, renewed no more.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
import weakref
from typing import Final, Protocol

from .._core import _fork
from .._core._errors import StoreError
from ._renewer import COMPACT_MIN, renew_retry_s


class AsyncRenewable(Protocol):
    """What the loop's renewer asks of a lock (``_lock_async.AsyncLock``)."""

    #: The loop's time of its next renewal; 0 once it is not to be renewed.
    _renew_at: float
    #: Its renewal in flight, if any.
    _renewing: asyncio.Task[None] | None

    def remaining(self) -> float:
        """Seconds left in the window, measured locally."""

    async def _renew(self, ttl: float) -> bool:
        """One renewal; False once lost (reported) or released."""

    def _mark_lost(self, *, unreachable: bool) -> None:
        """Report the lease lost (``lost``, the loss count, ``on_lost``); ``unreachable``:
        the engine could not be reached in time (else the window closed unrenewed)."""


class LoopRenewer:
    """The renewer of one event loop; use :func:`renewer_of`. Loop-confined."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queues: dict[float, collections.deque[tuple[AsyncRenewable, float]]] = {}
        self._retries: list[tuple[float, int, AsyncRenewable, float]] = []
        self._order = itertools.count()
        self._queued = self._released = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._sleeping_until = math.inf

    def add(self, lock: AsyncRenewable, ttl: float) -> None:
        """Renew ``lock`` every ``ttl / 3`` seconds from now, until :meth:`cancel`."""
        lock._renew_at = self._loop.time() + ttl / 3.0
        self._queue(lock, ttl)

    def cancel(self, lock: AsyncRenewable) -> None:
        """Renew ``lock`` no more (a renewal in flight still completes)."""
        lock._renew_at = 0.0
        self._released += 1
        if self._released > max(self._queued // 2, COMPACT_MIN):
            self._compact()

    def runs_here(self) -> bool:
        """Whether the running event loop (if any) is this renewer's."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def cancel_soon(self, lock: AsyncRenewable) -> None:
        """:meth:`cancel` from any thread, in the loop (nothing when the loop is closed)."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.cancel, lock)

    @staticmethod
    async def settle(lock: AsyncRenewable) -> None:
        """Wait until ``lock``'s renewal in flight (if any) is over; never cancels it.

        Raises:
            asyncio.CancelledError: the waiting task was cancelled (the renewal goes on).
        """
        task = lock._renewing
        if task is not None and not task.done():
            await asyncio.wait((task,))

    def _queue(self, lock: AsyncRenewable, ttl: float) -> None:
        queue = self._queues.get(ttl)
        if queue is None:
            queue = self._queues[ttl] = collections.deque()
        queue.append((lock, ttl))
        self._queued += 1
        self._wake_up(lock._renew_at)

    def _wake_up(self, due: float) -> None:
        """Start the task, or wake it when it sleeps past ``due``."""
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run(), name="orbitive-renewer")
        elif due < self._sleeping_until and self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _compact(self) -> None:
        """Drop every released lock from the queues."""
        for ttl, queue in list(self._queues.items()):
            kept = [item for item in queue if item[0]._renew_at]
            if kept:
                self._queues[ttl] = collections.deque(kept)
            else:
                del self._queues[ttl]
        self._queued = sum(len(queue) for queue in self._queues.values())
        self._released = 0

    def _due(
        self,
    ) -> tuple[float, collections.deque[tuple[AsyncRenewable, float]] | None, float]:
        """The earliest due time of the queues' fronts and its queue, dropping released
        fronts, and the longest third of a ttl among those dropped (see ``_renewer``)."""
        due, queue, dropped = math.inf, None, 0.0
        for ttl, candidate in list(self._queues.items()):
            while candidate and not candidate[0][0]._renew_at:
                dropped = max(dropped, candidate.popleft()[1] / 3.0)
                self._queued -= 1
            if not candidate:
                del self._queues[ttl]
            elif candidate[0][0]._renew_at < due:
                due, queue = candidate[0][0]._renew_at, candidate
        return due, queue, dropped

    async def _run(self) -> None:
        """Sleep until the next renewal is due, and start it; end when none is left."""
        while True:
            due, queue, dropped = self._due()
            retry = self._retries[0][0] if self._retries else math.inf
            soonest = min(due, retry)
            if soonest == math.inf:
                if not dropped:
                    return  # started again by the next lock
                soonest = self._loop.time() + dropped  # as late as any lock queued since
            delay = soonest - self._loop.time()
            if delay > 0.0:
                self._sleeping_until = soonest
                self._wake = wake = self._loop.create_future()
                timer = self._loop.call_later(delay, _resolve, wake)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
                    self._sleeping_until = math.inf
                continue
            if queue is not None and due <= retry:
                lock, ttl = queue.popleft()
                self._queued -= 1
            else:
                _, _, lock, ttl = heapq.heappop(self._retries)
                if not lock._renew_at:
                    continue
            lock._renewing = self._loop.create_task(self._renew(lock, ttl))

    async def _renew(self, lock: AsyncRenewable, ttl: float) -> None:
        try:
            again, retry = await self._renew_once(lock, ttl)
        except Exception as error:  # an on_lost that raised: report it, renew the others
            self._loop.call_exception_handler(
                {"message": "orbitive: a store lock's on_lost raised", "exception": error}
            )
            return
        finally:
            lock._renewing = None
        if again is None or not lock._renew_at:  # no more, or released meanwhile
            return
        lock._renew_at = again
        if retry:
            heapq.heappush(self._retries, (again, next(self._order), lock, ttl))
            self._wake_up(again)
        else:  # due after everything queued at this ttl: its queue stays in order
            self._queue(lock, ttl)

    async def _renew_once(self, lock: AsyncRenewable, ttl: float) -> tuple[float | None, bool]:
        """Renew ``lock`` once: when next (loop time; None: no more), and if as a retry."""
        if lock.remaining() <= 0.0:  # fell behind: the window closed unrenewed
            lock._mark_lost(unreachable=False)
            return None, False
        try:
            if not await lock._renew(ttl):
                return None, False  # lost (reported by _renew), or released meanwhile
            return self._loop.time() + ttl / 3.0, False
        except StoreError:
            retry = renew_retry_s(ttl, lock.remaining())
            if retry is None:
                lock._mark_lost(unreachable=True)
                return None, False
            return self._loop.time() + retry, True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Renewers:
    """The renewer of each live event loop of this process."""

    def __init__(self) -> None:
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopRenewer] = (
            weakref.WeakKeyDictionary()
        )

    def _after_fork_in_child(self) -> None:
        self.by_loop = weakref.WeakKeyDictionary()  # the parent's loops and locks


_RENEWERS: Final = _Renewers()
_fork.register(_RENEWERS)


def renewer_of(loop: asyncio.AbstractEventLoop) -> LoopRenewer:
    """The renewer of ``loop`` (made on first use; call it from that loop)."""
    found = _RENEWERS.by_loop.get(loop)
    if found is None:
        found = _RENEWERS.by_loop[loop] = LoopRenewer(loop)
    return found
