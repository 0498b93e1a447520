"""Transaction mode's router answers a driver's startup itself and serves it on server
connections libpq opened, through their sockets.

The first packet is read on bytes (:func:`~orbitive.clients._startup.read_first_packet`).
Then real drivers connect to :class:`._deciding_relay.DecidingRelay` given psycopg
connections (``handover``): it answers the startup with the reported parameters
libpq holds, takes the connections' sockets, and serves the drivers' transactions
on them in turn, as the router will with the server connections it is handed.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest

from orbitive.clients import _startup
from orbitive.clients._client_state import Outcome, restore_query
from orbitive.clients._startup import Cancel, EncryptionRequest, Startup, read_first_packet
from orbitive.pool import MalformedError

from .._servers import TempPostgres
from ._deciding_relay import DecidingRelay


def _packet(code: int, body: bytes = b"") -> bytes:
    return struct.pack("!II", len(body) + 8, code) + body


STARTUP = _packet(_startup.PROTOCOL_3, b"user\0app\0database\0shop\0application_name\0w1\0\0")


def test_each_first_packet_is_read_whole_and_only_whole() -> None:
    for data, packet in [
        (STARTUP, Startup({b"user": b"app", b"database": b"shop", b"application_name": b"w1"})),
        (_packet(_startup.SSL_REQUEST), EncryptionRequest(_startup.SSL_REQUEST)),
        (_packet(_startup.GSSENC_REQUEST), EncryptionRequest(_startup.GSSENC_REQUEST)),
        (_packet(_startup.CANCEL_REQUEST, struct.pack("!ii", 42, -7)), Cancel(42, -7)),
    ]:
        assert read_first_packet(data + b"Q...") == (packet, len(data))
        assert all(read_first_packet(data[:end]) is None for end in range(len(data)))


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("!II", 7, _startup.PROTOCOL_3),
        struct.pack("!II", 10001, _startup.PROTOCOL_3),
        _packet(2 << 16, b"user\0app\0\0"),
        _packet((3 << 16) | 2, b"user\0app\0\0"),
        _packet(_startup.PROTOCOL_3, b"user\0app\0"),
        _packet(_startup.PROTOCOL_3, b"user\0app"),
        _packet(_startup.SSL_REQUEST, b"x"),
        _packet(_startup.CANCEL_REQUEST, b"\0\0\0\1"),
    ],
    ids=[
        "length 7",
        "length 10001",
        "protocol 2",
        "protocol 3.2",
        "no terminator",
        "cut value",
        "request with a body",
        "short cancel",
    ],
)
def test_a_malformed_first_packet_is_named(data: bytes) -> None:
    with pytest.raises(MalformedError):
        read_first_packet(data)


def test_a_startup_for_another_role_database_or_setting_is_refused() -> None:
    def refusal(parameters: dict[bytes, bytes]) -> str | None:
        return _startup.refusal(
            Startup(parameters),
            user="app",
            database="shop",
            fixed={b"search_path": b"shop"},
            tracked=frozenset({b"application_name"}),
        )

    base = {b"user": b"app", b"database": b"shop"}
    assert refusal(base) is None
    assert refusal({**base, b"application_name": b"any", b"options": b""}) is None
    assert refusal({**base, b"search_path": b"shop"}) is None
    assert refusal({b"user": b"app"}) == "this router serves database 'shop' only"
    assert refusal({**base, b"user": b"root"}) == "this router serves role 'app' only"
    for name, value in [
        (b"search_path", b"public"),
        (b"replication", b"true"),
        (b"options", b"-c x=1"),
    ]:
        assert f"startup parameter {name.decode()!r}" in (refusal({**base, name: value}) or "")


@pytest.fixture
def server_connections(postgres_server: TempPostgres) -> Iterator[list[psycopg.Connection]]:
    url = postgres_server.url + "?sslmode=disable"
    conns = [psycopg.connect(url, autocommit=True) for _ in range(3)]
    yield conns
    for conn in conns:
        conn.close()


def test_psycopg_is_served_on_the_sockets_of_connections_libpq_opened(
    server_connections: list[psycopg.Connection],
) -> None:
    relay = DecidingRelay(("", 0), handover=server_connections)
    pids = {conn.info.backend_pid for conn in server_connections}
    with psycopg.connect(relay.conninfo(), autocommit=True) as conn:
        assert conn.info.server_version == server_connections[0].info.server_version
        assert conn.info.parameter_status("TimeZone") is not None
        seen = {conn.execute("SELECT pg_backend_pid()").fetchone() for _ in range(6)}
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1 AS x")
            assert conn.execute("SELECT x FROM t").fetchone() == (1,)
    relay.join()
    assert seen == {
        (pid,) for pid in pids
    }  # every transaction on a handed-over connection, all of them used
    for server in server_connections:  # and libpq's connections still work afterwards
        assert server.execute("SELECT 1").fetchone() == (1,)


def test_asyncpg_is_served_by_the_routers_own_startup(
    server_connections: list[psycopg.Connection],
) -> None:
    relay = DecidingRelay(("", 0), handover=server_connections)

    async def body() -> set[int]:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=relay.port, user="postgres", database="postgres", ssl=False
        )
        try:
            return {await conn.fetchval("SELECT pg_backend_pid()") for _ in range(6)}
        finally:
            await conn.close()

    seen = asyncio.run(asyncio.wait_for(body(), 30))
    relay.join()
    assert seen == {conn.info.backend_pid for conn in server_connections}


def test_a_refused_startup_reaches_the_driver_as_a_fatal_error(
    server_connections: list[psycopg.Connection],
) -> None:
    relay = DecidingRelay(("", 0), handover=server_connections)
    with pytest.raises(psycopg.OperationalError, match="this router serves role 'postgres' only"):
        psycopg.connect(relay.conninfo(user="intruder"))
    relay.join()


def test_a_client_keeps_its_tracked_settings_on_every_connection(
    server_connections: list[psycopg.Connection],
) -> None:
    """A connection that another client left with another time zone serves this client
    with its own, and a setting this client makes follows it to every connection."""
    server_connections[1].execute("SET TimeZone = 'America/Lima'")
    server_connections[2].execute("SET application_name = $$it's $orb0$ here$$")
    own = server_connections[0].info.parameter_status("TimeZone")
    relay = DecidingRelay(("", 0), handover=server_connections)
    with psycopg.connect(relay.conninfo(), autocommit=True) as conn:
        before = {conn.execute("SHOW TimeZone").fetchone() for _ in range(3)}
        conn.execute("SET TimeZone = 'Asia/Tokyo'")
        conn.execute("SET application_name = 'mine'")
        both = "SELECT current_setting('TimeZone'), current_setting('application_name')"
        after = {conn.execute(both).fetchone() for _ in range(6)}
    relay.join()
    assert before == {(own,)}
    assert after == {("Asia/Tokyo", "mine")}
    assert set(relay.used) == {0, 1, 2}
    assert all(end.outcome is Outcome.RELEASE for end in relay.ends)


def test_a_setting_value_is_quoted_whatever_it_holds() -> None:
    query = restore_query({b"application_name": b"a $orb0$ b'c"}, {})
    assert query == b"SELECT set_config('application_name', $orb1$a $orb0$ b'c$orb1$, false)"
    assert restore_query({b"TimeZone": b"UTC"}, {b"TimeZone": b"UTC"}) is None
