"""AsyncFleetPool on a real PostgreSQL: create_async_engine on asyncpg and on psycopg.

A checkout that waits for the cap waits on the loop; the key comes from the URL,
so the sync and the asyncio engine of one database share one budget.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, cast

import pytest
import sqlalchemy
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from orbitive import Fleet
from orbitive.clients import InvalidPoolOptions, PoolOptions
from orbitive.clients.sqlalchemy import AsyncFleetPool, FleetPool

from .._processes import Processes
from ._sampling import ServerConnections, busy
from ._workers import sqlalchemy_holder
from .conftest import CAPACITY

DRIVERS = ["asyncpg", "psycopg"]


def _url(pg_url: str, driver: str) -> str:
    return pg_url.replace("postgresql://", f"postgresql+{driver}://")


def _engine(fleet: Fleet, url: str, tag: str, **options: Any) -> AsyncEngine:
    driver = url.split("+", 1)[1].split(":", 1)[0]
    connect_args: dict[str, Any] = (
        {"server_settings": {"application_name": tag}}
        if driver == "asyncpg"
        else {"application_name": tag}
    )
    return create_async_engine(
        url,
        poolclass=AsyncFleetPool,
        fleet=fleet,
        fleet_options=PoolOptions(**{"max_live": 3, "acquire_timeout": 10.0, **options}),
        connect_args=connect_args,
    )


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_cap_holds_and_waiting_never_blocks_the_loop(
    fleet: Fleet, pg_url: str, tag: str, driver: str
) -> None:
    worst = [0.0]

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.005)
            worst[0] = max(worst[0], loop.time() - start - 0.005)

    async def body() -> None:
        engine = _engine(fleet, _url(pg_url, driver), tag)

        async def one(n: int) -> int:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT pg_sleep(0.01)"))
                return int((await conn.execute(text("SELECT :n"), {"n": str(n)})).scalar_one())

        with ServerConnections(pg_url, tag) as server:
            watcher = asyncio.create_task(probe())
            assert await asyncio.gather(*(one(n) for n in range(40))) == list(range(40))
            watcher.cancel()
        assert 1 <= server.highest <= 3
        assert cast(AsyncFleetPool, engine.pool).clients.statistics().in_use == 0
        await engine.dispose()

    asyncio.run(body())
    assert worst[0] < 0.5  # loose: the FastAPI test holds the strict bound


@pytest.mark.parametrize("driver", DRIVERS)
def test_cancelled_uses_give_every_unit_back(
    fleet: Fleet, pg_url: str, tag: str, driver: str
) -> None:
    rng = random.Random(11)

    async def body() -> None:
        engine = _engine(fleet, _url(pg_url, driver), tag, max_live=2)

        async def use() -> None:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT pg_sleep(0.002)"))

        cut = 0
        for _ in range(8):
            uses = [asyncio.wait_for(use(), rng.uniform(0.0005, 0.03)) for _ in range(16)]
            for result in await asyncio.gather(*uses, return_exceptions=True):
                if isinstance(result, asyncio.TimeoutError):
                    cut += 1
                elif result is not None:
                    raise result
        assert cut > 20
        clients = cast(AsyncFleetPool, engine.pool).clients
        deadline = time.monotonic() + 10
        while busy(clients.statistics()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert clients.statistics().in_use == 0
        held = [await engine.connect() for _ in range(2)]  # max_live at once
        for conn in held:
            await conn.close()
        await engine.dispose()

    asyncio.run(body())


def test_sync_and_async_engines_of_one_database_share_one_budget(
    fleet: Fleet, fleet_name: str, pg_url: str, tag: str
) -> None:
    with Processes("spawn") as spawned:
        holder = spawned.start(
            sqlalchemy_holder, fleet_name, CAPACITY, _url(pg_url, "psycopg"), 3, 2
        )
        assert holder.recv(60) == "holding"

        async def body() -> None:
            engine = _engine(fleet, _url(pg_url, "asyncpg"), tag, acquire_timeout=0.5)
            async with engine.connect() as conn:  # the third of max_live 3
                assert await conn.scalar(text("SELECT 1")) == 1
                with pytest.raises(sqlalchemy.exc.TimeoutError):
                    await engine.connect()  # a fourth: the sync engine holds two
            await engine.dispose()

        asyncio.run(body())
        holder.send("release")
        assert holder.recv(60) == "done"
        assert holder.wait(60) == 0


def test_the_wrong_pool_class_or_no_key_is_a_named_error(fleet: Fleet, pg_url: str) -> None:
    with pytest.raises(InvalidPoolOptions, match="AsyncFleetPool"):
        create_async_engine(_url(pg_url, "asyncpg"), poolclass=FleetPool, fleet=fleet)
    with pytest.raises(InvalidPoolOptions, match="poolclass=FleetPool"):
        create_engine(_url(pg_url, "psycopg"), poolclass=AsyncFleetPool, fleet=fleet)
    with pytest.raises(InvalidPoolOptions, match="fleet_key"):
        create_engine("sqlite://", poolclass=FleetPool, fleet=fleet)
    with pytest.raises(InvalidPoolOptions, match="fleet_key"):
        create_engine(
            _url(pg_url, "psycopg"), poolclass=FleetPool, fleet=fleet, creator=lambda: None
        )
    with pytest.raises(InvalidPoolOptions, match="fleet="):
        create_async_engine(_url(pg_url, "asyncpg"), poolclass=AsyncFleetPool)
    engine = create_engine("sqlite://", poolclass=FleetPool, fleet=fleet, fleet_key="local")
    engine.dispose()


def test_sync_and_async_engines_derive_one_key_from_the_url(fleet: Fleet) -> None:
    sync = create_engine("postgresql+psycopg://app:pw@db/main", poolclass=FleetPool, fleet=fleet)
    asynchronous = create_async_engine(
        "postgresql+asyncpg://app@db:5432/main", poolclass=AsyncFleetPool, fleet=fleet
    )
    other = create_engine("postgresql+psycopg://app@db/other", poolclass=FleetPool, fleet=fleet)
    key = cast(FleetPool, sync.pool).clients.key
    assert cast(AsyncFleetPool, asynchronous.sync_engine.pool)._key == key
    assert cast(FleetPool, other.pool).clients.key != key
    sync.dispose()
    other.dispose()
