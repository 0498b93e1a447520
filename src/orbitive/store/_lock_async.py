"""The asyncio lock handle, :class:`AsyncLock`, and the verbs that make one: the twin of
:mod:`._lock` (``try_lock_async``, ``lock_async``'s :class:`Acquiring`).

A thin driver over the engine's asyncio form (:mod:`._engine_async`): the
guards, the checks between attempts (:func:`._lock.time_left`,
:func:`._lock.refuse_reentry`) and the state of a handle (:class:`._lock.Tenure`)
are the sync twin's, so both follow one contract. Nothing here blocks the event loop.

Cancellation, the rules these functions keep:

* A task cancelled while acquiring leaves no lock behind: if the engine granted
  after the cancellation arrived, the grant is released before the task ends.
* A task cancelled while releasing leaves the handle true to the store: the
  release the engine started is finished and recorded, so the lock is released
  and the handle says so; a cancellation that arrives before the engine call
  (while the renewer task stops) leaves the lock held and the handle releasable.
* A renew cut short by the release stopping its task completes first, so the
  release acts on the latest grant.

Timeline of a cancelled acquire on a thread-backed engine::

    t=0    task: await store.try_lock_async("n", ...)  -> the grant runs in a thread
    t=1ms  task.cancel()                                -> noted; the thread goes on
    t=2ms  thread commits the grant                     -> released again at once
    t=3ms  the task ends with CancelledError            -> "n" is free
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

from .._core._errors import StoreError
from ._backend import Backend
from ._engine import Busy, Grant, poll_pause_s
from ._engine_async import AsyncEngine, run_to_completion
from ._guards import check_store_ttl
from ._lock import Tenure, refuse_reentry, time_left
from ._renewer_async import LoopRenewer, renewer_of

_T = TypeVar("_T")
_L = TypeVar("_L", bound="AsyncLock")


class AsyncLock(Tenure):
    """A held named lock for asyncio code: a tenure of one owner, with a fencing token.

    Obtained from :meth:`Store.try_lock_async` or :meth:`Store.lock_async`; ``async
    with lock`` releases it on exit. Use it from the event loop that acquired it.
    ``renew_async`` and ``release_async`` are the same methods under the names of
    the design's API list.
    """

    __slots__ = ("_releasing", "_renewer", "_renewing", "_task")

    def __init__(
        self, backend: Backend, name: str, owner: str, grant: Grant, deadline: float
    ) -> None:
        super().__init__(backend, name, owner, grant, deadline)
        self._task = asyncio.current_task()  # the task it was granted to
        self._releasing = False  # an engine release is in flight
        self._renewer: LoopRenewer | None = None  # the loop's that renews it
        self._renewing: asyncio.Task[None] | None = None  # its renewal in flight

    async def renew(self, ttl: float) -> bool:
        """Set a new full window of ``ttl`` seconds from now (not added to what is left).

        Args:
            ttl: seconds, finite and > 0.

        Returns:
            True if the lease was still held; False if it had lapsed, was replaced,
            force-released or already released (the handle is then lost).

        Raises:
            StoreError: ``kind == ErrorKind.DATABASE`` for a bad ttl (duration guard,
                before the engine is touched); ``UNAVAILABLE`` when the engine cannot
                be reached; ``CLOSED`` after the store was closed.
            asyncio.CancelledError: the task was cancelled; the renew the engine
                started was finished and recorded first.

        Store contract: "renew gives a new full window from now; False when lost".
        """
        return await self._renew(check_store_ttl(ttl))

    async def _renew(self, ttl: float) -> bool:
        if self._released or self._releasing or self._lost:
            return False
        engine = self._backend.asyncio()
        started = time.monotonic()
        renewed, cancelled = await _settled(engine, self._renew_step(engine, ttl))
        if self._released or self._releasing:  # a release overtook it: no loss to report
            held = False
        else:
            held = self._count_renew(self._settle_renew(started, ttl, renewed))
        if cancelled is not None:
            raise cancelled
        return held

    async def release(self) -> bool:
        """Give the lock up (stopping the renewal task first).

        Returns:
            True if this tenure was still held; False (no error) if it had lapsed or
            been replaced, or on a second release.

        Raises:
            StoreError: ``UNAVAILABLE`` when the engine cannot be reached; ``CLOSED``
                after the store was closed. The handle then stays releasable.
            asyncio.CancelledError: the task was cancelled; a release the engine had
                started was finished and recorded first, else the lock is still
                held and this method may be awaited again.

        Store contract: "release removes only the owner's own tenure".
        """
        await self._stop_renewal()
        if self._released or self._releasing:
            return False
        engine = self._backend.asyncio()
        self._releasing = True
        try:
            released, cancelled = await _settled(engine, self._release_step(engine))
        finally:
            self._releasing = False
        outcome = self._count_release(released, self._settle_release(released))
        if cancelled is not None:
            raise cancelled
        return outcome

    renew_async = renew
    release_async = release

    def _renew_step(self, engine: AsyncEngine[Any, Any], ttl: float) -> Awaitable[Grant | None]:
        """The engine step that renews this tenure (a semaphore lease renews its slot)."""
        return engine.renew(self._name, self._owner, self._grant, ttl)

    def _release_step(self, engine: AsyncEngine[Any, Any]) -> Awaitable[bool]:
        """The engine step that releases this tenure (a semaphore lease frees its slot)."""
        return engine.release(self._name, self._owner, self._grant)

    def _start_renewer(self, ttl: float, on_lost: Callable[[AsyncLock], object] | None) -> None:
        self._on_lost = on_lost
        self._renewer = renewer_of(asyncio.get_running_loop())
        self._renewer.add(self, ttl)

    async def _stop_renewal(self) -> None:
        """Renew no more, and wait until a renewal in flight ended (it completes)."""
        renewer, self._renewer = self._renewer, None
        if renewer is None:
            return
        if not renewer.runs_here():  # released from another loop than it renews in
            renewer.cancel_soon(self)
            return
        renewer.cancel(self)
        await LoopRenewer.settle(self)

    def _stop_renewer(self) -> None:
        """Renew no more, from any thread (the store is closing); no waiting."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel_soon(self)

    async def __aenter__(self) -> AsyncLock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


