"""The named-lock store contract (seed 002): the Store, its blocking and asyncio helpers.

The public verbs live here and validate (with :mod:`._guards`); the handles are in
:mod:`._handle` and :mod:`._async`. Each engine (``_sqlite``, ``_postgres``,
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

import itertools
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._core._errors import LockTimeout
from ._engine import Busy, ClosedEngine, Engine, Grant, LockInfo, StoreStatistics
from ._guards import (
    check_name,
    check_owner,
    check_renewal,
    check_store_ttl,
    check_timeout,
    random_owner,
)
from ._handle import Lock, Tenure

if TYPE_CHECKING:
    from ._async import Acquiring, AsyncLock
    from ._engine_async import AsyncEngine

_H = TypeVar("_H", bound=Tenure)
#: First pause of the blocking helper between attempts, in seconds (doubles, jittered).
_WAIT_FIRST_S: Final = 0.002


# -- the store -----------------------------------------------------------------------------


class _Counter:
    """Counts events from any thread without a lock.

    :attr:`add` is the ``__next__`` of an ``itertools.count``, one atomic step on
    every CPython build (the idiom ``threading`` and ``asyncio`` use for their own
    counters). A read takes a number too, so :meth:`read` subtracts the numbers
    earlier reads took; reads must not overlap one another (the store serialises them).
    """

    __slots__ = ("_reads", "add")

    def __init__(self) -> None:
        self.add: Callable[[], int] = itertools.count().__next__
        self._reads = 0

    def read(self) -> int:
        """How many times :attr:`add` was called so far."""
        taken = self.add() - self._reads
        self._reads += 1
        return taken


class Store:
    """A named-lock store over one engine; open it with :func:`orbitive.store.open_store`.

    Thread-safe; a forked child may keep using it (engines reconnect in the child).
    Use it as a context manager to close it.
    """

    def __init__(self, engine: Engine[Any], url: str) -> None:
        self._engine: Engine[Any] = engine  # a ClosedEngine once closed
        self._kind = engine.kind
        self._monotonic = engine.monotonic_clock
        self._url = url
        self._acquisitions = _Counter()
        self._refusals = _Counter()
        self._renewals = _Counter()
        self._losses = _Counter()
        self._releases = _Counter()
        self._reads_mutex = threading.Lock()  # serialises the counters' reads
        # Every lock granted here and still alive: a lock's death drops its
        # reference through the callback (set.discard, run in C, no Python frame).
        self._granted: set[weakref.ref[Tenure]] = set()
        self._async: AsyncEngine[Any] | None = None  # the engine's asyncio form, on first use

    @property
    def url(self) -> str:
        """The store's URL, password removed."""
        return self._url

    def _deadline(self, started: float, ttl: float, grant: Grant) -> float:
        """The local monotonic deadline of a grant requested at ``started``."""
        deadline = started + ttl
        if self._monotonic and grant.expires_at < deadline:  # min() costs a call
            return grant.expires_at
        return deadline

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

        Seed 002: "try_lock grants exclusively; None means someone holds it".
        """
        name, owner, ttl = check_name(name), check_owner(owner), check_store_ttl(ttl)
        result = self._attempt(name, owner, ttl)
        return result if type(result) is Lock else None

    def _attempt(self, name: str, owner: str, ttl: float) -> Lock | Busy:
        """One engine attempt: the new Lock, or the engine's refusal."""
        started = time.monotonic()
        return self._admit(Lock, name, owner, ttl, started, self._engine.acquire(name, owner, ttl))

    def _admit(
        self,
        handle: type[_H],
        name: str,
        owner: str,
        ttl: float,
        started: float,
        result: Grant | Busy,
    ) -> _H | Busy:
        """The handle of an engine's grant (requested at ``started``), or its refusal, counted."""
        if type(result) is Busy:
            self._refusals.add()
            return result
        lock = handle(self, name, owner, result, self._deadline(started, ttl, result))
        self._granted.add(weakref.ref(lock, self._granted.discard))
        self._acquisitions.add()
        return lock

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

        Waiting is by bounded, jittered polling (SQLite, PostgreSQL, Redis) or by the lock
        table's readiness descriptor (shm), and never past the holder's expiry.

        Args:
            name: the lock name (see :meth:`try_lock`).
            owner: the owner; None makes a fresh ``"host:pid:random"`` one.
            ttl: lease length in seconds; renewed every ``ttl / 3`` when ``auto_renew``.
            timeout: seconds to wait; None waits forever; 0 makes exactly one attempt.
            auto_renew: renew in a background thread until released or lost.
            on_lost: called with the lock when a renew finds the lease lost (from
                the renewer thread under ``auto_renew``); :attr:`Lock.lost` turns
                True either way, and leaving the ``with`` block does not raise.

        Returns:
            The held :class:`Lock`; leaving its ``with`` block releases it.

        Raises:
            LockTimeout: still held elsewhere after ``timeout`` seconds.
            InvalidTtl: a negative, NaN or non-number ``timeout``.
            InvalidArgumentType: ``auto_renew`` not a bool, or ``on_lost`` not
                callable (checked before any attempt).
            StoreError: as for :meth:`try_lock`.

        Example::

            with store.lock("jobs/nightly", ttl=30.0, timeout=10.0) as lock:
                run_job(fencing_token=lock.fencing_token)

        Seed 002: the blocking helper renews at about a third of the TTL.
        """
        name, ttl = check_name(name), check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        check_renewal(auto_renew, on_lost)
        lock = self._wait_for(name, owner, ttl, wait_s)
        if auto_renew:
            lock._start_renewer(ttl, on_lost)
        else:
            lock._on_lost = on_lost
        return lock

    def _wait_for(self, name: str, owner: str, ttl: float, timeout: float | None) -> Lock:
        engine = self._engine
        started = time.monotonic()
        attempt = 0
        while True:
            engine.arm()
            result = self._attempt(name, owner, ttl)
            if not isinstance(result, Busy):
                return result
            engine.wait(next_pause(name, result, started, timeout, attempt, engine.poll_cap_s))
            attempt = min(attempt + 1, 20)

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

        Seed 002: "try_lock grants exclusively; None means someone holds it".
        """
        from ._async import try_lock_async  # noqa: PLC0415 - _async imports this module

        return await try_lock_async(self, name, owner, ttl)

    def lock_async(
        self,
        name: str,
        owner: str | None = None,
        ttl: float = 30.0,
        timeout: float | None = None,
        *,
        auto_renew: bool = True,
        on_lost: Callable[[AsyncLock], object] | None = None,
    ) -> Acquiring:
        """:meth:`lock` for asyncio code: waits without blocking the loop, renews in a task.

        ``async with store.lock_async(name, ttl=30.0, timeout=10.0) as lock:`` holds
        the lock for the block and releases it on exit; ``lock = await
        store.lock_async(...)`` returns the :class:`AsyncLock` for the caller to
        release. Waiting is on the lock table's readiness descriptor through the
        loop (shm) or by jittered ``asyncio.sleep`` polling (SQLite, PostgreSQL),
        never past the holder's expiry.

        Args:
            name, owner, ttl, timeout: as for :meth:`lock` (seconds as float;
                ``timeout=None`` waits forever, 0 makes exactly one attempt).
            auto_renew: renew every ``ttl / 3`` in an asyncio task until released or lost.
            on_lost: called in the event loop with the lock when a renew finds the
                lease lost; :attr:`AsyncLock.lost` turns True either way. It must not
                block; leaving the ``async with`` block does not raise for a loss.

        Returns:
            An awaitable async context manager; name, owner, ttl and timeout are
            checked at once, so bad input raises here, before anything is awaited.

        Raises:
            LockTimeout: (when awaited) still held elsewhere after ``timeout`` seconds.
            InvalidTtl: a negative, NaN or non-number ``timeout``.
            InvalidArgumentType: ``auto_renew`` not a bool, or ``on_lost`` not callable.
            StoreError: as for :meth:`try_lock`.
            asyncio.CancelledError: the task was cancelled while waiting; no lock is
                left behind.

        Example::

            async with store.lock_async("jobs/nightly", ttl=30.0, timeout=10.0) as lock:
                await run_job(fencing_token=lock.fencing_token)

        Seed 002: the blocking helper renews at about a third of the TTL.
        """
        from ._async import Acquiring  # noqa: PLC0415 - _async imports this module

        name, ttl = check_name(name), check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        check_renewal(auto_renew, on_lost)
        return Acquiring(self, name, owner, ttl, wait_s, auto_renew, on_lost)

    def _asyncio(self) -> AsyncEngine[Any]:
        """The engine's asyncio form, made on first use (a closed store's refuses)."""
        found = self._async
        if found is None:
            with self._reads_mutex:
                if self._async is None:
                    self._async = self._engine.async_engine()
                found = self._async
        return found

    def inspect(self, name: str) -> LockInfo | None:
        """The live lease on ``name``, or None.

        Raises:
            InvalidLockName: bad name. StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._engine.inspect(check_name(name))

    def locks(self) -> list[LockInfo]:
        """Every live lease in the store, sorted by name.

        Raises:
            StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._engine.locks()

    def force_release(self, name: str) -> bool:
        """Administratively remove whatever lease holds ``name``.

        Returns:
            True if a live lease was removed. Its holder's renew and release then
            return False; the next acquisition gets a larger fencing token.

        Raises:
            InvalidLockName: bad name. StoreError: ``UNAVAILABLE`` or ``CLOSED``.
        """
        return self._engine.force_release(check_name(name))

    def statistics(self) -> StoreStatistics:
        """Counters of this Store object (this process), and locks it holds now."""
        held = sum(1 for lock in self._granted_locks() if not lock._released and not lock.lost)
        with self._reads_mutex:
            return StoreStatistics(
                engine=self._kind,
                held_count=held,
                acquired_count=self._acquisitions.read(),
                busy_count=self._refusals.read(),
                renewed_count=self._renewals.read(),
                lost_count=self._losses.read(),
                released_count=self._releases.read(),
            )

    def _granted_locks(self) -> list[Tenure]:
        """The locks granted by this store that are still alive (held or not)."""
        alive = (ref() for ref in list(self._granted))
        return [lock for lock in alive if lock is not None]

    def close(self) -> None:
        """Stop background renewals and close the engine; locks are left to lapse. Idempotent."""
        for lock in self._granted_locks():
            lock._stop_renewer()
        engine, self._engine = self._engine, ClosedEngine(self._url)
        asynchronous, self._async = self._async, None
        if asynchronous is not None:
            asynchronous.close()
        engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(
            "a Store holds connections or mappings of this process and cannot be pickled; "
            "pass its URL and call open_store in the other process"
        )

    def __repr__(self) -> str:
        state = "closed" if isinstance(self._engine, ClosedEngine) else "open"
        return f"<Store {self._kind} {self._url!r} {state}>"


def next_pause(
    name: str, busy: Busy, started: float, timeout: float | None, attempt: int, cap_s: float
) -> float:
    """How long a waiter pauses after its ``attempt``-th refusal, in seconds (no I/O).

    Jittered doubling from :data:`_WAIT_FIRST_S` up to the engine's ``cap_s``, never
    past the holder's expiry nor the end of the ``timeout`` counted from ``started``
    (``time.monotonic()``). The blocking and the asyncio helpers both pause by it.

    Raises:
        LockTimeout: the timeout has run out.
    """
    left = None if timeout is None else started + timeout - time.monotonic()
    if left is not None and left <= 0.0:
        raise LockTimeout(_busy_message(name, busy.holder, timeout), key=name)
    delay = random.uniform(0.5, 1.0) * min(cap_s, _WAIT_FIRST_S * 2.0**attempt)
    if busy.holder is not None:
        delay = min(delay, busy.holder.remaining_s + 0.001)
    return delay if left is None else min(delay, left)


def _busy_message(name: str, holder: LockInfo | None, timeout: float | None) -> str:
    who = "another owner" if holder is None else f"{holder.owner!r}"
    return f"lock {name!r} still held by {who} after {timeout or 0.0:g} s"
