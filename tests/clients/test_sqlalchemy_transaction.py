"""``fleet_options=PoolOptions(mode="transaction")`` in the SQLAlchemy pools: the engine's
code is unchanged, its connections go to the process's router, and ``max_live`` counts
the server connections its transactions share (``postgresql+psycopg``, sync and asyncio).
"""

from __future__ import annotations

import asyncio
import os
import threading

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from orbitive import Fleet
from orbitive.clients import Budget, InvalidPoolOptions, PoolOptions
from orbitive.clients.sqlalchemy import AsyncFleetPool, FleetPool

from .._processes import Channel, Processes
from .._servers import TempPostgres
from ._router_pool import cancel_while_a_router_starts, sessions, until
from ._sampling import ServerConnections

ROUNDS = 15
WORKERS = 6
#: Every how many rounds a worker also writes a row in a savepoint it rolls back.
SAVEPOINT_EVERY = 3


def _url(server: TempPostgres, driver: str = "psycopg") -> str:
    return server.url.replace("postgresql://", f"postgresql+{driver}://")


def _async_engine(fleet: Fleet, server: TempPostgres, tag: str, max_live: int) -> AsyncEngine:
    """An async engine in transaction mode, its server connections tagged ``tag``."""
    return create_async_engine(
        _url(server),
        connect_args={"application_name": tag},
        poolclass=AsyncFleetPool,
        fleet=fleet,
        fleet_options=PoolOptions(max_live=max_live, mode="transaction"),
    )


def _insert(writes: str) -> sqlalchemy.TextClause:
    return sqlalchemy.text(f'INSERT INTO "{writes}" VALUES (:worker, :n, :kept)')


def _rows(server: TempPostgres, writes: str) -> tuple[int, int]:
    """(rows kept, distinct; rows written in a rolled-back savepoint)."""
    with psycopg.connect(server.url) as conn:
        row = conn.execute(
            f"SELECT count(DISTINCT (worker, n)) FILTER (WHERE kept), "
            f'count(*) FILTER (WHERE NOT kept) FROM "{writes}"'
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_threads_of_a_sync_engine_share_max_live_and_savepoints_roll_back(
    fleet: Fleet, postgres_server: TempPostgres, writes: str
) -> None:
    engine = sqlalchemy.create_engine(
        _url(postgres_server),
        connect_args={"application_name": writes},
        poolclass=FleetPool,
        fleet=fleet,
        fleet_options=PoolOptions(max_live=2, mode="transaction"),
    )
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for n in range(ROUNDS):
                with engine.begin() as conn:  # one transaction, on one server connection
                    conn.execute(_insert(writes), {"worker": worker, "n": n, "kept": True})
                    if n % SAVEPOINT_EVERY == 0:
                        savepoint = conn.begin_nested()
                        conn.execute(_insert(writes), {"worker": worker, "n": n, "kept": False})
                        savepoint.rollback()
        except BaseException as error:
            errors.append(error)

    with ServerConnections(postgres_server.url, writes) as server:
        threads = [threading.Thread(target=work, args=(worker,)) for worker in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert _rows(postgres_server, writes) == (WORKERS * ROUNDS, 0)
    assert 1 <= server.highest <= 2
    pool = engine.pool
    assert isinstance(pool, FleetPool)
    assert pool.clients.label.endswith("(router clients)")
    engine.dispose()  # the last pool of the key: its router and server connections go
    until(lambda: sessions(postgres_server, writes) == 0)


def test_tasks_of_an_async_engine_share_max_live(
    fleet: Fleet, postgres_server: TempPostgres, writes: str
) -> None:
    async def body() -> None:
        engine = _async_engine(fleet, postgres_server, writes, 2)

        async def work(worker: int) -> None:
            for n in range(ROUNDS):
                async with engine.begin() as conn:
                    await conn.execute(_insert(writes), {"worker": worker, "n": n, "kept": True})
                    await conn.execute(sqlalchemy.text("SELECT pg_sleep(0.001)"))

        try:
            await asyncio.gather(*(work(worker) for worker in range(WORKERS)))
        finally:
            await engine.dispose()

    with ServerConnections(postgres_server.url, writes) as server:
        asyncio.run(asyncio.wait_for(body(), 60))
    assert _rows(postgres_server, writes) == (WORKERS * ROUNDS, 0)
    assert 1 <= server.highest <= 2
    until(lambda: sessions(postgres_server, writes) == 0)


def test_a_first_checkout_cancelled_while_the_router_starts_gives_it_back(
    fleet: Fleet, postgres_server: TempPostgres, tag: str
) -> None:
    """The router a cancelled first checkout of an async engine started stops (its server
    connection closes); the next checkout opens the pool anew and serves."""

    async def body() -> int:
        engine = _async_engine(fleet, postgres_server, tag, 1)
        try:
            await cancel_while_a_router_starts(engine.connect().start())
            await asyncio.to_thread(until, lambda: sessions(postgres_server, tag) == 0)
            async with engine.connect() as conn:
                return int((await conn.execute(sqlalchemy.text("SELECT 1"))).scalar_one())
        finally:
            await engine.dispose()

    assert asyncio.run(asyncio.wait_for(body(), 60)) == 1
    until(lambda: sessions(postgres_server, tag) == 0)


def _transact_when_told(channel: Channel, engine: sqlalchemy.Engine, writes: str) -> None:
    """In a forked child: once told, write one row through the parent's engine."""
    channel.recv()
    with engine.begin() as conn:
        conn.execute(_insert(writes), {"worker": os.getpid(), "n": 0, "kept": True})
    channel.send("written")


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+: fork with threads
def test_a_forked_child_opens_its_own_router(
    fleet: Fleet, fleet_name: str, postgres_server: TempPostgres, writes: str
) -> None:
    """A pool used before a fork (gunicorn's --preload): the child's connections go to a
    router of its own, not to the parent's, which may be gone."""
    del fleet  # the parent's member: the child's pool joins as its own node
    engine = sqlalchemy.create_engine(
        _url(postgres_server),
        connect_args={"application_name": writes},
        poolclass=FleetPool,
        fleet=Fleet.join(fleet_name, 16),
        fleet_options=PoolOptions(max_live=2, mode="transaction"),
    )
    with engine.begin() as conn:  # the parent's router starts
        conn.execute(_insert(writes), {"worker": 0, "n": 0, "kept": True})
    with Processes("fork") as processes:
        child = processes.start(_transact_when_told, engine, writes)
        engine.dispose()  # the parent's router and its socket are gone
        child.send("go")
        assert child.recv(60) == "written"
    assert _rows(postgres_server, writes) == (2, 0)


def test_transaction_mode_refuses_another_driver_and_a_budget(
    fleet: Fleet, postgres_server: TempPostgres
) -> None:
    options = PoolOptions(mode="transaction")
    with pytest.raises(InvalidPoolOptions, match="postgresql\\+psycopg"):
        create_async_engine(
            _url(postgres_server, "asyncpg"),
            poolclass=AsyncFleetPool,
            fleet=fleet,
            fleet_options=options,
        )
    budget = Budget(postgres_server.url, "sqlalchemy-transaction-mode", total=2)
    with pytest.raises(InvalidPoolOptions, match="budget"):
        sqlalchemy.create_engine(
            _url(postgres_server),
            poolclass=FleetPool,
            fleet=fleet,
            fleet_options=options,
            fleet_budget=budget,
        )
