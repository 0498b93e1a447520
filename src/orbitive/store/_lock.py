"""The sync lock handle: what a held named lock knows, how it renews and releases, and
the sync verbs that make one (one attempt; the blocking wait).

:class:`Tenure` holds what both handles share (identity, window, and how an
engine's answer to a renew or a release changes the handle); :class:`Lock` is the
thread-safe handle of :meth:`Store.try_lock` and :meth:`Store.lock`, renewed in a
background thread by :class:`_Renewer`. :func:`attempt` and :func:`wait_for` are
the verbs; :func:`next_pause` is the pause between attempts, which the asyncio
twin (:mod:`._lock_async`: ``AsyncLock`` and the same verbs) shares.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from .._core._errors import LockTimeout, StoreError
from ._backend import Backend
from ._engine import Busy, Engine, Grant, LockInfo, SlotInfo
from ._guards import check_store_ttl

_log = logging.getLogger("orbitive.store")
#: A renewer that cannot reach the engine retries at least this often, in seconds.
_RENEW_RETRY_MIN_S: Final = 0.01
#: First pause of a waiter between attempts, in seconds (doubles, jittered).
_WAIT_FIRST_S: Final = 0.002
#: The largest attempt number the pause doubles for.
ATTEMPT_MAX: Final = 20


# -- the lock handles ----------------------------------------------------------------------


class Tenure:
    """What both lock handles share: the tenure's identity, its window, and how an
    engine's answer to a renew or a release changes the handle's state.

    The subclasses serialise the engine calls (a thread mutex for :class:`Lock`,
    the event loop for the asyncio handle) and call the ``_settle_*`` steps after
    the engine answered; a handle is marked released only once the engine said so.
    """

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

    def _mark_lost(self) -> None:
        """The renewer could not reach the engine before the window closed."""
        if self._flag_lost():
            self._count_renew(False, unreachable=True)

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

    __slots__ = ("_mutex", "_renewer")

    def __init__(
        self, backend: Backend, name: str, owner: str, grant: Grant, deadline: float
    ) -> None:
        super().__init__(backend, name, owner, grant, deadline)
        self._mutex = threading.Lock()
        self._renewer: _Renewer | None = None

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
        self._stop_renewer()
        with self._mutex:
            if self._released:
                return False
            released = self._release_step(self._backend.engine)
            newly_lost = self._settle_release(released)
        return self._count_release(released, newly_lost)

    def _start_renewer(self, ttl: float, on_lost: Callable[[Any], object] | None) -> None:
        self._on_lost = on_lost
        self._renewer = _Renewer(self, ttl)
        self._renewer.start()

    def _stop_renewer(self) -> None:
        renewer = self._renewer
        if renewer is not None:
            renewer.stop()

    def _mark_lost(self) -> None:
        with self._mutex:
            newly_lost = self._flag_lost()
        if newly_lost:
            self._count_renew(False, unreachable=True)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def renew_retry_s(ttl: float, left: float) -> float | None:
    """When a renewer retries after a transient engine error, in seconds (None: too late).

    Well before the window closes: a quarter of what is ``left``, at most a third of
    the ``ttl``, at least :data:`_RENEW_RETRY_MIN_S`.
    """
    if left <= 0.0:
        return None
    return max(min(ttl / 3.0, left / 4.0), _RENEW_RETRY_MIN_S)


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
                retry = renew_retry_s(self._ttl, self._lock.remaining())
                if retry is not None:
                    interval = retry
                    continue
            if not self._stopped.is_set():
                self._lock._mark_lost()
            return


# -- the sync verbs ------------------------------------------------------------------------


def attempt(backend: Backend, name: str, owner: str, ttl: float) -> Lock | Busy:
    """One engine attempt with validated arguments: the new :class:`Lock`, or the refusal."""
    started = time.monotonic()
    return backend.admit(Lock, name, owner, ttl, started, backend.engine.acquire(name, owner, ttl))


def wait_for(backend: Backend, name: str, owner: str, ttl: float, timeout: float | None) -> Lock:
    """Attempt, pause, attempt again until granted.

    Raises:
        LockTimeout: still held elsewhere after ``timeout`` seconds.
        StoreError: as the engine raises.
    """
    engine = backend.engine
    started = time.monotonic()
    tries = 0
    while True:
        engine.arm()
        result = attempt(backend, name, owner, ttl)
        if not isinstance(result, Busy):
            return result
        engine.wait(next_pause(name, result, started, timeout, tries, engine.poll_cap_s))
        tries = min(tries + 1, ATTEMPT_MAX)


def next_pause(
    name: str, busy: Busy, started: float, timeout: float | None, tries: int, cap_s: float
) -> float:
    """How long a waiter pauses after its ``tries``-th refusal, in seconds (no I/O).

    Jittered doubling from :data:`_WAIT_FIRST_S` up to the engine's ``cap_s``, never
    past the holder's expiry nor the end of the ``timeout`` counted from ``started``
    (``time.monotonic()``). The blocking and the asyncio waits both pause by it.

    Raises:
        LockTimeout: the timeout has run out.
    """
    left = None if timeout is None else started + timeout - time.monotonic()
    if left is not None and left <= 0.0:
        raise LockTimeout(_busy_message(name, busy.holder, timeout), key=name)
    delay = random.uniform(0.5, 1.0) * min(cap_s, _WAIT_FIRST_S * 2.0**tries)
    if busy.holder is not None:
        delay = min(delay, busy.holder.remaining_s + 0.001)
    return delay if left is None else min(delay, left)


def _busy_message(name: str, holder: LockInfo | SlotInfo | None, timeout: float | None) -> str:
    if type(holder) is SlotInfo:
        return f"semaphore {name!r}: all {holder.limit} slots still held after {timeout or 0.0:g} s"
    who = "another owner" if holder is None else f"{holder.owner!r}"
    return f"lock {name!r} still held by {who} after {timeout or 0.0:g} s"
