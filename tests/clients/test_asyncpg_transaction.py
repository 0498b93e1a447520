"""``options=PoolOptions(mode="transaction")`` in the asyncpg pool: the user's code is
unchanged, its connections go to the process's router, and ``max_live`` counts the
server connections its transactions share.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import uuid

import asyncpg
import pytest

from orbitive import Fleet
from orbitive.clients import Budget, InvalidPoolOptions, PoolOptions
from orbitive.clients.asyncpg import create_pool

from .._servers import TempPostgres
from ._router_pool import cancel_while_a_router_starts, sessions, until
from ._sampling import ServerConnections

ROUNDS = 15
TASKS = 6


def _tagged(server: TempPostgres, tag: str) -> str:
    """The server's URL whose sessions carry ``tag`` (the router's server connections)."""
    return f"{server.url}?application_name={tag}"


def test_tasks_share_max_live_and_every_transaction_lands(
    fleet: Fleet, postgres_server: TempPostgres, writes: str
) -> None:
    options = PoolOptions(max_live=2, mode="transaction")

    async def body() -> list[tuple[int, int]]:
        async with create_pool(
            _tagged(postgres_server, writes), fleet=fleet, options=options
        ) as pool:

            async def work(worker: int) -> None:
                for n in range(ROUNDS):
                    async with pool.acquire() as conn, conn.transaction():
                        insert = f'INSERT INTO "{writes}" (worker, n) VALUES ($1, $2)'
                        await conn.execute(insert, worker, n)
                        assert await conn.fetchval("SELECT $1::int + 1", n) == n + 1

            await asyncio.gather(*(work(worker) for worker in range(TASKS)))
            rows = await pool.fetch(f'SELECT DISTINCT worker, n FROM "{writes}"')
        return [(row["worker"], row["n"]) for row in rows]

    with ServerConnections(postgres_server.url, writes) as server:
        rows = asyncio.run(asyncio.wait_for(body(), 60))
    assert sorted(rows) == [(w, n) for w in range(TASKS) for n in range(ROUNDS)]
    assert 1 <= server.highest <= 2
    until(lambda: sessions(postgres_server, writes) == 0)  # the pool closed its router's


def test_an_open_cancelled_while_the_router_starts_gives_it_back(
    fleet: Fleet, postgres_server: TempPostgres, tag: str
) -> None:
    """The router a cancelled first open started stops (its server connection closes);
    the pool opens anew at the next await and serves."""
    options = PoolOptions(max_live=1, mode="transaction")

    async def body() -> int:
        pool = create_pool(_tagged(postgres_server, tag), fleet=fleet, options=options)
        await cancel_while_a_router_starts(pool)
        await asyncio.to_thread(until, lambda: sessions(postgres_server, tag) == 0)
        async with pool:
            return int(await pool.fetchval("SELECT 1"))

    assert asyncio.run(asyncio.wait_for(body(), 60)) == 1
    until(lambda: sessions(postgres_server, tag) == 0)


def test_types_round_trip_through_the_router(
    fleet: Fleet, postgres_server: TempPostgres, tag: str
) -> None:
    values = (
        datetime.datetime(2026, 12, 7, 11, 53, 16, 123456, tzinfo=datetime.timezone.utc),
        decimal.Decimal("12345.678900"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        '{"a": [1, 2, null]}',
        [1, 2, 3],
        b"\x00\xffbytes",
        None,
    )
    query = (
        "SELECT $1::timestamptz, $2::numeric, $3::uuid, $4::jsonb, $5::int[], $6::bytea, $7::text"
    )

    async def body() -> tuple[tuple[object, ...], tuple[object, ...]]:
        options = PoolOptions(max_live=1, mode="transaction")
        async with create_pool(_tagged(postgres_server, tag), fleet=fleet, options=options) as pool:
            routed = await pool.fetchrow(query, *values)
        direct = await asyncpg.connect(postgres_server.url)
        try:
            own = await direct.fetchrow(query, *values)
        finally:
            await direct.close()
        assert routed is not None and own is not None
        return tuple(routed), tuple(own)

    routed, own = asyncio.run(asyncio.wait_for(body(), 60))
    assert routed == own
    assert routed[:3] == values[:3] and routed[4:] == values[4:]


def test_transaction_mode_refuses_a_connect_callback_and_a_budget(
    fleet: Fleet, postgres_server: TempPostgres
) -> None:
    options = PoolOptions(mode="transaction")

    async def connect(*args: object, **kwargs: object) -> asyncpg.Connection:
        raise AssertionError("never called")

    with pytest.raises(InvalidPoolOptions, match="connect"):
        create_pool(postgres_server.url, fleet=fleet, options=options, connect=connect)
    budget = Budget(postgres_server.url, "asyncpg-transaction-mode", total=2)
    with pytest.raises(InvalidPoolOptions, match="budget"):
        create_pool(postgres_server.url, fleet=fleet, options=options, budget=budget)


def test_session_state_pins_the_connection_or_is_refused_by_name(
    fleet: Fleet, postgres_server: TempPostgres, tag: str
) -> None:
    url = _tagged(postgres_server, tag)
    pinning = PoolOptions(max_live=2, mode="transaction")
    refusing = PoolOptions(max_live=2, mode="transaction", on_session_state="refuse")

    async def pins() -> None:
        pool = await create_pool(url, fleet=fleet, options=pinning)
        async with pool, pool.acquire() as pinned:
            await pinned.execute("SET search_path TO pinned_path")  # outlives a transaction
            pid = await pinned.fetchval("SELECT pg_backend_pid()")
            for _ in range(3):  # other transactions run on the other server connection
                async with pool.acquire() as other:
                    row = await other.fetchrow(
                        "SELECT pg_backend_pid(), current_setting('search_path')"
                    )
                    assert row is not None and row[0] != pid and row[1] != "pinned_path"
            assert await pinned.fetchval("SELECT pg_backend_pid()") == pid
            assert await pinned.fetchval("SHOW search_path") == "pinned_path"

    async def refuses() -> None:
        pool = await create_pool(url, fleet=fleet, options=refusing)
        async with pool, pool.acquire() as conn:
            with pytest.raises(asyncpg.FeatureNotSupportedError, match="LISTEN") as refused:
                await conn.execute("LISTEN news")
            assert refused.value.sqlstate == "0A000"
            assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0

    asyncio.run(asyncio.wait_for(pins(), 60))
    asyncio.run(asyncio.wait_for(refuses(), 60))
