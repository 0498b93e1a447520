"""What the child processes of ``test_postgres_processes`` run (no test framework here,
so a spawned child starts quickly)."""

from __future__ import annotations

import asyncio

from limits import RateLimitItemPerSecond
from limits.aio.strategies import STRATEGIES as AIO_STRATEGIES
from limits.strategies import STRATEGIES

from orbitive.limits import AsyncPostgresStorage, PostgresStorage

from .._processes import Channel


def hammer(
    channel: Channel,
    url: str,
    form: str,
    strategy: str,
    limit: int,
    expiry: int,
    hits: int,
    cost: int,
) -> None:
    """Open a storage of ``form`` on ``url``, say "ready", wait for "go", then hit one key
    ``hits`` times through ``strategy``, each hit of ``cost``; send how many hits were
    admitted."""
    item = RateLimitItemPerSecond(limit, expiry)
    if form == "sync":
        storage = PostgresStorage(url)
        limiter = STRATEGIES[strategy](storage)
        storage.check()  # connected and the tables made before the start
        channel.send("ready")
        channel.recv(None)
        channel.send(sum(limiter.hit(item, "shared", cost=cost) for _ in range(hits)))
        storage.close()
        return

    async def run() -> None:
        storage = AsyncPostgresStorage("async+" + url)
        limiter = AIO_STRATEGIES[strategy](storage)  # type: ignore[abstract]  # each is concrete
        await storage.check()
        channel.send("ready")
        await asyncio.to_thread(channel.recv, None)
        admitted = 0
        for _ in range(hits):
            admitted += await limiter.hit(item, "shared", cost=cost)
        channel.send(admitted)
        storage.close()

    asyncio.run(run())


def hit_inherited(channel: Channel, storage: PostgresStorage, hits: int) -> None:
    """In a forked child, increment key "fork" ``hits`` times through the storage object
    the parent made and used; send the counts."""
    channel.send([storage.incr("fork", 60) for _ in range(hits)])
