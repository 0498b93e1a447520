"""``fleet_options=PoolOptions(mode="transaction")`` in the SQLAlchemy pools: the engine's
code is unchanged, its connections go to the process's router, and ``max_live`` counts
the server connections its transactions share (``postgresql+psycopg``, sync and asyncio).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

from orbitive import Fleet
from orbitive.clients import Budget, InvalidPoolOptions, PoolOptions
from orbitive.clients.sqlalchemy import AsyncFleetPool, FleetPool

from .._servers import TempPostgres
from ._router_pool import sessions

ROUNDS = 15
WORKERS = 6
#: Every how many rounds a worker also writes a row in a savepoint it rolls back.
SAVEPOINT_EVERY = 3


@pytest.fixture
def table(postgres_server: TempPostgres, tag: str) -> Iterator[str]:
    """A table of the test's own (``worker``, ``n``, ``kept``), dropped after."""
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE TABLE "{tag}" (worker int, n int, kept bool)')
        yield tag
        admin.execute(f'DROP TABLE "{tag}"')


def _url(server: TempPostgres, driver: str = "psycopg") -> str:
    return server.url.replace("postgresql://", f"postgresql+{driver}://")


def _insert(table: str) -> sqlalchemy.TextClause:
    return sqlalchemy.text(f'INSERT INTO "{table}" VALUES (:worker, :n, :kept)')


def _rows(server: TempPostgres, table: str) -> tuple[int, int]:
    """(rows kept, distinct; rows written in a rolled-back savepoint)."""
    with psycopg.connect(server.url) as conn:
        row = conn.execute(
            f"SELECT count(DISTINCT (worker, n)) FILTER (WHERE kept), "
            f'count(*) FILTER (WHERE NOT kept) FROM "{table}"'
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _gone(server: TempPostgres, tag: str) -> int:
    """The server sessions tagged ``tag`` once they had 10 s to end."""
    until = time.monotonic() + 10
    while sessions(server, tag) and time.monotonic() < until:
        time.sleep(0.02)
    return sessions(server, tag)


def test_threads_of_a_sync_engine_share_max_live_and_savepoints_roll_back(
    fleet: Fleet, postgres_server: TempPostgres, table: str
) -> None:
    engine = sqlalchemy.create_engine(
        _url(postgres_server),
        connect_args={"application_name": table},
        poolclass=FleetPool,
        fleet=fleet,
        fleet_options=PoolOptions(max_live=2, mode="transaction"),
    )
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for n in range(ROUNDS):
                with engine.begin() as conn:  # one transaction, on one server connection
                    conn.execute(_insert(table), {"worker": worker, "n": n, "kept": True})
                    if n % SAVEPOINT_EVERY == 0:
                        savepoint = conn.begin_nested()
                        conn.execute(_insert(table), {"worker": worker, "n": n, "kept": False})
                        savepoint.rollback()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(WORKERS)]
    for thread in threads:
        thread.start()
    peak = 0
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, sessions(postgres_server, table))
        time.sleep(0.02)
    assert errors == []
    assert _rows(postgres_server, table) == (WORKERS * ROUNDS, 0)
    assert 1 <= peak <= 2
    pool = engine.pool
    assert isinstance(pool, FleetPool)
    assert pool.clients.label.endswith("(router clients)")
    engine.dispose()  # the last pool of the key: its router and server connections go
    assert _gone(postgres_server, table) == 0


def test_tasks_of_an_async_engine_share_max_live(
    fleet: Fleet, postgres_server: TempPostgres, table: str
) -> None:
    async def body() -> None:
        engine = create_async_engine(
            _url(postgres_server),
            connect_args={"application_name": table},
            poolclass=AsyncFleetPool,
            fleet=fleet,
            fleet_options=PoolOptions(max_live=2, mode="transaction"),
        )

        async def work(worker: int) -> None:
            for n in range(ROUNDS):
                async with engine.begin() as conn:
                    await conn.execute(_insert(table), {"worker": worker, "n": n, "kept": True})
                    await conn.execute(sqlalchemy.text("SELECT pg_sleep(0.001)"))

        try:
            await asyncio.gather(*(work(worker) for worker in range(WORKERS)))
        finally:
            await engine.dispose()

    done = threading.Event()
    peaks: list[int] = []

    def sample() -> None:
        while not done.is_set():
            peaks.append(sessions(postgres_server, table))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        asyncio.run(asyncio.wait_for(body(), 60))
    finally:
        done.set()
        sampler.join()
    assert _rows(postgres_server, table) == (WORKERS * ROUNDS, 0)
    assert 1 <= max(peaks) <= 2
    assert _gone(postgres_server, table) == 0


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
