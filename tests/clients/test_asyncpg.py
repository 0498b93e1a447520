"""The asyncpg adapter on a real PostgreSQL server: asyncpg's Pool, capped host-wide.

Every connection carries the test's ``application_name``; the server's own
``pg_stat_activity`` is the witness for the cap and for closes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import asyncpg
import pytest

from orbitive import Fleet
from orbitive.clients import (
    InvalidPoolOptions,
    PoolClosed,
    PoolOptions,
    PoolTimeout,
    UnknownClient,
)
from orbitive.clients.asyncpg import Pool, create_pool
from orbitive.clients.sqlalchemy import FleetPool

from ._sampling import ServerConnections, busy


class TaggedConnection(asyncpg.Connection):
    """A user's connection class."""


def _open(fleet: Fleet, url: str, tag: str, **kwargs: Any) -> Pool:
    options = kwargs.pop("options", PoolOptions(max_live=3, acquire_timeout=10.0))
    return create_pool(
        url, fleet=fleet, options=options, server_settings={"application_name": tag}, **kwargs
    )


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


def test_acquire_yields_real_connections_and_the_shortcuts_answer(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    async def body() -> None:
        async with _open(fleet, pg_url, tag, connection_class=TaggedConnection) as pool:
            async with pool.acquire(timeout=5.0) as conn:
                assert isinstance(conn, TaggedConnection)
                assert await conn.fetchval("SELECT 41 + 1") == 42
            conn = await pool.acquire()
            assert isinstance(conn, asyncpg.Connection)
            await pool.release(conn)
            assert await pool.fetchval("SELECT $1::int", 7) == 7
            assert [tuple(row) for row in await pool.fetch("SELECT 1 UNION SELECT 2")] == [
                (1,),
                (2,),
            ]
            assert (await pool.fetchrow("SELECT 3 AS x"))["x"] == 3
            await pool.execute("CREATE TEMP TABLE t (x int)")  # a session's own table
            await pool.executemany("SELECT $1::int", [(1,), (2,)])
            assert [r[0] for r in await pool.fetchmany("SELECT $1::int", [(5,), (6,)])] == [5, 6]
            assert pool.get_max_size() == 3
            assert pool.get_min_size() == 0
            assert pool.get_size() >= 1
            assert pool.get_idle_size() == pool.get_size()
            # The key's label: the DSN's user@host:port/database, as orbit pool shows it.
            label = pg_url.removeprefix("postgresql://")
            assert pool._clients is not None
            (row,) = [key for key in pool._clients.pool.statistics().keys if key.label == label]
            assert row.max_live == 3

    _run(body)


def test_init_setup_and_reset_hooks_run_as_asyncpg_runs_them(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    calls: list[str] = []

    async def init(conn: Any) -> None:
        calls.append("init")
        await conn.execute("SET application_name TO DEFAULT")  # reset by RESET ALL... and kept:
        await conn.execute(f"SET application_name = '{tag}'")

    async def setup(conn: Any) -> None:
        calls.append("setup")

    async def reset(conn: Any) -> None:
        calls.append(f"reset in transaction {conn.is_in_transaction()}")

    async def body() -> None:
        async with _open(fleet, pg_url, tag, init=init, setup=setup, reset=reset) as pool:
            async with pool.acquire() as conn:
                tx = conn.transaction()
                await tx.start()  # left open: rolled back before reset runs
            async with pool.acquire() as conn:
                assert not conn.is_in_transaction()
        assert calls == [
            "init",
            "setup",
            "reset in transaction False",
            "setup",
            "reset in transaction False",
        ]

    _run(body)


def test_release_resets_the_session_as_asyncpg_does(fleet: Fleet, pg_url: str, tag: str) -> None:
    async def body() -> None:
        async with _open(fleet, pg_url, tag, options=PoolOptions(max_live=1)) as pool:
            async with pool.acquire() as conn:
                await conn.execute("SET statement_timeout = 1234")
                await conn.execute("SELECT pg_advisory_lock(42)")
                pid = conn.get_server_pid()
            async with pool.acquire() as conn:
                assert conn.get_server_pid() == pid  # the same session, reset
                assert await conn.fetchval("SHOW statement_timeout") == "0"
                held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1"
                assert await conn.fetchval(held, pid) == 0

    _run(body)


def test_the_cap_holds_and_waiters_are_served_without_blocking_the_loop(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    worst = [0.0]

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.005)
            worst[0] = max(worst[0], loop.time() - start - 0.005)

    async def body() -> None:
        async with _open(fleet, pg_url, tag) as pool:

            async def one() -> None:
                async with pool.acquire() as conn:
                    await conn.execute("SELECT pg_sleep(0.01)")

            with ServerConnections(pg_url, tag) as server:
                watcher = asyncio.create_task(probe())
                await asyncio.gather(*(one() for _ in range(60)))
                watcher.cancel()
            assert 1 <= server.highest <= 3
            assert pool.statistics().in_use == 0

    _run(body)
    assert worst[0] < 0.5  # a loose bound: the FastAPI test holds the strict one


def test_cancelled_while_waiting_mid_query_or_in_the_reset_loses_no_unit(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    """Hundreds of uses cut by ``wait_for`` at random points (waiting for the cap,
    connecting, mid-query, in the reset); then every unit of max_live is back."""
    rng = random.Random(7)

    async def use(pool: Pool) -> None:
        async with pool.acquire() as conn:
            await conn.execute("SELECT pg_sleep(0.002)")

    async def body() -> None:
        async with _open(fleet, pg_url, tag, options=PoolOptions(max_live=2)) as pool:
            cut = 0
            for _ in range(12):
                uses = [asyncio.wait_for(use(pool), rng.uniform(0.0005, 0.02)) for _ in range(20)]
                for result in await asyncio.gather(*uses, return_exceptions=True):
                    if isinstance(result, asyncio.TimeoutError):
                        cut += 1
                    elif result is not None:
                        raise result
            assert cut > 50
            deadline = time.monotonic() + 10
            while busy(pool.statistics()) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert pool.statistics().in_use == 0
            held = [await pool.acquire(timeout=5.0) for _ in range(2)]  # max_live at once
            for conn in held:
                await pool.release(conn)

    _run(body)


def test_connections_retired_by_the_upkeep_thread_close_on_their_own_loop(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    """The upkeep thread refills min_idle and retires idle connections past idle_timeout:
    each opens and closes on the pool's loop (the server sees them come and go)."""
    options = PoolOptions(max_live=3, min_idle=2, max_idle=3, idle_timeout=0.3)

    async def body() -> None:
        async with _open(fleet, pg_url, tag, options=options) as pool:
            with ServerConnections(pg_url, tag) as server:
                deadline = time.monotonic() + 10
                while server.count() < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert server.count() == 2  # the warm floor, opened by the upkeep thread
                async with pool.acquire() as a, pool.acquire() as b, pool.acquire() as c:
                    assert [await x.fetchval("SELECT 1") for x in (a, b, c)] == [1, 1, 1]
                deadline = time.monotonic() + 10
                while server.count() > 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert server.count() == 2  # the third, idle past idle_timeout, closed
            assert pool.statistics().close_errors_count == 0

    _run(body)


def test_terminate_and_close_give_every_unit_back(fleet: Fleet, pg_url: str, tag: str) -> None:
    async def body() -> None:
        pool = await _open(fleet, pg_url, tag)
        held = await pool.acquire()
        async with pool.acquire():
            pass
        pool.terminate()
        assert held.is_closed()
        await pool.release(held)  # a no-op after terminate
        with pytest.raises(PoolClosed):
            await pool.acquire()
        other = await _open(fleet, pg_url, tag)
        deadline = time.monotonic() + 10
        while other.get_size() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert other.get_size() == 0
        held = await other.acquire()
        closing = asyncio.create_task(other.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # close waits for the release
        await other.release(held)
        await closing
        assert other.is_closing()

    _run(body)


def test_errors_keep_asyncpg_types_and_the_pool_names_its_own(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    async def body() -> None:
        missing = pg_url.rsplit("/", 1)[0] + "/no_such_database"
        async with _open(fleet, missing, tag) as pool:
            with pytest.raises(asyncpg.InvalidCatalogNameError):
                await pool.fetchval("SELECT 1")
            assert pool.statistics().live == 0  # the claim went back

        async def failing_setup(conn: Any) -> None:
            raise ValueError("setup")

        async with _open(fleet, pg_url, tag, setup=failing_setup) as pool:
            with pytest.raises(ValueError, match="setup"):
                await pool.fetchval("SELECT 1")
            assert pool.statistics().in_use == 0
        options = PoolOptions(max_live=1, acquire_timeout=0.2)
        async with _open(fleet, pg_url, tag, options=options) as pool:
            async with pool.acquire():
                with pytest.raises(PoolTimeout):
                    await pool.acquire()
                with pytest.raises(TimeoutError):  # as asyncio.wait_for raises it
                    await pool.acquire(timeout=0.05)
            with pytest.raises(UnknownClient):
                await pool.release(object())
        unopened = _open(fleet, pg_url, tag)
        with pytest.raises(PoolClosed, match="await"):
            await unopened.fetchval("SELECT 1")

    _run(body)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"min_size": 2}, "PoolOptions(min_idle=...)"),
        ({"max_size": 10}, "PoolOptions(max_live=...)"),
        ({"init_size": 1}, "PoolOptions(min_idle=...)"),
        ({"max_inactive_connection_lifetime": 60.0}, "PoolOptions(idle_timeout=...)"),
        ({"loop": None}, "loop"),
        ({"no_such_argument": 1}, "no_such_argument"),
        ({"connection_class": object}, "connection_class"),
        ({"record_class": dict}, "record_class"),
        ({"max_queries": 0}, "max_queries"),
        ({"setup": "not callable"}, "setup"),
        ({"options": {"max_live": 4}}, "options"),
    ],
)
def test_bad_input_is_a_named_error_at_start_up(
    fleet: Fleet, pg_url: str, arguments: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidPoolOptions) as caught:
        create_pool(pg_url, fleet=fleet, **arguments)
    assert named in str(caught.value)


@pytest.mark.parametrize("dsn", ["mysql://app@db/main", "postgresql://[::1", "\0", 42])
def test_a_dsn_that_is_no_postgresql_url_is_refused(fleet: Fleet, dsn: Any) -> None:
    with pytest.raises(InvalidPoolOptions):
        create_pool(dsn, fleet=fleet)


def test_one_database_is_one_key_whatever_the_api_or_spelling(fleet: Fleet) -> None:
    def key(dsn: str | None, **kwargs: Any) -> object:
        return create_pool(dsn, fleet=fleet, **kwargs)._key

    base = key("postgresql://app:secret@db:5432/main")
    assert key("postgres://app@db/main?statement_cache_size=0") == base  # port 5432 by default
    assert key(None, host="db", user="app", database="main", password="x") == base
    assert key("postgresql://db/other", user="app", database="main") == base  # arguments win
    assert key("postgresql:///main?host=db&user=app") == base
    assert key("postgresql://app@db/main", server_settings={"application_name": "x"}) == base
    assert key("postgresql://app@db:5433/main") != base
    assert key("postgresql://other@db/main") != base
    from sqlalchemy import create_engine  # noqa: PLC0415 - the key is shared with SQLAlchemy

    engine = create_engine("postgresql+psycopg://app@db/main", poolclass=FleetPool, fleet=fleet)
    assert cast(FleetPool, engine.pool).clients.key == base
    engine.dispose()
