"""Value types of the lock table: keys, owners, leases, results, events, fences."""

from __future__ import annotations

import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple, Protocol, cast, final

from .._core._bytes import exact_bytes
from .._core._errors import (
    EntryTooLarge,
    InvalidArgumentType,
    InvalidEncoding,
    KeyEmpty,
    NamespaceEmpty,
    OwnerEmpty,
    shown,
)

#: Bits of a lock id (NetId64) that hold the fencing token.
TOKEN_BITS: Final = 40
TOKEN_MASK: Final = (1 << TOKEN_BITS) - 1
NODE_SHIFT: Final = 40
KIND_SHIFT: Final = 56
#: What a key part or owner may be: text (UTF-8 encoded) or bytes-like (copied).
Part = str | bytes | bytearray | memoryview


def _as_bytes(value: object, what: str) -> bytes:
    """``value`` as exact bytes: a str as UTF-8, a bytes-like as the bytes it holds."""
    if type(value) is bytes:
        return value
    if type(value) is str:
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise _not_utf8(value, what) from None
    return _odd_bytes(value, what)


def _odd_bytes(value: object, what: str) -> bytes:
    """:func:`_as_bytes` of a str subclass or a bytes-like, whatever its own hooks do."""
    if issubclass(type(value), str):  # type(), not isinstance: a __class__ property may lie
        try:
            return str.encode(cast(str, value))  # str's own encode, not the subclass's
        except UnicodeEncodeError:
            raise _not_utf8(value, what) from None
    raw = exact_bytes(value)
    if raw is None:
        released = " (released)" if type(value) is memoryview else ""
        raise InvalidArgumentType(
            f"{what} must be str or readable bytes-like, not {type(value).__name__}{released}"
        )
    return raw


def _not_utf8(value: object, what: str) -> InvalidEncoding:
    return InvalidEncoding(f"{what} {shown(value)} has no UTF-8 form (a lone surrogate)")


class HasNamespace(Protocol):
    """A type (or object) with a ``NAMESPACE``; read-only, so ``NAMESPACE = "..."`` fits."""

    @property
    def NAMESPACE(self) -> str | bytes: ...  # noqa: N802 - the attribute name is the contract


@final
@dataclass(frozen=True, slots=True, init=False)
class LockKey:
    """What is mutually excluded: a readable namespace plus a resource label.

    Only the key decides contention (lease contract, "Identity"). ``str`` values are
    encoded as UTF-8; bytes are kept as they are.

    Raises:
        NamespaceEmpty: empty namespace.
        KeyEmpty: empty label.
        EntryTooLarge: a namespace longer than 65535 bytes (no layout holds it; a
            longer label is refused by the table, whose ``payload_max`` is at most that).
        InvalidEncoding: a str part with a lone surrogate (no UTF-8 form).
        InvalidArgumentType: a part is neither str nor bytes-like (``bytearray``
            and ``memoryview`` are copied), or a released memoryview.
    """

    namespace: bytes
    label: bytes
    digest: int = field(repr=False, compare=False)
    ident: bytes = field(repr=False, compare=False)

    def __init__(self, namespace: Part, label: Part) -> None:
        ns = _as_bytes(namespace, "namespace")
        lb = _as_bytes(label, "label")
        if not ns:
            raise NamespaceEmpty("lock key namespace must not be empty")
        if not lb:
            raise KeyEmpty("lock key label must not be empty")
        try:
            digest = zlib.crc32(lb, zlib.crc32(len(ns).to_bytes(2, "little") + ns))
        except OverflowError:  # the u16 namespace length: no layout holds the key
            raise EntryTooLarge(
                f"lock key namespace is {len(ns)} bytes; at most 65535 fit any layout"
            ) from None
        object.__setattr__(self, "namespace", ns)
        object.__setattr__(self, "label", lb)
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "ident", ns + lb)

    @classmethod
    def of(cls, typ: HasNamespace, label: Part) -> LockKey:
        """A key whose namespace is ``typ.NAMESPACE`` (a typed caller's stable domain).

        Raises:
            InvalidArgumentType: ``typ`` has no readable ``NAMESPACE`` (the error
                reading it is the ``__cause__``), or a part is neither str nor bytes.
            KeyEmpty, NamespaceEmpty, InvalidEncoding, EntryTooLarge: as the constructor.
        """
        try:
            namespace = typ.NAMESPACE
        except Exception as error:  # a missing attribute, or a property that raises
            raise InvalidArgumentType(
                f"LockKey.of needs a type with a NAMESPACE, not {type(typ).__name__}"
            ) from error
        return cls(namespace, label)

    def __str__(self) -> str:
        return f"{self.namespace.decode(errors='replace')}/{self.label.decode(errors='replace')}"


