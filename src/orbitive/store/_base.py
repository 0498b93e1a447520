"""The named-lock store contract (seed 002): guards, the Lock handle, the blocking helper.

The public verbs live here and validate; each engine (``_sqlite``, ``_postgres``,
``_shm``) implements only the :class:`Engine` primitives, each one transaction or
one table step. So every rule below is the contract's, identical on every engine:

* **Name rule**: a ``str`` of 1 to :data:`NAME_MAX_BYTES` (255) bytes once UTF-8
  encoded, with no control character (U+0000-U+001F, U+007F-U+009F) and no lone
  surrogate. Anything else raises :class:`~orbitive._errors.InvalidLockName`
  (a ``StoreError`` with ``kind == ErrorKind.INVALID_INPUT``, also ``ValueError``).
* **Owner rule**: a non-empty ``str`` of at most :data:`OWNER_MAX_BYTES` (255)
  UTF-8 bytes without NUL, else :class:`~orbitive._errors.InvalidLockOwner`.
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
import os
import random
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

from .._clock import TTL_MAX_S, check_ttl
from .._errors import (
    InvalidLockName,
    InvalidLockOwner,
    InvalidLockTtl,
    InvalidTtl,
    LockTimeout,
    StoreError,
)
from ._engine import Busy, ClosedEngine, Engine, Grant, LockInfo, StoreStatistics

#: Longest lock name, in UTF-8 bytes.
NAME_MAX_BYTES: Final = 255
#: Longest owner, in UTF-8 bytes.
OWNER_MAX_BYTES: Final = 255
#: Shortest lease, in seconds; a shorter positive ttl counts as this on every engine.
TTL_MIN_S: Final = 0.001
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: First pause of the blocking helper between attempts, in seconds (doubles, jittered).
_WAIT_FIRST_S: Final = 0.002
#: A renewer that cannot reach the engine retries at least this often, in seconds.
_RENEW_RETRY_MIN_S: Final = 0.01


# -- guards --------------------------------------------------------------------------------


def check_name(name: object) -> str:
    """Return ``name`` if it follows the store's name rule (see the module docstring).

    Raises:
        InvalidLockName: not a str, empty, longer than 255 UTF-8 bytes, a control
            character, or a lone surrogate.
    """
    # ASCII is one UTF-8 byte per character, and its only non-printable characters
    # are the rule's U+0000-U+001F and U+007F: the common case needs no encoding.
    if (
        type(name) is str
        and name.isascii()
        and 0 < len(name) <= NAME_MAX_BYTES
        and name.isprintable()
    ):
        return name
    return _check_name_fully(name)


def _check_name_fully(name: object) -> str:
    """The whole name rule, for any value the ASCII fast path did not accept."""
    if type(name) is not str:
        raise InvalidLockName(f"lock name must be a str, not {type(name).__name__}", key=name)
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise InvalidLockName(f"lock name {name!r} is not valid UTF-8", key=name) from None
    if not 0 < size <= NAME_MAX_BYTES:
        raise InvalidLockName(
            f"lock name must be 1..{NAME_MAX_BYTES} UTF-8 bytes, got {size}", key=name
        )
    if _CONTROL.search(name):
        raise InvalidLockName(f"lock name {name!r} contains a control character", key=name)
    return name


def check_owner(owner: object) -> str:
    """Return ``owner`` if it is a non-empty str of at most 255 UTF-8 bytes without NUL.

    Raises:
        InvalidLockOwner: any other value.
    """
    if (
        type(owner) is str
        and owner.isascii()  # one UTF-8 byte per character
        and 0 < len(owner) <= OWNER_MAX_BYTES
        and "\x00" not in owner
    ):
        return owner
    return _check_owner_fully(owner)


def _check_owner_fully(owner: object) -> str:
    """The whole owner rule, for any value the ASCII fast path did not accept."""
    if type(owner) is not str:
        raise InvalidLockOwner(f"lock owner must be a str, not {type(owner).__name__}")
    try:
        size = len(owner.encode())
    except UnicodeEncodeError:
        raise InvalidLockOwner(f"lock owner {owner!r} is not valid UTF-8") from None
    if not 0 < size <= OWNER_MAX_BYTES or "\x00" in owner:
        raise InvalidLockOwner(
            f"lock owner must be 1..{OWNER_MAX_BYTES} UTF-8 bytes without NUL, got {owner!r}"
        )
    return owner


def check_store_ttl(ttl: object) -> float:
    """The store duration guard: a finite ttl > 0 seconds, else ``StoreError(DATABASE)``.

    Returns:
        The ttl as a float, at least :data:`TTL_MIN_S` (a shorter positive ttl is
        rounded up on every engine, as the SHM table's millisecond clock does).

    Raises:
        InvalidLockTtl: ``kind == ErrorKind.DATABASE``; ``__cause__`` is the
            validator's :class:`~orbitive._errors.InvalidTtl`.
    """
    if type(ttl) is float and TTL_MIN_S <= ttl <= TTL_MAX_S:  # the common case, as is
        return ttl
    try:
        value = check_ttl(ttl)
    except InvalidTtl as error:
        raise InvalidLockTtl(f"lock duration rejected: {error.message}") from error
    return value if value >= TTL_MIN_S else TTL_MIN_S


def check_timeout(timeout: object) -> float | None:
    """``None`` (wait forever) or a finite number of seconds ``>= 0``.

    Raises:
        InvalidTtl: anything else (also ``ValueError`` and ``TypeError``).
    """
    if timeout is None:
        return None
    if timeout == 0 and type(timeout) in (int, float):
        return 0.0
    try:
        return check_ttl(timeout, what="timeout")
    except InvalidTtl as error:
        raise InvalidTtl(
            f"timeout must be None (wait forever) or a finite number of seconds >= 0, "
            f"got {timeout!r}"
        ) from error


def random_owner() -> str:
    """A fresh owner naming this host and process: ``"host:pid:hex"``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


# -- the lock handle -----------------------------------------------------------------------


class Lock:
    """A held named lock: a tenure of one owner, with a fencing token.

    Obtained from :meth:`Store.try_lock` or :meth:`Store.lock`; use it as a context
    manager to release on exit. Thread-safe.
    """

    __slots__ = (
        "__weakref__",
        "_deadline",
        "_grant",
        "_lost",
        "_mutex",
        "_name",
        "_on_lost",
        "_owner",
        "_released",
        "_renewer",
        "_store",
    )

    def __init__(self, store: Store, name: str, owner: str, grant: Grant, deadline: float) -> None:
        self._store = store
        self._name = name
        self._owner = owner
        self._grant = grant  # the engine's latest grant of this tenure
        self._deadline = deadline  # time.monotonic(); never later than the engine's expiry
        self._mutex = threading.Lock()
        self._released = False
        self._lost = False
        self._renewer: _Renewer | None = None
        self._on_lost: Callable[[Lock], None] | None = None

    @property
    def name(self) -> str:
        """The lock name."""
        return self._name

    @property
    def owner(self) -> str:
        """The owner string of this tenure."""
        return self._owner

    @property
    def fencing_token(self) -> int:
        """Strictly larger than the token of every earlier acquisition in the store."""
        return self._grant.fencing_token

    @property
    def expires_at(self) -> float:
        """Expiry on the engine's clock (Unix epoch s; for shm ``time.monotonic()``)."""
        return self._grant.expires_at

    @property
    def lost(self) -> bool:
        """True once the lease is known lost: a renew failed, or its window has passed."""
        return self._lost or (not self._released and self.remaining() <= 0.0)

    def remaining(self) -> float:
        """Seconds left in the window, measured locally from before the grant (conservative)."""
        return max(self._deadline - time.monotonic(), 0.0)

    def renew(self, ttl: float) -> bool:
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

        Seed 002: "renew gives a new full window from now; False when lost".
        """
        ttl = check_store_ttl(ttl)
        return self._renew(ttl)

    def _renew(self, ttl: float) -> bool:
        with self._mutex:
            if self._released or self._lost:
                return False
            started = time.monotonic()
            renewed = self._store._engine.renew(self._name, self._owner, self._grant, ttl)
            if renewed is None:
                self._lost = True
            else:
                self._grant = renewed
                self._deadline = self._store._deadline(started, ttl, renewed)
        if renewed is None:
            self._store._losses.add()
            self._notify_lost()
            return False
        self._store._renewals.add()
        return True

    def release(self) -> bool:
        """Give the lock up (stopping any background renewal).

        Returns:
            True if this tenure was still held; False (no error) if it had lapsed or
            been replaced, or on a second release.

        Raises:
            StoreError: ``UNAVAILABLE`` when the engine cannot be reached; ``CLOSED``
                after the store was closed.

        Seed 002: "release removes only the owner's own tenure".
        """
        self._stop_renewer()
        with self._mutex:
            if self._released:
                return False
            released = self._store._engine.release(self._name, self._owner, self._grant)
            self._released = True
            newly_lost = not released and not self._lost
            self._lost = self._lost or not released
        if released:
            self._store._releases.add()
        elif newly_lost:
            self._store._losses.add()
        return released

    def _start_renewer(self, ttl: float, on_lost: Callable[[Lock], None] | None) -> None:
        self._on_lost = on_lost
        self._renewer = _Renewer(self, ttl)
        self._renewer.start()

    def _stop_renewer(self) -> None:
        renewer = self._renewer
        if renewer is not None:
            renewer.stop()

    def _mark_lost(self) -> None:
        """The renewer could not reach the engine before the window closed."""
        with self._mutex:
            if self._lost or self._released:
                return
            self._lost = True
        self._store._losses.add()
        self._notify_lost()

    def _notify_lost(self) -> None:
        if self._on_lost is not None:
            self._on_lost(self)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        try:
            state = "released" if self._released else "lost" if self.lost else "held"
            return (
                f"<Lock {self._name!r} owner={self._owner!r} token={self.fencing_token} "
                f"{state} remaining={self.remaining():.3f}s>"
            )
        except Exception:  # a repr never raises
            return "<Lock (unreadable)>"


class _Renewer(threading.Thread):
    """Renews a lock at about a third of its ttl until stopped or the lease is lost."""

    def __init__(self, lock: Lock, ttl: float) -> None:
        super().__init__(name=f"orbitive-renew-{lock.name[:32]}", daemon=True)
        self._lock = lock
        self._ttl = ttl
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        if threading.current_thread() is not self:
            self.join()

    def run(self) -> None:
        interval = self._ttl / 3.0
        while not self._stopped.wait(interval):
            try:
                if not self._lock._renew(self._ttl):
                    return  # lost: _renew flagged it and called back
                interval = self._ttl / 3.0
                continue
            except StoreError:
                left = self._lock.remaining()
                if left > 0.0:  # transient: retry well before the window closes
                    interval = max(min(self._ttl / 3.0, left / 4.0), _RENEW_RETRY_MIN_S)
                    continue
            if not self._stopped.is_set():
                self._lock._mark_lost()
            return


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
        self._granted: set[weakref.ref[Lock]] = set()

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
        result = self._engine.acquire(name, owner, ttl)
        if type(result) is Busy:
            self._refusals.add()
            return result
        lock = Lock(self, name, owner, result, self._deadline(started, ttl, result))
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
            StoreError: as for :meth:`try_lock`.

        Example::

            with store.lock("jobs/nightly", ttl=30.0, timeout=10.0) as lock:
                run_job(fencing_token=lock.fencing_token)

        Seed 002: the blocking helper renews at about a third of the TTL.
        """
        name, ttl = check_name(name), check_store_ttl(ttl)
        owner = random_owner() if owner is None else check_owner(owner)
        wait_s = check_timeout(timeout)
        lock = self._wait_for(name, owner, ttl, wait_s)
        if auto_renew:
            lock._start_renewer(ttl, on_lost)
        else:
            lock._on_lost = on_lost
        return lock

    def _wait_for(self, name: str, owner: str, ttl: float, timeout: float | None) -> Lock:
        engine = self._engine
        start = time.monotonic()
        attempt = 0
        while True:
            engine.arm()
            result = self._attempt(name, owner, ttl)
            if not isinstance(result, Busy):
                return result
            holder = result.holder
            left = None if timeout is None else start + timeout - time.monotonic()
            if left is not None and left <= 0.0:
                raise LockTimeout(_busy_message(name, holder, timeout), key=name)
            delay = random.uniform(0.5, 1.0) * min(engine.poll_cap_s, _WAIT_FIRST_S * 2**attempt)
            if holder is not None:
                delay = min(delay, holder.remaining_s + 0.001)
            engine.wait(delay if left is None else min(delay, left))
            attempt = min(attempt + 1, 20)

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

    def _granted_locks(self) -> list[Lock]:
        """The locks granted by this store that are still alive (held or not)."""
        alive = (ref() for ref in list(self._granted))
        return [lock for lock in alive if lock is not None]

    def close(self) -> None:
        """Stop background renewals and close the engine; locks are left to lapse. Idempotent."""
        for lock in self._granted_locks():
            lock._stop_renewer()
        engine, self._engine = self._engine, ClosedEngine(self._url)
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


def _busy_message(name: str, holder: LockInfo | None, timeout: float | None) -> str:
    who = "another owner" if holder is None else f"{holder.owner!r}"
    return f"lock {name!r} still held by {who} after {timeout or 0.0:g} s"
