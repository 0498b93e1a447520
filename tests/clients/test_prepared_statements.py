"""Prepared statements in transaction mode: a statement a driver prepared in one
transaction works in the next, on another server connection.

Real drivers run through :class:`._deciding_relay.DecidingRelay` with three server
connections that the transactions take in turn, so nearly every statement is used on
a connection it was not parsed on: psycopg preparing every query
(``prepare_threshold=0``), in autocommit, in transactions and in a pipeline with an
error in it; asyncpg with its statement cache, with a cache of one (which closes
statements), and with none (the unnamed statement parsed in one transaction and
bound in the next). :class:`~orbitive.clients._server_statements.ServerStatements`
is also tested on messages alone, for the answers the router writes itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import psycopg
import pytest

from orbitive.clients import _wire
from orbitive.clients._server_statements import ServerStatements
from orbitive.clients._statement_names import StatementNames
from orbitive.clients._wire import Message

from .._servers import TempPostgres
from ._deciding_relay import DecidingRelay

SERVERS = 3


def _relay(server: TempPostgres, max_prepared: int = 256) -> DecidingRelay:
    return DecidingRelay(("127.0.0.1", server.port), servers=SERVERS, max_prepared=max_prepared)


def _every_connection_served(relay: DecidingRelay) -> None:
    relay.join()
    assert set(relay.used) == set(range(SERVERS))


def _parse(name: bytes, text: bytes) -> Message:
    return Message(_wire.PARSE, name + b"\0" + text + b"\0\0\0")


def test_a_parse_already_prepared_is_answered_at_once_even_before_a_flush() -> None:
    """The router writes the ParseComplete itself when no server answer precedes it: a
    driver that sends Parse and Flush and waits is answered."""
    names, statements = StatementNames(), ServerStatements()
    to_server, now = statements.send(names.op(_parse(b"a", b"SELECT 1")))
    assert [m.kind for m in to_server] == [_wire.PARSE] and now == []
    assert statements.answer(Message(_wire.PARSE_COMPLETE, b"")) == [
        Message(_wire.PARSE_COMPLETE, b"")
    ]
    to_server, now = statements.send(names.op(_parse(b"b", b"SELECT 1")))
    assert to_server == [] and now == [Message(_wire.PARSE_COMPLETE, b"")]


def test_answers_the_router_writes_keep_their_place_among_the_servers() -> None:
    names, statements = StatementNames(), ServerStatements()
    statements.send(names.op(_parse(b"a", b"SELECT 1")))
    statements.send(names.op(Message(_wire.SYNC, b"")))
    statements.send(names.op(_parse(b"b", b"SELECT 1")))  # prepared already (as "a")
    bind = Message(_wire.BIND, b"\0b\0\0\0\0\0\0\0")
    _, now = statements.send(names.op(bind))
    assert now == []  # the ParseComplete of "a" is still owed by the server
    answers = [
        Message(_wire.PARSE_COMPLETE, b""),
        _wire.ready_for_query(_wire.IDLE),
        Message(_wire.BIND_COMPLETE, b""),
    ]
    out = [message for answer in answers for message in statements.answer(answer)]
    assert [m.kind for m in out] == [
        _wire.PARSE_COMPLETE,
        _wire.READY_FOR_QUERY,
        _wire.PARSE_COMPLETE,  # the router's, for "b"
        _wire.BIND_COMPLETE,
    ]


def test_psycopg_prepared_statements_work_on_every_connection(
    postgres_server: TempPostgres,
) -> None:
    relay = _relay(postgres_server)
    with psycopg.connect(relay.conninfo(), autocommit=True, prepare_threshold=0) as conn:
        for value in range(12):
            assert conn.execute("SELECT %s::int + 1", (value,)).fetchone() == (value + 1,)
            assert conn.execute("SELECT %s::text || 'x'", (str(value),)).fetchone() == (
                f"{value}x",
            )
    _every_connection_served(relay)
    assert all(len(statements.prepared) == 2 for statements in relay.statements)


def test_psycopg_transactions_use_statements_prepared_elsewhere(
    postgres_server: TempPostgres,
) -> None:
    relay = _relay(postgres_server)
    with psycopg.connect(relay.conninfo(), prepare_threshold=0) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS prepared_rows (n int)")
        conn.execute("TRUNCATE prepared_rows")
        conn.commit()
        for value in range(9):
            with conn.transaction():
                conn.execute("INSERT INTO prepared_rows VALUES (%s)", (value,))
                conn.execute("INSERT INTO prepared_rows VALUES (%s)", (value + 100,))
        rows = conn.execute("SELECT n FROM prepared_rows ORDER BY n").fetchall()
        conn.commit()
        assert [row[0] for row in rows] == [*range(9), *range(100, 109)]
        conn.execute("DROP TABLE prepared_rows")
        conn.commit()
    _every_connection_served(relay)


def test_a_psycopg_pipeline_with_an_error_in_it_prepares_nothing_it_skipped(
    postgres_server: TempPostgres,
) -> None:
    """After an error the server skips every message up to Sync: the statements those
    would have prepared must be parsed again where they are next used."""
    relay = _relay(postgres_server)
    with psycopg.connect(relay.conninfo(), autocommit=True, prepare_threshold=0) as conn:
        for round_ in range(6):
            with pytest.raises(psycopg.errors.DivisionByZero), conn.pipeline():
                conn.execute("SELECT %s::int / 0", (round_,))
                conn.execute("SELECT %s::int * 7", (round_,))
            with conn.pipeline():
                cursors = [conn.execute("SELECT %s::int * 7", (n,)) for n in range(3)]
            assert [cursor.fetchone() for cursor in cursors] == [(0,), (7,), (14,)]
    _every_connection_served(relay)


def test_a_full_statement_cache_closes_the_least_recently_used(
    postgres_server: TempPostgres,
) -> None:
    relay = _relay(postgres_server, max_prepared=2)
    with psycopg.connect(relay.conninfo(), autocommit=True, prepare_threshold=0) as conn:
        for value in range(10):
            for offset in range(5):
                query = f"SELECT %s::int + {offset}"
                assert conn.execute(query, (value,)).fetchone() == (value + offset,)
        on_server = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    _every_connection_served(relay)
    assert on_server is not None and on_server[0] <= 2
    assert all(len(statements.prepared) <= 2 for statements in relay.statements)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.parametrize("cache", [100, 1, 0], ids=["statement cache", "cache of one", "no cache"])
def test_asyncpg_statements_work_on_every_connection(
    postgres_server: TempPostgres, cache: int
) -> None:
    relay = _relay(postgres_server)

    async def body() -> None:
        conn = await asyncpg.connect(
            host="127.0.0.1",
            port=relay.port,
            user="postgres",
            database="postgres",
            ssl=False,
            statement_cache_size=cache,
        )
        try:
            for value in range(9):
                assert await conn.fetchval("SELECT $1::int + 1", value) == value + 1
                assert await conn.fetchval("SELECT $1::text || 'y'", str(value)) == f"{value}y"
            statement = await conn.prepare("SELECT $1::int * 3")
            assert [await statement.fetchval(n) for n in range(4)] == [0, 3, 6, 9]
            async with conn.transaction():
                assert await statement.fetchval(5) == 15
        finally:
            await conn.close()

    _run(body)
    _every_connection_served(relay)


def test_an_eviction_the_server_skipped_after_an_error_keeps_the_statement() -> None:
    """A full cache closes its oldest statement before a new one; when an error earlier
    in the same Sync makes the server skip that Close, the statement is still
    prepared, and is neither parsed again (42P05) nor closed twice."""
    names, statements = StatementNames(), ServerStatements(max_prepared=1)
    statements.send(names.op(_parse(b"a", b"SELECT 1")))
    statements.send(names.op(Message(_wire.SYNC, b"")))
    for answer in (Message(_wire.PARSE_COMPLETE, b""), _wire.ready_for_query(_wire.IDLE)):
        statements.answer(answer)
    old = next(iter(statements.prepared))
    failing = Message(_wire.EXECUTE, b"\0\0\0\0\0")  # fails: no portal
    statements.send(names.op(failing))
    to_server, _ = statements.send(names.op(_parse(b"b", b"SELECT 2")))
    assert [m.kind for m in to_server] == [_wire.CLOSE, _wire.PARSE]  # the eviction
    statements.send(names.op(Message(_wire.SYNC, b"")))
    statements.answer(_wire.error_response("ERROR", "34000", "portal does not exist"))
    statements.answer(_wire.ready_for_query(_wire.IDLE))
    assert statements.prepared == {old}  # skipped: still there, the new one is not
    to_server, now = statements.send(names.op(_parse(b"c", b"SELECT 1")))
    assert to_server == [] and now == [Message(_wire.PARSE_COMPLETE, b"")]
