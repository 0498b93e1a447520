"""The pool table's bytes: one layout block, declared once.

One SHM object per (fleet, pool kind): ``/dev/shm/orbit-{fleet}-{kind}-{uid}``.
All integers are little-endian. Areas follow each other, each starting on a
64-byte boundary::

    area        size                          content
    header      64                            geometry, epoch, checksum (below)
    bell        round64(8 + F)                generation u32 @0; armed[F] u8 @8
    doorbells   round64(8 * F)                incarnation u64 per node (0: none)
    bell lives  round64(8 * F)                per node: the fleet incarnation of the
                                              doorbell's process (0: none)
    keys        K * key_stride                key slots (below)
    resources   F * L * 384                   resource slots, node-major (below)

F = fleet capacity, K = key capacity, L = resource lane capacity.

Header (64 bytes)::

    offset size field            meaning
    0      4    magic            b"POOL"
    4      2    version          LAYOUT_VERSION
    6      2    header_size      64
    8      4    key_capacity     K, a power of two
    12     4    lane_capacity    L, a power of two, <= 65536
    16     4    key_stride       bytes per key slot
    20     4    resource_size    bytes per resource slot (384)
    24     2    fleet_capacity   F
    26     1    kind             the SHM kind number
    27     1    pending          pending reservations per resource (16)
    28     4    reserved         zero
    32     8    epoch            (wall ms << 20) | 20 random bits; grows on reset_all
    40     8    total_size       bytes of the whole object
    48     12   reserved         zero
    60     4    checksum         CRC-32 of bytes 0..60

Key slot (key_stride bytes; F8 = round8(F))::

    offset          size            field      meaning
    0               1               state      0 empty, 1 installed
    8               8               key_lo     low 64 bits of the key
    16              8               key_hi     high 64 bits of the key
    24              4               changes    version word: bumped on every change
    64              F               parked     per node: 1 while a thread of it waits
    64 + F8         F               interest   per node: 1 = bump the bell on change
    64 + 2*F8       4 * F           claims     per node: creation claims held (u32)
    claims + 4F'    4 * F           waiters    per node: client-pool waiters at max_live (u32)
    waiters + 4F'   4 * F           since      per node: monotonic ms its waiting began (u32)
    since + 4F'     4 * F           seen       per node: monotonic ms a waiter last tried (u32)
    seen + 4F'      ceil(F*L/8)     members    bit per global resource index
    waits           8               timeouts   checkouts that gave up at max_live (u64)
    waits + 8       8               waits      checkouts that waited at max_live, then got one
    waits + 16      8               wait_us    their waits, summed, in microseconds
    waits + 24      8 * B           buckets    per bound of WAIT_BOUNDS_US: waits that took
                                               at most it and more than the bound before
    waits + 96      12              limits     max_live, min_idle, max_idle (u32 each; 0: none)
    waits + 112     128             label      length u8, then that many bytes of UTF-8
    label + 128     F               opened     per node: 1 while a client pool of its
                                               process is open on the key (version 7)

(4F' = round8(4 * F); waits = members + round8(ceil(F*L/8)); B = 9.) A key's
idle count is not stored: it is the free units (capacity - reserved - active)
of its live members, counted inside the step that needs it, so it can never
disagree with the resources it counts. Limits and label describe the key for
people and metrics: the client pool opened last on the key wrote them.

Resource slot (384 bytes; global index = node * L + slot)::

    offset size field             meaning
    0      1    state             0 empty, 1 live, 2 draining, 3 closed, 4 exhausted
    2      2    owner_node        the node whose lane this is
    4      4    generation        1..2**24-1, bumped on every registration
    8      8    owner_incarnation the owning process life
    16     8    key_lo            key this resource serves (low 64 bits)
    24     8    key_hi            (high 64 bits)
    32     4    capacity          units, >= 1
    36     4    key_index         the key slot's index
    40     4    active            accepted units not yet completed
    48     8    fence             last fence handed out (first lease gets 1)
    56     8    last_reserve_ms   Unix wall ms of the last reservation
    64     8    epoch             table epoch at registration
    128    128  pending fences    16 x u64, 0 = free entry
    256    128  pending since     16 x u64 Unix wall ms of each reservation

The number of reserved units is the number of non-zero pending fences, so no
counter can disagree with the entries it counts. Likewise a key's live count
is the number of its member bits and its creating count the sum of its claims.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from .._core._clock import wall_ms
from .._core._errors import LayoutMismatch, MalformedError, shown
from .._core._region import store

#: The default SHM kind of the pool table.
POOL_KIND: Final = 247
#: Bumped whenever any offset or meaning below changes.
LAYOUT_VERSION: Final = 7
MAGIC: Final = b"POOL"
HEADER_SIZE: Final = 64
RESOURCE_SIZE: Final = 384
#: Pending reservations per resource (part of the layout, not tunable).
PENDING: Final = 16
#: Largest key and lane capacities (slot numbers are 16-bit).
CAPACITY_MAX: Final = 65536
#: Generations are 24-bit; a slot that reaches the last one is exhausted.
GENERATION_MAX: Final = (1 << 24) - 1
#: The largest epoch (a u64).
EPOCH_MAX: Final = (1 << 64) - 1
DEFAULT_KEY_CAPACITY: Final = 256
DEFAULT_LANE_CAPACITY: Final = 256
ENV_KEY_CAPACITY: Final = "ORBIT_POOL_KEY_CAPACITY"
ENV_LANE_CAPACITY: Final = "ORBIT_POOL_RESOURCE_LANE_CAPACITY"

# Resource states.
EMPTY: Final = 0
LIVE: Final = 1
DRAINING: Final = 2
CLOSED: Final = 3
EXHAUSTED: Final = 4

HEADER: Final = struct.Struct("<4sHHIIIIHBBIQQ12sI")
HEADER_NAMES: Final = (
    "magic", "version", "header_size", "key_capacity", "lane_capacity", "key_stride",
    "resource_size", "fleet_capacity", "kind", "pending", "reserved", "epoch", "total_size",
    "reserved_tail", "checksum",
)  # fmt: skip
HEADER_CHECKED: Final = 60  # bytes covered by the checksum
EPOCH_OFFSET: Final = 32

BELL_PARKED: Final = 8  # armed bytes (readiness sockets, ``_core._channel``) @8 of the bell

KEY_HEAD: Final = struct.Struct("<B7xQQI")  # state, key_lo, key_hi, changes
KEY_LOHI: Final = 8
KEY_CHANGES: Final = 24
KEY_PARKED: Final = 64
#: Upper bounds, in microseconds, of the wait-time buckets a key slot counts
#: (1 ms to 10 s; a longer wait is counted in ``waits`` only).
WAIT_BOUNDS_US: Final = (1_000, 5_000, 10_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000,
                         10_000_000)  # fmt: skip
#: timeouts, waits, wait_us, then one count per bound of WAIT_BOUNDS_US.
KEY_WAITS: Final = struct.Struct(f"<QQQ{len(WAIT_BOUNDS_US)}Q")
#: max_live, min_idle, max_idle of the client pool opened last on the key (0: none).
KEY_LIMITS: Final = struct.Struct("<III")
#: Bytes from the limits to the label (the limits, then 4 bytes of padding).
LIMITS_SIZE: Final = 16
#: Bytes of a key's label area: a length byte, then at most LABEL_MAX bytes of UTF-8.
LABEL_SIZE: Final = 128
LABEL_MAX: Final = LABEL_SIZE - 1

RES_HOT: Final = struct.Struct("<BxHIQQQIIIxxxxQQQ")
RES_BODY: Final = struct.Struct("<HIQQQIIIxxxxQQQ")  # RES_HOT from offset 2 (no state)
RES_BODY_AT: Final = 2
#: RES_HOT without key_lo, key_hi and last_reserve_ms: what the lease steps check.
RES_LEASE: Final = struct.Struct("<BxHIQ16xIIIxxxxQ8xQ")
RES_OWNER: Final = struct.Struct("<HIQ")  # owner_node, generation, incarnation at offset 2
RES_KEY_INDEX: Final = 36
RES_ACTIVE: Final = 40
RES_FENCE: Final = 48  # fence, last_reserve_ms
RES_FENCES: Final = 128
RES_SINCE: Final = 256

U32: Final = struct.Struct("<I")
U64: Final = struct.Struct("<Q")
U64_PAIR: Final = struct.Struct("<QQ")
PENDING_WORDS: Final = struct.Struct(f"<{PENDING}Q")


def _round(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def _env_capacity(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip().replace("_", ""), 10)
    except ValueError:
        raise MalformedError(f"{name}={raw!r} is not a decimal integer") from None
    return check_capacity(value, name)


def check_capacity(value: object, what: str) -> int:
    """Return ``value`` if it is a power of two in 1..:data:`CAPACITY_MAX`.

    Raises:
        MalformedError: anything else.
    """
    if type(value) is not int or not 1 <= value <= CAPACITY_MAX or value & (value - 1):
        raise MalformedError(
            f"{what} must be a power of two in 1..{CAPACITY_MAX}, got {shown(value)}"
        )
    return value


_env: tuple[int, int] | MalformedError | None = None


def env_geometry() -> tuple[int, int]:
    """(key capacity, lane capacity) from the environment, read once per process.

    Raises:
        MalformedError: a variable is not a power of two in 1..65536 (on every call).
    """
    global _env  # noqa: PLW0603 - the process-wide geometry is read exactly once
    if _env is None:
        try:
            _env = (
                _env_capacity(ENV_KEY_CAPACITY, DEFAULT_KEY_CAPACITY),
                _env_capacity(ENV_LANE_CAPACITY, DEFAULT_LANE_CAPACITY),
            )
        except MalformedError as error:
            _env = error
    if isinstance(_env, MalformedError):
        raise _env
    return _env


def new_epoch(previous: int) -> int:
    """A fresh epoch: wall ms in the high bits, random low bits, above ``previous``.

    Above unless ``previous`` is :data:`EPOCH_MAX`, which only a damaged header
    holds (wall-clock epochs reach it in the year 2527): then the wall-clock
    epoch, which differs from it all the same.
    """
    fresh = (wall_ms() << 20) | random.getrandbits(20)
    return fresh if previous >= EPOCH_MAX else max(fresh, previous + 1)


@dataclass(frozen=True, slots=True)
class Layout:
    """Offsets of one pool table geometry."""

    kind: int
    fleet_capacity: int
    key_capacity: int
    lane_capacity: int

    @property
    def bell(self) -> int:
        """Offset of the bell generation word."""
        return HEADER_SIZE

    @property
    def doorbells(self) -> int:
        """Offset of the per-node incarnation array."""
        return self.bell + _round(BELL_PARKED + self.fleet_capacity, 64)

    @property
    def bell_lives(self) -> int:
        """Offset of the per-node fleet incarnations of the doorbells (layout version 4)."""
        return self.doorbells + _round(8 * self.fleet_capacity, 64)

    @property
    def keys(self) -> int:
        """Offset of key slot 0."""
        return self.bell_lives + _round(8 * self.fleet_capacity, 64)

    @property
    def key_interest(self) -> int:
        """Offset of the interest bytes inside a key slot."""
        return KEY_PARKED + _round(self.fleet_capacity, 8)

    @property
    def key_claims(self) -> int:
        """Offset of the claim counters inside a key slot."""
        return KEY_PARKED + 2 * _round(self.fleet_capacity, 8)

    @property
    def key_waiters(self) -> int:
        """Offset of the per-node waiter counters inside a key slot (layout version 2)."""
        return self.key_claims + _round(4 * self.fleet_capacity, 8)

    @property
    def key_wait_since(self) -> int:
        """Offset of the per-node waiting-began times inside a key slot (layout version 3)."""
        return self.key_waiters + _round(4 * self.fleet_capacity, 8)

    @property
    def key_wait_seen(self) -> int:
        """Offset of the per-node last-try times inside a key slot (layout version 3)."""
        return self.key_wait_since + _round(4 * self.fleet_capacity, 8)

    @property
    def key_members(self) -> int:
        """Offset of the member bitmap inside a key slot."""
        return self.key_wait_seen + _round(4 * self.fleet_capacity, 8)

    @property
    def key_waits(self) -> int:
        """Offset of the wait counters inside a key slot (layout version 5)."""
        return self.key_members + self.member_bytes

    @property
    def key_limits(self) -> int:
        """Offset of the limits inside a key slot (layout version 5)."""
        return self.key_waits + KEY_WAITS.size

    @property
    def key_label(self) -> int:
        """Offset of the label area inside a key slot (layout version 5)."""
        return self.key_limits + LIMITS_SIZE

    @property
    def key_opened(self) -> int:
        """Offset of the per-node open-client-pool marks inside a key slot (layout version 7)."""
        return self.key_label + LABEL_SIZE

    @property
    def member_mask(self) -> int:
        """The bits of a member bitmap that name a resource slot (one per slot)."""
        return (1 << self.fleet_capacity * self.lane_capacity) - 1

    @property
    def member_bytes(self) -> int:
        """Bytes of one key's member bitmap."""
        return _round((self.fleet_capacity * self.lane_capacity + 7) // 8, 8)

    @property
    def key_stride(self) -> int:
        """Bytes per key slot."""
        return _round(self.key_opened + _round(self.fleet_capacity, 8), 64)

    @property
    def resources(self) -> int:
        """Offset of resource slot 0."""
        return self.keys + self.key_capacity * self.key_stride

    @property
    def size(self) -> int:
        """Bytes of the whole object."""
        return self.resources + self.fleet_capacity * self.lane_capacity * RESOURCE_SIZE

    def key_offset(self, index: int) -> int:
        """Offset of key slot ``index``."""
        return self.keys + index * self.key_stride

    # -- header ----------------------------------------------------------------

    def header_fields(self, epoch: int) -> tuple[object, ...]:
        """The header's field values (without the checksum) for this geometry."""
        return (
            MAGIC,
            LAYOUT_VERSION,
            HEADER_SIZE,
            self.key_capacity,
            self.lane_capacity,
            self.key_stride,
            RESOURCE_SIZE,
            self.fleet_capacity,
            self.kind,
            PENDING,
            0,
            epoch,
            self.size,
            bytes(12),
        )

    def init(self, buf: mmap.mmap) -> None:
        """Write a fresh header into zeroed memory (called under the kind's flock)."""
        write_header(buf, self, new_epoch(0))

    def validate(self, buf: mmap.mmap) -> None:
        """Check every header field of an existing object against this geometry.

        Raises:
            LayoutMismatch: any field differs, the checksum is wrong or the epoch
                is zero; the message names the field and both values.
        """
        raw = buf[:HEADER_SIZE]
        if len(raw) < HEADER_SIZE:
            raise LayoutMismatch(f"pool table has {len(raw)} bytes, less than a header")
        actual = HEADER.unpack(raw)
        expected = self.header_fields(actual[11])
        for name, want, got in zip(HEADER_NAMES, expected, actual, strict=False):
            if want != got:
                raise LayoutMismatch(
                    f"pool table (kind {self.kind}) header field {name} is {got!r}, "
                    f"this process expects {want!r}",
                    kind=self.kind,
                )
        if actual[11] == 0:
            raise LayoutMismatch(f"pool table (kind {self.kind}) has epoch 0", kind=self.kind)
        if zlib.crc32(raw[:HEADER_CHECKED]) != actual[14]:
            raise LayoutMismatch(
                f"pool table (kind {self.kind}) header checksum does not match its bytes",
                kind=self.kind,
            )


def write_header(buf: mmap.mmap, layout: Layout, epoch: int) -> None:
    """Write the whole header, checksum last."""
    packed = HEADER.pack(*layout.header_fields(epoch), 0)[:HEADER_CHECKED]
    buf[:HEADER_CHECKED] = packed
    store(buf, HEADER_CHECKED, U32, zlib.crc32(packed))