async def _settled(
    engine: AsyncEngine[Any, Any], step: Awaitable[_T]
) -> tuple[_T, asyncio.CancelledError | None]:
    """The step's result and any cancellation that arrived during it (see the module)."""
    if engine.atomic:
        return await step, None
    return await run_to_completion(step)


async def attempt(backend: Backend, name: str, owner: str, ttl: float) -> AsyncLock | Busy:
    """One engine attempt with validated arguments: the new AsyncLock, or the refusal;
    cancel-safe (a grant that arrives with a cancellation is released again)."""
    engine = backend.asyncio()
    started = time.monotonic()
    return await admit(
        backend, AsyncLock, name, owner, ttl, started, engine.acquire(name, owner, ttl)
    )


async def admit(
    backend: Backend,
    handle: type[_L],
    name: str,
    owner: str,
    ttl: float,
    started: float,
    step: Awaitable[Grant | Busy],
) -> _L | Busy:
    """The ``handle`` of the grant ``step`` brings (requested at ``started``), or its refusal.

    Cancel-safe: a grant that arrives with a cancellation is released again, then the
    cancellation is raised.
    """
    result, cancelled = await _settled(backend.asyncio(), step)
    granted = backend.admit(handle, name, owner, ttl, started, result)
    if cancelled is not None:
        if type(granted) is not Busy:
            await _discard(granted, cancelled)
        raise cancelled
    return granted


async def _discard(lock: AsyncLock, cancelled: asyncio.CancelledError) -> None:
    """Release a grant its cancelled requester no longer wants (cancellation noted)."""
    try:
        await lock.release()
    except asyncio.CancelledError:  # cancelled again: the release was still finished
        pass
    except StoreError as error:  # the engine failed: the lease lapses at its ttl
        raise cancelled from error


class Acquiring(Generic[_L]):
    """What :meth:`Store.lock_async` returns: await it, or ``async with`` it.

    ``await`` gives the held handle; ``async with`` holds it for the block and
    releases it on exit (a loss of the lease does not raise there). ``wait`` makes
    the coroutine that waits for the handle (an :class:`AsyncLock`, or a
    semaphore's lease).
    """

    __slots__ = ("_auto_renew", "_lock", "_on_lost", "_ttl", "_wait")

    def __init__(
        self,
        wait: Callable[[], Awaitable[_L]],
        ttl: float,
        auto_renew: bool,
        on_lost: Callable[[_L], object] | None,
    ) -> None:
        self._wait = wait
        self._ttl = ttl
        self._auto_renew = auto_renew
        self._on_lost: Callable[[Any], object] | None = on_lost
        self._lock: _L | None = None

    async def _acquire(self) -> _L:
        lock = await self._wait()
        if self._auto_renew:
            lock._start_renewer(self._ttl, self._on_lost)
        else:
            lock._on_lost = self._on_lost
        return lock

    def __await__(self) -> Generator[Any, None, _L]:
        return self._acquire().__await__()

    async def __aenter__(self) -> _L:
        self._lock = await self._acquire()
        return self._lock

    async def __aexit__(self, *exc: object) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await lock.release()


async def wait_for(
    backend: Backend, name: str, owner: str, ttl: float, timeout: float | None
) -> AsyncLock:
    """Attempt, pause, attempt again until granted.

    Raises:
        LockTimeout: still held elsewhere after ``timeout`` seconds.
        LockNotReentrant: this very task holds ``name`` in the store (at once).
        StoreError: as the engine raises.
        asyncio.CancelledError: the task was cancelled; no lock is left behind.
    """
    started = time.monotonic()
    if name in backend.holders and timeout != 0.0:  # it would wait: for this very task?
        refuse_reentry(backend, name, threading.get_ident(), asyncio.current_task())
    tries = 0
    while True:
        result = await attempt(backend, name, owner, ttl)
        if not isinstance(result, Busy):
            return result
        engine = backend.asyncio()
        left = time_left(backend, name, result, started, timeout)
        await engine.wait(poll_pause_s(result, left, tries, engine.poll_cap_s))
        tries += 1
