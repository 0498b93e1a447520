"""The asyncio handle of a counting lease, :class:`AsyncSemaphoreLease`, and the verbs
that make one: the twin of :mod:`._semaphore_lease`.

The handle is an :class:`~._lock_async.AsyncLock` whose engine steps are the
semaphore's; the attempt is the lock's cancel-safe admission
(:func:`._lock_async.admit`), so a task cancelled while acquiring leaves no slot
held. The wait subscribes to the engine's notifications where it has them and is
woken on its own loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar, cast

from ._backend import Backend
from ._engine import Busy, Grant, UnitGrant, poll_pause_s
from ._engine_async import AsyncEngine
from ._lock import time_left
from ._lock_async import AsyncLock, admit
from ._notifications import Subscription

_T = TypeVar("_T")


class AsyncSemaphoreLease(AsyncLock):
    """A held slot of a semaphore for asyncio code: a tenure of one owner, with a token.

    Obtained from :meth:`Semaphore.try_acquire_async` or
    :meth:`Semaphore.acquire_async`; ``async with lease`` releases it on exit. Use
    it from the event loop that acquired it. The members are the
    :class:`~orbitive.store.AsyncLock`'s, and :attr:`slot`.
    """

    exclusive = False  # up to ``limit`` holders of the name

    __slots__ = ()

    @property
    def slot(self) -> int:
        """Which slot of the semaphore this tenure holds, ``0 <= slot < limit``."""
        return cast(UnitGrant, self._grant).slot

    def _held_thing(self) -> str:
        return f"semaphore {self._name!r} slot {self.slot}"

    def _renew_step(self, engine: AsyncEngine[Any, Any], ttl: float) -> Awaitable[Grant | None]:
        return _only(engine.renew_units(self._name, self._owner, (self._grant,), ttl))

    def _release_step(self, engine: AsyncEngine[Any, Any]) -> Awaitable[bool]:
        return _only(engine.release_units(self._name, self._owner, (self._grant,)))

    async def __aenter__(self) -> AsyncSemaphoreLease:
        return self


async def _only(step: Awaitable[Sequence[_T]]) -> _T:
    """The one answer of a batch step given one grant."""
    return (await step)[0]


async def attempt(
    backend: Backend, name: str, limit: int, owner: str, ttl: float
) -> AsyncSemaphoreLease | Busy:
    """One engine attempt with validated arguments: the new lease, or the refusal;
    cancel-safe (a grant that arrives with a cancellation is released again)."""
    engine = backend.asyncio()
    started = time.monotonic()
    step = engine.acquire_unit(name, limit, owner, ttl)
    return await admit(backend, AsyncSemaphoreLease, name, owner, ttl, started, step)


async def wait_for(
    backend: Backend, name: str, limit: int, owner: str, ttl: float, timeout: float | None
) -> AsyncSemaphoreLease:
    """Attempt, pause until woken, attempt again until granted.

    Raises:
        LockTimeout: every slot still held after ``timeout`` seconds.
        SemaphoreLimitMismatch: the holders have another limit.
        StoreError: as the engine raises.
        asyncio.CancelledError: the task was cancelled; no slot is left held.
    """
    subscription = backend.asyncio().subscribe(name)
    if subscription is None:
        return await _pursue(backend, name, limit, owner, ttl, timeout, None)
    with subscription:
        return await _pursue(backend, name, limit, owner, ttl, timeout, subscription)


async def _pursue(
    backend: Backend,
    name: str,
    limit: int,
    owner: str,
    ttl: float,
    timeout: float | None,
    subscription: Subscription | None,
) -> AsyncSemaphoreLease:
    started = time.monotonic()
    tries = 0
    while True:
        if subscription is not None:
            subscription.arm()
        result = await attempt(backend, name, limit, owner, ttl)
        if not isinstance(result, Busy):
            return result
        engine = backend.asyncio()
        left = time_left(backend, name, result, started, timeout)
        cap = None if subscription is None else subscription.cap_s
        delay = poll_pause_s(result, left, tries, cap or engine.poll_cap_s)
        if subscription is None:
            await engine.wait(delay)
        else:
            await subscription.wait_async(delay)
        tries += 1
