"""The sync lock handle: what a held named lock knows, how it renews and releases, and
the sync verbs that make one (one attempt; the blocking wait).

:class:`Tenure` holds what both handles share (identity, window, and how an
engine's answer to a renew or a release changes the handle); :class:`Lock` is the
thread-safe handle of :meth:`Store.try_lock` and :meth:`Store.lock`, renewed by
the process's one renewer thread (:mod:`._renewer`). :func:`attempt` and
:func:`wait_for` are the verbs; :func:`time_left` and :func:`refuse_reentry`,
the timeout and the re-entry checks between attempts, are shared with the asyncio
twin (:mod:`._lock_async`: ``AsyncLock`` and the same verbs).

Store locks are not re-entrant: a blocking helper asked to wait for a name its own
thread (or asyncio task) holds through the same store raises
:class:`LockNotReentrant` at once rather than wait for itself (``timeout=0``,
which never waits, makes its one attempt), and a timeout's message says when the
holder is this very process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from .._core._errors import LockNotReentrant, LockTimeout
from ._backend import Backend, Handle
from ._engine import Busy, Engine, Grant, LockInfo, SlotInfo
from ._guards import check_store_ttl
from ._renewer import RENEWER

_log = logging.getLogger("orbitive.store")

# -- the lock handles ----------------------------------------------------------------------


class Tenure:
    """What both lock handles share: the tenure's identity, its window, and how an
    engine's answer to a renew or a release changes the handle's state.

    The subclasses serialise the engine calls (a thread mutex for :class:`Lock`,
    the event loop for the asyncio handle) and call the ``_settle_*`` steps after
    the engine answered; a handle is marked released only once the engine said so.
    """

    #: A lock: one holder of its name at most (see :attr:`Backend.holders`).
    exclusive: ClassVar[bool] = True

    __slots__ = (
        "__weakref__",
        "_backend",
        "_deadline",
        "_grant",
        "_lost",
        "_name",
        "_on_lost",
        "_owner",
        "_released",
        "_renew_at",
        "_thread",
    )

    def __init__(
        self, backend: Backend, name: str, owner: str, grant: Grant, deadline: float
    ) -> None:
        self._backend = backend
        self._name = name
        self._owner = owner
        self._grant = grant  # the engine's latest grant of this tenure
        self._deadline = deadline  # time.monotonic(); never later than the engine's expiry
        self._released = False
        self._lost = False
        self._on_lost: Callable[[Any], object] | None = None
        self._thread = threading.get_ident()  # the thread it was granted to
        self._renew_at = 0.0  # the renewer's: when it renews next (0: it does not)

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

    def _settle_renew(self, started: float, ttl: float, renewed: Grant | None) -> bool:
        """Record a renew the engine answered (requested at ``started``); False: lost."""
        if renewed is None:
            self._lost = True
            return False
        self._grant = renewed
        self._deadline = self._backend.deadline(started, ttl, renewed)
        return True

    def _count_renew(self, held: bool, *, unreachable: bool = False) -> bool:
        """Count a settled renew (outside any mutex); on a loss (``unreachable``: the
        renewer could not reach the engine in time) log it and call back. Returns held."""
        if held:
            self._backend.renewals.add()
        else:
            self._backend.losses.add()
            if unreachable:
                self._log_lost("the store could not be reached to renew it before its TTL ran out")
            else:
                self._log_lost(self._why_gone("renewed"))
            self._notify_lost()
        return held

    def _settle_release(self, released: bool) -> bool:
        """Record a release the engine answered; True if it was newly counted as lost."""
        self._released = True
        holders = self._backend.holders
        ref = holders.get(self._name)
        if ref is not None and ref() is self:
            del holders[self._name]
        newly_lost = not released and not self._lost
        self._lost = self._lost or not released
        return newly_lost

    def _count_release(self, released: bool, newly_lost: bool) -> bool:
        if released:
            self._backend.releases.add()
        elif newly_lost:
            self._backend.losses.add()
            self._log_lost(self._why_gone("released"))
        return released

    def _why_gone(self, verb: str) -> str:
        """Why the engine no longer had the lease when it was to be ``verb``."""
        if self.remaining() > 0.0:
            return (
                "the store no longer had it while its TTL had time left: it was "
                "force-released, or the store's clock ran ahead"
            )
        return f"its TTL ran out before it was {verb}"

    def _held_thing(self) -> str:
        """What this handle holds, as a log record names it (a semaphore lease: its slot)."""
        return f"lock {self._name!r}"

    def _log_lost(self, why: str) -> None:
        _log.warning(
            "store %s: %s (owner %r, fencing token %d) is lost: %s",
            self._backend.url,
            self._held_thing(),
            self._owner,
            self._grant.fencing_token,
            why,
        )

    def _stop_renewer(self) -> None:
        """Stop background renewal (the store is closing); each handle kind has its own."""

    def _after_fork_in_child(self) -> None:
        """In a forked child: replace what a parent's thread may have held (no lock here)."""

    def _mark_lost(self, *, unreachable: bool) -> None:
        """The renewer could not reach the engine before the window closed
        (``unreachable``), or came too late to renew it."""
        if self._flag_lost():
            self._count_renew(False, unreachable=unreachable)

    def _flag_lost(self) -> bool:
        """Flag the lease lost unless it already was (or was released); True if it is news."""
        if self._lost or self._released:
            return False
        self._lost = True
        return True

    def _notify_lost(self) -> None:
        if self._on_lost is not None:
            self._on_lost(self)

    def __repr__(self) -> str:
        kind = type(self).__name__
        try:
            state = "released" if self._released else "lost" if self.lost else "held"
            return (
                f"<{kind} {self._name!r} owner={self._owner!r} token={self.fencing_token} "
                f"{state} remaining={self.remaining():.3f}s>"
            )
        except Exception:  # a repr never raises
            return f"<{kind} (unreadable)>"


