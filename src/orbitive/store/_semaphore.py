"""Counting leases: :class:`Semaphore`, up to ``limit`` holders of one name at once.

The public verbs validate (with :mod:`._guards`), then call the handle modules,
the sync :mod:`._semaphore_lease` and its asyncio twin
:mod:`._semaphore_lease_async`, over the store's backend, as :class:`Store` does
for named locks. Every rule of the store contract holds for each holder: a TTL
on the engine's clock, owner compare on renew and release, a renew that sets a
new full window, a lapse that loses the lease, the duration guard and the name
and owner rules. And:

* **At most ``limit`` live holders** of a name, each in its own slot
  ``0 <= slot < limit``; an acquisition takes the lowest free slot.
* **Fencing**: each acquisition's token is strictly larger than every earlier
  token of the name, across all its slots (tokens increase per store).
* **One limit per name**: an acquisition under another limit than the live
  holders' raises :class:`~orbitive._core._errors.SemaphoreLimitMismatch` and
  takes nothing. Once every holder is gone (released or lapsed), the next
  acquisition sets the limit anew.
* **Namespaces**: a semaphore and a named lock of the same name are unrelated.
"""

from __future__ import annotations

from collections.abc import Callable

from . import _semaphore_lease, _semaphore_lease_async
from ._backend import Backend
from ._engine import SlotInfo
from ._guards import (
    check_owner,
    check_renewal,
    check_store_ttl,
    check_timeout,
    random_owner,
)
from ._lock_async import Acquiring
from ._semaphore_lease import SemaphoreLease
from ._semaphore_lease_async import AsyncSemaphoreLease


