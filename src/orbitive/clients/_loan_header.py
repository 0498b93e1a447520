"""The loan header: what a borrower's router says of its client before a transaction.

A loan is one stream session on the owner's transaction socket: the 48-byte lease
frame of :mod:`orbitive.pool.session`, then this header, then the client's protocol
messages (docs/architecture.md, "The message format on the owner's socket"). The
header is 24 bytes, little-endian, then the client's tracked settings::

    offset size field      meaning
    0      4    magic      b"PTXN"
    4      1    version    1
    5      1    flags      bit 0: the client is pinned; bit 1: state check always
    6      2    settings   how many (name, value) pairs follow, at most 64
    8      4    client     the borrower's number for the client (cancels, logs)
    12     4    lease_ms   how long the owner may keep this loan, from its accept
    16     4    reserved   zero
    20     4    checksum   CRC-32 of bytes 0..20 and the pairs

and each pair is ``u16 length, name, u16 length, value``: a name of 1 to 63 bytes
of ``[A-Za-z0-9_.]``, a value of at most 4,096 bytes. :func:`decode`
checks every field before it trusts the next, and a prefix of a valid header is
reported as incomplete, never as malformed.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import Final, NamedTuple

from .._core._errors import MalformedError

MAGIC: Final = b"PTXN"
VERSION: Final = 1
FIXED: Final = struct.Struct("<4sBBHIII")
CHECKSUM: Final = struct.Struct("<I")
SIZE: Final = FIXED.size + CHECKSUM.size
_LENGTH: Final = struct.Struct("<H")
#: The client is pinned: the owner keeps the server connection for its next transactions.
PINNED: Final = 1
#: Run the state and settings checks after every transaction (``state_check="always"``).
ALWAYS_CHECK: Final = 2
SETTINGS_MAX: Final = 64
VALUE_MAX: Final = 4096
_NAME: Final = re.compile(rb"[A-Za-z0-9_.]{1,63}")


class LoanHeader(NamedTuple):
    """A decoded loan header.

    Attributes:
        flags: :data:`PINNED` and :data:`ALWAYS_CHECK`, or'ed.
        client: the borrower's number for its client connection (``u32``).
        lease_ms: how long the owner may keep the loan, in milliseconds (``u32``, > 0).
        settings: the client's tracked settings, ``(name, value)`` in the order sent.
    """

    flags: int
    client: int
    lease_ms: int
    settings: tuple[tuple[bytes, bytes], ...]

    def encode(self) -> bytes:
        """The header's bytes.

        Raises:
            MalformedError: a field outside its rule (the same rules :meth:`decode`
                checks), so that nothing sent is refused by its owner.
        """
        pairs = b"".join(
            _LENGTH.pack(len(name)) + name + _LENGTH.pack(len(value)) + value
            for name, value in self.settings
        )
        head = _pack(self.flags, len(self.settings), self.client, self.lease_ms)
        data = head + CHECKSUM.pack(zlib.crc32(pairs, zlib.crc32(head))) + pairs
        if decode(data) != (self, len(data)):
            raise MalformedError(f"{self!r} breaks the loan header's rules")
        return data


def _pack(flags: int, count: int, client: int, lease_ms: int) -> bytes:
    try:
        return FIXED.pack(MAGIC, VERSION, flags, count, client, lease_ms, 0)
    except struct.error as error:
        raise MalformedError(f"a loan header field is out of range: {error}") from None


def decode(data: bytes) -> tuple[LoanHeader, int] | None:
    """Read a loan header from the start of ``data``.

    Args:
        data: the bytes received after the lease frame, so far.

    Returns:
        The header and how many bytes of ``data`` it took, or ``None`` while ``data``
        is a valid prefix of a header that has not all arrived.

    Raises:
        MalformedError: a wrong magic, version, reserved word, flag, settings count,
            name, value length or checksum, found as soon as its bytes arrived.
    """
    if len(data) < FIXED.size:
        if not MAGIC.startswith(data[:4]):
            raise MalformedError("a loan does not start with the loan header's magic")
        return None
    magic, version, flags, count, client, lease_ms, reserved = FIXED.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise MalformedError(f"loan header {magic!r} version {version}, not {MAGIC!r} {VERSION}")
    if reserved or flags & ~(PINNED | ALWAYS_CHECK) or count > SETTINGS_MAX or not lease_ms:
        raise MalformedError(
            f"loan header flags {flags:#x}, {count} settings, lease {lease_ms} ms,"
            f" reserved {reserved:#x}: out of range"
        )
    if len(data) < SIZE:
        return None
    offset = SIZE
    settings = []
    for _ in range(count):
        pair = _pair(data, offset)
        if pair is None:
            return None
        name, value, offset = pair
        settings.append((name, value))
    (checksum,) = CHECKSUM.unpack_from(data, FIXED.size)
    if checksum != zlib.crc32(data[SIZE:offset], zlib.crc32(data[: FIXED.size])):
        raise MalformedError("the loan header's checksum does not match")
    return LoanHeader(flags, client, lease_ms, tuple(settings)), offset


def _pair(data: bytes, offset: int) -> tuple[bytes, bytes, int] | None:
    fields: list[bytes] = []
    for limit in (63, VALUE_MAX):
        if len(data) < offset + _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(data, offset)
        if length > limit:
            raise MalformedError(f"a loan header setting has a field of {length} bytes")
        offset += _LENGTH.size
        if len(data) < offset + length:
            return None
        fields.append(data[offset : offset + length])
        offset += length
    if not _NAME.fullmatch(fields[0]):
        raise MalformedError(f"{fields[0]!r} is not a setting's name")
    return fields[0], fields[1], offset
