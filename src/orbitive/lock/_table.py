"""The lock table: keyed leases in one fleet-shared, open-addressed SHM table.

Every public method validates its arguments, then runs one critical-section
step (process mutex + the state object's section, see ``_region`` and
``_section``). Each step is one immediate attempt: no sleep, retry or timeout
(seed 000, "Every operation is one immediate attempt").

Invariant (seed 000 "Crash-safe"): inside the critical section the counters
are advanced first, then the transition is published, then the slot is set
TOMBSTONE, rewritten, and set OCCUPIED last. A process killed anywhere in that
sequence leaves the key absent or intact, never half-written, and the kernel
releases its lock; at worst a fencing token and a revision are consumed.

The three hot operations, try_acquire, release and renew, are each one C call
(``_fastpath.c``, built when a compiler is present) on tables whose section is
the robust mutex: checks, clock, the stripes of the key's probe (see
``_layout``), step and result objects, the same bytes in the same order as the
Python steps here, which hold the whole section (every stripe). Those are the reference;
they run when the C module is missing, for observers, for anything the C call
declines (other argument types, errors to raise, a fork, a closed fleet), and
while the test-only :data:`crash_hook` is set.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar, final

from .. import _fork, _section
from .._clock import TTL_MAX_S, check_ttl, monotonic_ns, ttl_ms
from .._errors import (
    EntryTooLarge,
    FleetError,
    IdExhausted,
    InvalidArgumentType,
    StateFull,
)
from .._fleet import Fleet
from .._readiness import Readiness
from .._region import store
from .._ring import Ring
from . import _events
from ._layout import (
    COUNTERS,
    COUNTERS_OFFSET,
    EMPTY,
    HEADER_SIZE,
    MAX_PROBE,
    MAX_PROBE_OFFSET,
    OCCUPIED,
    SLOT,
    SLOT_HEADER_SIZE,
    TOMBSTONE,
    LockLayout,
)
from ._types import (
    KIND_SHIFT,
    NODE_SHIFT,
    TOKEN_MASK,
    Acquired,
    LockKey,
    LockLease,
    LockOwner,
    LockPoll,
    Occupied,
)

try:
    from ._fastpath import Steps
except ImportError:  # not built (no C compiler): the Python steps are used
    Steps = None  # type: ignore[assignment, misc]

_unpack_slot = SLOT.unpack_from
_unpack_counters = COUNTERS.unpack_from
_unpack_max_probe = MAX_PROBE.unpack_from
_U64: Final = struct.Struct("<Q")
_REVISION_OFFSET: Final = 24
_EXPIRES_OFFSET: Final = 40
_REVISION_MAX: Final = (1 << 64) - 1
#: First 8 bytes of an EMPTY slot: state, reserved and the three lengths, all zero.
#: A state byte of 0 with any non-zero length is a damaged slot, not the end of a chain.
_EMPTY_HEAD: Final = bytes(8)
_T = TypeVar("_T")
_A = TypeVar("_A")
_B = TypeVar("_B")
_EVENT: Final = _events.EVENT_HEADER
_EVENT_MAGIC: Final = _events.EVENT_MAGIC
_EVENT_VERSION: Final = _events.EVENT_VERSION

#: The value types the C operations read and build, in their order.
_TYPES: Final = (LockKey, LockOwner, LockLease, Acquired, Occupied)

#: Test-only hook, called with a point name inside the critical section
#: ("bound_raised": after max_probe was raised for an insert, before its slot changes;
#: "tombstoned": after the slot went TOMBSTONE, before it is rewritten).
crash_hook: Callable[[str], None] | None = None


@final
@dataclass(frozen=True, slots=True)
class LockTableStatistics:
    """A snapshot of the state table and this handle's ring position."""

    capacity: int
    occupied_count: int
    expired_count: int
    tombstone_count: int
    max_probe: int
    last_fencing_token: int
    last_state_revision: int
    ring_heads: tuple[int, ...]


