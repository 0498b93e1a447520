"""Lease sessions: the frame comes first, is accepted exactly once, and is checked."""

from __future__ import annotations

import array
import asyncio
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive._core._errors import MalformedError, NotOwnerError, NotReservedError, StaleError
from orbitive.pool import Key, Lease, Pool, ResourceId
from orbitive.pool.session import (
    FRAME_SIZE,
    SessionClosed,
    accept_session,
    accept_session_async,
    decode_frame,
    encode_frame,
    open_session,
    open_session_async,
)

from .._fleets import new_fleet_name, remove_fleet_files
from ._agent import Context
from ._borrower import borrow
from .conftest import CAPACITY

KEY = Key(7)
PAYLOAD = bytes(range(128))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    right.settimeout(10.0)
    with left, right:
        yield left, right


def _units(pool: Pool) -> tuple[int, int]:
    [candidate] = pool.candidates(KEY)
    return candidate.reserved, candidate.active


def test_session_delivers_frame_then_payload_and_accepts_once(
    pool: Pool, pair: tuple[socket.socket, socket.socket]
) -> None:
    borrower, owner = pair
    rid = pool.register(KEY, 2)
    lease = pool.reserve(rid)
    open_session(lease, borrower, PAYLOAD)
    with accept_session(pool, owner) as execution:
        assert (execution.id, execution.fence) == (lease.id, lease.fence)
        assert _units(pool) == (0, 1)
        assert owner.recv(len(PAYLOAD), socket.MSG_WAITALL) == PAYLOAD  # untouched by the frame
    assert _units(pool) == (0, 0)
    open_session(lease, borrower)  # the same frame again: a replay
    with pytest.raises(NotReservedError):
        accept_session(pool, owner)
    assert _units(pool) == (0, 0)


def test_frame_codec_round_trips_and_has_a_fixed_size(pool: Pool) -> None:
    lease = pool.reserve(pool.register(KEY, 1))
    frame = encode_frame(lease)
    assert len(frame) == FRAME_SIZE == 48
    assert decode_frame(frame) == lease


def test_decode_frame_takes_any_bytes_like_frame(pool: Pool) -> None:
    lease = pool.reserve(pool.register(KEY, 1))
    frame = encode_frame(lease)
    words = array.array("I", frame)  # 12 items of 4 bytes: a memoryview of another format
    for data in (bytearray(frame), memoryview(frame), memoryview(words), memoryview(frame)[::1]):
        assert decode_frame(data) == lease


@pytest.mark.parametrize("data", [None, 48, 4.8, "x" * 48, [0] * 48])
def test_decode_frame_refuses_anything_not_bytes_like(data: object) -> None:
    with pytest.raises(MalformedError):
        decode_frame(data)  # type: ignore[arg-type]  # refused at run time


def test_decode_frame_refuses_a_released_memoryview(pool: Pool) -> None:
    view = memoryview(encode_frame(pool.reserve(pool.register(KEY, 1))))
    view.release()
    with pytest.raises(MalformedError):
        decode_frame(view)


def test_a_checksummed_frame_naming_no_resource_is_refused_every_time() -> None:
    body = struct.pack("<4sBBHQQQQ4x", b"PSES", 1, 247, 0, 247 << 56 | 3, 1, 1, 1)  # generation 0
    frame = body + struct.pack("<I", zlib.crc32(body))
    for _ in range(2):  # a refusal is not remembered as an id
        with pytest.raises(MalformedError, match="names no resource"):
            decode_frame(frame)


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f[:20],  # short
        lambda f: b"XSES" + f[4:],  # magic
        lambda f: f[:4] + b"\x09" + f[5:],  # version
        lambda f: f[:16] + bytes([f[16] ^ 1]) + f[17:],  # a bit of the fence (checksum)
        lambda f: f[:40] + b"\x01" + f[41:],  # reserved
        lambda f: f[:44] + bytes(4),  # checksum
    ],
    ids=["short", "magic", "version", "flipped-bit", "reserved", "checksum"],
)
def test_short_or_malformed_frame_is_refused_and_accepts_nothing(
    pool: Pool, pair: tuple[socket.socket, socket.socket], damage: object
) -> None:
    borrower, owner = pair
    lease = pool.reserve(pool.register(KEY, 1))
    assert callable(damage)
    borrower.sendall(damage(encode_frame(lease)))
    borrower.shutdown(socket.SHUT_WR)
    with pytest.raises(MalformedError):
        accept_session(pool, owner)
    assert _units(pool) == (1, 0)  # still reserved, never accepted
    with pool.accept(lease) as execution:  # the genuine lease still works
        assert execution.fence == lease.fence


