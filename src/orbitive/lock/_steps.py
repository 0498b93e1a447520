"""The lock table's steps in Python: the reference twin of ``_fastpath.c``.

:class:`ReferenceSteps` holds the bytes of one lock table and does, inside the
critical section its caller holds (every stripe), what ``_fastpath.c`` does for
try_acquire, release and renew: the probe with lazy reclaim, the tombstone run,
the insert, the rewrite of a renewal and the removal of a release, in the same
order of writes, under the same names (``read_live``, ``holds_key``,
``tombstone``, ``bound``, ``free_after``, ``probe``, ``publish``, ``insert``,
``find_tenure``, ``rewrite``). They run when the C module is missing, for
everything it declines, and while the test-only :data:`crash_hook` is set.

Invariant (lease contract, "Crash-safe"): the counters are advanced first, then the
transition is published, then the slot changes. An insert sets its slot (which
holds no live entry) TOMBSTONE, writes it, and sets it OCCUPIED last; a renewal
rewrites its live entry in place, the revision and then the expiry, each one
aligned 8-byte store; a release sets the slot TOMBSTONE. A process killed
anywhere in that sequence leaves no entry half-written, and a live entry live
until the old expiry or the new one: a holder killed inside its own renewal keeps
its key until the expiry it held. The kernel releases its lock; at worst a
fencing token and a revision are consumed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from .._core._errors import FleetError, IdExhausted, StateFull
from .._core._region import store
from . import _events
from ._layout import (
    CONFLICTS,
    CONFLICTS_OFFSET,
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
from ._ring import Ring
from ._types import TOKEN_MASK, Acquired, LockKey, LockLease, LockOwner, Occupied

if TYPE_CHECKING:
    import mmap

_unpack_slot = SLOT.unpack_from
_unpack_counters = COUNTERS.unpack_from
_unpack_conflicts = CONFLICTS.unpack_from
_unpack_max_probe = MAX_PROBE.unpack_from
_U64: Final = struct.Struct("<Q")
_U32: Final = struct.Struct("<I")
_REVISION_OFFSET: Final = 24
_EXPIRES_OFFSET: Final = 40
_REVISION_MAX: Final = (1 << 64) - 1
_U64_MAX: Final = (1 << 64) - 1
#: First 8 bytes of an EMPTY slot: state, reserved and the three lengths, all zero.
#: A state byte of 0 with any non-zero length is a damaged slot, not the end of a chain.
_EMPTY_HEAD: Final = bytes(8)
_EVENT_MAGIC: Final = _events.EVENT_MAGIC
_EVENT_VERSION: Final = _events.EVENT_VERSION

#: Test-only hook, called with a point name inside the critical section
#: ("bound_raised": after max_probe was raised for an insert, before its slot changes;
#: "tombstoned": after an insert's slot went TOMBSTONE, before it is written;
#: "published" and "revision_stored": a renewal's, after its transition was published
#: and after the entry's revision was stored, before its expiry is).
crash_hook: Callable[[str], None] | None = None


class ReferenceSteps:
    """The Python steps on one lock table's state bytes, run inside its critical section.

    Each step takes ``(a, b, c, now)`` (``now`` in monotonic milliseconds), the
    shape ``LockTable._locked`` calls. ``node`` and ``id_base`` are this
    process's (set again by the table after a fork); node -1 only observes.
    """

    def __init__(
        self, fleet_name: str, buf: mmap.mmap, ring: Ring, layout: LockLayout, stripes: int
    ) -> None:
        self.fleet_name = fleet_name
        self.buf = buf
        self.ring = ring
        self.mask = layout.capacity - 1
        self.stride = layout.slot_size
        self.payload_max = layout.payload_max
        # The slots of one stripe (its first slot: digest & stripe_floor).
        self.stripe_floor = self.mask & ~(layout.capacity // stripes - 1)
        self.node = -1
        self.id_base = 0

    # -- errors raised inside a step ------------------------------------------------------

    def _full(self, key: LockKey) -> StateFull:
        return StateFull(
            f"fleet {self.fleet_name!r}: lock table full ({self.mask + 1} slots)",
            fleet=self.fleet_name,
            key=key,
        )

    def _exhausted(self, token: int, revision: int) -> IdExhausted:
        return IdExhausted(
            f"fleet {self.fleet_name!r}: lock table counters exhausted "
            f"(token {token}, revision {revision})",
            fleet=self.fleet_name,
        )

    # -- the operations' steps ------------------------------------------------------------

    def acquire(self, key: LockKey, owner: LockOwner, ms: int, now: int) -> Acquired | Occupied:
        """try_acquire: the live holder of ``key``, else a new entry for ``ms`` milliseconds."""
        slot = key.digest & self.mask
        offset = HEADER_SIZE + slot * self.stride
        if self.buf[offset : offset + 8] != _EMPTY_HEAD:  # else: a free home slot
            slot = self.probe(key, now)
            if slot >= 0:
                self.count_conflict()
                return Occupied(self.lease_at(slot))
            slot = ~slot
        return Acquired(self.insert(slot, key, owner, now, now + ms))

    def release(self, lease: LockLease, _: None, __: int, now: int) -> tuple[int, int]:
        """release: remove exactly ``lease``'s tenure; ``(-1, 0)`` when it is not live,
        else the number of nodes waiting for the key and the key word the release left
        (``LockTable._release_handing``)."""
        slot = self.find_tenure(lease, now)
        if slot < 0:
            return -1, 0
        return self.remove(slot, lease)

    def renew(self, lease: LockLease, _: None, ms: int, now: int) -> LockLease | None:
        """renew: a full new window of ``ms`` milliseconds for exactly ``lease``'s tenure."""
        slot = self.find_tenure(lease, now)
        return None if slot < 0 else self.rewrite(slot, now, now + ms)

    def renew_owned(self, key: LockKey, owner: LockOwner, ms: int, now: int) -> LockLease | None:
        """renew_owned: as :meth:`renew`, for the live tenure of ``key`` held by ``owner``."""
        slot = self.probe(key, now)
        if slot < 0 or not self.owner_is(slot, key, owner):
            return None
        return self.rewrite(slot, now, now + ms)

    def release_owned(self, key: LockKey, owner: LockOwner, _: int, now: int) -> bool:
        """release_owned: as :meth:`release`, for the live tenure of ``key`` held by ``owner``."""
        slot = self.probe(key, now)
        if slot < 0 or not self.owner_is(slot, key, owner):
            return False
        self.remove(slot)
        return True

    def force(self, key: LockKey, _: None, __: int, now: int) -> bool:
        """force_release: remove the live entry of ``key``, whoever holds it."""
        slot = self.probe(key, now)
        if slot < 0:
            return False
        self.remove(slot)
        return True

    def current(self, key: LockKey, _: None, __: int, now: int) -> LockLease | None:
        """current: the live lease of ``key``, or None."""
        slot = self.probe(key, now)
        return None if slot < 0 else self.lease_at(slot)

    def replace(
        self, lease: LockLease, change: tuple[LockOwner, tuple[LockKey, ...]], ms: int, now: int
    ) -> Acquired | Occupied | None:
        """replace: end exactly ``lease``'s tenure and take its key for the owner of ``change``
        for ``ms`` milliseconds, unless a key of ``change`` is held (its holder, Occupied)
        or the tenure is not live (None); either refusal changes nothing."""
        owner, unless = change
        slot = self.find_tenure(lease, now)
        if slot < 0:
            return None
        held = self.first_live(unless, now)
        if held >= 0:
            return Occupied(self.lease_at(held))
        self.remove(slot, lease)
        return Acquired(self.insert(~self.probe(lease.key, now), lease.key, owner, now, now + ms))

    def first_live(self, keys: tuple[LockKey, ...], now: int) -> int:
        """Slot of a live entry of one of ``keys``, else -1.

        A probe per key, or, for more keys than an eighth of the slots, one pass over
        every slot (a probe costs several slot reads; the pass reads each slot once).
        """
        if len(keys) * 8 <= self.mask + 1:
            for key in keys:
                slot = self.probe(key, now)
                if slot >= 0:
                    return slot
            return -1
        digests = {key.ident: key.digest for key in keys}
        buf, stride = self.buf, self.stride
        for slot in range(self.mask + 1):
            fields = self.read_live(slot, now)
            if fields is not None:
                start = HEADER_SIZE + slot * stride + SLOT_HEADER_SIZE
                if digests.get(buf[start : start + fields[1] + fields[2]]) == fields[4]:
                    return slot
        return -1

    # -- slot primitives, in the order of their C twins --------------------------------

    def read_live(self, slot: int, now: int) -> tuple[int, ...] | None:
        """The slot's fields when it holds a valid, unexpired entry; else None."""
        fields = _unpack_slot(self.buf, HEADER_SIZE + slot * self.stride)
        state, ns, lb, ow, _, _, _, acquired, expires = fields
        if (
            state != OCCUPIED
            or not (ns and lb and ow)
            or ns + lb + ow > self.payload_max
            or not acquired < expires
            or expires <= now
        ):
            return None
        return fields

    def holds_key(self, offset: int, fields: tuple[int, ...], key: LockKey) -> bool:
        """Whether the slot at ``offset`` (with its ``fields``) stores exactly ``key``."""
        start = offset + SLOT_HEADER_SIZE
        return (
            fields[4] == key.digest
            and fields[1] == len(key.namespace)
            and fields[2] == len(key.label)
            and self.buf[start : start + len(key.ident)] == key.ident
        )

    def tombstone(self, slot: int, digest: int) -> None:
        """Mark ``slot`` TOMBSTONE; when the next slot is EMPTY, turn the run EMPTY.

        A tombstone followed by EMPTY ends every probe sequence through it
        anyway, so clearing it (and tombstones before it) keeps chains short.
        The run is cleared back no further than the first slot of the stripe
        of ``digest``'s home: the slots a C step on that key holds (``_layout``).
        """
        buf, mask, stride = self.buf, self.mask, self.stride
        buf[HEADER_SIZE + slot * stride] = TOMBSTONE
        following = HEADER_SIZE + ((slot + 1) & mask) * stride
        if buf[following : following + 8] != _EMPTY_HEAD:
            return
        for _ in range(((slot - (digest & self.stripe_floor)) & mask) + 1):
            offset = HEADER_SIZE + slot * stride
            if buf[offset] != TOMBSTONE:
                return
            buf[offset : offset + 8] = _EMPTY_HEAD  # any torn write reads as a tombstone
            slot = (slot - 1) & mask

    def bound(self) -> int:
        """The stored ``max_probe``, read as at most ``capacity - 1`` (never trusted further)."""
        stored: int = _unpack_max_probe(self.buf, MAX_PROBE_OFFSET)[0]
        return min(stored, self.mask)

    def free_after(self, slot: int, count: int, now: int, digest: int) -> int:
        """The first reusable slot of the ``count`` from ``slot`` on, else ``capacity``.

        Past the probe bound no entry of the key can lie, so every slot that
        holds no live entry is reusable (an expired one is tombstoned first).
        """
        buf, mask, stride = self.buf, self.mask, self.stride
        for _ in range(count):
            if buf[HEADER_SIZE + slot * stride] != OCCUPIED:
                return slot
            if self.read_live(slot, now) is None:
                self.tombstone(slot, digest)
                return slot
            slot = (slot + 1) & mask
        return mask + 1

    def probe(self, key: LockKey, now: int) -> int:
        """Slot of ``key``'s live entry, else ``~insertion_slot`` (``~capacity``: none).

        Linear probing from the key digest; stops at EMPTY or after the probe
        bound (``max_probe + 1`` slots: no entry lies further from its home).
        Expired or invalid OCCUPIED slots met on the way are tombstoned (lazy
        reclaim); any other slot (TOMBSTONE, or damaged bytes) is reusable and
        the chain goes on. With no reusable slot within the bound, the insertion
        slot is the first one past it (:meth:`free_after`).
        """
        buf, mask, stride = self.buf, self.mask, self.stride
        slot = key.digest & mask
        insert_at = mask + 1
        bound = self.bound()
        for _ in range(bound + 1):
            offset = HEADER_SIZE + slot * stride
            state = buf[offset]
            if state == EMPTY and buf[offset : offset + 8] == _EMPTY_HEAD:
                return ~(insert_at if insert_at <= mask else slot)
            if state == OCCUPIED:
                fields = self.read_live(slot, now)
                if fields is not None:
                    if self.holds_key(offset, fields, key):
                        return slot
                    slot = (slot + 1) & mask
                    continue
                self.tombstone(slot, key.digest)
            if insert_at > mask:
                insert_at = slot
            slot = (slot + 1) & mask
        if insert_at <= mask:
            return ~insert_at
        return ~self.free_after(slot, mask - bound, now, key.digest)

    def publish(self, kind: int, revision: int, lease: LockLease, times: tuple[int, int]) -> None:
        """One transition frame of ``lease`` (``times``: acquired and expiry ms) in our lane."""
        key, raw_owner = lease.key, lease.owner.value
        ns_len = len(key.namespace)
        self.ring.publish(
            self.node,
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

    def next_ids(self, new_token: bool) -> tuple[int, int]:
        """Advance and return (last_token, last_revision) in the header."""
        if self.node < 0:
            raise FleetError(
                f"fleet {self.fleet_name!r}: an observer cannot change the lock table",
                fleet=self.fleet_name,
            )
        token, revision = _unpack_counters(self.buf, COUNTERS_OFFSET)
        token += new_token
        revision += 1
        if token > TOKEN_MASK or revision > _REVISION_MAX:
            raise self._exhausted(token, revision)
        store(self.buf, COUNTERS_OFFSET, COUNTERS, token, revision)
        return token, revision

    def count_conflict(self) -> None:
        """Count one try_acquire that found a live holder (an observer counts nothing)."""
        if self.node >= 0:
            (conflicts,) = _unpack_conflicts(self.buf, CONFLICTS_OFFSET)
            store(self.buf, CONFLICTS_OFFSET, CONFLICTS, (conflicts + 1) & _U64_MAX)

    def raise_bound(self, slot: int, key: LockKey) -> None:
        """Store ``slot``'s displacement from ``key``'s home as ``max_probe`` if it is larger.

        Done before the entry is written: a process killed after it leaves a
        bound that is merely larger than needed.
        """
        displacement = (slot - key.digest) & self.mask
        if displacement > self.bound():
            store(self.buf, MAX_PROBE_OFFSET, MAX_PROBE, displacement)
            if crash_hook is not None:
                crash_hook("bound_raised")

    def insert(
        self, slot: int, key: LockKey, owner: LockOwner, now: int, expires: int
    ) -> LockLease:
        """Write a new entry of ``key`` in ``slot``: ids, transition, bound, then the slot."""
        if slot > self.mask:
            raise self._full(key)
        token, revision = self.next_ids(True)
        lock_id = self.id_base | token
        lease = LockLease(key, owner, lock_id, revision, now / 1000.0, expires / 1000.0, slot)
        self.publish(_events.ACQUIRED, revision, lease, (now, expires))
        self.raise_bound(slot, key)
        buf, offset = self.buf, HEADER_SIZE + slot * self.stride
        buf[offset] = TOMBSTONE
        if crash_hook is not None:
            crash_hook("tombstoned")
        ident, ns_len = key.ident, len(key.namespace)
        store(
            buf,
            offset,
            SLOT,
            TOMBSTONE,
            ns_len,
            len(ident) - ns_len,
            len(owner.value),
            key.digest,
            lock_id,
            revision,
            now,
            expires,
        )
        start = offset + SLOT_HEADER_SIZE
        body = ident + owner.value
        buf[start : start + len(body)] = body
        buf[offset] = OCCUPIED
        return lease

    def lease_at(self, slot: int) -> LockLease:
        """The lease stored in ``slot``."""
        offset = HEADER_SIZE + slot * self.stride
        _, ns, lb, ow, _, lock_id, revision, acquired, expires = _unpack_slot(self.buf, offset)
        body = self.buf[offset + SLOT_HEADER_SIZE : offset + SLOT_HEADER_SIZE + ns + lb + ow]
        return LockLease(
            LockKey(body[:ns], body[ns : ns + lb]),
            LockOwner(body[ns + lb :]),
            lock_id,
            revision,
            acquired / 1000.0,
            expires / 1000.0,
            slot,
        )

    def owner_is(
        self, slot: int, key: LockKey, owner: LockOwner, lock_id: int | None = None
    ) -> bool:
        """Whether the entry of ``key`` in ``slot`` stores ``owner`` (and ``lock_id``, if given)."""
        offset = HEADER_SIZE + slot * self.stride
        fields = _unpack_slot(self.buf, offset)
        start = offset + SLOT_HEADER_SIZE + len(key.ident)
        return (
            (lock_id is None or fields[5] == lock_id)
            and fields[3] == len(owner.value)
            and self.buf[start : start + fields[3]] == owner.value
        )

    def find_tenure(self, lease: LockLease, now: int) -> int:
        """Slot holding exactly ``lease``'s tenure (key, lock id and owner), or -1.

        Found by probing for the key, never by the lease's slot alone: only an
        entry a lookup can reach is the key's holder, so a renew or release
        can never act on an entry that damaged bytes cut off from its chain.
        (A live entry of the key in its home slot is what the probe would find
        first, so that case skips the probe.) Lease contract: release and renewal
        compare the key and the stored owner.
        """
        key, slot = lease.key, lease.slot
        fields = None
        if slot == key.digest & self.mask:
            fields = self.read_live(slot, now)
        if fields is None or not self.holds_key(HEADER_SIZE + slot * self.stride, fields, key):
            slot = self.probe(key, now)
        return slot if slot >= 0 and self.owner_is(slot, key, lease.owner, lease.lock_id) else -1

    def rewrite(self, slot: int, now: int, expires: int) -> LockLease:
        """Renew the live entry in ``slot``: new revision and a full new window.

        In place, the entry OCCUPIED throughout: the revision, then the expiry, each
        an 8-byte copy to an 8-aligned offset (glibc's ``memcpy`` of 8 bytes stores
        whole words), so a process killed anywhere leaves the entry live with its
        old expiry or its new one, never a key absent before the expiry it held.
        """
        lease = self.lease_at(slot)
        _, revision = self.next_ids(False)
        acquired: int = _unpack_slot(self.buf, HEADER_SIZE + slot * self.stride)[7]
        self.publish(_events.RENEWED, revision, lease, (acquired, expires))
        if crash_hook is not None:
            crash_hook("published")
        buf, offset = self.buf, HEADER_SIZE + slot * self.stride
        store(buf, offset + _REVISION_OFFSET, _U64, revision)
        if crash_hook is not None:
            crash_hook("revision_stored")
        store(buf, offset + _EXPIRES_OFFSET, _U64, expires)
        return lease._replace(state_revision=revision, expires_at=expires / 1000.0)

    def remove(self, slot: int, lease: LockLease | None = None) -> tuple[int, int]:
        """Release the live entry in ``slot`` (whose tenure is ``lease`` when known).

        Returns how many nodes wait for the key (``Ring.key_released``: when some do,
        the key word went up by one and its longest waiter was woken), and the key
        word as the release left it.
        """
        if lease is None:
            lease = self.lease_at(slot)
        _, revision = self.next_ids(False)
        self.publish(_events.RELEASED, revision, lease, (0, 0))
        digest = lease.key.digest
        self.tombstone(slot, digest)
        waiting = self.ring.key_released(digest)
        word: int = _U32.unpack_from(self.ring.buf, self.ring.geometry.key_word(digest))[0]
        return waiting, word
