"""SHM engine (``shm://FLEET``): the store contract over a fleet's :class:`LockTable`.

Each lock name is the label of a :class:`LockKey` in the namespace
:data:`NAMESPACE`; the owner string is the :class:`LockOwner`, UTF-8 encoded.
Every primitive is one table step (one critical section of the lock table), so
the table's rules carry over unchanged: only the key decides contention, renew
and release match the exact tenure (lock id), renew sets a new full window,
fencing tokens strictly increase across the table.

Times are ``time.monotonic()`` seconds (the host monotonic clock), in whole
milliseconds. The blocking helper waits in the name's queue
(``lock/_key_wait.py``): a release wakes the thread that has waited longest,
in any process, by itself; a caller that finds threads waiting for the name, or
that has just handed it to a waiter, waits behind them before it asks, so the
name goes round in turn (a waiter woken by a release is not overtaken).
An expiry publishes nothing, so a waiter also looks again at the holder's
deadline. The asyncio form waits on the table's readiness descriptor instead
(``_shm_async``), which any transition of any process makes readable.

Each store joins the fleet as one node (``Fleet.join``), so at most ``capacity``
processes can have an ``shm://`` store of one fleet open at a time. A fleet's
capacity is fixed while any member lives (the transition ring has one writer
lane per node): ``_fleet.capacity_advice`` says how to change it.

The store's table is its own pair of SHM kinds (:data:`STORE_LAYOUT`), sized to
what the contract needs: names and owners of at most 255 bytes, and a short ring
(the waiters only need its readiness word). With the default fleet capacity of
64 it takes about 0.8 MB of ``/dev/shm`` (:func:`footprint`), where a default
``LockTable`` would take 72 MB; it never collides with a ``LockTable`` an
application opens on the same fleet.

A semaphore of limit N is N keys of the namespace :data:`SEMAPHORE_NAMESPACE`,
one per slot (label ``name NUL slot``), and one marker key (label ``name``)
whose owner is the limit, as text. Each held slot and the marker take a name of
the table, so a limit is at most :data:`SHM_LIMIT_MAX` (127): a full semaphore
takes half the 256 names and answers busy, and leaves the other half to the
store's other locks (a larger limit would fill the table, and its next
acquisition, and every other lock's, would find the table full). The table's
steps each act on one key, so the count needs no more: at most N keys, at most
N holders. A slot key does not say under which limit it was taken; the marker
says it for all of them, and is what makes two limits meet:

* An acquisition takes (or finds) the marker first, then the lowest free slot,
  then checks the marker again: it is granted if the marker still says its
  limit (renewed when it ends before the new lease), else it gives the slot back
  and raises ``SemaphoreLimitMismatch``.
* A marker of another limit is replaced in one table step
  (``LockTable._replace``, the slow path): that step ends the marker's exact
  tenure and takes the marker for the new limit only if no slot below the old
  limit is held; else it changes nothing and the acquisition is refused. The
  check and the change being one step, a grant of the old limit is on one side
  of it: its slot taken before, the replacement sees the slot and is refused;
  taken after, the grant's own check sees the new marker and the slot is given
  back. So no holder of the old limit outlives a replacement, and no grant of
  the new limit can be mistaken for one (none exists before the replacement).
  A replacement that finds the marker changed meanwhile looks again.
* Nothing gives a marker back. An acquisition that backs off leaves the marker
  as it is: other grants may already rely on it, and a name without a marker
  says nothing about its held slots, so a plain acquisition of the absent
  marker would check none of them. A marker ends only by a replacement, or by
  lapsing (or with its replacer killed inside that step, when no slot of the
  old limit is held: the name is free).
* An acquisition that finds every slot held reads the marker once more: a marker
  of another limit (a replacement that raced with its first look) is refused, so
  a full semaphore of another limit never answers as a full one of this limit.
  In such a race a slot may be held for a moment by a client of the old limit
  that took it before its check: an acquisition that finds the slots full
  meanwhile answers busy (refusing is safe, mixing is not).
* The marker lives :data:`_MARKER_SPAN` times the ttl of the grant or renewal
  that last extended it, so it outlasts every lease whose holders use one ttl.
  Holders of one semaphore that use very different ttls can, in a race between
  two renewals, leave the marker ending before the longest lease; a user of
  another limit arriving after the marker lapsed is then not refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, TypeVar

from .._core._clock import TTL_MAX_S
from .._core._errors import (
    CapacityMismatch,
    ErrorKind,
    FleetError,
    InvalidCapacity,
    InvalidName,
    InvalidStoreUrl,
    OrbitError,
    StoreError,
)
from .._core._fleet import CAPACITY_DEFAULT, Fleet
from .._core._section import object_bytes
from ..lock import Acquired, LockKey, LockLayout, LockLease, LockOwner, LockTable
from ..lock._key_wait import KeyWaiter
from ..lock._layout import EVENT_HEADER_SIZE, STORE_EVENT_KIND, STORE_STATE_KIND
from ..lock._types import TOKEN_MASK
from ._engine import Busy, Engine, LockInfo, SlotInfo, Waiter, limit_mismatch, poll_pause_s
from ._guards import LIMIT_MAX
from ._shm_readiness import SharedReadiness

#: The lock-table namespace of every store lock.
NAMESPACE: Final = "orbitive.store"
_NAMESPACE_BYTES: Final = NAMESPACE.encode()
#: Fleet capacity of an ``shm://`` store that creates its fleet.
SHM_CAPACITY_DEFAULT: Final = CAPACITY_DEFAULT
#: Longest name and owner, in UTF-8 bytes (the store's own rules).
_TEXT_MAX: Final = 255
_PAYLOAD_MAX: Final = len(_NAMESPACE_BYTES) + 2 * _TEXT_MAX
#: The store's table: kinds 230 (state) and 231 (ring), 256 names resident at once,
#: payloads of a full-length name and owner, 16 transition frames per node.
STORE_LAYOUT: Final = LockLayout(
    state_kind=STORE_STATE_KIND,
    event_kind=STORE_EVENT_KIND,
    capacity=256,
    payload_max=_PAYLOAD_MAX,
    ring_capacity=16,
    frame_bytes=EVENT_HEADER_SIZE + _PAYLOAD_MAX,
)
#: Largest semaphore limit: a full semaphore holds a name per slot and its marker, half
#: the table, and leaves the other half to the store's other locks and semaphores.
SHM_LIMIT_MAX: Final = STORE_LAYOUT.capacity // 2 - 1
#: The lock-table namespace of semaphore keys; short, so that the namespace, a slot
#: key's label (name, NUL, up to four digits) and its owner fit the table's payload.
SEMAPHORE_NAMESPACE: Final = "semaphore"
_SEMAPHORE_BYTES: Final = SEMAPHORE_NAMESPACE.encode()
#: A semaphore's marker lasts this many times the ttl of the lease that extended it.
_MARKER_SPAN: Final = 2.0
#: The longest ttl whose marker span is still a valid ttl.
_SPAN_TTL_MAX: Final = TTL_MAX_S / _MARKER_SPAN
#: Names (and owners) whose table key is kept ready; the cache is emptied when full.
_CACHE_MAX: Final = 4096
#: ``ShmUnit(...)`` without the named tuple's Python ``__new__``.
_unit = tuple.__new__
_K = TypeVar("_K")
_V = TypeVar("_V")


class _Semaphore(NamedTuple):
    """The table keys of a semaphore under one limit, built once per name and limit."""

    name: str
    marker: LockKey
    limit_owner: LockOwner  # the marker's owner: the limit, as text
    limit_value: bytes  # its bytes
    slots: tuple[LockKey, ...]

    @classmethod
    def of(cls, name_and_limit: tuple[str, int]) -> _Semaphore:
        name, limit = name_and_limit
        slots = tuple(LockKey(SEMAPHORE_NAMESPACE, f"{name}\x00{slot}") for slot in range(limit))
        owner = LockOwner(str(limit))
        return cls(name, LockKey(SEMAPHORE_NAMESPACE, name), owner, owner.value, slots)


class ShmUnit(NamedTuple):
    """An SHM tenure of a semaphore slot: the slot, the token and expiry of its lease (as
    fields: a handle reads them), the lease, and the marker as last seen."""

    slot: int
    fencing_token: int
    expires_at: float
    lease: LockLease
    marker: LockLease


class ShmEngine(Engine[LockLease, ShmUnit]):
    """Named locks and semaphores in the SHM lock table of one fleet."""

    kind = "shm"
    # The readiness wakes the semaphore waiters (_shm_readiness); the cap bounds the wake-up
    # an asyncio reader of this process can drain from a blocking waiter's poll.
    poll_cap_s = 0.25
    monotonic_clock = True
    limit_max = SHM_LIMIT_MAX
    limit_rule = (
        f" on an shm:// store (its table holds {STORE_LAYOUT.capacity} names; a semaphore"
        f" takes one per held slot and one more, at most half of them)"
    )

    def __init__(self, fleet: str, capacity: int | None) -> None:
        """Join ``fleet`` with ``capacity`` nodes (None: the fleet's own, else 64).

        Raises:
            InvalidStoreUrl: a bad fleet name.
            CapacityMismatch: the fleet exists with another capacity (the message
                quotes the URL and says how to clear the fleet).
            StoreError: ``UNAVAILABLE`` when every node of the fleet is held.
        """
        shown = f"shm://{fleet}" + ("" if capacity is None else f"?capacity={capacity}")
        try:
            self._fleet = Fleet.join(fleet, capacity)
        except CapacityMismatch as error:  # a valid URL: the fleet in /dev/shm disagrees
            raise CapacityMismatch(f"store URL {shown!r}: {error.message}", fleet=fleet) from None
        except InvalidName as error:
            raise InvalidStoreUrl(f"store URL {shown!r}: {error.message}") from error
        except InvalidCapacity as error:
            raise InvalidStoreUrl(f"store URL {shown!r}: {error.message}") from error
        except FleetError as error:
            message = f"store URL {shown!r}: {error.message}"
            raise StoreError(message, kind=ErrorKind.UNAVAILABLE) from error
        try:
            self._table = LockTable(self._fleet, STORE_LAYOUT)
        except BaseException:
            self._fleet.close()
            raise
        # Building a key hashes the name: each name's key (and owner) is built once.
        self._keys = _Cache(_key)
        self._owners = _Cache(LockOwner)
        self._semaphores = _Cache(_Semaphore.of)  # by (name, limit)
        self._queued: _Cache[str, Callable[[], bool]] = _Cache(
            lambda name: self._table._queue_probe(self._keys[name])
        )
        self._closed = False
        # .name, .word: what this thread last handed to a waiter, and the key word its
        # release left; .after: that word, from queues_first to the waiter made right
        # after it (which takes it).
        self._handed = threading.local()
        self._readiness = SharedReadiness(self.fileno, self._drain_table)

    def _failure(self, error: Exception) -> Exception:
        """What a failed table call raises: ``StoreError(CLOSED)`` once this engine
        is closed (its mapping is gone: FleetError, or the mmap's ValueError), a
        table refusal as ``StoreError(DATABASE)``, anything else as it is."""
        if self._closed:
            return StoreError(f"shm store {self._fleet.name!r} is closed", kind=ErrorKind.CLOSED)
        return _store_error(error) if isinstance(error, OrbitError) else error

    def acquire(self, name: str, owner: str, ttl: float) -> LockLease | Busy:
        try:
            result = self._table.try_acquire(self._keys[name], self._owners[owner], ttl)
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        if type(result) is Acquired:
            return result.lease  # the lease is the grant: it carries the lock id
        return Busy(_info(result.lease))

    def renew(self, name: str, owner: str, grant: LockLease, ttl: float) -> LockLease | None:
        try:
            return self._table.renew(grant, ttl)
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def release(self, name: str, owner: str, grant: LockLease) -> bool:
        try:
            waiting, word = self._table._release_handing(grant)
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        if waiting > 0:  # handed to a waiter: this thread's next wait for it queues first
            self._handed.name, self._handed.word = name, word
        return waiting >= 0

    def inspect(self, name: str) -> LockInfo | None:
        try:
            lease = self._table.current(self._keys[name])
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        return None if lease is None else _info(lease)

    def locks(self) -> list[LockInfo]:
        try:
            leases = self._table.leases()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        infos = [_info(lease) for lease in leases if lease.key.namespace == _NAMESPACE_BYTES]
        return sorted(infos, key=lambda info: info.name)

    def force_release(self, name: str) -> bool:
        try:
            return self._table.force_release(self._keys[name])
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> ShmUnit | Busy:
        # The hot path of a counting lease, inlined: the marker, the lowest free slot,
        # the marker again (see the module docstring).
        try:
            keys = self._semaphores[name, limit]
            _, marker_key, limit_owner, limit_value, slots = keys
            try_acquire, who = self._table.try_acquire, self._owners[owner]
            span = _MARKER_SPAN * ttl if ttl <= _SPAN_TTL_MAX else TTL_MAX_S
            result = try_acquire(marker_key, limit_owner, span)
            marker = result.lease
            if type(result) is not Acquired and marker.owner.value != limit_value:
                marker = self._take_over(keys, marker, span)
            first: LockLease | None = None  # the holder that ends first
            for slot, key in enumerate(slots):
                result = try_acquire(key, who, ttl)
                lease = result.lease
                if type(result) is Acquired:  # check the marker again (see the docstring)
                    check = try_acquire(marker_key, limit_owner, span)
                    now = check.lease
                    if type(check) is Acquired or (
                        now.owner.value == limit_value and now.expires_at >= lease.expires_at
                    ):
                        token = lease.lock_id & TOKEN_MASK  # its fencing_token, no property call
                        return _unit(ShmUnit, (slot, token, lease.expires_at, lease, now))
                    return self._covered(keys, slot, lease, now, span)
                if first is None or lease.expires_at < first.expires_at:
                    first = lease
            found = self._table.current(marker_key)  # every slot held: by whose limit?
            if found is not None and found.owner.value != limit_value:
                raise limit_mismatch(name, limit, _limit_of(found))
        except StoreError:  # the semaphore's own verdict, as it is
            raise
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        return Busy(None if first is None else _slot_info(name, limit, first))

    def renew_units(
        self, name: str, owner: str, grants: Sequence[ShmUnit], ttl: float
    ) -> list[ShmUnit | None]:
        renew = self._table.renew
        try:
            leases = [renew(grant.lease, ttl) for grant in grants]
            live = [lease for lease in leases if lease is not None]
            if not live:
                return [None] * len(grants)
            last = max(live, key=lambda lease: lease.expires_at)
            marker = max((grant.marker for grant in grants), key=lambda lease: lease.expires_at)
            now = self._cover(marker.key, marker, last, _span(ttl))
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        if now.owner.value != marker.owner.value:  # it lapsed, and another limit took it
            now = marker
        return [
            None
            if lease is None
            else grant._replace(expires_at=lease.expires_at, lease=lease, marker=now)
            for grant, lease in zip(grants, leases, strict=True)
        ]

    def release_units(self, name: str, owner: str, grants: Sequence[ShmUnit]) -> list[bool]:
        release, released = self._table.release, []
        try:  # a loop, not a comprehension: no function object and frame (3.10, 3.11)
            for grant in grants:
                released.append(release(grant.lease))
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        return released

    def holders(self, name: str) -> list[SlotInfo]:
        return [info for info in self.semaphores() if info.name == name]

    def semaphores(self) -> list[SlotInfo]:
        try:
            leases = self._table.leases()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        mine = [lease for lease in leases if lease.key.namespace == _SEMAPHORE_BYTES]
        limits = {
            lease.key.label: _limit_of(lease) for lease in mine if b"\x00" not in lease.key.label
        }
        infos = []
        for lease in mine:
            label, nul, slot = lease.key.label.partition(b"\x00")
            if nul and slot.isdigit():
                name = label.decode(errors="replace")
                infos.append(_slot_info(name, limits.get(label, 0), lease))
        return sorted(infos, key=lambda info: (info.name.encode(), info.slot))

    def _covered(
        self, keys: _Semaphore, slot: int, lease: LockLease, marker: LockLease, span: float
    ) -> ShmUnit:
        """The grant of ``lease`` when the marker found after it (``marker``) ends before it
        or says another limit: the marker extended, or the lease given back.

        Raises:
            SemaphoreLimitMismatch: the marker was taken over for another limit
                meanwhile; ``lease`` is given back.
        """
        now = self._cover(keys.marker, marker, lease, span)
        if now.owner.value != keys.limit_value:
            self._table.release(lease)
            raise limit_mismatch(keys.name, len(keys.slots), _limit_of(now))
        return ShmUnit(slot, lease.fencing_token, lease.expires_at, lease, now)

    def _take_over(self, keys: _Semaphore, marker: LockLease, span: float) -> LockLease:
        """The marker for this limit in place of ``marker``, of another limit (slow path):
        replaced in one table step that finds no slot of that limit held, or found
        already replaced for this limit.

        Raises:
            SemaphoreLimitMismatch: a slot of the marker's limit is held, or the marker
                is now held under a third limit whose slots are held.
        """
        table, name, limit = self._table, keys.name, len(keys.slots)
        while True:
            found = _limit_of(marker)
            others = self._semaphores[name, found].slots
            result = table._replace(marker, keys.limit_owner, span, others)
            if type(result) is Acquired:
                return result.lease
            if result is not None:  # a holder of the marker's limit
                raise limit_mismatch(name, limit, found)
            result = table.try_acquire(keys.marker, keys.limit_owner, span)  # it changed
            marker = result.lease
            if type(result) is Acquired or marker.owner.value == keys.limit_value:
                return marker

    def _cover(self, key: LockKey, marker: LockLease, lease: LockLease, span: float) -> LockLease:
        """The semaphore's marker now: ``marker`` renewed when it ended before ``lease``,
        else as found at ``key`` (taken again under ``marker``'s limit if it had lapsed)."""
        table = self._table
        if marker.expires_at < lease.expires_at:
            renewed = table.renew(marker, span)
            if renewed is not None:
                return renewed
        result = table.try_acquire(key, marker.owner, span)
        now = result.lease
        if type(result) is Acquired or now.owner.value != marker.owner.value:
            return now
        if now.expires_at < lease.expires_at:
            return table.renew(now, span) or now
        return now

    def unit_waiter(self, name: str) -> Waiter:
        """A semaphore waiter's: woken by the table's readiness (any transition)."""
        del name
        return ReadinessWaiter(self._readiness)

    def drain(self) -> None:
        """Clear the table's readiness for this process (before an attempt), waking
        this process's semaphore waiters if it held a signal."""
        self._readiness.drain()

    def _drain_table(self) -> int:
        try:
            return self._table.drain()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def queues_first(self, name: str) -> bool:
        """Whether a thread waits for ``name`` (alone: ``_key_wait.queue_probe``), or this
        thread's last release of it woke a waiter (its :meth:`waiter` then waits for
        that waiter's release)."""
        handed = getattr(self._handed, "name", None)
        if handed is not None:
            self._handed.name = None
            if handed == name:
                self._handed.after = self._handed.word
                return True
        try:
            return self._queued[name]()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def waiter(self, name: str) -> Waiter:
        """A place in ``name``'s wait queue: woken by the release itself (``_key_wait``)."""
        handed: int | None = getattr(self._handed, "after", None)
        self._handed.after = None
        return ShmWaiter(self._key_waiter(name), handed)

    def _key_waiter(self, name: str) -> KeyWaiter:
        try:
            return self._table._key_waiter(self._keys[name])
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def fileno(self) -> int:
        """The lock table's readiness descriptor: readable after any transition."""
        try:
            return self._table.fileno()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def close(self) -> None:
        self._closed = True
        self._table.close()
        self._fleet.close()

    def __repr__(self) -> str:
        return f"<ShmEngine fleet={self._fleet.name!r}>"


class ShmWaiter(Waiter):
    """The blocking helper's wait for one name: its place in the name's queue."""

    watches = True

    def __init__(self, waiter: KeyWaiter, handed: int | None) -> None:
        super().__init__(ShmEngine.poll_cap_s)
        self._waiter = waiter
        self._handed = handed  # the key word this thread's release left (_key_wait.queue)

    def enter(self) -> None:
        self._waiter.enter()

    def queue(self, left: float | None) -> None:
        self._waiter.queue(left, self._handed)

    def look(self) -> None:
        self._waiter.look()

    def wait(self, busy: Busy, left: float | None, tries: int) -> None:
        """Until a release of the name, the holder's expiry or ``left`` seconds."""
        del tries  # no doubling: each wait lasts until the release, in queue order
        holder = busy.holder
        bound = None if holder is None else holder.remaining_s + 0.001
        if left is not None:
            bound = left if bound is None else min(bound, left)
        self._waiter.wait(None if holder is None else holder.fencing_token, bound)

    def leave(self, granted: bool) -> None:
        self._waiter.leave(granted)


class ReadinessWaiter(Waiter):
    """A semaphore waiter's wait: until the table's readiness says something changed
    (its slots are many keys, so no one key's queue serves), the pause's end, or the
    holder's expiry."""

    watches = True

    def __init__(self, readiness: SharedReadiness) -> None:
        super().__init__(ShmEngine.poll_cap_s)
        self._readiness = readiness
        self._seen = 0  # the signal count at this waiter's last look

    def look(self) -> None:
        self._seen = self._readiness.look()

    def wait(self, busy: Busy, left: float | None, tries: int) -> None:
        pause = poll_pause_s(busy, left, tries, ShmEngine.poll_cap_s)
        self._readiness.wait(self._seen, pause)


def footprint(capacity: int) -> int:
    """Bytes of ``/dev/shm`` the store's table takes in a fleet of ``capacity`` nodes."""
    ring = STORE_LAYOUT.ring_geometry(capacity).size
    return object_bytes(STORE_LAYOUT.state_size) + object_bytes(ring)


class _Cache(dict[_K, _V]):
    """A value per key, built on first use by ``build``; emptied when full.

    A hit is a plain dict lookup, with no Python call.
    """

    def __init__(self, build: Callable[[_K], _V]) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, key: _K) -> _V:
        if len(self) >= _CACHE_MAX:
            self.clear()
        value = self[key] = self._build(key)
        return value


def _key(name: str) -> LockKey:
    """The table key of the store lock ``name``."""
    return LockKey(NAMESPACE, name)


def _span(ttl: float) -> float:
    """The marker's window for a lease of ``ttl`` seconds (inlined in ``acquire_unit``)."""
    return _MARKER_SPAN * ttl if ttl <= _SPAN_TTL_MAX else TTL_MAX_S


def _limit_of(marker: LockLease) -> int:
    """The limit a marker records (0 for an owner that is not one)."""
    text = marker.owner.value
    return int(text) if text.isdigit() and int(text) <= LIMIT_MAX else 0


def _slot_info(name: str, limit: int, lease: LockLease) -> SlotInfo:
    """The snapshot of a slot lease (its slot read from its key's label)."""
    return SlotInfo(
        name,
        int(lease.key.label.rpartition(b"\x00")[2]),
        limit,
        lease.owner.value.decode(errors="replace"),
        lease.fencing_token,
        lease.expires_at,
        lease.remaining(),
    )


def _store_error(error: OrbitError) -> StoreError:
    """A lock-table refusal (full table, exhausted ids, its own ttl guard) as a StoreError."""
    return StoreError(f"shm store: {error.message}", kind=ErrorKind.DATABASE, key=error.key)


def _info(lease: LockLease) -> LockInfo:
    return LockInfo(
        lease.key.label.decode(errors="replace"),
        lease.owner.value.decode(errors="replace"),
        lease.fencing_token,
        lease.expires_at,
        lease.remaining(),
    )
