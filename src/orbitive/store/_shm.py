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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final, TypeVar

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
from ._engine import Busy, Engine, LockInfo, Waiter

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
#: Names (and owners) whose table key is kept ready; the cache is emptied when full.
_CACHE_MAX: Final = 4096
_V = TypeVar("_V")


class ShmEngine(Engine[LockLease]):
    """Named locks in the SHM lock table of one fleet."""

    kind = "shm"
    # The asyncio form's readiness wakes its waiters; the cap bounds a wake-up another
    # thread of this process drained first (drain clears readiness for the whole process).
    poll_cap_s = 0.25
    monotonic_clock = True

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
        self._queued = _Cache(lambda name: self._table._queue_probe(self._keys[name]))
        self._closed = False
        self._handed = threading.local()  # .name: what this thread last handed to a waiter

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
            waiting = self._table.release_waking(grant)
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error
        if waiting > 0:  # handed to a waiter: this thread's next wait for it queues first
            self._handed.name = name
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

    def arm(self) -> None:
        try:
            self._table.drain()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def queues_first(self, name: str) -> bool:
        """Whether a thread waits for ``name`` (alone: ``_key_wait.queue_probe``), or this
        thread's last release of it woke a waiter that still waits."""
        handed = getattr(self._handed, "name", None)
        if handed is not None:
            self._handed.name = None
            if handed == name and self._key_waiter(name).others_wait():
                return True
        try:
            return self._queued[name]()
        except (OrbitError, ValueError) as error:
            raise self._failure(error) from error

    def waiter(self, name: str) -> Waiter:
        """A place in ``name``'s wait queue: woken by the release itself (``_key_wait``)."""
        return ShmWaiter(self._key_waiter(name))

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

    def __init__(self, waiter: KeyWaiter) -> None:
        super().__init__(ShmEngine.poll_cap_s)
        self._waiter = waiter

    def enter(self) -> None:
        self._waiter.enter()

    def queue(self, left: float | None) -> None:
        self._waiter.queue(left)

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


def footprint(capacity: int) -> int:
    """Bytes of ``/dev/shm`` the store's table takes in a fleet of ``capacity`` nodes."""
    ring = STORE_LAYOUT.ring_geometry(capacity).size
    return object_bytes(STORE_LAYOUT.state_size) + object_bytes(ring)


class _Cache(dict[str, _V]):
    """A value per string, built on first use by ``build``; emptied when full.

    A hit is a plain dict lookup, with no Python call.
    """

    def __init__(self, build: Callable[[str], _V]) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, text: str) -> _V:
        if len(self) >= _CACHE_MAX:
            self.clear()
        value = self[text] = self._build(text)
        return value


def _key(name: str) -> LockKey:
    """The table key of the store lock ``name``."""
    return LockKey(NAMESPACE, name)


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
