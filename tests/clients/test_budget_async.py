"""An asyncio psycopg pool naming a budget holds the host's units as the sync pool does,
and gives them back when it closes."""

from __future__ import annotations

import asyncio
import secrets
import time

from orbitive import Fleet
from orbitive.clients import Budget, PoolOptions
from orbitive.clients._coordinator import Coordinator
from orbitive.clients.psycopg import AsyncConnectionPool

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
    coordinator = Coordinator(budget)
    try:
        deadline = time.monotonic() + 5.0
        while coordinator.survey().units and time.monotonic() < deadline:
            time.sleep(0.05)
        assert coordinator.survey().units == []  # given back, not left to lapse
    finally:
        coordinator.close()