def test_a_stream_closed_before_any_frame_byte_is_session_closed_and_accepts_nothing(
    pool: Pool, pair: tuple[socket.socket, socket.socket]
) -> None:
    borrower, owner = pair
    lease = pool.reserve(pool.register(KEY, 1))
    borrower.shutdown(socket.SHUT_WR)
    with pytest.raises(SessionClosed):
        accept_session(pool, owner)
    assert _units(pool) == (1, 0)
    with pool.accept(lease) as execution:
        assert execution.fence == lease.fence


def test_frame_for_another_node_epoch_or_kind_is_refused(
    pool: Pool, fleet: Fleet, pair: tuple[socket.socket, socket.socket]
) -> None:
    borrower, owner = pair
    rid = pool.register(KEY, 4)
    lease = pool.reserve(rid)
    other_node = ResourceId(rid.kind, (rid.node + 1) % CAPACITY, rid.slot, 1, rid.epoch)
    other_epoch = ResourceId(rid.kind, rid.node, rid.slot, rid.generation, rid.epoch + 1)
    other_kind = ResourceId(9, rid.node, rid.slot, rid.generation, rid.epoch)
    cases: list[tuple[ResourceId, type[Exception]]] = [
        (other_node, NotOwnerError),
        (other_epoch, StaleError),
        (other_kind, MalformedError),
    ]
    for foreign, error in cases:
        open_session(
            Lease(foreign, lease.fence, lease.holder_node, lease.holder_incarnation), borrower
        )
        with pytest.raises(error):
            accept_session(pool, owner)
    assert _units(pool) == (1, 0)


def test_frame_from_another_fleets_pool_is_refused(
    pool: Pool, pair: tuple[socket.socket, socket.socket]
) -> None:
    borrower, owner = pair
    pool.register(KEY, 1)
    name = new_fleet_name()
    try:
        with Fleet.join(name, CAPACITY) as other_fleet, Pool(other_fleet) as other:
            foreign = other.reserve(other.register(KEY, 1))
            open_session(foreign, borrower)
            with pytest.raises((StaleError, NotOwnerError)):
                accept_session(pool, owner)
    finally:
        remove_fleet_files(name)
    assert _units(pool) == (0, 0)


def test_peer_dropping_mid_payload_does_not_free_the_unit(
    shm_pool: Pool, fleet_name: str, context: Context, tmp_path: Path
) -> None:
    rid = shm_pool.register(KEY, 1)
    path = str(tmp_path / "owner.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(30.0)
        process = context.Process(
            target=borrow, args=(fleet_name, CAPACITY, rid, path, PAYLOAD[:50])
        )
        process.start()
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(10.0)
            execution = accept_session(shm_pool, connection)
            received = connection.recv(len(PAYLOAD), socket.MSG_WAITALL)
        process.join(30.0)
    assert process.exitcode == 0
    assert len(received) == 50  # the peer is gone mid-payload
    assert _units(shm_pool) == (0, 1)  # giving up frees nothing
    execution.complete()  # only the owner's completion does
    assert _units(shm_pool) == (0, 0)


def test_async_session_round_trip_and_short_frame(pool: Pool, tmp_path: Path) -> None:
    rid = pool.register(KEY, 1)
    path = str(tmp_path / "async.sock")
    outcomes: list[object] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with await accept_session_async(pool, reader) as execution:
                outcomes.append((execution.fence, await reader.readexactly(len(PAYLOAD))))
                writer.write(b"done")
                await writer.drain()
        except MalformedError as error:
            outcomes.append(error)
        writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(serve, path)
        async with server:
            reader, writer = await asyncio.open_unix_connection(path)
            await open_session_async(pool.reserve(rid), writer, PAYLOAD)
            assert await reader.readexactly(4) == b"done"
            writer.close()
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"PSES\x01")
            writer.write_eof()
            await reader.read()
            writer.close()

    asyncio.run(main())
    assert outcomes[0] == (1, PAYLOAD)
    assert isinstance(outcomes[1], MalformedError)
    assert _units(pool) == (0, 0)
