"""Transition ring: per-node writer lanes of seqlock frames in one SHM object.

Each fleet node writes only its own lane (one live process per node, see
``_fleet``); readers keep one cursor per lane. The ring is advisory history: it
wakes observers and feeds diagnostics, it never decides ownership.

Layout (little-endian; version :data:`RING_VERSION`)::

    header, 64 bytes
      off size field            meaning
        0    4 magic            0x4F524254 "ORBT"
        4    2 version          RING_VERSION
        6    2 header_size      64
        8    4 lane_count       fleet capacity (one writer lane per node)
       12    4 capacity         frames per lane, a power of two
       16    4 frame_bytes      payload capacity of one frame
       20    4 slot_stride      round_up(32 + frame_bytes, 64)
       24    4 generation       readiness word: +1 after every publish
       28    1 kind             SHM kind number of this ring
       29   35 reserved         zero
    armed, round_up(lane_count, 64) bytes: byte n has a bit per readiness socket of
        node n that the next publish signals (``_core._channel``)
    waiting, round_up(4 x lane_count, 64) bytes: u32 n is the tag of the key threads of
        node n wait for, 0xFFFFFFFF while they wait for several keys, 0 otherwise
        (``_key_wait``; a key's tag is its 32-bit digest, made neither 0 nor all ones)
    lane heads, lane_count x 64 bytes: head u64 @0 = frames ever committed in the
        lane; key word u32 @8, +1 at every release of a key of bucket n
        (a key's bucket is its digest modulo lane_count)
    slots, lane_count x capacity x slot_stride, lane-major; one slot:
        0    8 seq              0 never written; 2c+1 writing counter c; 2c+2 committed
        8    8 counter          the lane counter c of the frame
       16    8 ver              caller's version (the lock table's state_revision)
       24    4 payload_len      <= frame_bytes
       28    1 frame_kind       caller's message class
       29    3 reserved
       32    .. payload

Seqlock protocol. Writer: ``seq := 2c+1``, write the fields and payload,
``seq := 2c+2``, then ``head := c+1``. Reader: read seq, copy, re-read seq; a
mismatch or odd value is a torn frame and is never returned. A writer killed
mid-frame leaves an odd seq and an unmoved head, so nothing torn is
readable and the next writer of that lane reuses the counter. (Stores from one
Python thread reach the mapping in program order on x86-64 TSO; the readers'
double check covers the rest.)

Every store is one copy of packed bytes (:func:`~orbitive._core._region.store`), never
``struct.pack_into``, which zeroes its target first: a writer SIGKILLed between
the two steps would leave the lane's head at 0 for good, hiding every frame in
it, and a reader would see the lane go back to 0.
"""

from __future__ import annotations

import mmap
import struct
import threading
from dataclasses import dataclass
from typing import Final

from .._core import _fork
from .._core._errors import InvalidLayout, LayoutMismatch
from .._core._fleet import Fleet
from .._core._readiness import Channel, Readiness, wake_word
from .._core._region import Region, object_name, object_size, read_prefix, store

RING_MAGIC: Final = 0x4F524254
RING_VERSION: Final = 2
HEADER_SIZE: Final = 64
LANE_HEAD_SIZE: Final = 64
SLOT_HEADER_SIZE: Final = 32
#: Offset of a lane head's key word (the wait word of the keys of that bucket).
KEY_WORD_OFFSET: Final = 8
#: A node's waiting slot while its threads wait for more than one key.
ANY_KEY: Final = 0xFFFFFFFF

_HEADER: Final = struct.Struct("<IHHIIII")  # magic .. slot_stride (24 bytes)
_GENERATION_OFFSET: Final = 24
_KIND_OFFSET: Final = 28
_U64: Final = struct.Struct("<Q")
_U32: Final = struct.Struct("<I")
_COUNTER_LIMIT: Final = 1 << 62  # 2c + 2 must fit a u64
_SLOT: Final = struct.Struct("<QQQIB")  # seq, counter, ver, payload_len, frame_kind
_unpack_u64 = _U64.unpack_from


def _round_up(value: int, unit: int) -> int:
    return (value + unit - 1) // unit * unit


def key_tag(digest: int) -> int:
    """What a waiting slot holds for the key of ``digest`` (a 32-bit CRC): never 0 nor ANY_KEY."""
    tag = digest & ANY_KEY
    return tag if 0 < tag < ANY_KEY else 1