def _not_a(what: str, expected: str, value: object) -> InvalidArgumentType:
    return InvalidArgumentType(f"{what} must be a {expected}, not {type(value).__name__}")


class LockTable:
    """Keyed leases shared by every process of a fleet (seed 000).

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
        if not isinstance(fleet, Fleet):
            raise _not_a("fleet", "Fleet", fleet)
        if layout is None:
            layout = LockLayout.default()
        elif type(layout) is not LockLayout:
            raise _not_a("layout", "LockLayout", layout)
        self.fleet = fleet
        self.layout = layout
        self._state = fleet.region(
            layout.state_kind,
            layout.state_size,
            layout.init_state,
            layout.validate_state,
            layout.stripes,
        )
        self._buf = self._state.buf
        self._ring = Ring(fleet, layout.ring_geometry(fleet.capacity), _EVENT)
        self._fork_generation = _fork.generation
        self._mask = layout.capacity - 1
        self._stride = layout.slot_size
        section = self._state.section
        # The slots of one stripe (its first slot: digest & _stripe_floor).
        stripe_slots = layout.capacity // (1 if section is None else section.stripes)
        self._stripe_floor = self._mask & ~(stripe_slots - 1)
        self._payload_max = layout.payload_max
        self._refresh_node()
        self._closed = False

    def _refresh_node(self) -> None:
        node = self.fleet.node  # may raise in a forked child; then stay unrefreshed
        if self._fork_generation != _fork.generation:
            self._ring.forget_readiness()  # the parent's driver thread is not ours
        self._fork_generation = _fork.generation
        self._node = node
        self._id_base = (self.layout.state_kind << KIND_SHIFT) | (self._node << NODE_SHIFT)
        self._bind(self._new_steps() if Steps is not None and node >= 0 else None)

    def _bind(self, steps: Steps | None) -> None:
        """Make the C operations this table's own try_acquire, release and renew (None: unbind).

        Each then is one C call, which hands anything off its path to the Python
        operation of the same name with a leading underscore.
        """
        self._steps = steps
        for name in ("try_acquire", "release", "renew"):
            if steps is None:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = getattr(steps, name)

    def _new_steps(self) -> Steps | None:
        """The C operations, where the state's section is a robust mutex they can lock."""
        section = self._state.section
        if section is None or section.mechanism != _section.ROBUST_MUTEX:
            return None
        ring = self._ring.geometry
        steps = Steps(
            self._buf,
            self._ring.buf,
            self._state.block,
            self._mask + 1,
            self._stride,
            self._payload_max,
            ring.lane_count,
            ring.heads_offset,
            ring.slots_offset,
            ring.capacity,
            ring.stride,
            ring.frame_bytes,
            self._node,
            self._id_base,
            self._ring.wake,
            section.stripes,
            _TYPES,
            _fork,
            self,
            sys.modules[__name__],
        )
        self._state.on_close(steps.close)
        return steps

    # -- argument checks ---------------------------------------------------------------

    def _full(self, key: LockKey) -> StateFull:
        return StateFull(
            f"fleet {self.fleet.name!r}: lock table full ({self._mask + 1} slots)",
            fleet=self.fleet.name,
            key=key,
        )

    def _exhausted(self, token: int, revision: int) -> IdExhausted:
        return IdExhausted(
            f"fleet {self.fleet.name!r}: lock table counters exhausted "
            f"(token {token}, revision {revision})",
            fleet=self.fleet.name,
        )

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
            raise _not_a("lease", "LockLease", lease)
        key, owner, lock_id = lease.key, lease.owner, lease.lock_id
        if (
            type(key) is not LockKey
            or type(owner) is not LockOwner
            or type(lock_id) is not int
            or type(lease.slot) is not int
        ):
            raise _not_a(
                "lease", "LockLease of a LockKey, a LockOwner, int lock id and slot", lease
            )
        return len(key.ident) + len(owner.value) > self._payload_max

    def _check_entry(self, key: LockKey, owner: LockOwner | bytes | str) -> LockOwner:
        """Validate a (key, owner) pair; returns the owner as a LockOwner."""
        if type(key) is not LockKey:
            raise _not_a("key", "LockKey", key)
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

        Seed 000: TTL on the host monotonic clock; strictly increasing fencing
        tokens; a full table refuses, it never evicts.
        """
        return self._try_acquire(key, owner, ttl)

    def _try_acquire(
        self, key: LockKey, owner: LockOwner | bytes | str, ttl: float
    ) -> Acquired | Occupied:
        if type(ttl) is not float or not 0.0 < ttl <= TTL_MAX_S:
            ttl = check_ttl(ttl)
        owner = self._check_entry(key, owner)
        return self._locked(self._acquire_step, key, owner, ttl_ms(ttl))

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
        return self._locked(self._renew_step, lease, None, ttl_ms(ttl))

    def renew_owned(
        self, key: LockKey, owner: LockOwner | bytes | str, ttl: float
    ) -> LockLease | None:
        """Like :meth:`renew`, for whatever live tenure of ``key`` has exactly ``owner``."""
        ttl = check_ttl(ttl)
        owner = self._check_entry(key, owner)
        return self._locked(self._renew_owned_step, key, owner, ttl_ms(ttl))

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
        if self._foreign(lease):
            return False
        return self._locked(self._release_step, lease, None, 0)

    def release_owned(self, key: LockKey, owner: LockOwner | bytes | str) -> bool:
        """Release whatever live tenure of ``key`` has exactly ``owner``; False if none."""
        owner = self._check_entry(key, owner)
        return self._locked(self._release_owned_step, key, owner, 0)

    def force_release(self, key: LockKey) -> bool:
        """Administrative, ownerless release of ``key`` (an escape hatch, not normal use).

        Returns:
            True when a live entry was released; False when absent or already expired.
        """
        if type(key) is not LockKey:
            raise _not_a("key", "LockKey", key)
        return self._locked(self._force_step, key, None, 0)

    def current(self, key: LockKey) -> LockLease | None:
        """Authoritative lookup: the live lease of ``key``, or None."""
        if type(key) is not LockKey:
            raise _not_a("key", "LockKey", key)
        return self._locked(self._current_step, key, None, 0)

    def restore(self, key: LockKey, owner: LockOwner | bytes | str) -> LockLease | None:
        """:meth:`current`, but only when the live holder is exactly ``owner``."""
        owner = self._check_entry(key, owner)
        lease = self.current(key)
        return lease if lease is not None and lease.owner == owner else None

    def leases(self) -> list[LockLease]:
        """Every live lease, in slot order (inspection)."""
        return self._locked(self._leases_step, None, None, 0)

    # -- critical-section steps ---------------------------------------------------------

    def _locked(self, step: Callable[[_A, _B, int, int], _T], a: _A, b: _B, c: int) -> _T:
        if self._fork_generation != _fork.generation:
            self._refresh_node()
        state = self._state
        state.acquire()
        try:
            return step(a, b, c, monotonic_ns() // 1_000_000)
        finally:
            state.release()

    def _acquire_step(
        self, key: LockKey, owner: LockOwner, ms: int, now: int
    ) -> Acquired | Occupied:
        expires = now + ms
        slot = key.digest & self._mask
        offset = HEADER_SIZE + slot * self._stride
        if self._buf[offset : offset + 8] != _EMPTY_HEAD:  # else: a free home slot
            slot = self._probe(key, now)
            if slot >= 0:
                return Occupied(self._lease_at(slot))
            slot = ~slot
        return Acquired(self._insert(slot, key, owner, now, expires))

    def _release_step(self, lease: LockLease, _: None, __: int, now: int) -> bool:
        slot = self._find_tenure(lease, now)
        if slot < 0:
            return False
        self._remove(slot, lease)
        return True

    def _renew_step(self, lease: LockLease, _: None, ms: int, now: int) -> LockLease | None:
        slot = self._find_tenure(lease, now)
        return None if slot < 0 else self._rewrite(slot, now, now + ms)

    def _renew_owned_step(
        self, key: LockKey, owner: LockOwner, ms: int, now: int
    ) -> LockLease | None:
        slot = self._probe(key, now)
        if slot < 0 or not self._owner_is(slot, key, owner):
            return None
        return self._rewrite(slot, now, now + ms)

    def _release_owned_step(self, key: LockKey, owner: LockOwner, _: int, now: int) -> bool:
        slot = self._probe(key, now)
        if slot < 0 or not self._owner_is(slot, key, owner):
            return False
        self._remove(slot)
        return True

    def _force_step(self, key: LockKey, _: None, __: int, now: int) -> bool:
        slot = self._probe(key, now)
        if slot < 0:
            return False
        self._remove(slot)
        return True

    def _current_step(self, key: LockKey, _: None, __: int, now: int) -> LockLease | None:
        slot = self._probe(key, now)
        return None if slot < 0 else self._lease_at(slot)

    def _leases_step(self, _: None, __: None, ___: int, now: int) -> list[LockLease]:
        return [self._lease_at(slot) for slot in range(self._mask + 1) if self._live(slot, now)]

    # -- slot primitives (called inside the critical section) --------------------------

    def _read_live(self, slot: int, now: int) -> tuple[int, ...] | None:
        """The slot's fields when it holds a valid, unexpired entry; else None."""
        fields = _unpack_slot(self._buf, HEADER_SIZE + slot * self._stride)
        state, ns, lb, ow, _, _, _, acquired, expires = fields
        if (
            state != OCCUPIED
            or not (ns and lb and ow)
            or ns + lb + ow > self._payload_max
            or not acquired < expires
            or expires <= now
        ):
            return None
        return fields

    def _live(self, slot: int, now: int) -> bool:
        """A valid, unexpired entry whose stored digest matches its stored key (inspection)."""
        fields = self._read_live(slot, now)
        return fields is not None and self._lease_at(slot).key.digest == fields[4]

    def _holds_key(self, offset: int, fields: tuple[int, ...], key: LockKey) -> bool:
        """Whether the slot at ``offset`` (with its ``fields``) stores exactly ``key``."""
        start = offset + SLOT_HEADER_SIZE
        return (
            fields[4] == key.digest
            and fields[1] == len(key.namespace)
            and fields[2] == len(key.label)
            and self._buf[start : start + len(key.ident)] == key.ident
        )

    def _probe(self, key: LockKey, now: int) -> int:
        """Slot of ``key``'s live entry, else ``~insertion_slot`` (``~capacity``: none).

        Linear probing from the key digest; stops at EMPTY or after the probe
        bound (``max_probe + 1`` slots: no entry lies further from its home).
        Expired or invalid OCCUPIED slots met on the way are tombstoned (lazy
        reclaim); any other slot (TOMBSTONE, or damaged bytes) is reusable and
        the chain goes on. With no reusable slot within the bound, the insertion
        slot is the first one past it (:meth:`_free_after`).
        """
        buf, mask, stride = self._buf, self._mask, self._stride
        slot = key.digest & mask
        insert_at = mask + 1
        bound = self._bound()
        for _ in range(bound + 1):
            offset = HEADER_SIZE + slot * stride
            state = buf[offset]
            if state == EMPTY and buf[offset : offset + 8] == _EMPTY_HEAD:
                return ~(insert_at if insert_at <= mask else slot)
            if state == OCCUPIED:
                fields = self._read_live(slot, now)
                if fields is not None:
                    if self._holds_key(offset, fields, key):
                        return slot
                    slot = (slot + 1) & mask
                    continue
                self._tombstone(slot, key.digest)
            if insert_at > mask:
                insert_at = slot
            slot = (slot + 1) & mask
        if insert_at <= mask:
            return ~insert_at
        return ~self._free_after(slot, mask - bound, now, key.digest)

    def _bound(self) -> int:
        """The stored ``max_probe``, read as at most ``capacity - 1`` (never trusted further)."""
        stored: int = _unpack_max_probe(self._buf, MAX_PROBE_OFFSET)[0]
        return min(stored, self._mask)

    def _free_after(self, slot: int, count: int, now: int, digest: int) -> int:
        """The first reusable slot of the ``count`` from ``slot`` on, else ``capacity``.

        Past the probe bound no entry of the key can lie, so every slot that
        holds no live entry is reusable (an expired one is tombstoned first).
        """
        buf, mask, stride = self._buf, self._mask, self._stride
        for _ in range(count):
            if buf[HEADER_SIZE + slot * stride] != OCCUPIED:
                return slot
            if self._read_live(slot, now) is None:
                self._tombstone(slot, digest)
                return slot
            slot = (slot + 1) & mask
        return mask + 1

    def _raise_bound(self, slot: int, key: LockKey) -> None:
        """Store ``slot``'s displacement from ``key``'s home as ``max_probe`` if it is larger.

        Done before the entry is written: a process killed after it leaves a
        bound that is merely larger than needed.
        """
        displacement = (slot - key.digest) & self._mask
        if displacement > self._bound():
            store(self._buf, MAX_PROBE_OFFSET, MAX_PROBE, displacement)
            if crash_hook is not None:
                crash_hook("bound_raised")

    def _find_tenure(self, lease: LockLease, now: int) -> int:
        """Slot holding exactly ``lease``'s tenure (key, lock id and owner), or -1.

        Found by probing for the key, never by the lease's slot alone: only an
        entry a lookup can reach is the key's holder, so a renew or release
        can never act on an entry that damaged bytes cut off from its chain.
        (A live entry of the key in its home slot is what the probe would find
        first, so that case skips the probe.) Seed 000: release and renewal
        compare the key and the stored owner.
        """
        key, slot = lease.key, lease.slot
        fields = None
        if slot == key.digest & self._mask:
            fields = self._read_live(slot, now)
        if fields is None or not self._holds_key(HEADER_SIZE + slot * self._stride, fields, key):
            slot = self._probe(key, now)
        return slot if slot >= 0 and self._owner_is(slot, key, lease.owner, lease.lock_id) else -1

    def _owner_is(
        self, slot: int, key: LockKey, owner: LockOwner, lock_id: int | None = None
    ) -> bool:
        """Whether the entry of ``key`` in ``slot`` stores ``owner`` (and ``lock_id``, if given)."""
        offset = HEADER_SIZE + slot * self._stride
        fields = _unpack_slot(self._buf, offset)
        start = offset + SLOT_HEADER_SIZE + len(key.ident)
        return (
            (lock_id is None or fields[5] == lock_id)
            and fields[3] == len(owner.value)
            and self._buf[start : start + fields[3]] == owner.value
        )

    def _lease_at(self, slot: int) -> LockLease:
        offset = HEADER_SIZE + slot * self._stride
        _, ns, lb, ow, _, lock_id, revision, acquired, expires = _unpack_slot(self._buf, offset)
        body = self._buf[offset + SLOT_HEADER_SIZE : offset + SLOT_HEADER_SIZE + ns + lb + ow]
        return LockLease(
            LockKey(body[:ns], body[ns : ns + lb]),
            LockOwner(body[ns + lb :]),
            lock_id,
            revision,
            acquired / 1000.0,
            expires / 1000.0,
            slot,
        )

    def _next_ids(self, new_token: bool) -> tuple[int, int]:
        """Advance and return (last_token, last_revision) in the header."""
        if self._node < 0:
            raise FleetError(
                f"fleet {self.fleet.name!r}: an observer cannot change the lock table",
                fleet=self.fleet.name,
            )
        token, revision = _unpack_counters(self._buf, COUNTERS_OFFSET)
        token += new_token
        revision += 1
        if token > TOKEN_MASK or revision > _REVISION_MAX:
            raise self._exhausted(token, revision)
        store(self._buf, COUNTERS_OFFSET, COUNTERS, token, revision)
        return token, revision

    def _insert(
        self, slot: int, key: LockKey, owner: LockOwner, now: int, expires: int
    ) -> LockLease:
        if slot > self._mask:
            raise self._full(key)
        token, revision = self._next_ids(True)
        lock_id = self._id_base | token
        ident, raw_owner, ns_len = key.ident, owner.value, len(key.namespace)
        label_len, owner_len = len(ident) - ns_len, len(raw_owner)
        body = ident + raw_owner
        self._ring.publish(
            self._node,
            _events.ACQUIRED,
            revision,
            (_EVENT_MAGIC, _EVENT_VERSION, ns_len, label_len, owner_len, lock_id, now, expires),
            body,
        )
        self._raise_bound(slot, key)
        buf, offset = self._buf, HEADER_SIZE + slot * self._stride
        buf[offset] = TOMBSTONE
        if crash_hook is not None:
            crash_hook("tombstoned")
        store(
            buf,
            offset,
            SLOT,
            TOMBSTONE,
            ns_len,
            label_len,
            owner_len,
            key.digest,
            lock_id,
            revision,
            now,
            expires,
        )
        start = offset + SLOT_HEADER_SIZE
        buf[start : start + len(body)] = body
        buf[offset] = OCCUPIED
        return LockLease(key, owner, lock_id, revision, now / 1000.0, expires / 1000.0, slot)

    def _publish(self, kind: int, revision: int, lease: LockLease, times: tuple[int, int]) -> None:
        key, raw_owner = lease.key, lease.owner.value
        ns_len = len(key.namespace)
        self._ring.publish(
            self._node,
            kind,
            revision,
            (
                _EVENT_MAGIC,
                _EVENT_VERSION,
                ns_len,
                len(key.ident) - ns_len,
                len(raw_owner),
                lease.lock_id,
                *times,
            ),
            key.ident + raw_owner,
        )

    def _rewrite(self, slot: int, now: int, expires: int) -> LockLease:
        """Renew the live entry in ``slot``: new revision and a full new window."""
        lease = self._lease_at(slot)
        _, revision = self._next_ids(False)
        acquired: int = _unpack_slot(self._buf, HEADER_SIZE + slot * self._stride)[7]
        self._publish(_events.RENEWED, revision, lease, (acquired, expires))
        buf, offset = self._buf, HEADER_SIZE + slot * self._stride
        buf[offset] = TOMBSTONE
        if crash_hook is not None:
            crash_hook("tombstoned")
        store(buf, offset + _REVISION_OFFSET, _U64, revision)
        store(buf, offset + _EXPIRES_OFFSET, _U64, expires)
        buf[offset] = OCCUPIED
        return LockLease(
            lease.key,
            lease.owner,
            lease.lock_id,
            revision,
            lease.acquired_at,
            expires / 1000.0,
            slot,
        )

    def _remove(self, slot: int, lease: LockLease | None = None) -> None:
        """Release the live entry in ``slot`` (whose tenure is ``lease`` when known)."""
        if lease is None:
            lease = self._lease_at(slot)
        _, revision = self._next_ids(False)
        self._publish(_events.RELEASED, revision, lease, (0, 0))
        self._tombstone(slot, lease.key.digest)

    def _tombstone(self, slot: int, digest: int) -> None:
        """Mark ``slot`` TOMBSTONE; when the next slot is EMPTY, turn the run EMPTY.

        A tombstone followed by EMPTY ends every probe sequence through it
        anyway, so clearing it (and tombstones before it) keeps chains short.
        The run is cleared back no further than the first slot of the stripe
        of ``digest``'s home: the slots a C step on that key holds (``_layout``).
        """
        buf, mask, stride = self._buf, self._mask, self._stride
        buf[HEADER_SIZE + slot * stride] = TOMBSTONE
        following = HEADER_SIZE + ((slot + 1) & mask) * stride
        if buf[following : following + 8] != _EMPTY_HEAD:
            return
        for _ in range(((slot - (digest & self._stripe_floor)) & mask) + 1):
            offset = HEADER_SIZE + slot * stride
            if buf[offset] != TOMBSTONE:
                return
            buf[offset : offset + 8] = _EMPTY_HEAD  # any torn write reads as a tombstone
            slot = (slot - 1) & mask

    # -- transitions and readiness -----------------------------------------------------

    def poll(self) -> LockPoll:
        """Transitions published since the last poll, sorted by state_revision.

        Advisory: a wrapped ring loses history (counted in ``overwritten``) but
        never current state; re-check :meth:`current` for decisions.
        """
        read = self._ring.read(self._cursors)
        events = []
        malformed = 0
        for frame in read.frames:
            event = _events.decode(frame, self._payload_max)
            if event is None:
                malformed += 1
            else:
                events.append(event)
        events.sort(key=lambda event: event.state_revision)
        return LockPoll(tuple(events), read.overwritten, read.unavailable, malformed)

    def fileno(self) -> int:
        """Readiness descriptor: readable after any transition by any process.

        Works with ``select``, ``selectors`` and asyncio ``loop.add_reader``;
        call :meth:`drain` then :meth:`poll` when it is readable. Built on first
        use (one driver thread per handle); a forked child gets its own.
        """
        return self._readiness().fileno()

    def drain(self) -> int:
        """Clear readiness; returns a coalesced wake count, not an event count."""
        return self._readiness().drain()

    def _readiness(self) -> Readiness:
        if self._fork_generation != _fork.generation:
            self._refresh_node()
        name = f"orbit-lock-{self.fleet.name}-{self.layout.event_kind}"
        return self._ring.readiness(self._node, name, self._state)

    # -- lifecycle ---------------------------------------------------------------------

    def reset_transport(self) -> None:
        """Clear the state table and the transition ring (quiescent owner boot only)."""
        self._state.acquire()
        try:
            self._buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + MAX_PROBE.size] = bytes(MAX_PROBE.size)
            self._buf[COUNTERS_OFFSET : COUNTERS_OFFSET + COUNTERS.size] = bytes(COUNTERS.size)
            self._buf[HEADER_SIZE:] = bytes(len(self._buf) - HEADER_SIZE)
            self._ring.reset()
            self._cursors = self._ring.heads()
        finally:
            self._state.release()

    def unlink(self) -> None:
        """Remove the state and ring objects' names (and lock files); mappings stay valid."""
        self._state.unlink()
        self._ring.region.unlink()

    def close(self) -> None:
        """Stop this handle's readiness driver. The mappings belong to the fleet."""
        self._ring.close()
        self._closed = True

    def statistics(self) -> LockTableStatistics:
        """Counts of occupied, expired and tombstoned slots, the probe bound and the counters.

        Read in one critical section, so the counts agree with each other.

        Raises:
            FleetError: the fleet was closed.
        """
        return self._locked(self._statistics_step, None, None, 0)

    def _statistics_step(self, _: None, __: None, ___: int, now: int) -> LockTableStatistics:
        occupied = expired = tombstones = 0
        for slot in range(self._mask + 1):
            state = self._buf[HEADER_SIZE + slot * self._stride]
            if state == TOMBSTONE:
                tombstones += 1
            elif state == OCCUPIED:
                if self._live(slot, now):
                    occupied += 1
                else:
                    expired += 1
        token, revision = _unpack_counters(self._buf, COUNTERS_OFFSET)
        return LockTableStatistics(
            self._mask + 1,
            occupied,
            expired,
            tombstones,
            self._bound(),
            token,
            revision,
            tuple(self._ring.heads()),
        )

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
