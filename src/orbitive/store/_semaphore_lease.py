"""The sync handle of a counting lease, :class:`SemaphoreLease`, and the sync verbs that
make one (one attempt; the blocking wait).

A semaphore lease is a :class:`~._lock.Lock` whose tenure is one slot of a
semaphore: it shares the lock's state, renewal (the same renewer serves both)
and release, and only its engine steps differ, the batch primitives of the
semaphore given its one grant. The asyncio twin is :mod:`._semaphore_lease_async`.

Waiting: a waiter subscribes to the engine's notifications of released units
before its first attempt (PostgreSQL ``LISTEN``, Redis Pub/Sub; see
``_notifications``) and is woken by a release; an engine without them (SQLite;
the SHM table, whose readiness wakes it) pauses as a lock waiter does. No pause
ever passes the expiry of the holder that ends first, so a holder that died
frees a waiter no later than its lease's end.
"""

from __future__ import annotations

import time
from typing import Any, cast

from ._backend import Backend
from ._engine import Busy, Engine, Grant, UnitGrant, poll_pause_s
from ._lock import Lock, time_left
from ._notifications import Subscription


class SemaphoreLease(Lock):
    """A held slot of a semaphore: a tenure of one owner, with a fencing token.

    Obtained from :meth:`Semaphore.try_acquire` or :meth:`Semaphore.acquire`; use
    it as a context manager to release on exit. Thread-safe. ``renew``,
    ``release``, ``lost``, ``remaining`` and the other members are the
    :class:`~orbitive.store.Lock`'s; ``name`` is the semaphore's name.
    """

    exclusive = False  # up to ``limit`` holders of the name

    __slots__ = ()

    @property
    def slot(self) -> int:
        """Which slot of the semaphore this tenure holds, ``0 <= slot < limit``."""
        return cast(UnitGrant, self._grant).slot

    def _held_thing(self) -> str:
        return f"semaphore {self._name!r} slot {self.slot}"

    def _renew_step(self, engine: Engine[Any, Any], ttl: float) -> Grant | None:
        return engine.renew_units(self._name, self._owner, (self._grant,), ttl)[0]

    def _release_step(self, engine: Engine[Any, Any]) -> bool:
        return engine.release_units(self._name, self._owner, (self._grant,))[0]

    def __enter__(self) -> SemaphoreLease:
        return self


def attempt(
    backend: Backend, name: str, limit: int, owner: str, ttl: float
) -> SemaphoreLease | Busy:
    """One engine attempt with validated arguments: the new lease, or the refusal."""
    started = time.monotonic()
    result = backend.engine.acquire_unit(name, limit, owner, ttl)
    return backend.admit(SemaphoreLease, name, owner, ttl, started, result)


def wait_for(
    backend: Backend, name: str, limit: int, owner: str, ttl: float, timeout: float | None
) -> SemaphoreLease:
    """Attempt, pause until woken, attempt again until granted.

    Raises:
        LockTimeout: every slot still held after ``timeout`` seconds.
        SemaphoreLimitMismatch: the holders have another limit.
        StoreError: as the engine raises.
    """
    subscription = backend.engine.subscribe(name)
    if subscription is None:
        return _pursue(backend, name, limit, owner, ttl, timeout, None)
    with subscription:
        return _pursue(backend, name, limit, owner, ttl, timeout, subscription)


def _pursue(
    backend: Backend,
    name: str,
    limit: int,
    owner: str,
    ttl: float,
    timeout: float | None,
    subscription: Subscription | None,
) -> SemaphoreLease:
    engine = backend.engine
    started = time.monotonic()
    waiter = engine.unit_waiter(name) if subscription is None else None
    tries = 0
    while True:
        if waiter is not None:
            waiter.look()
        else:
            assert subscription is not None
            subscription.arm()
        result = attempt(backend, name, limit, owner, ttl)
        if not isinstance(result, Busy):
            return result
        left = time_left(backend, name, result, started, timeout)
        if waiter is not None:
            waiter.wait(result, left, tries)
        else:
            assert subscription is not None
            cap = subscription.cap_s or engine.poll_cap_s
            subscription.wait(poll_pause_s(result, left, tries, cap))
        tries += 1
