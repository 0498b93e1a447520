"""The store contract (docs/architecture.md, "Contracts"): the Store and its public verbs.

The public verbs live here and validate (with :mod:`._guards`), then call the
handle modules, the sync :mod:`._lock` and its asyncio twin :mod:`._lock_async`,
over the store's :class:`~._backend.Backend`. Each engine (``_sqlite``, ``_postgres``,
``_shm``) implements only the :class:`Engine` primitives, each one transaction or
one table step. So every rule below is the contract's, identical on every engine:

* **Name rule**: a ``str`` of 1 to :data:`NAME_MAX_BYTES` (255) bytes once UTF-8
  encoded, with no control character (U+0000-U+001F, U+007F-U+009F) and no lone
  surrogate. Anything else raises :class:`~orbitive._core._errors.InvalidLockName`
  (a ``StoreError`` with ``kind == ErrorKind.INVALID_INPUT``, also ``ValueError``).
* **Owner rule**: a non-empty ``str`` of at most :data:`OWNER_MAX_BYTES` (255)
  UTF-8 bytes without NUL, else :class:`~orbitive._core._errors.InvalidLockOwner`.
* **Duration guard**: ``ttl <= 0``, NaN, inf (or not a number) on ``try_lock``,
  ``renew`` and ``lock`` raises ``StoreError`` with ``kind == ErrorKind.DATABASE``
  before the engine is touched; the validator's message stays in ``__cause__``.
  A positive ttl under 1 ms counts as 1 ms on every engine. Each engine keeps a
  guard of its own (a CHECK constraint, the lock table's ttl check) whose error
  also surfaces as ``StoreError(DATABASE)`` with the engine's message as cause.

Timeline of a renew (why it is a *new full window*, not an extension)::

    t=0   try_lock(ttl=30)  -> expires at 30
    t=20  renew(30)         -> expires at 50 (= 20 + 30), not 60 (= 30 + 30)
    t=55  renew(30)         -> False: the lease lapsed at 50, even if nobody took it
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from . import _lock, _lock_async
from ._backend import AsyncForm, Backend
from ._engine import Engine, LockInfo, SlotInfo, StoreStatistics
from ._guards import (
    check_limit,
    check_name,
    check_owner,
    check_renewal,
    check_store_ttl,
    check_timeout,
    random_owner,
)
from ._lock import Lock
from ._lock_async import Acquiring, AsyncLock
from ._semaphore import Semaphore

_log = logging.getLogger("orbitive.store")


class Store:
    """A named-lock store over one engine; open it with :func:`orbitive.store.open_store`.

    Thread-safe; a forked child may keep using it (engines reconnect in the child).
    Use it as a context manager to close it, ``with`` or ``async with`` (which closes
    it without blocking the event loop).
    """

    def __init__(self, engine: Engine[Any, Any], url: str, async_form: AsyncForm) -> None:
        self._backend = Backend(engine, url, async_form)

    @property
    def url(self) -> str:
        """The store's URL, password removed."""
        return self._backend.url

    def try_lock(self, name: str, owner: str, ttl: float) -> Lock | None:
        """Take ``name`` for ``owner`` for ``ttl`` seconds if nobody holds it.

        Args:
            name: the lock name (1..255 UTF-8 bytes, no control characters).
            owner: a non-empty str identifying the holder (at most 255 UTF-8 bytes).
            ttl: lease length in seconds, finite and > 0.

        Returns:
            A :class:`Lock` with a fencing token larger than any earlier one, or
            None when a live lease holds the name (no work is a value, not an error).

        Raises:
            InvalidLockName: the name breaks the rule (``kind == INVALID_INPUT``).
            InvalidLockOwner: empty or non-str owner (``kind == INVALID_INPUT``).
            StoreError: ``kind == DATABASE`` for a bad ttl, before the engine is
                touched (cause chained); ``UNAVAILABLE`` when the engine cannot be
                reached; ``CLOSED`` after :meth:`close`.

        Store contract: "try_lock grants exclusively; None means someone holds it".
        """
        name, owner, ttl = check_name(name), check_owner(owner), check_store_ttl(ttl)
        result = _lock.attempt(self._backend, name, owner, ttl)
        return result if type(result) is Lock else None

    def lock(
        self,
        name: str,
        owner: str | None = None,
        ttl: float = 30.0,
        timeout: float | None = None,
        *,
        auto_renew: bool = True,
        on_lost: Callable[[Lock], None] | None = None,
    ) -> Lock:
        """Wait for ``name`` and hold it, renewing in the background; use with ``with``.

        Waiting is by bounded, jittered polling (SQLite, PostgreSQL, Redis), or in the
        name's queue (shm: a release wakes the waiter that has waited longest, in any
        process, and a caller that finds waiters, or has just handed the name to one,
        waits behind them before it asks); never past the holder's expiry.

        Args:
            name: the lock name (see :meth:`try_lock`).
            owner: the owner; None makes a fresh ``"host:pid:random"`` one.
            ttl: lease length in seconds; renewed every ``ttl / 3`` when ``auto_renew``.
            timeout: seconds to wait; None waits forever; 0 makes exactly one attempt.
            auto_renew: renew until released or lost, by the process's one renewer
                thread (which every auto-renewed lock of every store shares).
            on_lost: called with the lock when a renew finds the lease lost, or when
                a renewal comes due after its window closed (a stalled process); from
                the renewer thread under ``auto_renew``, so keep it short.
                :attr:`Lock.lost` turns True either way, and leaving the ``with``
                block does not raise.

        Returns:
            The held :class:`Lock`; leaving its ``with`` block releases it.

        Raises:
            LockTimeout: still held elsewhere after ``timeout`` seconds (the message
                says when the holder is another thread of this process).
            LockNotReentrant: this very thread holds ``name`` through this store,
                and the call would wait for it (store locks are not re-entrant).
            InvalidTtl: a negative, NaN or non-number ``timeout``.
            InvalidArgumentType: ``auto_renew`` not a bool, or ``on_lost`` not
                callable (checked before any attempt).
            StoreError: as for :meth:`try_lock`.

        Example::

            with store.lock("jobs/nightly", ttl=30.0, timeout=10.0) as lock:
                run_job(fencing_token=lock.fencing_token)

        Store contract: the blocking helper renews at about a third of the TTL.
        """
        name, ttl = check_name(name), check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        if on_lost is not None or type(auto_renew) is not bool:  # else nothing to check
            check_renewal(auto_renew, on_lost)
        lock = _lock.wait_for(self._backend, name, owner, ttl, wait_s)
        if auto_renew:
            lock._start_renewer(ttl, on_lost)
        else:
            lock._on_lost = on_lost
        return lock

    async def try_lock_async(self, name: str, owner: str, ttl: float) -> AsyncLock | None:
        """:meth:`try_lock` for asyncio code: the event loop is never blocked.

        Args:
            name: the lock name (1..255 UTF-8 bytes, no control characters).
            owner: a non-empty str identifying the holder (at most 255 UTF-8 bytes).
            ttl: lease length in seconds, finite and > 0.

        Returns:
            An :class:`AsyncLock` (``await lock.renew(ttl)``, ``await lock.release()``,
            ``async with lock``), or None when a live lease holds the name.

        Raises:
            InvalidLockName, InvalidLockOwner, StoreError: as for :meth:`try_lock`.
            asyncio.CancelledError: the task was cancelled; a grant the engine
                committed meanwhile has been released again, so no lock is left behind.

        Store contract: "try_lock grants exclusively; None means someone holds it".
        """
        name, owner, ttl = check_name(name), check_owner(owner), check_store_ttl(ttl)
        result = await _lock_async.attempt(self._backend, name, owner, ttl)
        return result if type(result) is AsyncLock else None

    def lock_async(
        self,
        name: str,
        owner: str | None = None,
        ttl: float = 30.0,
        timeout: float | None = None,
        *,
        auto_renew: bool = True,
        on_lost: Callable[[AsyncLock], object] | None = None,
    ) -> Acquiring[AsyncLock]:
        """:meth:`lock` for asyncio code: waits without blocking the loop, renews in a task.

        ``async with store.lock_async(name, ttl=30.0, timeout=10.0) as lock:`` holds
        the lock for the block and releases it on exit; ``lock = await
        store.lock_async(...)`` returns the :class:`AsyncLock` for the caller to
        release. Waiting is on the lock table's readiness descriptor through the
        loop (shm) or by jittered ``asyncio.sleep`` polling (SQLite, PostgreSQL),
        never past the holder's expiry.

        Args:
            name: the lock name (see :meth:`try_lock`).
            owner: the owner; None makes a fresh ``"host:pid:random"`` one.
            ttl: lease length in seconds (float), as for :meth:`lock`.
            timeout: seconds to wait; None waits forever; 0 makes exactly one attempt.
            auto_renew: renew every ``ttl / 3`` until released or lost, by the event
                loop's one renewer task (which every auto-renewed lock of the loop shares).
            on_lost: called in the event loop with the lock when a renew finds the
                lease lost; :attr:`AsyncLock.lost` turns True either way. It must not
                block; leaving the ``async with`` block does not raise for a loss.

        Returns:
            An awaitable async context manager; name, owner, ttl and timeout are
            checked at once, so bad input raises here, before anything is awaited.

        Raises:
            LockTimeout: (when awaited) still held elsewhere after ``timeout`` seconds.
            LockNotReentrant: (when awaited) this very task holds ``name`` through this
                store, and the call would wait for it.
            InvalidTtl: a negative, NaN or non-number ``timeout``.
            InvalidArgumentType: ``auto_renew`` not a bool, or ``on_lost`` not callable.
            StoreError: as for :meth:`try_lock`.
            asyncio.CancelledError: the task was cancelled while waiting; no lock is
                left behind.

        Example::

            async with store.lock_async("jobs/nightly", ttl=30.0, timeout=10.0) as lock:
                await run_job(fencing_token=lock.fencing_token)

        Store contract: the blocking helper renews at about a third of the TTL.
        """
        name, ttl = check_name(name), check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        check_renewal(auto_renew, on_lost)
        backend = self._backend
        return Acquiring(
            lambda: _lock_async.wait_for(backend, name, owner, ttl, wait_s),
            ttl,
            auto_renew,
            on_lost,
        )

    def inspect(self, name: str) -> LockInfo | None:
        """The live lease on ``name``, or None.

        Raises:
            InvalidLockName: bad name. StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._backend.engine.inspect(check_name(name))

    def locks(self) -> list[LockInfo]:
        """Every live lease in the store, sorted by name.

        Raises:
            StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._backend.engine.locks()

    def force_release(self, name: str) -> bool:
        """Administratively remove whatever lease holds ``name``.

        Returns:
            True if a live lease was removed (logged at WARNING on ``orbitive.store``).
            Its holder's renew and release then return False; the next acquisition
            gets a larger fencing token.

        Raises:
            InvalidLockName: bad name. StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        released = self._backend.engine.force_release(check_name(name))
        if released:
            _log.warning(
                "store %s: lock %r force-released; its holder has lost it",
                self._backend.url,
                name,
            )
        return released

    def semaphore(self, name: str, limit: int) -> Semaphore:
        """Counting leases of ``name``: up to ``limit`` holders at once.

        Nothing is asked of the engine here; the limit is checked against the live
        holders' at each acquisition. Semaphore names follow the lock name rule and
        are a namespace of their own: semaphore ``"x"`` and lock ``"x"`` are unrelated.

        Args:
            name: the semaphore name (1..255 UTF-8 bytes, no control characters).
            limit: how many holders at once, an int in ``1..4096`` (``1..127`` on
                ``shm://``, whose table holds 256 names).

        Returns:
            A :class:`Semaphore` (``try_acquire``, ``acquire``, their asyncio forms,
            ``holders``).

        Raises:
            InvalidLockName: the name breaks the rule (``kind == INVALID_INPUT``).
            InvalidSemaphoreLimit: not an int in ``1..4096``, or above 127 on ``shm://``
                (``kind == INVALID_INPUT``, also ``ValueError`` and ``TypeError``).

        Example::

            sem = store.semaphore("payments-api", limit=5)
            lease = sem.try_acquire("worker-1", ttl=30.0)   # None when all 5 are held
        """
        name, engine = check_name(name), self._backend.engine
        limit = check_limit(limit, engine.limit_max, engine.limit_rule)
        return Semaphore(self._backend, name, limit)

    def semaphores(self) -> list[SlotInfo]:
        """Every live holder of every semaphore in the store, by name and slot.

        Raises:
            StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._backend.engine.semaphores()

    def statistics(self) -> StoreStatistics:
        """Counters of this Store object (this process): named locks and semaphore leases
        alike, and the handles it holds now."""
        return self._backend.statistics()

    def close(self) -> None:
        """Stop background renewals and close the engine; locks are left to lapse. Idempotent."""
        self._backend.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the store from a worker thread: closing a connection may wait on the network."""
        await asyncio.to_thread(self.close)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(
            "a Store holds connections or mappings of this process and cannot be pickled; "
            "pass its URL and call open_store in the other process"
        )

    def __repr__(self) -> str:
        backend = self._backend
        state = "closed" if backend.closed else "open"
        return f"<Store {backend.kind} {backend.url!r} {state}>"
