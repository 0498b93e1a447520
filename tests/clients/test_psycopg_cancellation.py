"""Requests cut short by ``asyncio.wait_for`` on the psycopg asyncio pool, on a real
PostgreSQL server (issue 19, item 1).

ASGI client disconnects and ``wait_for`` timeouts cancel requests all day, anywhere:
in the checkout's connection check, in the query, in the return's rollback. Afterwards
no unit of ``max_live`` may be missing: ``max_live`` connections can be checked out at
once, here and in another process, and the server never saw more than ``max_live``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from typing import Any

import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import ClientPoolStatistics, PoolOptions, PoolTimeout
from orbitive.clients.psycopg import AsyncConnectionPool, check_connection_async

from ._sampling import ServerConnections
from .conftest import Prober

MAX_LIVE = 3
TASKS = 6
REQUESTS_PER_TASK = 40

#: The requests' ``wait_for`` timeouts are drawn from this range, in seconds.
TIMEOUTS_S = (0.0001, 0.004)

#: Seconds the pool may take to settle once the requests are over.
SETTLE_S = 2.0


async def _request(pool: AsyncConnectionPool) -> None:
    async with pool.connection(timeout=5.0) as conn:
        await conn.execute("SELECT 1")


async def _cut_short(pool: AsyncConnectionPool, seed: int) -> int:
    """REQUESTS_PER_TASK requests, each under wait_for with a short timeout; how many were
    cut short."""
    draw = random.Random(seed)
    cut = 0
    for _ in range(REQUESTS_PER_TASK):
        try:
            await asyncio.wait_for(_request(pool), draw.uniform(*TIMEOUTS_S))
        except asyncio.TimeoutError:
            cut += 1
        except PoolTimeout:
            pass  # the leaked budget shows in the checks below
    return cut


async def _settled(pool: AsyncConnectionPool) -> ClientPoolStatistics:
    deadline = time.monotonic() + SETTLE_S
    stats = pool.statistics()
    while (stats.in_use or stats.creating or stats.waiting) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        stats = pool.statistics()
    return stats


async def _all_at_once(pool: AsyncConnectionPool) -> int:
    """How many of MAX_LIVE connections could be checked out at once (each within 2 s)."""
    held: list[psycopg.AsyncConnection[Any]] = []
    with contextlib.suppress(PoolTimeout):
        while len(held) < MAX_LIVE:
            held.append(await pool.getconn(timeout=2.0))
    for conn in held:
        await pool.putconn(conn)
    return len(held)


@pytest.mark.parametrize("check", [check_connection_async, None], ids=["default-check", "no-check"])
def test_requests_cut_short_by_wait_for_leave_every_unit_of_max_live(
    fleet: Fleet, prober: Prober, pg_url: str, tag: str, check: Any
) -> None:
    async def scenario() -> tuple[int, ClientPoolStatistics, int, object]:
        async with AsyncConnectionPool(
            pg_url, fleet=fleet, kwargs={"application_name": tag}, check=check,
            options=PoolOptions(max_live=MAX_LIVE),
        ) as pool:  # fmt: skip
            cut = sum(await asyncio.gather(*(_cut_short(pool, seed) for seed in range(TASKS))))
            stats = await _settled(pool)
            at_once = await _all_at_once(pool)
            return cut, stats, at_once, pool.clients.key

    try:
        with ServerConnections(pg_url, tag) as server:
            cut, stats, at_once, key = asyncio.run(scenario())
            left = server.wait_at_most(0, timeout=SETTLE_S)
    finally:
        gc.collect()  # a connection the pool lost is reported (ResourceWarning) in this test
    assert cut > TASKS * REQUESTS_PER_TASK // 4, cut  # most requests were cut short
    assert (stats.in_use, stats.creating, stats.waiting) == (0, 0, 0), stats
    assert stats.live <= MAX_LIVE, stats
    assert at_once == MAX_LIVE
    assert server.highest <= MAX_LIVE, server.highest
    assert left == 0  # the pool's close ended every session
    assert prober.probe(key, MAX_LIVE, 2.0) is None