class Lock(Tenure):
    """A held named lock: a tenure of one owner, with a fencing token.

    Obtained from :meth:`Store.try_lock` or :meth:`Store.lock`; use it as a context
    manager to release on exit. Thread-safe.
    """

    __slots__ = ("_mutex",)

    def __init__(
        self, backend: Backend, name: str, owner: str, grant: Grant, deadline: float
    ) -> None:
        super().__init__(backend, name, owner, grant, deadline)
        self._mutex = threading.Lock()

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

        Store contract: "renew gives a new full window from now; False when lost".
        """
        ttl = check_store_ttl(ttl)
        return self._renew(ttl)

    def _renew(self, ttl: float) -> bool:
        with self._mutex:
            if self._released or self._lost:
                return False
            started = time.monotonic()
            renewed = self._renew_step(self._backend.engine, ttl)
            held = self._settle_renew(started, ttl, renewed)
        return self._count_renew(held)

    def _renew_step(self, engine: Engine[Any, Any], ttl: float) -> Grant | None:
        """The engine step that renews this tenure (a semaphore lease renews its slot)."""
        return engine.renew(self._name, self._owner, self._grant, ttl)

    def _release_step(self, engine: Engine[Any, Any]) -> bool:
        """The engine step that releases this tenure (a semaphore lease frees its slot)."""
        return engine.release(self._name, self._owner, self._grant)

    def release(self) -> bool:
        """Give the lock up (stopping any background renewal).

        Returns:
            True if this tenure was still held; False (no error) if it had lapsed or
            been replaced, or on a second release.

        Raises:
            StoreError: ``UNAVAILABLE`` when the engine cannot be reached; ``CLOSED``
                after the store was closed.

        Store contract: "release removes only the owner's own tenure".
        """
        if self._renew_at:
            RENEWER.cancel(self)
        with self._mutex:
            if self._released:
                return False
            released = self._release_step(self._backend.engine)
            newly_lost = self._settle_release(released)
        return self._count_release(released, newly_lost)

    def _start_renewer(self, ttl: float, on_lost: Callable[[Any], object] | None) -> None:
        self._on_lost = on_lost
        RENEWER.add(self, ttl)

    def _stop_renewer(self) -> None:
        if self._renew_at:
            RENEWER.cancel(self)

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.Lock()  # the parent's renewer may have been renewing it

    def _mark_lost(self, *, unreachable: bool) -> None:
        with self._mutex:
            newly_lost = self._flag_lost()
        if newly_lost:
            self._count_renew(False, unreachable=unreachable)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the sync verbs ------------------------------------------------------------------------


def attempt(backend: Backend, name: str, owner: str, ttl: float) -> Lock | Busy:
    """One engine attempt with validated arguments: the new :class:`Lock`, or the refusal."""
    started = time.monotonic()
    return backend.admit(Lock, name, owner, ttl, started, backend.engine.acquire(name, owner, ttl))


def wait_for(backend: Backend, name: str, owner: str, ttl: float, timeout: float | None) -> Lock:
    """Attempt, wait as the engine's waiter does, attempt again until granted.

    A caller that finds threads waiting for ``name``, or that has just handed it to
    one of them (shm), waits behind them first: it takes its turn instead of taking
    the name before the waiter a release woke.

    Raises:
        LockTimeout: still held elsewhere after ``timeout`` seconds.
        LockNotReentrant: this very thread holds ``name`` in the store (at once).
        StoreError: as the engine raises.
    """
    started = time.monotonic()
    engine = backend.engine
    if name in backend.holders and timeout != 0.0:  # it would wait: for this very thread?
        refuse_reentry(backend, name, threading.get_ident())
    queue = timeout != 0.0 and engine.queues_first(name)
    result: Lock | Busy | None = None
    if not queue:  # the usual case: one attempt before any waiting is set up
        result = backend.admit(Lock, name, owner, ttl, started, engine.acquire(name, owner, ttl))
        if type(result) is not Busy:
            return result
        time_left(backend, name, result, started, timeout)  # timeout 0: that was the one
    waiter = engine.waiter(name)
    granted = False
    waiter.enter()
    try:
        if queue:
            waiter.queue(timeout)
        fresh = queue or waiter.watches  # attempt again at once, now that it watches
        tries = 0
        while True:
            if fresh:
                waiter.look()
                result = attempt(backend, name, owner, ttl)
                if type(result) is Lock:
                    granted = True
                    return result
            assert isinstance(result, Busy)
            waiter.wait(result, time_left(backend, name, result, started, timeout), tries)
            tries += 1
            fresh = True
    finally:
        waiter.leave(granted)


def refuse_reentry(backend: Backend, name: str, thread: int, task: object = None) -> None:
    """Raise when this store granted ``name`` to this very thread (sync) or asyncio ``task``.

    (Another store object, even on the same URL, is another client: its holder may
    be released by anyone, so waiting for it is no self-deadlock.)

    Raises:
        LockNotReentrant: it did; the message names the handle's owner and token.
    """
    holder = backend.holder(name)
    if holder is None:
        return
    mine = holder._thread == thread if task is None else getattr(holder, "_task", None) is task
    if not mine:
        return
    who = "thread" if task is None else "asyncio task"
    raise LockNotReentrant(
        f"lock {name!r} in store {backend.url!r} is held by this very {who} (owner "
        f"{holder.owner!r}, token {holder.fencing_token}): store locks are not re-entrant, "
        "and waiting for it would never end; use the handle you hold, or release it first",
        key=name,
    )


def time_left(
    backend: Backend, name: str, busy: Busy, started: float, timeout: float | None
) -> float | None:
    """Seconds left of the ``timeout`` counted from ``started`` (None: no timeout).

    Raises:
        LockTimeout: none is left; the message names the holder (for a semaphore, its
            limit), and says when it is this very process (another thread or task,
            through this store).
    """
    if timeout is None:
        return None
    left = started + timeout - time.monotonic()
    if left > 0.0:
        return left
    raise LockTimeout(_busy_message(backend, name, busy.holder, timeout), key=name)


def _busy_message(
    backend: Backend, name: str, holder: LockInfo | SlotInfo | None, timeout: float | None
) -> str:
    if type(holder) is SlotInfo:
        return f"semaphore {name!r}: all {holder.limit} slots still held after {timeout or 0.0:g} s"
    who = "another owner" if holder is None else f"{holder.owner!r}"
    mine = backend.holder(name)
    if holder is not None and mine is not None and mine.fencing_token == holder.fencing_token:
        who += f" in this very process ({_thread_name(mine)}, through this store)"
    return f"lock {name!r} still held by {who} after {timeout or 0.0:g} s"


def _thread_name(handle: Handle) -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return f"thread {names.get(handle._thread, handle._thread)!r}"
