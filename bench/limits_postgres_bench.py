"""One fixed-window ``hit`` through ``limits`` on ``postgresql://`` against ``redis://``.

Run: ``.venv/bin/python bench/limits_postgres_bench.py [--hits N] [--postgres URL]
[--redis URL]``. Each storage is made by ``limits.storage.storage_from_string`` and
driven by ``FixedWindowRateLimiter.hit`` (one key, a limit no run reaches, so every hit
does the same work); the hits of the two storages are timed one by one and
interleaved, so both see the same machine load, after a warm-up. It prints the median,
p10 and p90 of each in microseconds and the ratio of the medians (PostgreSQL over
Redis), and the same for the asyncio forms (``async+postgresql://`` against
``async+redis://`` on redis-py's asyncio client), each hit awaited in one running loop.
Without ``--postgres`` (``--redis``) a throw-away server is started as the tests do
(``tests/_servers.py``), on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

from limits import RateLimitItemPerSecond
from limits.aio.storage import Storage as AsyncStorage
from limits.aio.strategies import FixedWindowRateLimiter as AsyncFixedWindowRateLimiter
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter

import orbitive.limits  # noqa: F401 - registers postgresql:// and async+postgresql://

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._servers import TempPostgres, TempRedis

#: A limit no run reaches, per a window longer than any run.
ITEM = RateLimitItemPerSecond(10**12, 3600)
WARM_UP = 500


def summary(samples: list[float]) -> str:
    """Median, p10 and p90 of ``samples`` (microseconds)."""
    deciles = statistics.quantiles(samples, n=10)
    median = statistics.median(samples)
    return f"median {median:8.1f} us  p10 {deciles[0]:8.1f}  p90 {deciles[-1]:8.1f}"


def interleaved(hits: int, calls: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
    """Microseconds of each call of each named callable, taking turns, after a warm-up."""
    clock = time.perf_counter_ns
    for call in calls.values():
        for _ in range(WARM_UP):
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(hits):
        for name, call in calls.items():
            started = clock()
            call()
            samples[name].append((clock() - started) / 1000.0)
    return samples


async def interleaved_async(
    hits: int, calls: dict[str, Callable[[], Any]]
) -> dict[str, list[float]]:
    """:func:`interleaved` for coroutine functions, awaited in the running loop."""
    clock = time.perf_counter_ns
    for call in calls.values():
        for _ in range(WARM_UP):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(hits):
        for name, call in calls.items():
            started = clock()
            await call()
            samples[name].append((clock() - started) / 1000.0)
    return samples


def report(title: str, samples: dict[str, list[float]]) -> None:
    print(title)
    for name, found in samples.items():
        print(f"  {name:<20} {summary(found)}")
    postgres, redis = (statistics.median(found) for found in samples.values())
    print(f"  ratio of medians (postgresql / redis): {postgres / redis:.2f}")


@contextlib.contextmanager
def servers(postgres: str | None, redis: str | None) -> Iterator[tuple[str, str]]:
    """The URLs to measure: the given ones, or throw-away servers' (stopped afterwards)."""
    started: list[TempPostgres | TempRedis] = []
    try:
        if postgres is None:
            started.append(TempPostgres.start())
            postgres = started[-1].url
        if redis is None:
            started.append(TempRedis.start())
            redis = started[-1].url
        yield postgres, redis
    finally:
        for server in started:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hits", type=int, default=5000, help="timed hits per storage")
    parser.add_argument("--postgres", help="a postgresql:// URL (default: a throw-away server)")
    parser.add_argument("--redis", help="a redis:// URL (default: a throw-away server)")
    arguments = parser.parse_args()
    with servers(arguments.postgres, arguments.redis) as (postgres_url, redis_url):
        postgres = cast(Storage, storage_from_string(postgres_url))
        redis = cast(Storage, storage_from_string(redis_url))
        calls: dict[str, Callable[[], object]] = {
            name: partial(FixedWindowRateLimiter(storage).hit, ITEM, "bench")
            for name, storage in (("postgresql://", postgres), ("redis://", redis))
        }
        report(f"fixed-window hit, {arguments.hits} each, interleaved", interleaved(
            arguments.hits, calls))  # fmt: skip
        postgres.reset()
        redis.reset()

        async def asynchronous() -> None:
            async_postgres = cast(AsyncStorage, storage_from_string("async+" + postgres_url))
            async_redis = cast(
                AsyncStorage, storage_from_string("async+" + redis_url, implementation="redispy")
            )
            async_calls: dict[str, Callable[[], Any]] = {
                name: partial(AsyncFixedWindowRateLimiter(storage).hit, ITEM, "bench-async")
                for name, storage in (
                    ("async+postgresql://", async_postgres),
                    ("async+redis://", async_redis),
                )
            }
            report(
                f"asyncio fixed-window hit, {arguments.hits} each, interleaved",
                await interleaved_async(arguments.hits, async_calls),
            )
            await async_postgres.reset()
            await async_redis.reset()

        asyncio.run(asynchronous())


if __name__ == "__main__":
    main()
