"""The lock table: keyed leases in one fleet-shared, open-addressed SHM table.

Every public method validates its arguments, then runs one critical-section
step (process mutex + the state object's section, see ``_region`` and
``_section``). Each step is one immediate attempt: no sleep, retry or timeout
(lease contract, "Every operation is one immediate attempt"). The steps, and the
crash-safety invariant they keep, are in ``_steps`` (the Python reference) and
``_inspection`` (leases and statistics); the transition frames in ``_events``.

The hot operations, try_acquire, release, renew and ``_release_handing`` (the release
under release_waking and the SHM store's release), are each one C call
(``_fastpath.c``, built when a compiler is present) on tables whose section is
the robust mutex: checks, clock, the stripes of the key's probe (see
``_layout``), step and result objects, the same bytes in the same order as the
Python steps of ``_steps``, which hold the whole section (every stripe). The
Python steps are the reference; they run when the C module is missing, for
observers, for anything the C call declines (other argument types, errors to
raise, a fork, a closed fleet), and while the test-only ``_steps.crash_hook`` is
set. A C call declines to this class's method of the same name, which runs
``_try_acquire``, ``_release``, ``_renew`` or ``_release_waking``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final, TypeVar

from .._core import _fork
from .._core._clock import TTL_MAX_S, check_timeout, check_ttl, monotonic_ns, ttl_ms
from .._core._errors import EntryTooLarge
from .._core._fleet import Fleet
from .._core._readiness import Readiness
from .._core._section import recoveries
from . import _events, _inspection, _key_wait
from ._inspection import LockTableStatistics
from ._key_wait import KeyWaiter
from ._layout import (
    CONFLICTS,
    CONFLICTS_OFFSET,
    COUNTERS_OFFSET,
    HEADER_SIZE,
    MAX_PROBE,
    MAX_PROBE_OFFSET,
    LockLayout,
)
from ._opening import c_steps, not_a, open_objects
from ._steps import ReferenceSteps
from ._types import (
    KIND_SHIFT,
    NODE_SHIFT,
    Acquired,
    LockKey,
    LockLease,
    LockOwner,
    LockPoll,
    Occupied,
)

if TYPE_CHECKING:
    from ._fastpath import Steps

_log = logging.getLogger("orbitive.lock")
#: The header's counters (last token, last revision, conflicts) end here.
CONFLICTS_END = CONFLICTS_OFFSET + CONFLICTS.size
_T = TypeVar("_T")
_A = TypeVar("_A")
_B = TypeVar("_B")
#: The holder's expiry publishes nothing: a waiter looks again this long after it.
_EXPIRY_SLACK_S: Final = 0.001
#: The table's methods the C steps bind over (``_bind``), and the step of each.
_BOUND: Final = (
    ("try_acquire", "try_acquire"),
    ("release", "release"),
    ("renew", "renew"),
    ("_release_handing", "release_handing"),
)


class LockTable:
    """Keyed leases shared by every process of a fleet (the lease contract).

    ``LockTable(fleet)`` subscribes after the current transition heads;
    :meth:`replay_retained` subscribes from the oldest retained transition.

    Args:
        fleet: a joined (:meth:`Fleet.join`) or local (:meth:`Fleet.local`) fleet.
        layout: kinds and geometry; all peers must agree (default
            :meth:`LockLayout.default`).

    Raises:
        InvalidArgumentType: ``fleet`` is not a Fleet or ``layout`` not a LockLayout.
        LayoutMismatch: the existing state or ring object has another layout or
            section mechanism.
        AccessDenied: an object or ``/dev/shm`` is not exclusively ours.

    Example::

        table = LockTable(Fleet.join("web", capacity=8))
        key, me = LockKey("jobs", "nightly"), LockOwner.random()
        match table.try_acquire(key, me, ttl=30.0):
            case Acquired(lease): ...; table.release(lease)
            case Occupied(holder): print("held until", holder.expires_at)
    """

    def __init__(self, fleet: Fleet, layout: LockLayout | None = None) -> None:
        self._setup(fleet, layout)
        self._cursors = self._ring.heads()

    @classmethod
    def replay_retained(cls, fleet: Fleet, layout: LockLayout | None = None) -> LockTable:
        """A table whose first :meth:`poll` returns every still-retained transition."""
        table = cls.__new__(cls)
        table._setup(fleet, layout)
        table._cursors = [0] * fleet.capacity
        return table

    def _setup(self, fleet: Fleet, layout: LockLayout | None) -> None:
        self._closed = True
        self.layout, self._state, self._ring = open_objects(fleet, layout)
        self.fleet = fleet
        self._buf = self._state.buf
        self._fork_generation = _fork.generation
        self._mask = self.layout.capacity - 1
        self._payload_max = self.layout.payload_max
        section = self._state.section
        stripes = 1 if section is None else section.stripes
        self._reference = ReferenceSteps(fleet.name, self._buf, self._ring, self.layout, stripes)
        # .key, .word: the key this thread's last release_waking handed to a waiter, and
        # the key word that release left (taken by its next wait_acquire(queue=True)).
        self._handed = threading.local()
        self._refresh_node()
        self._closed = False

    def _refresh_node(self) -> None:
        node = self.fleet.node  # may raise in a forked child; then stay unrefreshed
        if self._fork_generation != _fork.generation:
            self._ring.forget_readiness()  # the parent's readiness socket is not ours
        self._fork_generation = _fork.generation
        self._node = self._reference.node = node
        if node >= 0:  # a previous process of this node may have left its waiting slot
            _key_wait.forget(self._ring, node)
        self._reference.id_base = (self.layout.state_kind << KIND_SHIFT) | (node << NODE_SHIFT)
        self._bind(c_steps(self._state, self._ring, self._reference, self))

    def _bind(self, steps: Steps | None) -> None:
        """Make the C operations this table's own try_acquire, release, renew and
        _release_handing (None: unbind).

        Each then is one C call, which hands anything off its path to the Python
        operation of the same name with a leading underscore (``_release_waking``
        for ``_release_handing``).
        """
        self._steps = steps
        for name, step in _BOUND:
            if steps is None:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = getattr(steps, step)

    # -- argument checks ---------------------------------------------------------------

    def _too_large(self, key: LockKey, owner: LockOwner) -> EntryTooLarge:
        return EntryTooLarge(
            f"namespace {len(key.namespace)} + label {len(key.label)} + owner "
            f"{len(owner.value)} bytes exceed the {self._payload_max}-byte entry limit",
            fleet=self.fleet.name,
            key=key,
        )

    def _foreign(self, lease: LockLease) -> bool:
        """Validate a lease's types; True when no tenure of this table can match it."""
        if type(lease) is not LockLease:
            raise not_a("lease", "LockLease", lease)
        key, owner, lock_id = lease.key, lease.owner, lease.lock_id
        if (
            type(key) is not LockKey
            or type(owner) is not LockOwner
            or type(lock_id) is not int
            or type(lease.slot) is not int
        ):
            raise not_a("lease", "LockLease of a LockKey, a LockOwner, int lock id and slot", lease)
        return len(key.ident) + len(owner.value) > self._payload_max

    def _check_entry(self, key: LockKey, owner: LockOwner | bytes | str) -> LockOwner:
        """Validate a (key, owner) pair; returns the owner as a LockOwner."""
        if type(key) is not LockKey:
            raise not_a("key", "LockKey", key)
        owner = owner if type(owner) is LockOwner else LockOwner(owner)
        if len(key.ident) + len(owner.value) > self._payload_max:
            raise self._too_large(key, owner)
        return owner

    # -- public operations -------------------------------------------------------------

    def try_acquire(
        self, key: LockKey, owner: LockOwner | bytes | str, ttl: float
    ) -> Acquired | Occupied:
        """Acquire ``key`` for ``owner`` for ``ttl`` seconds, in one immediate attempt.

        Args:
            key: what is excluded; only the key decides contention.
            owner: opaque compare token (``bytes``/``str`` are wrapped in LockOwner).
            ttl: seconds, finite and > 0; sub-millisecond rounds up to 1 ms.

        Returns:
            ``Acquired(lease)`` with a fencing token larger than every earlier
            one, or ``Occupied(lease)`` describing the live holder (even when the
            holder uses the same owner bytes: one live entry per key).

        Raises:
            InvalidTtl: bad ttl. OwnerEmpty, InvalidArgumentType: bad owner or key.
            EntryTooLarge: namespace + label + owner exceed ``payload_max``.
            StateFull: every slot holds a live key (nothing is ever evicted).
            IdExhausted: the 40-bit fencing token or the revision ran out.
            LayoutMismatch: this node's ring lane head in shared memory is corrupt.
            FleetError: the fleet is closed, or this handle only observes.

        Lease contract: TTL on the host monotonic clock; strictly increasing fencing
        tokens; a full table refuses, it never evicts.
        """
        return self._try_acquire(key, owner, ttl)

    def _try_acquire(
        self, key: LockKey, owner: LockOwner | bytes | str, ttl: float
    ) -> Acquired | Occupied:
        if type(ttl) is not float or not 0.0 < ttl <= TTL_MAX_S:
            ttl = check_ttl(ttl)
        owner = self._check_entry(key, owner)
        return self._locked(self._reference.acquire, key, owner, ttl_ms(ttl))

    def renew(self, lease: LockLease, ttl: float) -> LockLease | None:
        """Give the exact tenure ``lease`` a new full window of ``ttl`` seconds from now.

        Not additive: the new deadline is ``now + ttl`` whatever was left. The
        fencing token is kept.

        Returns:
            The renewed lease, or None when that tenure expired, was released or
            was replaced (the successor is never touched, even with equal owner bytes).

        Raises:
            InvalidTtl: bad ttl. InvalidArgumentType: ``lease`` is not a LockLease
                (of a LockKey, a LockOwner and an int lock id).
            IdExhausted: the revision counter ran out.
        """
        return self._renew(lease, ttl)

    def _renew(self, lease: LockLease, ttl: float) -> LockLease | None:
        ttl = check_ttl(ttl)
        if self._foreign(lease):
            return None
        return self._locked(self._reference.renew, lease, None, ttl_ms(ttl))

    def renew_owned(
        self, key: LockKey, owner: LockOwner | bytes | str, ttl: float
    ) -> LockLease | None:
        """Like :meth:`renew`, for whatever live tenure of ``key`` has exactly ``owner``."""
        ttl = check_ttl(ttl)
        owner = self._check_entry(key, owner)
        return self._locked(self._reference.renew_owned, key, owner, ttl_ms(ttl))

    def release(self, lease: LockLease) -> bool:
        """End the exact tenure ``lease``.

        Returns:
            True when it was live and is now released; False when it had expired,
            was released already or was replaced (no error, successor untouched).

        Raises:
            InvalidArgumentType: ``lease`` is not a LockLease
                (of a LockKey, a LockOwner and an int lock id).
            IdExhausted, LayoutMismatch, FleetError: as for :meth:`try_acquire`.
        """
        return self._release(lease)

    def _release(self, lease: LockLease) -> bool:
        return self._release_waking(lease)[0] >= 0

    def release_waking(self, lease: LockLease) -> int:
        """:meth:`release`, telling whether :meth:`wait_acquire` callers were waiting.

        Returns:
            -1 when the tenure was not live (``release`` would return False), else
            the number of nodes with threads waiting for the key; the release woke
            the one that waited longest. A caller that found waiters and asks for
            the key again at once passes ``queue=True`` to :meth:`wait_acquire`,
            to take its turn behind them.

        Raises:
            InvalidArgumentType, IdExhausted, LayoutMismatch, FleetError: as for
                :meth:`release`.
        """
        waiting, word = self._release_handing(lease)
        if waiting > 0:  # this thread's next wait_acquire(key, queue=True) waits past it
            self._handed.key, self._handed.word = lease.key, word
        return waiting

    def _release_handing(self, lease: LockLease) -> tuple[int, int]:
        """:meth:`release_waking`'s release (the C step binds over it): ``(-1, 0)`` when
        the tenure was not live, else the number of nodes waiting for the key and the
        key word (``_key_wait``) as the release left it: what the releaser's next wait
        for the key waits past (``KeyWaiter.queue``).

        Raises:
            As :meth:`release`.
        """
        return self._release_waking(lease)

    def _release_waking(self, lease: LockLease) -> tuple[int, int]:
        if self._foreign(lease):
            return -1, 0
        return self._locked(self._reference.release, lease, None, 0)

    def wait_acquire(
        self,
        key: LockKey,
        owner: LockOwner | bytes | str,
        ttl: float,
        timeout: float | None = None,
        *,
        queue: bool = False,
    ) -> Acquired | Occupied:
        """Acquire ``key`` for ``owner``, waiting while another tenure holds it.

        A release wakes the waiter of the key that has waited longest, in any
        process (one wake-up, by the release itself; see ``_key_wait``): the
        waiters of a key are served oldest first. An expiry publishes nothing:
        the waiters look again at the holder's deadline, and then race. A caller
        that finds the key free takes it, even while others wait, unless it
        passes ``queue``.

        Args:
            key: as for :meth:`try_acquire`.
            owner: as for :meth:`try_acquire`.
            ttl: seconds (float), as for :meth:`try_acquire`.
            timeout: seconds to wait (float); None waits forever; 0 makes one attempt.
            queue: wait behind the current waiters first (for at most
                ``_key_wait.QUEUE_S`` seconds), for a caller whose
                :meth:`release_waking` just found some: it then takes its turn
                instead of taking the key straight back. When this thread's last
                :meth:`release_waking` was of ``key`` and woke a waiter, it waits
                for that waiter's own release (watching the key word briefly
                before it sleeps), as the SHM store's lock does.

        Returns:
            ``Acquired(lease)``, or ``Occupied(holder)`` once ``timeout`` has passed.

        Raises:
            InvalidTtl: a bad ttl or timeout. Otherwise as :meth:`try_acquire`.
        """
        wait_s = check_timeout(timeout)
        if type(ttl) is not float or not 0.0 < ttl <= TTL_MAX_S:
            ttl = check_ttl(ttl)
        owner = self._check_entry(key, owner)
        deadline = None if wait_s is None else time.monotonic() + wait_s
        handed = self._handed_word(key) if queue else None
        if not queue:  # the common case: free at once, no wait to set up
            result = self.try_acquire(key, owner, ttl)
            if type(result) is Acquired or wait_s == 0.0:
                return result
        waiter = self._key_waiter(key)
        granted = False
        waiter.enter()
        try:
            if queue and wait_s != 0.0 and (handed is not None or waiter.others_wait()):
                waiter.queue(None if deadline is None else deadline - time.monotonic(), handed)
            while True:
                waiter.look()
                result = self.try_acquire(key, owner, ttl)
                if type(result) is Acquired:
                    granted = True
                    return result
                holder = result.lease
                left = holder.remaining() + _EXPIRY_SLACK_S
                if deadline is not None:
                    if deadline <= time.monotonic():
                        return result
                    left = min(left, deadline - time.monotonic())
                waiter.wait(holder.lock_id, left)
        finally:
            waiter.leave(granted)

    def _key_waiter(self, key: LockKey) -> KeyWaiter:
        """A place in the wait queue of ``key`` for this process's node (see ``_key_wait``)."""
        if self._fork_generation != _fork.generation:
            self._refresh_node()
        return KeyWaiter(self._ring, key.digest, self.fleet, self._node)

    def _queue_probe(self, key: LockKey) -> Callable[[], bool]:
        """Whether a thread of some node waits for ``key`` alone (``_key_wait.queue_probe``)."""
        return _key_wait.queue_probe(self._ring, key.digest)

    def _handed_word(self, key: LockKey) -> int | None:
        """The key word this thread's last :meth:`release_waking` left, when that release
        was of ``key`` and woke a waiter; taken once."""
        handed = self._handed
        last: LockKey | None = getattr(handed, "key", None)
        if last is None:
            return None
        handed.key = None
        return handed.word if last == key else None

    def _replace(
        self, lease: LockLease, owner: LockOwner, ttl: float, unless: tuple[LockKey, ...]
    ) -> Acquired | Occupied | None:
        """In one step: end exactly ``lease``'s tenure and take its key for ``owner`` for
        ``ttl`` seconds, unless a key of ``unless`` is held.

        What the store's semaphores replace a marker with (``store/_shm.py``): the check
        and the change are one critical section, so no acquisition of a key of
        ``unless`` falls between them. A process killed inside it leaves the old
        tenure, the new one, or the key free (the release and the acquisition each
        keep the steps' crash invariant).

        Returns:
            ``Acquired(lease)`` of the new tenure (a larger fencing token); ``Occupied``
            with the lease of a held key of ``unless``; None when ``lease``'s tenure is
            no longer live. Both refusals change nothing.

        Raises:
            InvalidTtl: bad ttl. InvalidArgumentType: ``lease`` is not a LockLease.
            EntryTooLarge: the key and ``owner`` exceed ``payload_max``.
            IdExhausted, LayoutMismatch, FleetError: as for :meth:`try_acquire`.
        """
        ttl = check_ttl(ttl)
        if self._foreign(lease):
            return None
        owner = self._check_entry(lease.key, owner)
        return self._locked(self._reference.replace, lease, (owner, unless), ttl_ms(ttl))

    def release_owned(self, key: LockKey, owner: LockOwner | bytes | str) -> bool:
        """Release whatever live tenure of ``key`` has exactly ``owner``; False if none.

        Like every release, it wakes the key's longest :meth:`wait_acquire` waiter.
        """
        owner = self._check_entry(key, owner)
        return self._locked(self._reference.release_owned, key, owner, 0)

    def force_release(self, key: LockKey) -> bool:
        """Administrative, ownerless release of ``key`` (an escape hatch, not normal use).

        Returns:
            True when a live entry was released (and logged at WARNING on
            ``orbitive.lock``: its holder has lost it); False when absent or already
            expired.
        """
        if type(key) is not LockKey:
            raise not_a("key", "LockKey", key)
        released: bool = self._locked(self._reference.force, key, None, 0)
        if released:
            _log.warning(
                "lock table of fleet %r (kind %d): key %r force-released; its holder has lost it",
                self.fleet.name,
                self.layout.state_kind,
                str(key),
            )
        return released

    def current(self, key: LockKey) -> LockLease | None:
        """Authoritative lookup: the live lease of ``key``, or None."""
        if type(key) is not LockKey:
            raise not_a("key", "LockKey", key)
        return self._locked(self._reference.current, key, None, 0)

    def restore(self, key: LockKey, owner: LockOwner | bytes | str) -> LockLease | None:
        """:meth:`current`, but only when the live holder is exactly ``owner``."""
        owner = self._check_entry(key, owner)
        lease = self.current(key)
        return lease if lease is not None and lease.owner == owner else None

    def leases(self) -> list[LockLease]:
        """Every live lease, in slot order (inspection)."""
        return self._locked(_inspection.leases, self._reference, None, 0)

    def _locked(self, step: Callable[[_A, _B, int, int], _T], a: _A, b: _B, c: int) -> _T:
        """``step(a, b, c, now)`` inside the critical section (after a fork: this node's)."""
        if self._fork_generation != _fork.generation:
            self._refresh_node()
        with self._state:
            return step(a, b, c, monotonic_ns() // 1_000_000)

    # -- transitions and readiness -----------------------------------------------------

    def poll(self) -> LockPoll:
        """Transitions published since the last poll, sorted by state_revision.

        Advisory: a wrapped ring loses history (counted in ``overwritten``) but
        never current state; re-check :meth:`current` for decisions.
        """
        return _events.poll(self._ring, self._cursors, self._payload_max)

    def fileno(self) -> int:
        """Readiness descriptor: readable after any transition by any process.

        Works with ``select``, ``selectors`` and asyncio ``loop.add_reader``;
        call :meth:`drain` then :meth:`poll` when it is readable. Built on first
        use (a socket the publishers write to; no thread); a forked child gets its own.
        """
        return self._readiness().fileno()

    def drain(self) -> int:
        """Clear readiness; returns a coalesced wake count, not an event count."""
        return self._readiness().drain()

    def _readiness(self) -> Readiness:
        if self._fork_generation != _fork.generation:
            self._refresh_node()
        name = f"orbit-lock-{self.fleet.name}-{self.layout.event_kind}"
        return self._ring.readiness(self._node, name)

    # -- lifecycle ---------------------------------------------------------------------

    def reset_transport(self) -> None:
        """Clear the state table and the transition ring (quiescent owner boot only)."""
        with self._state:
            self._buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + MAX_PROBE.size] = bytes(MAX_PROBE.size)
            self._buf[COUNTERS_OFFSET:CONFLICTS_END] = bytes(CONFLICTS_END - COUNTERS_OFFSET)
            self._buf[HEADER_SIZE:] = bytes(len(self._buf) - HEADER_SIZE)
            self._ring.reset()
            self._cursors = self._ring.heads()

    def unlink(self) -> None:
        """Remove the state and ring objects' names (and lock files); mappings stay valid.

        Raises:
            AccessDenied: a name is no longer ours (another user's object took it).
        """
        self._state.unlink()
        self._ring.region.unlink()

    def close(self) -> None:
        """Close this handle's readiness descriptor. The mappings belong to the fleet."""
        self._ring.close()
        self._closed = True

    def statistics(self) -> LockTableStatistics:
        """Counts of occupied, expired and tombstoned slots, the probe bound and the counters.

        Read in one critical section, so the counts agree with each other.

        Raises:
            FleetError: the fleet was closed.
        """
        counted = self._locked(_inspection.statistics, self._reference, None, 0)
        if not self._state.shared:
            return counted
        return replace(counted, recoveries_count=recoveries(self._state.block))

    def __enter__(self) -> LockTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a LockTable cannot be pickled; build one from Fleet.join in each process")

    def __repr__(self) -> str:
        try:
            state = "closed" if self._closed else f"node={self._node}"
            return f"<LockTable fleet={self.fleet.name!r} {state} capacity={self._mask + 1}>"
        except AttributeError:
            return "<LockTable (not initialised)>"
