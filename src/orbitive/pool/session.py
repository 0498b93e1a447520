"""Carrying a lease to its owner over a byte stream you supply.

The borrower writes one fixed-size **lease frame** first (:func:`open_session`);
the owner reads exactly that frame and accepts the lease before a single byte
of your payload is trusted (:func:`accept_session`). What crosses afterwards is
yours alone: the pool carries no bytes. Blocking sockets (Unix domain or TCP)
and asyncio streams share one frame codec.

Lease frame, 48 bytes, little-endian (documented in ``docs/format.md``)::

    offset size field               meaning
    0      4    magic               b"PSES"
    4      1    version             FRAME_VERSION
    5      1    kind                the pool's SHM kind
    6      2    holder_node         node that reserved the lease
    8      8    resource            kind << 56 | node << 40 | generation << 16 | slot
    16     8    fence               the lease's fence, >= 1
    24     8    holder_incarnation  process life that reserved it
    32     8    epoch               the table epoch the resource belongs to
    40     4    reserved            zero
    44     4    checksum            CRC-32 of bytes 0..44

A short frame (the peer closed first), a bad magic, version, reserved field or
checksum is :class:`~orbitive.OrbitError` ``MalformedError``; a frame for
another pool kind is ``MalformedError`` too; a frame for another node is
``NotOwnerError``, for another epoch or a reused slot ``StaleError``, and a
replayed frame ``NotReservedError`` (each fence is accepted once). In every
case nothing is accepted.

Giving up on a session (closing the socket) frees nothing: the unit returns
only when the owner completes its :class:`~orbitive.pool.Execution`.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import zlib
from typing import Final

from .._core._errors import MalformedError, SessionClosed, shown
from ._execution import Execution
from ._pool import Pool
from ._values import Lease, ResourceId, bytes_of, check_lease

#: The API contract's names; ``encode_frame``, ``decode_frame`` and ``FRAME_SIZE``
#: are public too, for transports of your own.
__all__ = [
    "SessionClosed",
    "accept_session",
    "accept_session_async",
    "open_session",
    "open_session_async",
]

SessionClosed.__module__ = __name__

FRAME_MAGIC: Final = b"PSES"
FRAME_VERSION: Final = 1
FRAME: Final = struct.Struct("<4sBBHQQQQ4xI")
FRAME_CHECKED: Final = 44
_BODY: Final = struct.Struct("<4sBBHQQQQ4x")  # FRAME without the checksum
_CHECKSUM: Final = struct.Struct("<I")
_ZERO4: Final = bytes(4)
#: Bytes of one lease frame.
FRAME_SIZE: Final = FRAME.size
#: ``ResourceId.from_raw`` remembered: an owner sees the same few resources in
#: frame after frame, and building a checked, frozen id costs more than the rest
#: of a decode. A bad id raises and is not remembered.
_resource_id: Final = functools.lru_cache(maxsize=1024)(ResourceId.from_raw)


def encode_frame(lease: Lease) -> bytes:
    """The 48-byte lease frame of ``lease``.

    Raises:
        MalformedError: ``lease`` is not a Lease with sane numbers.
    """
    rid = check_lease(lease).id  # int fields: a hostile __index__ never reaches pack
    try:
        body = _BODY.pack(
            FRAME_MAGIC, FRAME_VERSION, rid.kind, lease.holder_node, rid.raw, lease.fence,
            lease.holder_incarnation, rid.epoch,
        )  # fmt: skip
    except struct.error as error:
        raise MalformedError(f"lease {shown(lease)} does not fit a session frame") from error
    return body + _CHECKSUM.pack(zlib.crc32(body))


def decode_frame(data: bytes | bytearray | memoryview) -> Lease:
    """The lease in a 48-byte frame; checks type, size, magic, version, reserved and checksum.

    Args:
        data: the frame, a bytes-like object (bytes, bytearray or memoryview)
            of :data:`FRAME_SIZE` bytes.

    Returns:
        The :class:`~orbitive.pool.Lease` it carries.

    Raises:
        MalformedError: anything but a well-formed frame, a str or None included.
    """
    return Lease(*_decode(data))


def _decode(data: object) -> tuple[ResourceId, int, int, int]:
    """(id, fence, holder node, holder incarnation) of a frame, checked as decode_frame."""
    data = bytes_of(data, "a session frame")
    if len(data) != FRAME_SIZE:
        raise MalformedError(f"a session offered {len(data)} of {FRAME_SIZE} lease bytes")
    magic, version, kind, holder, raw, fence, life, epoch, checksum = FRAME.unpack(data)
    if magic != FRAME_MAGIC or version != FRAME_VERSION:
        raise MalformedError(f"not a pool session frame (magic {magic!r}, version {version})")
    if data[40:44] != _ZERO4 or zlib.crc32(data[:FRAME_CHECKED]) != checksum:
        raise MalformedError("pool session frame is corrupt (reserved bytes or checksum)")
    if raw >> 56 != kind or not fence or not life:
        raise MalformedError("pool session frame is inconsistent (kind, fence or incarnation)")
    try:
        rid: ResourceId = _resource_id(raw, epoch)
    except MalformedError as error:
        raise MalformedError(f"pool session frame names no resource: {error}") from None
    return rid, fence, holder, life


def _accept(pool: Pool, data: bytes) -> Execution:
    if not data:
        raise SessionClosed("the peer closed the session before sending a lease frame")
    rid, fence, _, _ = _decode(data)
    return pool._accept(rid, fence)  # an id of another pool kind is MalformedError there


def open_session(lease: Lease, sock: socket.socket, data: bytes = b"") -> None:
    """Write the lease frame (and optionally the first payload bytes) to ``sock``.

    Args:
        lease: a lease from ``reserve`` or ``acquire``, for a resource of the
            process at the other end.
        sock: a connected blocking stream socket (Unix domain or TCP).
        data: payload to send in the same write, after the frame.

    Raises:
        MalformedError: not a lease, or ``data`` not bytes-like. OSError: the
            socket's own errors.
    """
    sock.sendall(encode_frame(lease) + bytes_of(data, "a session payload"))


def _read_frame(sock: socket.socket) -> bytes:
    data = sock.recv(FRAME_SIZE, socket.MSG_WAITALL)
    while 0 < len(data) < FRAME_SIZE:  # a timeout socket, or a signal, returns early
        more = sock.recv(FRAME_SIZE - len(data), socket.MSG_WAITALL)
        if not more:
            break
        data += more
    return data


def accept_session(pool: Pool, sock: socket.socket) -> Execution:
    """Read exactly one lease frame from ``sock`` and accept it.

    Reads no byte past the frame: the payload stays in the socket, and is read
    only after the lease is accepted.

    Returns:
        The Execution; complete it when the work for this session is over.

    Raises:
        SessionClosed: the peer closed the stream before the first byte of a
            frame (a clean end: a serving loop stops on it).
        MalformedError: short, malformed or foreign frame.
        StaleError, NotOwnerError, DrainingError, NotReservedError: as
            ``Pool.accept`` (a replayed frame is NotReservedError).
        OSError: the socket's own errors.
    """
    return _accept(pool, _read_frame(sock))


async def open_session_async(lease: Lease, writer: asyncio.StreamWriter, data: bytes = b"") -> None:
    """Asyncio twin of :func:`open_session` over a stream writer."""
    writer.write(encode_frame(lease) + bytes_of(data, "a session payload"))
    await writer.drain()


async def accept_session_async(pool: Pool, reader: asyncio.StreamReader) -> Execution:
    """Asyncio twin of :func:`accept_session` over a stream reader.

    Raises:
        SessionClosed, MalformedError, StaleError, NotOwnerError, DrainingError, NotReservedError:
            as :func:`accept_session`.
    """
    try:
        data = await reader.readexactly(FRAME_SIZE)
    except asyncio.IncompleteReadError as error:
        data = error.partial
    return _accept(pool, data)
