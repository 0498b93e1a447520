"""A per-process queue in front of an asyncio pool's checkout: callers served in arrival order.

A process can hold at most ``max_live`` of a key's clients, so no more than
``max_live`` of its tasks have a reason to wait in the
:class:`~orbitive.clients.ClientPool` checkout at once. Every waiter there
sleeps on the key's version word, and every change of the key (a return, a
waiter counted in or out) wakes them all: with hundreds of requests waiting in
a worker, each change would cost hundreds of wake-ups and table steps. The gate
lets ``max_live`` tasks in, holding their place until they hand their client
back, and queues the others in FIFO order on an ``asyncio.Semaphore``, where a
leave wakes exactly one.

The queue also decides the order: without it, the waiters a return wakes run
in whatever order the loop resumes them (the last to wait first, measured), so
a task could wait while later ones are served. Through the gate the oldest task
takes the place a return gives back, first come first served, as the pool
table's queue orders processes.

A task holds a place from :meth:`Gate.enter` to :meth:`Gate.leave`, exactly
once whatever happens in between (:class:`~orbitive.clients.ClientPool` leaves
when the client is handed back or the checkout fails; :func:`leaver` gives the
place back from any thread).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import final

from .._core._errors import PoolTimeout, TooManyRequests
from ..pool import Key


@final
class Gate:
    """The places of one asyncio pool in this process (see the module).

    Used from the pool's event loop only.
    """

    __slots__ = ("_free", "_key", "_max_waiting", "_queue")

    def __init__(self, places: int, max_waiting: int, key: Key) -> None:
        self._free = places
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self._max_waiting, self._key = max_waiting, key

    async def enter(self, timeout: float) -> float:
        """Take a place, waiting in turn (FIFO) for at most ``timeout`` seconds.

        Returns:
            The seconds waited in the queue (0.0 when a place was free at once).

        Raises:
            PoolTimeout: no place within ``timeout``.
            TooManyRequests: ``max_waiting`` tasks of this process already queue.
        """
        if self._free and not self._queue:
            self._free -= 1
            return 0.0
        if len(self._queue) >= self._max_waiting:
            raise TooManyRequests(
                f"{len(self._queue)} tasks of this process already wait for key {self._key} "
                f"(max_waiting {self._max_waiting})",
                key=self._key,
            )
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        turn: asyncio.Future[None] = loop.create_future()
        self._queue.append(turn)
        expiry = loop.call_later(timeout, self._expire, turn, timeout)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.leave()  # given a place, then cancelled: it goes to the next in turn
            elif turn in self._queue:
                self._queue.remove(turn)
            raise
        finally:
            expiry.cancel()
        return time.monotonic() - start

    def _expire(self, turn: asyncio.Future[None], timeout: float) -> None:
        if not turn.done():
            self._queue.remove(turn)
            turn.set_exception(
                PoolTimeout(f"no client for key {self._key} within {timeout:g} s", key=self._key)
            )

    @property
    def queued(self) -> int:
        """The tasks waiting for a place now (read from any thread: a snapshot)."""
        return sum(not turn.done() for turn in tuple(self._queue))

    def leave(self) -> None:
        """Give a place back: to the oldest task still waiting, else free."""
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():  # not timed out nor cancelled
                turn.set_result(None)
                return
        self._free += 1


def leaver(gate: Gate, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """``gate.leave`` for ``loop``'s gate, callable from any thread: it runs at once on
    the loop's own thread, else is scheduled there (and does nothing once the loop is
    closed: its tasks are gone)."""

    def leave() -> None:
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:  # no running loop in this thread
            here = False
        if here:
            gate.leave()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(gate.leave)

    return leave
