"""Plain value types of the pool: keys, incarnations, resource ids, leases, candidates.

They are frozen, slotted dataclasses: numbers that cross processes, never
handles on anything.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Final, Literal, cast, final

from .._core._bytes import exact_bytes
from .._core._clock import TTL_MAX_S
from .._core._errors import MalformedError, shown
from ._layout import LABEL_MAX, PENDING

U64_MAX: Final = (1 << 64) - 1
#: Longest duration a pool verb takes, in seconds (about 31.7 years, as a lock's ttl).
SECONDS_MAX: Final = TTL_MAX_S
U32_MAX: Final = (1 << 32) - 1
_U128_MAX: Final = (1 << 128) - 1


def _check_int(value: object, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise MalformedError(f"{what} must be an int in {low}..{high}, got {shown(value)}")
    return value


def bytes_of(data: object, what: str) -> bytes:
    """``data`` as exact bytes if it is a readable bytes-like, else MalformedError."""
    raw = exact_bytes(data)
    if raw is None:
        raise MalformedError(
            f"{what} needs bytes, bytearray or a readable memoryview, not {type(data).__name__}"
        )
    return raw


@final
@dataclass(frozen=True, slots=True)
class Key:
    """The caller's 128-bit digest of "what a resource is usable for".

    The pool never hashes the real key: two resources are interchangeable exactly
    when their ``Key`` values are equal. Put an origin and everything that forbids
    reuse across contexts (credentials, TLS settings, database) into the digest.

    Args:
        value: an int in ``0 .. 2**128 - 1``.

    Raises:
        MalformedError: ``value`` is not such an int (bools refused).
    """

    value: int

    def __post_init__(self) -> None:
        _check_int(self.value, "a pool key", 0, _U128_MAX)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Key:
        """The key whose little-endian 16-byte form is ``data``.

        Args:
            data: exactly 16 bytes (``bytes``, ``bytearray`` or ``memoryview``).

        Raises:
            MalformedError: ``data`` is not bytes-like (a released memoryview
                too), or not exactly 16 bytes.
        """
        raw = bytes_of(data, "Key.from_bytes")
        if len(raw) != 16:
            raise MalformedError(f"Key.from_bytes needs exactly 16 bytes, got {len(raw)}")
        return cls(int.from_bytes(raw, "little"))

    @classmethod
    def digest(cls, data: bytes | bytearray | memoryview) -> Key:
        """A key from arbitrary bytes: the 16-byte BLAKE2b digest of ``data``.

        Args:
            data: ``bytes``, ``bytearray`` or ``memoryview`` (encode text first:
                an int or a str is refused, not read as a length or a text).

        Raises:
            MalformedError: ``data`` is not bytes-like, or a released memoryview.
        """
        raw = bytes_of(data, "Key.digest")
        return cls.from_bytes(hashlib.blake2b(raw, digest_size=16).digest())

    @property
    def lo(self) -> int:
        """Low 64 bits."""
        return self.value & U64_MAX

    @property
    def hi(self) -> int:
        """High 64 bits."""
        return self.value >> 64

    def __str__(self) -> str:
        return f"{self.value:032x}"


@final
@dataclass(frozen=True, slots=True)
class Incarnation:
    """One value per process life, from whoever supervises processes.

    ``Pool(fleet)`` uses ``fleet.incarnation``, which already is one.

    Raises:
        MalformedError: not an int in ``1 .. 2**64 - 1``.
    """

    value: int

    def __post_init__(self) -> None:
        _check_int(self.value, "an incarnation", 1, U64_MAX)


@final
@dataclass(frozen=True, slots=True)
class ResourceId:
    """Where a resource lives in one pool table, and which registration it is.

    ``generation`` grows each time the slot is reused and ``epoch`` is the table's
    epoch at registration, so an id of a closed, reused or reset slot is stale.
    ``raw`` is the 64-bit wire form (``kind << 56 | node << 40 | generation << 16 |
    slot``); ``str`` gives ``kind:node:counter``.
    """

    kind: int
    node: int
    slot: int
    generation: int
    epoch: int

    def __post_init__(self) -> None:
        kind, node, slot, generation, epoch = (
            self.kind, self.node, self.slot, self.generation, self.epoch
        )  # fmt: skip
        if not (  # one expression: ids are built on the session path
            type(kind) is int and type(node) is int and type(slot) is int
            and type(generation) is int and type(epoch) is int
            and 0 <= kind <= 255 and 0 <= node <= 0xFFFF and 0 <= slot <= 0xFFFF
            and 1 <= generation <= 0xFFFFFF and 1 <= epoch <= U64_MAX
        ):  # fmt: skip
            _check_int(kind, "a resource id's kind", 0, 255)
            _check_int(node, "a resource id's node", 0, 0xFFFF)
            _check_int(slot, "a resource id's slot", 0, 0xFFFF)
            _check_int(generation, "a resource id's generation", 1, 0xFFFFFF)
            _check_int(epoch, "a resource id's epoch", 1, U64_MAX)

    @property
    def raw(self) -> int:
        """The 64-bit id without the epoch."""
        return self.kind << 56 | self.node << 40 | self.generation << 16 | self.slot

    @classmethod
    def from_raw(cls, raw: int, epoch: int) -> ResourceId:
        """Rebuild an id from its 64-bit form and the epoch it belongs to.

        Raises:
            MalformedError: ``raw`` is not an int in ``0 .. 2**64 - 1``, or a
                field (or ``epoch``) is out of range.
        """
        _check_int(raw, "a raw resource id", 0, U64_MAX)
        return cls(raw >> 56, raw >> 40 & 0xFFFF, raw & 0xFFFF, raw >> 16 & 0xFFFFFF, epoch)

    def __str__(self) -> str:
        return f"{self.kind}:{self.node}:{self.generation << 16 | self.slot}"


@final
@dataclass(frozen=True, slots=True)
class Lease:
    """One reserved unit of a resource's capacity: plain data that crosses processes.

    Attributes:
        id: the resource.
        fence: grows with every reservation on that resource; the owner accepts
            each fence exactly once.
        holder_node: the node that reserved it.
        holder_incarnation: the process life that reserved it.
    """

    id: ResourceId
    fence: int
    holder_node: int
    holder_incarnation: int


State = Literal["live", "draining"]


@final
@dataclass(frozen=True, slots=True)
class Candidate:
    """A snapshot of one resource registered under a key (not a lease).

    ``free`` is what a reservation can still take: the units neither reserved
    nor active, and at most the free entries of the resource's 16 pending
    reservations (``PENDING``): with 16 reservations pending, ``reserve``
    answers ``BusyError`` whatever the capacity, and ``free`` is 0. The
    shipped policies choose only resources with ``free > 0``.

    Attributes:
        id: the resource.
        owner_node: node of the owning process.
        owner_incarnation: life of the owning process.
        local: owned by the pool that took the snapshot.
        state: ``"live"`` or ``"draining"``.
        capacity: units in all.
        reserved: reserved units not yet accepted.
        active: accepted units not yet completed.
        last_reserve_at: Unix epoch seconds of the last reservation (or the
            registration).
    """

    id: ResourceId
    owner_node: int
    owner_incarnation: int
    local: bool
    state: State
    capacity: int
    reserved: int
    active: int
    last_reserve_at: float

    @property
    def free(self) -> int:
        """``min(capacity - reserved - active, 16 - reserved)``, never below zero."""
        return max(min(self.capacity - self.reserved - self.active, PENDING - self.reserved), 0)


# -- argument checks shared by the public verbs ----------------------------------


def check_key(key: object) -> Key:
    """Return ``key`` if it is a :class:`Key`, else raise MalformedError."""
    if type(key) is not Key:
        raise MalformedError(f"expected a pool Key, got {type(key).__name__}")
    return key


def check_units(value: object, what: str, low: int) -> int:
    """Return ``value`` if it is an int in ``low .. 2**32 - 1``, else raise MalformedError."""
    if type(value) is not int or not low <= value <= U32_MAX:
        raise MalformedError(f"{what} must be an int in {low}..{U32_MAX}, got {shown(value)}")
    return value


def check_rid(rid: object) -> ResourceId:
    """Return ``rid`` if it is a :class:`ResourceId`, else raise MalformedError."""
    if type(rid) is not ResourceId:
        raise MalformedError(f"expected a ResourceId, got {type(rid).__name__}")
    return rid


def check_lease(lease: object) -> Lease:
    """Return ``lease`` if it is a Lease of a ResourceId, a fence >= 1 and int holder
    fields, else raise MalformedError."""
    if type(lease) is not Lease:
        raise MalformedError(f"expected a Lease, got {type(lease).__name__}")
    check_rid(lease.id)
    if type(lease.holder_node) is not int or type(lease.holder_incarnation) is not int:
        raise MalformedError(
            f"lease holder must be an int node and incarnation, got "
            f"{type(lease.holder_node).__name__} and {type(lease.holder_incarnation).__name__}"
        )
    if type(lease.fence) is not int or not 1 <= lease.fence <= U64_MAX:
        raise MalformedError(
            f"lease fence must be an int in 1..{U64_MAX}, got {shown(lease.fence)}"
        )
    return lease


def check_label(label: object) -> bytes:
    """``label`` as the UTF-8 bytes a key slot stores: 1..127 bytes, no control character.

    Raises:
        MalformedError: not a str, empty, longer than 127 bytes of UTF-8, holding a
            control character (U+0000-U+001F, U+007F-U+009F) or a lone surrogate.
    """
    if not issubclass(type(label), str):  # type(), not isinstance: __class__ may lie
        raise MalformedError(f"a key label must be a str, got {shown(label)}")
    text = str.__str__(cast(str, label))  # an exact str, its hooks bypassed
    try:
        raw = text.encode()
    except UnicodeEncodeError:
        raise MalformedError(f"key label {shown(text)} has a lone surrogate") from None
    if not 1 <= len(raw) <= LABEL_MAX:
        raise MalformedError(
            f"a key label must be 1..{LABEL_MAX} bytes of UTF-8, got {len(raw)}: {shown(text)}"
        )
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text):
        raise MalformedError(f"key label {shown(text)} has a control character")
    return raw


def check_seconds(value: object, what: str) -> float:
    """Return ``value`` as float seconds if it is an int or float in 0..:data:`SECONDS_MAX`.

    Raises:
        MalformedError: anything else (bools, NaN, infinities, negative or longer).
    """
    if type(value) is not int and type(value) is not float:
        raise MalformedError(f"{what} must be seconds (int or float), got {shown(value)}")
    try:
        seconds = float(value)
    except OverflowError:  # an int past the float range
        seconds = math.inf
    if not 0 <= seconds <= SECONDS_MAX:  # also false for NaN
        raise MalformedError(f"{what} must be seconds in 0..{SECONDS_MAX:g}, got {shown(value)}")
    return seconds