@final
@dataclass(frozen=True, slots=True, init=False)
class LockOwner:
    """An opaque compare token for one caller-chosen tenure (never interpreted).

    Raises:
        OwnerEmpty: empty value.
        InvalidEncoding: a str with a lone surrogate (no UTF-8 form).
        InvalidArgumentType: neither str nor bytes-like, or a released memoryview.
    """

    value: bytes

    def __init__(self, value: Part) -> None:
        raw = _as_bytes(value, "owner")
        if not raw:
            raise OwnerEmpty("lock owner must not be empty")
        object.__setattr__(self, "value", raw)

    @classmethod
    def random(cls) -> LockOwner:
        """A fresh 16-byte random owner."""
        return cls(os.urandom(16))

    def text(self) -> str:
        """The owner as text when it is printable UTF-8, else as hex."""
        try:
            decoded = self.value.decode()
        except UnicodeDecodeError:
            return self.value.hex()
        return decoded if decoded.isprintable() else self.value.hex()


class LockLease(NamedTuple):
    """One tenure of a key: who holds it, its fencing token and its deadline.

    ``acquired_at`` and ``expires_at`` are ``time.monotonic()`` seconds (the
    host monotonic clock). ``lock_id`` packs kind, acquiring node and the
    fencing token (its low 40 bits); it identifies the tenure exactly.
    ``slot`` is where the table keeps it (a lookup hint).

    A named tuple rather than a frozen dataclass: the table builds one per
    acquire and renew, and a tuple is built in a sixth of the time.
    """

    key: LockKey
    owner: LockOwner
    lock_id: int
    state_revision: int
    acquired_at: float
    expires_at: float
    slot: int = -1

    @property
    def fencing_token(self) -> int:
        """Strictly increasing per acquisition across the table; renew keeps it."""
        return self.lock_id & TOKEN_MASK

    @property
    def node(self) -> int:
        """The fleet node that acquired this tenure."""
        return (self.lock_id >> NODE_SHIFT) & 0xFFFF

    def remaining(self) -> float:
        """Seconds left before expiry, never negative."""
        return max(0.0, self.expires_at - time.monotonic())

    def __repr__(self) -> str:
        # The fencing token and node first: they are what a reader of a log wants, and
        # the packed lock_id hides both.
        return (
            f"LockLease(key={self.key!r}, owner={self.owner!r}, "
            f"fencing_token={self.fencing_token}, node={self.node}, "
            f"lock_id={self.lock_id:#x}, state_revision={self.state_revision}, "
            f"expires_at={self.expires_at:.3f}, slot={self.slot})"
        )


@final
@dataclass(frozen=True, slots=True)
class Acquired:
    """``try_acquire`` result: the caller now holds ``lease``."""

    lease: LockLease


@final
@dataclass(frozen=True, slots=True)
class Occupied:
    """``try_acquire`` result: someone else holds the key; ``lease`` is theirs."""

    lease: LockLease


Transition = Literal["acquired", "renewed", "released"]


@final
@dataclass(frozen=True, slots=True)
class LockEvent:
    """One transition read from the ring (advisory; the table is authoritative).

    ``expires_at`` is ``time.monotonic()`` seconds, or None for a release.
    ``node`` and ``counter`` name the frame (writer lane and position).
    """

    transition: Transition
    key: LockKey
    owner: LockOwner
    lock_id: int
    state_revision: int
    expires_at: float | None
    node: int
    counter: int

    @property
    def fencing_token(self) -> int:
        """The fencing token of the tenure this transition belongs to."""
        return self.lock_id & TOKEN_MASK


@final
@dataclass(frozen=True, slots=True)
class LockPoll:
    """What one ``poll()`` found: events sorted by state_revision, plus loss counts.

    ``overwritten``: frames the ring dropped before this reader got to them.
    ``unavailable``: frames torn or being written. ``malformed``: frames that
    did not decode as lock transitions.
    """

    events: tuple[LockEvent, ...]
    overwritten: int = 0
    unavailable: int = 0
    malformed: int = 0

    @property
    def lost(self) -> bool:
        """Whether any transition may have been missed."""
        return bool(self.overwritten or self.unavailable or self.malformed)


class Fence:
    """Resource-side stale-holder check: remembers the highest token admitted.

    ``admit(token)`` is True when ``token >= high_water`` (equal re-admits the
    same holder) and raises the mark; an older token is rejected. Thread-safe.

    Args:
        high_water: the highest token already admitted, an int (0: none yet).

    Raises:
        InvalidArgumentType: ``high_water`` is not an int (bools refused).
    """

    def __init__(self, high_water: int = 0) -> None:
        if type(high_water) is not int:
            raise InvalidArgumentType(f"high_water must be an int, not {type(high_water).__name__}")
        self._high_water = high_water
        self._mutex = threading.Lock()

    @property
    def high_water(self) -> int:
        """The highest token admitted so far."""
        return self._high_water

    def admit(self, token: int) -> bool:
        """Admit ``token`` if it is not older than any admitted before.

        Raises:
            InvalidArgumentType: ``token`` is not an int (bools refused).
        """
        if type(token) is not int:
            raise InvalidArgumentType(f"token must be an int, not {type(token).__name__}")
        with self._mutex:
            if token < self._high_water:
                return False
            self._high_water = token
            return True

    def __repr__(self) -> str:
        return f"Fence(high_water={self._high_water})"
