"""The asyncio form of an engine: the same primitives as awaitables, never blocking the loop.

:class:`AsyncEngine` is what the asyncio helpers (:mod:`._lock_async`) drive. This
class is also the default form of every engine (``open_store`` pairs each engine
with its form): it
runs the engine's sync primitives in the event loop's default executor, one
worker thread per call in flight, so SQLite and any new engine get an asyncio
form for free. An engine overrides it where it has something better: PostgreSQL
talks through ``psycopg.AsyncConnection`` (:mod:`._postgres_async`), and the SHM
table's steps, a few microseconds each, run on the loop itself and wait on the
table's readiness descriptor (:mod:`._shm_async`).

Cancellation facts the helpers rely on:

* A primitive that suspends (``atomic`` False) may commit after the task that
  awaits it was cancelled: a thread cannot be stopped, and a statement that
  reached the server may still commit. :func:`run_to_completion` therefore lets
  the primitive finish and hands the caller its result together with the
  cancellation, so the caller can release an orphaned grant, or record a
  release, before it re-raises.
* A primitive of an ``atomic`` form never suspends, so a cancellation can only
  arrive before or after it, never during it; it is awaited directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, Generic, TypeVar

from ._engine import Busy, Engine, Grant, UnitGrant
from ._notifications import Subscription

_G = TypeVar("_G", bound=Grant)
_U = TypeVar("_U", bound=UnitGrant)
_T = TypeVar("_T")


class AsyncEngine(Generic[_G, _U]):
    """The primitives the asyncio helpers await; by default, the sync ones in a thread.

    Arguments arrive validated, and the primitives keep the sync engine's rules
    (see :class:`~._engine.Engine`). Each call must be awaited in a running loop.
    """

    #: True when no primitive ever suspends (a cancellation cannot land inside one).
    atomic: ClassVar[bool] = False

    def __init__(self, engine: Engine[_G, _U]) -> None:
        self._engine = engine

    @property
    def poll_cap_s(self) -> float:
        """Longest pause between attempts of :meth:`Store.lock_async`, in seconds."""
        return self._engine.poll_cap_s

    def acquire(self, name: str, owner: str, ttl: float) -> Awaitable[_G | Busy]:
        """Grant ``name`` to ``owner`` for ``ttl`` seconds, or report the holder."""
        return _in_thread(self._engine.acquire, name, owner, ttl)

    def renew(self, name: str, owner: str, grant: _G, ttl: float) -> Awaitable[_G | None]:
        """A new full window of ``ttl`` seconds from now; None when the tenure is gone."""
        return _in_thread(self._engine.renew, name, owner, grant, ttl)

    def release(self, name: str, owner: str, grant: _G) -> Awaitable[bool]:
        """Remove the exact tenure of ``grant``; True only if it was still live."""
        return _in_thread(self._engine.release, name, owner, grant)

    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> Awaitable[_U | Busy]:
        """Grant ``owner`` the lowest free slot of semaphore ``name``, or report the holder
        that ends first; ``SemaphoreLimitMismatch`` under another limit."""
        return _in_thread(self._engine.acquire_unit, name, limit, owner, ttl)

    def renew_units(
        self, name: str, owner: str, grants: Sequence[_U], ttl: float
    ) -> Awaitable[list[_U | None]]:
        """A new full window for each tenure of ``grants``; None for each one gone."""
        return _in_thread(self._engine.renew_units, name, owner, grants, ttl)

    def release_units(self, name: str, owner: str, grants: Sequence[_U]) -> Awaitable[list[bool]]:
        """Remove the exact tenures of ``grants``; True for each one still live."""
        return _in_thread(self._engine.release_units, name, owner, grants)

    def subscribe(self, name: str) -> Subscription | None:
        """The sync engine's :meth:`~._engine.Engine.subscribe` (it never blocks): its
        subscriptions wake asyncio waiters too."""
        return self._engine.subscribe(name)

    async def wait(self, delay: float) -> None:
        """Pause up to ``delay`` seconds, returning early if the engine signals a change."""
        await asyncio.sleep(delay)

    def close(self) -> None:
        """Release what this form holds of its own (the sync engine is the store's)."""


def _in_thread(function: Callable[..., _T], *args: object) -> asyncio.Future[_T]:
    return asyncio.get_running_loop().run_in_executor(None, function, *args)


async def run_to_completion(
    step: Awaitable[_T],
) -> tuple[_T, asyncio.CancelledError | None]:
    """Await ``step`` to its end even if the awaiting task is cancelled meanwhile.

    Returns:
        ``(result, cancellation)``: the step's result and the ``CancelledError``
        that arrived while it ran, or None. The caller acts on the result and
        then raises the cancellation.

    Raises:
        Exception: whatever the step raised; but the cancellation instead when
            both happened (the step's failure changed nothing to undo).
    """
    task = asyncio.ensure_future(step)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as error:  # noted, raised by the caller afterwards
            cancelled = error
    if cancelled is not None and (task.cancelled() or task.exception() is not None):
        raise cancelled
    return task.result(), cancelled
