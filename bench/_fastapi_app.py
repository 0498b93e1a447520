"""The FastAPI app of ``bench/fastapi_bench.py``: one query per request, one pool per worker.

``BENCH_KIND`` picks the pool: ``orbitive`` (``orbitive.clients.asyncpg``, a
host-wide cap of ``BENCH_CAP``), ``asyncpg`` (``asyncpg.create_pool`` with
``max_size=BENCH_CAP`` in every worker) or ``pgbouncer`` (asyncpg without a
statement cache, as PgBouncer's transaction mode needs, and enough client
connections that PgBouncer does the queueing).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from fastapi import FastAPI

from orbitive import Fleet
from orbitive.clients import PoolOptions
from orbitive.clients.asyncpg import create_pool

KIND = os.environ.get("BENCH_KIND", "orbitive")
CAP = int(os.environ.get("BENCH_CAP", "4"))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    url = os.environ["DATABASE_URL"]
    fleet = None
    if KIND == "orbitive":
        fleet = Fleet.join(os.environ["BENCH_FLEET"], capacity=8)
        turn = float(os.environ.get("BENCH_TURN", "0.5"))
        options = PoolOptions(max_live=CAP, acquire_timeout=30.0, handoff_after=turn)
        app.state.db = await create_pool(url, fleet=fleet, options=options)
    elif KIND == "asyncpg":
        app.state.db = await asyncpg.create_pool(url, min_size=0, max_size=CAP)
    else:
        app.state.db = await asyncpg.create_pool(
            url, min_size=0, max_size=64, statement_cache_size=0
        )
    yield
    await app.state.db.close()
    if fleet is not None:
        fleet.close()


app = FastAPI(lifespan=lifespan)


@app.get("/q/{n}")
async def query(n: int) -> dict[str, int]:
    async with app.state.db.acquire() as conn:
        value: int = await conn.fetchval("SELECT $1::int", n)
    return {"n": value}
