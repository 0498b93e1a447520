"""What a driver reads through transaction mode's relay equals what it reads on a direct
connection: values of every common type, descriptions, row counts, errors with their
classes and SQLSTATEs, notices, ``COPY`` both ways and server-side cursors.

Each scenario runs on a direct connection and on one through
:class:`._deciding_relay.DecidingRelay` with three server connections taken in turn
(so the statements psycopg prepares and the unnamed ones asyncpg binds land on
connections they were not parsed on), and the two observations must be equal.
Transaction mode passes the server's messages on whole: the driver decodes them
itself, with its own loaders and its own exception classes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import psycopg
import pytest

from .._servers import TempPostgres
from ._deciding_relay import DecidingRelay

EVERY_TYPE = """SELECT
    42::int2, 2147483647::int4, 9007199254740993::int8, 1.5::float4, 2.25::float8,
    12345678901234567890.123456789::numeric, true, 'text é ✓'::text, 'x'::char(3),
    '2026-12-05'::date, '12:34:56.789'::time, '2026-12-05 12:34:56.789+05:30'::timestamptz,
    '2026-12-05 12:34:56'::timestamp, '1 day 02:03:04'::interval,
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, '{"a": [1, 2, null]}'::json,
    '{"b": {"c": 1.5}}'::jsonb, ARRAY[1, NULL, 3]::int[], ARRAY['x', 'y z']::text[],
    '\\x00ff10'::bytea, NULL::int, NULL::text, '192.168.0.1/24'::inet"""
SERVERS = 3


@pytest.fixture
def conninfos(postgres_server: TempPostgres) -> Iterator[Callable[[str], str]]:
    """``conninfos("direct")`` and ``conninfos("relay")``: libpq strings to the server,
    and through a new relay (at the end: joined, its errors raised, and every one of
    its server connections shown to have served)."""
    relays: list[DecidingRelay] = []

    def conninfo(path: str) -> str:
        if path == "direct":
            return (
                f"host=127.0.0.1 port={postgres_server.port} user=postgres dbname=postgres"
                " sslmode=disable"
            )
        relays.append(DecidingRelay(("127.0.0.1", postgres_server.port), servers=SERVERS))
        return relays[-1].conninfo()

    yield conninfo
    for relay in relays:
        relay.join()
        assert set(relay.used) == set(range(SERVERS)), "a server connection served nothing"


def _error(call: Callable[[], object]) -> tuple[str, str | None, str]:
    try:
        call()
    except psycopg.Error as error:
        return type(error).__name__, error.sqlstate, str(error).splitlines()[0]
    raise AssertionError("no error")


def _psycopg_scenario(conninfo: str) -> list[Any]:
    seen: list[Any] = []
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
        for _ in range(3):  # prepared after the first, on every connection in turn
            cursor = conn.execute(EVERY_TYPE)
            seen.append(cursor.fetchone())
            seen.append([(c.name, c.type_code) for c in cursor.description or ()])
        conn.execute("CREATE TABLE IF NOT EXISTS fidelity (n int PRIMARY KEY, s text)")
        conn.execute("TRUNCATE fidelity")
        with conn.cursor() as cursor, cursor.copy("COPY fidelity FROM STDIN") as copy:
            for n in range(5):
                copy.write_row((n, f"row {n}"))
        seen.append(conn.execute("UPDATE fidelity SET s = s || '!' WHERE n < 3").rowcount)
        with conn.cursor() as cursor, cursor.copy("COPY fidelity TO STDOUT") as copy:
            seen.append(sorted(bytes(block) for block in copy))
        seen.append(_error(lambda: conn.execute("INSERT INTO fidelity VALUES (1, 'again')")))
        seen.append(_error(lambda: conn.execute("SELECT 1 / %s", (0,))))
        seen.append(_error(lambda: conn.execute("SELEC 1")))
        conn.execute("DO $$ BEGIN RAISE NOTICE 'careful: %', 7; END $$")
        seen.append(notices)
        with conn.transaction(), conn.cursor(name="server_side") as cursor:
            cursor.execute("SELECT n, s FROM fidelity ORDER BY n")
            seen.append([cursor.fetchmany(2), cursor.fetchall()])
        conn.execute("DROP TABLE fidelity")
    return seen


def test_psycopg_reads_through_the_relay_what_it_reads_directly(
    conninfos: Callable[[str], str],
) -> None:
    direct = _psycopg_scenario(conninfos("direct"))
    assert _psycopg_scenario(conninfos("relay")) == direct
    assert direct[-2] == ["careful: 7"]


async def _asyncpg_scenario(conninfo: str, cache: int) -> list[Any]:
    fields = dict(field.split("=", 1) for field in conninfo.split())
    conn = await asyncpg.connect(
        host=fields["host"],
        port=int(fields["port"]),
        user="postgres",
        database="postgres",
        ssl=False,
        statement_cache_size=cache,
    )
    seen: list[Any] = []
    try:
        for _ in range(3):
            row = await conn.fetchrow(EVERY_TYPE)
            assert row is not None
            seen.append(tuple(row.values()))
        await conn.execute("CREATE TABLE IF NOT EXISTS fidelity_a (n int PRIMARY KEY)")
        await conn.copy_records_to_table("fidelity_a", records=[(n,) for n in range(4)])
        seen.append(await conn.fetch("SELECT n FROM fidelity_a ORDER BY n"))
        for statement in ("INSERT INTO fidelity_a VALUES (1)", "SELECT 1 / 0"):
            try:
                await conn.execute(statement)
            except asyncpg.PostgresError as error:
                seen.append((type(error).__name__, error.sqlstate))
        async with conn.transaction():
            cursor = await conn.cursor("SELECT n FROM fidelity_a ORDER BY n")
            seen.append([await cursor.fetch(3), await cursor.fetch(3)])
        await conn.execute("DROP TABLE fidelity_a")
    finally:
        await conn.close()
    return seen


@pytest.mark.parametrize("cache", [100, 0], ids=["statement cache", "no cache"])
def test_asyncpg_reads_through_the_relay_what_it_reads_directly(
    conninfos: Callable[[str], str], cache: int
) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        direct = await _asyncpg_scenario(conninfos("direct"), cache)
        return direct, await _asyncpg_scenario(conninfos("relay"), cache)

    direct, relayed = asyncio.run(asyncio.wait_for(both(), 60))
    assert relayed == direct
    assert ("UniqueViolationError", "23505") in direct