@dataclass(frozen=True, slots=True)
class RingGeometry:
    """The shape of one ring object; every peer must agree on all of it."""

    kind: int
    lane_count: int
    capacity: int
    frame_bytes: int

    def __post_init__(self) -> None:
        cap = self.capacity
        if cap < 1 or cap & (cap - 1) or cap > 1 << 20:
            raise InvalidLayout(f"ring capacity must be a power of two <= 2**20, got {cap}")
        if not 0 <= self.frame_bytes <= 1 << 20:
            raise InvalidLayout(f"ring frame_bytes must be in 0..2**20, got {self.frame_bytes}")

    @property
    def stride(self) -> int:
        return _round_up(SLOT_HEADER_SIZE + self.frame_bytes, 64)

    @property
    def armed_offset(self) -> int:
        return HEADER_SIZE

    @property
    def waiting_offset(self) -> int:
        return HEADER_SIZE + _round_up(self.lane_count, 64)

    @property
    def heads_offset(self) -> int:
        return self.waiting_offset + _round_up(4 * self.lane_count, 64)

    def key_word(self, digest: int) -> int:
        """Offset of the key word of ``digest``'s bucket (``digest % lane_count``)."""
        return self.heads_offset + (digest % self.lane_count) * LANE_HEAD_SIZE + KEY_WORD_OFFSET

    @property
    def slots_offset(self) -> int:
        return self.heads_offset + self.lane_count * LANE_HEAD_SIZE

    @property
    def size(self) -> int:
        return self.slots_offset + self.lane_count * self.capacity * self.stride

    def header(self) -> tuple[int, ...]:
        return (
            RING_MAGIC,
            RING_VERSION,
            HEADER_SIZE,
            self.lane_count,
            self.capacity,
            self.frame_bytes,
            self.stride,
        )


def lane_count_of(fleet: str, kind: int) -> int | None:
    """The lane count (fleet capacity) recorded in an existing ring object, or None.

    Raises:
        LayoutMismatch: the object exists but is not a ring of this version.
        AccessDenied: the object is not exclusively ours.
    """
    name = object_name(fleet, kind)
    size = object_size(name)
    if size is None:
        return None
    header = read_prefix(name, HEADER_SIZE)
    magic, version, header_size, lanes, *_ = _HEADER.unpack_from(header)
    if (magic, version, header_size) != (RING_MAGIC, RING_VERSION, HEADER_SIZE) or lanes < 1:
        raise LayoutMismatch(f"shm object {name!r} is not a version {RING_VERSION} ring", kind=kind)
    return int(lanes)


@dataclass(frozen=True, slots=True)
class Frame:
    """One committed frame read from a lane."""

    node: int
    counter: int
    ver: int
    kind: int
    payload: bytes


@dataclass(slots=True)
class RingRead:
    """What one poll of every lane found: frames plus loss accounting."""

    frames: list[Frame]
    overwritten: int = 0
    unavailable: int = 0


