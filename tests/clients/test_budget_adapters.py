"""The other adapters name a budget as the psycopg ConnectionPool does: the asyncio
psycopg pool, SQLAlchemy's FleetPool and the asyncpg pool hold one unit per
connection and give the units back when they close."""

from __future__ import annotations

import asyncio
import secrets
import time

from sqlalchemy import create_engine, text

from orbitive import Fleet
from orbitive.clients import Budget, PoolOptions
from orbitive.clients._coordinator import Coordinator
from orbitive.clients.asyncpg import create_pool as asyncpg_pool
from orbitive.clients.psycopg import AsyncConnectionPool
from orbitive.clients.sqlalchemy import FleetPool

from .._servers import TempPostgres


def test_an_async_pool_holds_units_for_its_connections_and_gives_them_back(
    fleet: Fleet, durable_postgres_server: TempPostgres
) -> None:
    db = durable_postgres_server.url
    budget = Budget(db, name=f"db-{secrets.token_hex(3)}", total=5, ttl=4.0)

    async def use() -> tuple[int, int]:
        options = PoolOptions(max_live=3)
        pool = AsyncConnectionPool(db, fleet=fleet, options=options, budget=budget)
        async with pool, pool.connection() as first, pool.connection() as second:
            await first.execute("SELECT 1")
            await second.execute("SELECT 1")
            statistics = pool.statistics()
            return statistics.budget_units, statistics.budget_cap

    assert asyncio.run(use()) == (2, 2)
    assert_given_back(budget)


def test_a_sqlalchemy_engine_holds_units_for_its_connections_and_gives_them_back(
    fleet: Fleet, durable_postgres_server: TempPostgres
) -> None:
    db = durable_postgres_server.url
    budget = Budget(db, name=f"db-{secrets.token_hex(3)}", total=5, ttl=4.0)
    engine = create_engine(
        db.replace("postgresql://", "postgresql+psycopg://", 1),
        poolclass=FleetPool,
        fleet=fleet,
        fleet_options=PoolOptions(max_live=3),
        fleet_budget=budget,
    )
    try:
        with engine.connect() as first, engine.connect() as second:
            first.execute(text("SELECT 1"))
            second.execute(text("SELECT 1"))
            pool = engine.pool
            assert isinstance(pool, FleetPool)
            statistics = pool.clients.statistics()
            assert (statistics.budget_units, statistics.budget_cap) == (2, 2)
    finally:
        engine.dispose()
    assert_given_back(budget)


def assert_given_back(budget: Budget) -> None:
    """The budget's units are given back within 5 s, not left to lapse."""
    coordinator = Coordinator(budget)
    try:
        deadline = time.monotonic() + 5.0
        while coordinator.survey().units and time.monotonic() < deadline:
            time.sleep(0.05)
        assert coordinator.survey().units == []
    finally:
        coordinator.close()


def test_an_asyncpg_pool_holds_units_for_its_connections_and_gives_them_back(
    fleet: Fleet, durable_postgres_server: TempPostgres
) -> None:
    db = durable_postgres_server.url
    budget = Budget(db, name=f"db-{secrets.token_hex(3)}", total=5, ttl=4.0)

    async def use() -> tuple[int, int]:
        options = PoolOptions(max_live=3)
        async with (
            asyncpg_pool(db, fleet=fleet, options=options, budget=budget) as pool,
            pool.acquire() as first,
            pool.acquire() as second,
        ):
            await first.fetchval("SELECT 1")
            await second.fetchval("SELECT 1")
            statistics = pool.clients.statistics()
            return statistics.budget_units, statistics.budget_cap

    assert asyncio.run(use()) == (2, 2)
    assert_given_back(budget)