class Semaphore:
    """Up to ``limit`` holders of one name at once; get one with :meth:`Store.semaphore`.

    Thread-safe, and cheap: it holds the name and the limit, and asks the engine
    only when a verb is called.

    Example::

        sem = store.semaphore("payments-api", limit=5)
        with sem.acquire(ttl=30.0, timeout=10.0) as lease:
            call_payments(fencing_token=lease.fencing_token)
    """

    __slots__ = ("_backend", "_limit", "_name")

    def __init__(self, backend: Backend, name: str, limit: int) -> None:
        self._backend = backend
        self._name = name
        self._limit = limit

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self._name

    @property
    def limit(self) -> int:
        """How many holders it admits at once."""
        return self._limit

    def try_acquire(self, owner: str, ttl: float) -> SemaphoreLease | None:
        """Take the lowest free slot for ``owner`` for ``ttl`` seconds, if one is free.

        Args:
            owner: a non-empty str identifying the holder (at most 255 UTF-8 bytes).
            ttl: lease length in seconds, finite and > 0.

        Returns:
            A :class:`SemaphoreLease` (``slot``, ``fencing_token``, ``renew``,
            ``release``), or None when ``limit`` live leases hold the name.

        Raises:
            InvalidLockOwner: empty or non-str owner (``kind == INVALID_INPUT``).
            SemaphoreLimitMismatch: the live holders were granted under another
                limit (``kind == INVALID_INPUT``); nothing is taken.
            StoreError: ``kind == DATABASE`` for a bad ttl, before the engine is
                touched (cause chained); ``UNAVAILABLE`` when the engine cannot be
                reached; ``CLOSED`` after the store was closed.
        """
        owner, ttl = check_owner(owner), check_store_ttl(ttl)
        result = _semaphore_lease.attempt(self._backend, self._name, self._limit, owner, ttl)
        return result if type(result) is SemaphoreLease else None

    def acquire(
        self,
        owner: str | None = None,
        ttl: float = 30.0,
        timeout: float | None = None,
        *,
        auto_renew: bool = True,
        on_lost: Callable[[SemaphoreLease], None] | None = None,
    ) -> SemaphoreLease:
        """Wait for a free slot and hold it, renewing in the background; use with ``with``.

        A waiter is woken by a release (PostgreSQL ``LISTEN``/``NOTIFY``, Redis
        Pub/Sub, the SHM table's readiness) or polls (SQLite), and never pauses
        past the expiry of the holder that ends first.

        Args:
            owner: the owner; None makes a fresh ``"host:pid:random"`` one.
            ttl: lease length in seconds; renewed every ``ttl / 3`` when ``auto_renew``.
            timeout: seconds to wait; None waits forever; 0 makes exactly one attempt.
            auto_renew: renew in the background until released or lost.
            on_lost: called with the lease when a renew finds it lost;
                :attr:`SemaphoreLease.lost` turns True either way, and leaving the
                ``with`` block does not raise.

        Returns:
            The held :class:`SemaphoreLease`; leaving its ``with`` block releases it.

        Raises:
            LockTimeout: every slot still held after ``timeout`` seconds.
            InvalidTtl: a negative, NaN or non-number ``timeout``.
            InvalidArgumentType: ``auto_renew`` not a bool, or ``on_lost`` not callable.
            SemaphoreLimitMismatch, StoreError: as for :meth:`try_acquire`.
        """
        ttl = check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        check_renewal(auto_renew, on_lost)
        lease = _semaphore_lease.wait_for(
            self._backend, self._name, self._limit, owner, ttl, wait_s
        )
        if auto_renew:
            lease._start_renewer(ttl, on_lost)
        else:
            lease._on_lost = on_lost
        return lease

    async def try_acquire_async(self, owner: str, ttl: float) -> AsyncSemaphoreLease | None:
        """:meth:`try_acquire` for asyncio code: the event loop is never blocked.

        Returns:
            An :class:`AsyncSemaphoreLease` (``await lease.renew(ttl)``, ``await
            lease.release()``, ``async with lease``), or None when every slot is held.

        Raises:
            InvalidLockOwner, SemaphoreLimitMismatch, StoreError: as for :meth:`try_acquire`.
            asyncio.CancelledError: the task was cancelled; a slot the engine granted
                meanwhile has been released again.
        """
        owner, ttl = check_owner(owner), check_store_ttl(ttl)
        backend = self._backend
        result = await _semaphore_lease_async.attempt(backend, self._name, self._limit, owner, ttl)
        return result if type(result) is AsyncSemaphoreLease else None

    def acquire_async(
        self,
        owner: str | None = None,
        ttl: float = 30.0,
        timeout: float | None = None,
        *,
        auto_renew: bool = True,
        on_lost: Callable[[AsyncSemaphoreLease], object] | None = None,
    ) -> Acquiring[AsyncSemaphoreLease]:
        """:meth:`acquire` for asyncio code: waits without blocking the loop, renews in a task.

        ``async with sem.acquire_async(ttl=30.0, timeout=10.0) as lease:`` holds a
        slot for the block; ``lease = await sem.acquire_async(...)`` returns the
        :class:`AsyncSemaphoreLease` for the caller to release.

        Args:
            owner: as for :meth:`acquire`.
            ttl: lease length in seconds (float), as for :meth:`acquire`.
            timeout: seconds to wait (float), as for :meth:`acquire`.
            auto_renew: as for :meth:`acquire`.
            on_lost: called in the event loop with the lease when a renew finds it
                lost; it must not block.

        Returns:
            An awaitable async context manager; the arguments are checked at once,
            so bad input raises here, before anything is awaited.

        Raises:
            LockTimeout: (when awaited) every slot still held after ``timeout`` seconds.
            InvalidTtl, InvalidArgumentType: as for :meth:`acquire`.
            SemaphoreLimitMismatch, StoreError: (when awaited) as for :meth:`try_acquire`.
            asyncio.CancelledError: the task was cancelled while waiting; no slot is
                left held.
        """
        ttl = check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        check_renewal(auto_renew, on_lost)
        backend, name, limit = self._backend, self._name, self._limit
        return Acquiring(
            lambda: _semaphore_lease_async.wait_for(backend, name, limit, owner, ttl, wait_s),
            ttl,
            auto_renew,
            on_lost,
        )

    def holders(self) -> list[SlotInfo]:
        """The live holders of this semaphore, by slot (whatever limit they were granted under).

        Raises:
            StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._backend.engine.holders(self._name)

    def __repr__(self) -> str:
        return f"<Semaphore {self._name!r} limit={self._limit} on {self._backend.url!r}>"
