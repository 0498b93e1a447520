"""The SHM engine's asyncio form: table steps on the loop, waits on the readiness descriptor.

A table step is one critical section of a few microseconds that never waits on
I/O, so it runs on the event loop itself, faster than a hop to a thread; the
form is ``atomic``: a cancellation cannot land inside a step.

Waiting uses the table's readiness descriptor through ``loop.add_reader``. The
descriptor is level-triggered and shared by the whole process, so one reader
per loop serves every task of that loop that waits (``add_reader`` keeps one
callback per descriptor): when it fires, it drains the descriptor and wakes them
all, and each attempts again. A transition after that attempt makes the
descriptor readable again, so no wake-up between an attempt and the next wait is
lost within a loop. A sync waiter of another thread drains the same descriptor;
the engine's ``poll_cap_s`` bounds the wake-up that can cost (as it does for the
blocking helper), and an expiry, which publishes nothing, is bounded by the
holder's deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from .._core import _fork
from .._core._errors import StoreError
from ..lock import LockLease
from ._engine import Busy
from ._engine_async import AsyncEngine
from ._notifications import Subscription
from ._shm import ShmEngine, ShmUnit


class ShmAsyncEngine(AsyncEngine[LockLease, ShmUnit]):
    """Named locks and semaphores in the SHM lock table, for asyncio code."""

    atomic = True

    def __init__(self, engine: ShmEngine) -> None:
        super().__init__(engine)
        self._shm = engine
        self._mutex = threading.Lock()  # loops of several threads may wait at once
        # Per loop waiting on the table: the descriptor its reader watches, and the waiters.
        self._waiting: dict[asyncio.AbstractEventLoop, tuple[int, set[asyncio.Future[None]]]] = {}
        _fork.register(self)

    async def acquire(self, name: str, owner: str, ttl: float) -> LockLease | Busy:
        return self._shm.acquire(name, owner, ttl)

    async def renew(self, name: str, owner: str, grant: LockLease, ttl: float) -> LockLease | None:
        return self._shm.renew(name, owner, grant, ttl)

    async def release(self, name: str, owner: str, grant: LockLease) -> bool:
        return self._shm.release(name, owner, grant)

    async def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> ShmUnit | Busy:
        return self._shm.acquire_unit(name, limit, owner, ttl)

    async def renew_units(
        self, name: str, owner: str, grants: Sequence[ShmUnit], ttl: float
    ) -> list[ShmUnit | None]:
        return self._shm.renew_units(name, owner, grants, ttl)

    async def release_units(self, name: str, owner: str, grants: Sequence[ShmUnit]) -> list[bool]:
        return self._shm.release_units(name, owner, grants)

    def subscribe(self, name: str) -> Subscription | None:
        """None: a semaphore waiter waits on the table's readiness, as a lock waiter does."""
        return None

    async def wait(self, delay: float) -> None:
        """Until the table signals a transition, or ``delay`` seconds."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self._enter(loop, woken)
        timer = loop.call_later(max(delay, 0.0), _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._leave(loop, woken)

    def _enter(self, loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> None:
        with self._mutex:
            entry = self._waiting.get(loop)
            if entry is None:
                fd = self._shm.fileno()  # StoreError(CLOSED) once the store closed
                loop.add_reader(fd, self._ring, loop)
                entry = self._waiting[loop] = (fd, set())
            entry[1].add(woken)

    def _leave(self, loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> None:
        with self._mutex:
            entry = self._waiting.get(loop)
            if entry is None or woken not in entry[1]:
                return
            entry[1].discard(woken)
            if not entry[1]:
                self._forget(loop)

    def _forget(self, loop: asyncio.AbstractEventLoop) -> set[asyncio.Future[None]]:
        """Stop watching for ``loop`` (mutex held); the waiters it had."""
        fd, waiters = self._waiting.pop(loop)
        if not loop.is_closed():
            loop.remove_reader(fd)
        return waiters

    def _ring(self, loop: asyncio.AbstractEventLoop) -> None:
        """The descriptor is readable: clear it and wake the loop's waiters."""
        try:
            self._shm.drain()
        except StoreError:  # closed: stop watching; each waiter's next attempt says so
            with self._mutex:
                waiters = self._forget(loop) if loop in self._waiting else set()
        else:
            with self._mutex:
                entry = self._waiting.get(loop)
                waiters = set() if entry is None else set(entry[1])
        for woken in waiters:
            _wake(woken)

    def close(self) -> None:
        """Wake every waiting task (the store is closing); their next attempt reports it."""
        with self._mutex:
            loops = list(self._waiting)
        for loop in loops:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._wake_all, loop)

    def _wake_all(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._mutex:
            waiters = self._forget(loop) if loop in self._waiting else set()
        for woken in waiters:
            _wake(woken)

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.Lock()
        self._waiting = {}  # the parent's loops and readers are not the child's

    def __repr__(self) -> str:
        return f"<ShmAsyncEngine {self._shm!r}>"


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
