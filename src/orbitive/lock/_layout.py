"""Byte layout of the lock state table, and the :class:`LockLayout` every peer shares.

State object ``orbit-{fleet}-{state_kind}-{uid}`` (little-endian; version
:data:`STATE_VERSION`)::

    header, 128 bytes: two cache lines, read-mostly fields in the first and the
    counters every acquisition writes in the second (see "Stripes" below)
      off size field          meaning
        0    4 magic          0x4F4C5354 "OLST"
        4    2 version        STATE_VERSION
        6    2 header_size    128
        8    4 capacity       slots, a power of two
       12    4 slot_size      round_up(48 + payload_max, 64)
       16    4 payload_max    namespace + label + owner bytes per slot
       20    4 max_probe      largest displacement ever written (probe bound)
       24   40 reserved       zero
       64    8 last_token     last fencing token issued (first acquisition gets 1)
       72    8 last_revision  last state_revision issued
       80    8 conflicts      try_acquire calls that found a live holder (Occupied)
       88   40 reserved       zero
    slots, capacity x slot_size; one slot:
        0    1 state          0 EMPTY (with zero lengths), 1 OCCUPIED, 2 TOMBSTONE
        1    1 reserved
        2    2 namespace_len
        4    2 label_len
        6    2 owner_len
        8    8 key_digest     CRC-32 of (u16 namespace_len, namespace, label)
       16    8 lock_id        kind << 56 | node << 40 | fencing token
       24    8 state_revision
       32    8 acquired_at_ms CLOCK_MONOTONIC milliseconds
       40    8 expires_at_ms  CLOCK_MONOTONIC milliseconds
       48    .. payload       namespace | label | owner, zero padded

Open addressing with linear probing from ``key_digest & (capacity - 1)``. Every
probe stops at EMPTY or after ``max_probe + 1`` slots: ``max_probe`` is raised to an
entry's displacement ``(slot - home) & (capacity - 1)`` before the entry is written
(it only grows until a reset), and a value above ``capacity - 1`` reads as
``capacity - 1``.
Invariant (crash safety, lease contract, "tombstone before rewrite"): a slot that
holds no live entry is set TOMBSTONE before any of its bytes change and OCCUPIED
only after all of them are written, all inside the critical section. A renewal
rewrites its live entry in place, OCCUPIED throughout: the state_revision, then
the expires_at_ms, each one aligned 8-byte store (slots start 8-aligned), so a
holder killed inside its renewal keeps the key until its old or its new expiry.

Stripes. The state's section block has :attr:`LockLayout.stripes` robust
mutexes; stripe ``i`` guards the ``stripe_slots`` slots from ``i * stripe_slots``
on. A step on one key holds the stripes of the slots its probe reads (from the
key's home to ``home + max_probe``, every stripe when that wraps); the header's
counters and ``max_probe`` change only by atomic instructions, so steps holding
disjoint stripes run at once. A run of tombstones is cleared back no further
than the first slot of the home's stripe (the step holds it). Every other step
holds every stripe.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Final, final

from .._core._errors import InvalidLayout, LayoutMismatch, shown
from .._core._region import store
from ._ring import RingGeometry

STATE_MAGIC: Final = 0x4F4C5354
STATE_VERSION: Final = 4
HEADER_SIZE: Final = 128
SLOT_HEADER_SIZE: Final = 48
EMPTY: Final = 0
OCCUPIED: Final = 1
TOMBSTONE: Final = 2

#: Transition frame header bytes (see ``_events``); a frame must hold a full entry.
EVENT_HEADER_SIZE: Final = 35

HEADER: Final = struct.Struct("<IHHIII")  # magic .. payload_max (20 bytes)
COUNTERS: Final = struct.Struct("<QQ")  # last_token, last_revision
COUNTERS_OFFSET: Final = 64
#: u64 count of ``try_acquire`` calls that found a live holder (layout version 4).
CONFLICTS_OFFSET: Final = 80
CONFLICTS: Final = struct.Struct("<Q")
#: u32 probe bound: the largest displacement of any entry written since creation or reset.
MAX_PROBE_OFFSET: Final = 20
MAX_PROBE: Final = struct.Struct("<I")
#: Most stripes of the state's section (each a robust mutex in its section block).
STRIPES_MAX: Final = 32
#: state, reserved, namespace_len, label_len, owner_len, digest, lock_id,
#: state_revision, acquired_at_ms, expires_at_ms
SLOT: Final = struct.Struct("<BxHHHQQQQQ")

#: Transition frames per node of a default table's ring: 2.2 MB of ``/dev/shm`` at 64
#: nodes (1024 frames took 71.6 MB, more than a container's default 64 MB); a watcher
#: woken by the table's readiness loses none at 1,000 transitions/s per node
#: (``bench/ring_history.py``, docs/operations.md).
RING_CAPACITY_DEFAULT: Final = 32
DEFAULT_STATE_KIND: Final = 228
DEFAULT_EVENT_KIND: Final = 229
#: The kinds of the ``shm://`` store's own table (``orbitive.store``'s ``STORE_LAYOUT``).
STORE_STATE_KIND: Final = 230
STORE_EVENT_KIND: Final = 231


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").replace("_", "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidLayout(
            f"environment variable {name} must be an integer, got {raw!r}"
        ) from None


def _power_of_two(value: int, what: str, limit: int) -> None:
    if type(value) is not int or value < 1 or value & (value - 1) or value > limit:
        raise InvalidLayout(f"{what} must be a power of two in 1..{limit}, got {shown(value)}")


@final
@dataclass(frozen=True, slots=True)
class LockLayout:
    """Kinds and geometry of one lock table; all fleet peers must agree.

    Args:
        state_kind: SHM kind of the state table, 0..255 (default 228).
        event_kind: SHM kind of the transition ring, 0..255, not ``state_kind`` (229).
        capacity: state slots, a power of two (256): the most keys resident at once.
        payload_max: bytes for namespace + label + owner per slot (960).
        ring_capacity: transition frames retained per writer lane, a power of two
            (:data:`RING_CAPACITY_DEFAULT`, 32): how far a watcher may fall behind one
            node before it loses transitions (``LockPoll.overwritten``).
        frame_bytes: bytes per transition frame (1024); must hold a full entry.

    Raises:
        InvalidLayout: any value out of range, or the two kinds equal.
    """

    state_kind: int = DEFAULT_STATE_KIND
    event_kind: int = DEFAULT_EVENT_KIND
    capacity: int = 256
    payload_max: int = 960
    ring_capacity: int = RING_CAPACITY_DEFAULT
    frame_bytes: int = 1024

    def __post_init__(self) -> None:
        for what in ("state_kind", "event_kind"):
            kind = getattr(self, what)
            if type(kind) is not int or not 0 <= kind <= 255:
                raise InvalidLayout(f"{what} must be an int in 0..255, got {shown(kind)}")
        if self.state_kind == self.event_kind:
            raise InvalidLayout("state_kind and event_kind must differ")
        _power_of_two(self.capacity, "capacity", 1 << 16)
        _power_of_two(self.ring_capacity, "ring_capacity", 1 << 20)
        if type(self.payload_max) is not int or not 3 <= self.payload_max <= 0xFFFF:
            raise InvalidLayout(
                f"payload_max must be an int in 3..65535, got {shown(self.payload_max)}"
            )
        if type(self.frame_bytes) is not int or self.frame_bytes < self.min_frame_bytes:
            raise InvalidLayout(
                f"frame_bytes must be >= {self.min_frame_bytes} "
                f"({EVENT_HEADER_SIZE} + payload_max), got {shown(self.frame_bytes)}"
            )

    @classmethod
    def default(cls) -> LockLayout:
        """The default layout, with the ``ORBIT_LOCK_*`` environment overrides applied.

        Read once per process (cached): ``ORBIT_LOCK_STATE_CAPACITY``,
        ``ORBIT_LOCK_STATE_PAYLOAD_CAPACITY``, ``ORBIT_LOCK_EVENT_RING_CAPACITY``,
        ``ORBIT_LOCK_EVENT_RING_PAYLOAD_CAPACITY``.
        """
        global _default  # noqa: PLW0603 - read the environment once per process
        if _default is None:
            _default = cls(
                capacity=_env_int("ORBIT_LOCK_STATE_CAPACITY", 256),
                payload_max=_env_int("ORBIT_LOCK_STATE_PAYLOAD_CAPACITY", 960),
                ring_capacity=_env_int("ORBIT_LOCK_EVENT_RING_CAPACITY", RING_CAPACITY_DEFAULT),
                frame_bytes=_env_int("ORBIT_LOCK_EVENT_RING_PAYLOAD_CAPACITY", 1024),
            )
        return _default

    @property
    def min_frame_bytes(self) -> int:
        """Smallest frame that carries an entry of ``payload_max`` bytes."""
        return EVENT_HEADER_SIZE + self.payload_max

    @property
    def slot_size(self) -> int:
        """Bytes per state slot: header plus payload, rounded up to 64."""
        return (SLOT_HEADER_SIZE + self.payload_max + 63) // 64 * 64

    @property
    def stripes(self) -> int:
        """Robust mutexes of the state's section: ``min(32, capacity)``."""
        return min(STRIPES_MAX, self.capacity)

    @property
    def state_size(self) -> int:
        """Bytes of the state object."""
        return HEADER_SIZE + self.capacity * self.slot_size

    def ring_geometry(self, lanes: int) -> RingGeometry:
        """The transition ring's geometry for a fleet of ``lanes`` nodes."""
        return RingGeometry(self.event_kind, lanes, self.ring_capacity, self.frame_bytes)

    def header(self) -> tuple[int, ...]:
        """The header fields this layout writes and expects, in HEADER order."""
        return (
            STATE_MAGIC,
            STATE_VERSION,
            HEADER_SIZE,
            self.capacity,
            self.slot_size,
            self.payload_max,
        )

    def init_state(self, buf: mmap.mmap) -> None:
        """Write the header of a new (zeroed) state object."""
        store(buf, 0, HEADER, *self.header())

    def validate_state(self, buf: mmap.mmap) -> None:
        """Check every header field of an existing state object.

        ``max_probe`` (bytes 20..24) changes at run time and is not compared.

        Raises:
            LayoutMismatch: any field differs, or a reserved byte is not zero.
        """
        found = HEADER.unpack_from(buf, 0)
        if found != self.header():
            raise LayoutMismatch(
                f"lock state kind {self.state_kind}: header {found} differs from {self.header()}",
                kind=self.state_kind,
            )
        counters_end = CONFLICTS_OFFSET + CONFLICTS.size
        if any(buf[MAX_PROBE_OFFSET + 4 : COUNTERS_OFFSET]) or any(buf[counters_end:HEADER_SIZE]):
            raise LayoutMismatch(
                f"lock state kind {self.state_kind}: reserved header bytes are not zero",
                kind=self.state_kind,
            )


_default: LockLayout | None = None
