"""One renewer task per event loop: every auto-renewed ``AsyncLock`` of the loop, from a heap.

The asyncio twin of :mod:`._renewer`, with the same rules: each renewal is due a
third of the ttl after the grant or the last renewal; one that comes due after
the window closed is reported as a loss without being attempted; a failing engine
is retried well before the window closes (``renew_retry_s``); ``on_lost`` runs
in the loop. Taking or releasing a lock creates no task of its own: the loop's
renewer task starts with its first lock and ends when it has none left.

Each renewal runs as a short task of its own, so a slow engine call delays no
other lock's renewal, and a release waits for the renewal of its lock in flight
(:meth:`LoopRenewer.settle`) and so acts on the latest grant. A cancellation of
the release during that wait leaves the lock held and releasable, renewed no more.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from typing import Final, Protocol

from .._core import _fork
from .._core._errors import StoreError
from ._renewer import renew_retry_s


class AsyncRenewable(Protocol):
    """What the loop's renewer asks of a lock (``_lock_async.AsyncLock``)."""

    def remaining(self) -> float:
        """Seconds left in the window, measured locally."""

    async def _renew(self, ttl: float) -> bool:
        """One renewal; False once lost (reported) or released."""

    def _mark_lost(self) -> None:
        """Report the lease lost (``lost``, the loss count, ``on_lost``)."""


class AsyncEntry:
    """One lock's place in its loop's heap, and its renewal in flight."""

    __slots__ = ("cancelled", "due", "lock", "queued", "renewer", "renewing", "ttl")

    def __init__(self, renewer: LoopRenewer, lock: AsyncRenewable, ttl: float, due: float) -> None:
        self.renewer = renewer
        self.lock = lock
        self.ttl = ttl
        self.due = due
        self.cancelled = False
        self.queued = False
        self.renewing: asyncio.Task[None] | None = None


class LoopRenewer:
    """The renewer of one event loop; use :func:`renewer_of`. Loop-confined."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, AsyncEntry]] = []
        self._order = itertools.count()
        self._cancelled = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None

    def add(self, lock: AsyncRenewable, ttl: float) -> AsyncEntry:
        """Renew ``lock`` every ``ttl / 3`` seconds from now, until :meth:`cancel`."""
        entry = AsyncEntry(self, lock, ttl, self._loop.time() + ttl / 3.0)
        self._push(entry)
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run(), name="orbitive-renewer")
        return entry

    def cancel(self, entry: AsyncEntry) -> None:
        """Renew ``entry``'s lock no more (a renewal in flight still completes)."""
        if entry.cancelled:
            return
        entry.cancelled = True
        if not entry.queued:
            return
        self._cancelled += 1
        if self._cancelled > len(self._heap) // 2:
            self._heap = [item for item in self._heap if not item[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def runs_here(self) -> bool:
        """Whether the running event loop (if any) is this renewer's."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def cancel_soon(self, entry: AsyncEntry) -> None:
        """:meth:`cancel` from any thread, in the loop (nothing when the loop is closed)."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.cancel, entry)

    @staticmethod
    async def settle(entry: AsyncEntry) -> None:
        """Wait until ``entry``'s renewal in flight (if any) is over; never cancels it.

        Raises:
            asyncio.CancelledError: the waiting task was cancelled (the renewal goes on).
        """
        task = entry.renewing
        if task is not None and not task.done():
            await asyncio.wait((task,))

    def _push(self, entry: AsyncEntry) -> None:
        head = self._heap[0][0] if self._heap else None
        entry.queued = True
        heapq.heappush(self._heap, (entry.due, next(self._order), entry))
        wake = self._wake
        if (head is None or entry.due < head) and wake is not None and not wake.done():
            wake.set_result(None)

    async def _run(self) -> None:
        while True:
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
                self._cancelled -= 1
            if not self._heap:
                return  # started again by the next lock
            delay = self._heap[0][0] - self._loop.time()
            if delay > 0.0:
                self._wake = wake = self._loop.create_future()
                timer = self._loop.call_later(delay, _resolve, wake)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
                continue
            entry = heapq.heappop(self._heap)[2]
            entry.queued = False
            entry.renewing = self._loop.create_task(self._renew(entry))

    async def _renew(self, entry: AsyncEntry) -> None:
        try:
            again = await self._renew_once(entry.lock, entry.ttl)
        except Exception as error:  # an on_lost that raised: report it, renew the others
            self._loop.call_exception_handler(
                {"message": "orbitive: a store lock's on_lost raised", "exception": error}
            )
            return
        finally:
            entry.renewing = None
        if again is not None and not entry.cancelled:
            entry.due = again
            self._push(entry)
            if self._task is None or self._task.done():
                self._task = self._loop.create_task(self._run(), name="orbitive-renewer")

    async def _renew_once(self, lock: AsyncRenewable, ttl: float) -> float | None:
        """Renew ``lock`` once; when to renew it next on the loop's clock (None: no more)."""
        if lock.remaining() <= 0.0:  # fell behind: the window closed unrenewed
            lock._mark_lost()
            return None
        try:
            if not await lock._renew(ttl):
                return None  # lost (reported by _renew), or released meanwhile
            return self._loop.time() + ttl / 3.0
        except StoreError:
            retry = renew_retry_s(ttl, lock.remaining())
            if retry is None:
                lock._mark_lost()
                return None
            return self._loop.time() + retry


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