class Ring:
    """A fleet's per-node transition ring for one kind."""

    def __init__(self, fleet: Fleet, geometry: RingGeometry, head: struct.Struct) -> None:
        """Attach or create the ring of ``geometry`` whose frames start with ``head``.

        Raises:
            InvalidLayout: ``head`` alone does not fit in a frame.
            LayoutMismatch, AccessDenied: as for :meth:`Region.open_shared`.
        """
        if head.size > geometry.frame_bytes:
            raise InvalidLayout(f"a {head.size}-byte frame header exceeds {geometry.frame_bytes}")
        self.geometry = geometry
        self._frame = struct.Struct(_SLOT.format + "3x" + head.format.lstrip("<"))
        self._head_size = head.size
        self._body_offset = SLOT_HEADER_SIZE + head.size
        self.region: Region = fleet.region(geometry.kind, geometry.size, self._init, self._validate)
        self.buf = self.region.buf
        self.channel = Channel(
            self.region, _GENERATION_OFFSET, geometry.armed_offset, geometry.lane_count
        )
        self._readiness: Readiness | None = None
        self._readiness_lock = threading.Lock()  # threads may ask for it at once
        _fork.register(self)
        # Hot-path copies of the geometry.
        self._heads_offset = geometry.heads_offset
        self._stride = geometry.stride
        self._index_mask = geometry.capacity - 1
        self._lanes = geometry.lane_count
        lane_span = geometry.capacity * geometry.stride
        self._lane_base = [geometry.slots_offset + n * lane_span for n in range(self._lanes)]
        self._nobody_waits = bytes(4 * self._lanes)
        self._waiting = struct.Struct(f"<{self._lanes}I")

    # -- layout ------------------------------------------------------------------------

    def _init(self, buf: mmap.mmap) -> None:
        g = self.geometry
        store(buf, 0, _HEADER, *g.header())
        buf[_KIND_OFFSET] = g.kind

    def _validate(self, buf: mmap.mmap) -> None:
        g = self.geometry
        found = _HEADER.unpack_from(buf, 0)
        if found != g.header() or buf[_KIND_OFFSET] != g.kind or any(buf[_KIND_OFFSET + 1 : 64]):
            raise LayoutMismatch(
                f"ring kind {g.kind}: existing header {found} differs from expected {g.header()}",
                kind=g.kind,
            )

    # -- writing -----------------------------------------------------------------------

    def publish(
        self, node: int, frame_kind: int, ver: int, fields: tuple[int, ...], body: bytes
    ) -> int:
        """Append one frame (payload: the ring's ``head`` packed from ``fields``, then ``body``).

        Bumps the readiness word afterwards. The caller serialises writers of
        one lane (one process per node, plus the caller's critical section for
        threads) and guarantees ``head.size + len(body) <= frame_bytes`` (the
        lock table does so through :class:`LockLayout` and its entry limit).
        Returns the frame's counter.

        Raises:
            LayoutMismatch: the lane head read from shared memory is corrupt.
        """
        buf = self.buf
        head_at = self._heads_offset + node * LANE_HEAD_SIZE
        counter: int = _unpack_u64(buf, head_at)[0]
        if counter >= _COUNTER_LIMIT:
            raise self.corrupt_head(node)
        slot = self._lane_base[node] + (counter & self._index_mask) * self._stride
        size = len(body)
        store(
            buf,
            slot,
            self._frame,
            2 * counter + 1,
            counter,
            ver,
            self._head_size + size,
            frame_kind,
            *fields,
        )
        start = slot + self._body_offset
        buf[start : start + size] = body
        store(buf, slot, _U64, 2 * counter + 2)
        store(buf, head_at, _U64, counter + 1)
        self.channel.bump()
        return counter

    def corrupt_head(self, node: int) -> LayoutMismatch:
        """The error for a lane head that shared memory holds out of range."""
        return LayoutMismatch(f"ring kind {self.geometry.kind} lane {node}: corrupt head")

    def key_released(self, digest: int) -> int:
        """After a release of the key of ``digest``: its waiters, one of its bucket's woken.

        Inside the critical section. When the waiting slots show threads waiting
        for the key (``_key_wait``), the key word of its bucket + 1 and the thread
        that has slept on it longest is woken (the C release does the same, once
        it has let its stripes go). Returns how many nodes wait for the key.
        """
        buf, start = self.buf, self.geometry.waiting_offset
        if buf[start : start + 4 * self._lanes] == self._nobody_waits:
            return 0
        tag = key_tag(digest)
        waiting = sum(v in (tag, ANY_KEY) for v in self._waiting.unpack_from(buf, start))
        if waiting:
            at = self.geometry.key_word(digest)
            store(buf, at, _U32, (_U32.unpack_from(buf, at)[0] + 1) & 0xFFFFFFFF)
            wake_word(buf, at, 1)
        return waiting

    # -- reading -----------------------------------------------------------------------

    def heads(self) -> list[int]:
        """The current head (frames ever committed) of every lane."""
        g = self.geometry
        return [
            _U64.unpack_from(self.buf, g.heads_offset + lane * LANE_HEAD_SIZE)[0]
            for lane in range(g.lane_count)
        ]

    def read(self, cursors: list[int]) -> RingRead:
        """Read every lane from its cursor to its head, advancing ``cursors`` in place.

        A cursor that fell more than one ring behind counts the lost frames as
        ``overwritten`` and jumps to the oldest retained one; a frame that is torn,
        being written, or was overwritten while read counts as ``unavailable``.
        """
        result = RingRead([])
        for lane, head in enumerate(self.heads()):
            cursors[lane] = self._read_lane(lane, cursors[lane], head, result)
        return result

    def _read_lane(self, lane: int, cursor: int, head: int, out: RingRead) -> int:
        g = self.geometry
        if cursor >= head:
            return head
        oldest = max(0, head - g.capacity)
        if cursor < oldest:
            out.overwritten += oldest - cursor
            cursor = oldest
        for counter in range(cursor, head):
            frame = self._read_slot(lane, counter)
            if frame is None:
                out.unavailable += 1
            else:
                out.frames.append(frame)
        return head

    def _read_slot(self, lane: int, counter: int) -> Frame | None:
        g = self.geometry
        slot = g.slots_offset + (lane * g.capacity + (counter & (g.capacity - 1))) * g.stride
        buf = self.buf
        seq, stored, ver, length, kind = _SLOT.unpack_from(buf, slot)
        if seq != 2 * counter + 2 or stored != counter or length > g.frame_bytes:
            return None
        payload = bytes(buf[slot + SLOT_HEADER_SIZE : slot + SLOT_HEADER_SIZE + length])
        if _U64.unpack_from(buf, slot)[0] != seq:
            return None
        return Frame(lane, counter, ver, kind, payload)

    # -- readiness and lifecycle -----------------------------------------------------------

    def readiness(self, node: int, name: str) -> Readiness:
        """This process's readiness descriptor for the ring (created once, whichever
        threads ask first)."""
        found = self._readiness
        if found is None:
            with self._readiness_lock:
                found = self._readiness
                if found is None:
                    found = self._readiness = Readiness(self.channel, node, name)
        return found

    def forget_readiness(self) -> None:
        """Drop the descriptor (a forked child's copy); the next call builds a new one."""
        self.close()

    def reset(self) -> None:
        """Zero every lane head and slot (quiescent boot only); signals readiness.

        The key words are zeroed too: waiters on them wake at their own timeouts.
        """
        g = self.geometry
        end = g.size
        start = g.heads_offset
        self.buf[start:end] = bytes(end - start)
        self.channel.bump()

    def close(self) -> None:
        """Close this process's readiness socket, if any; the mapping belongs to the fleet."""
        with self._readiness_lock:
            readiness, self._readiness = self._readiness, None
        if readiness is not None:
            readiness.close()

    def _after_fork_in_child(self) -> None:
        # A parent thread may have held the lock at the fork; the descriptor is
        # dropped by the table's first call in the child (forget_readiness).
        self._readiness_lock = threading.Lock()
