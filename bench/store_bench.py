"""Store try_lock + release, uncontended, one process, on each engine.

Run: ``.venv/bin/python bench/store_bench.py [--pairs N]
[--engines sqlite,postgres,shm,redis] [--postgres URL]``. Times every pair on its
own and prints the median, p10 and p90 in microseconds. Without ``--postgres`` a
throw-away server is started as the tests do (``tests/_servers.py``); the
redis-server is always a throw-away one (``tests/_servers.py``); the SQLite
file and the SHM fleet are temporary too. Targets (issue 3): SQLite <= 60 us,
PostgreSQL <= 1000 us on loopback, SHM <= 12 us; Redis (issue 12): at most 1.3x
redis-py's ``Lock`` per pair, on the same server.

For the SHM engine it also prints what the contract adds over the lock table: store
pairs and bare ``LockTable`` pairs on the same fleet, timed one by one and
interleaved (so both see the same machine load), and the difference of their medians.
And what asyncio adds: ``await try_lock_async`` + ``await release()`` pairs and
sync pairs, interleaved inside one running event loop, and the ratio of their
medians (target issue 12: at most 2x).
For Redis it likewise interleaves store pairs with redis-py ``Lock`` pairs
(``acquire(blocking=False)`` + ``release``) on the same server and prints the ratio
of their medians.

On every engine it also prints what the blocking helper costs over the pair it is
made of (issue 25): ``with store.lock(name, ttl=30, timeout=10)`` (renewed by the
process's renewer) against ``try_lock`` + ``release``, interleaved, and the asyncio
twins ``async with store.lock_async(...)`` against ``await try_lock_async`` +
``await release()``, interleaved in one loop. Targets: at most 2x on shm:// (sync
and asyncio), at most 1.2x on the other engines (sync).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from orbitive import Fleet
from orbitive.lock import LockKey, LockOwner, LockTable
from orbitive.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._fleets import remove_fleet_files
from tests._servers import ServerUnavailable, TempPostgres, TempRedis

TARGETS_US = {"sqlite": 60.0, "postgres": 1000.0, "shm": 12.0}
#: Largest ratio of an asyncio SHM pair's median to a sync pair's (issue 12).
ASYNC_RATIO_TARGET = 2.0
#: Redis: the store pair over redis-py's Lock pair, on the same server.
REDIS_TARGET_RATIO = 1.3
#: with store.lock() over the engine's try_lock + release (issue 25), by engine.
HELPER_TARGET_RATIO = {"shm": 2.0, "sqlite": 1.2, "postgres": 1.2, "redis": 1.2}
SHM_CAPACITY = 4
NETWORK = ("postgres", "redis")


def pair_times_us(url: str, pairs: int) -> list[float]:
    """Microseconds of each of ``pairs`` try_lock + release pairs (after a warm-up)."""
    with open_store(url) as store:
        try_lock = store.try_lock
        for _ in range(min(pairs, 5000)):  # SQLite: let the WAL file reach its size
            lock = try_lock("bench/key", "bench-owner", 30.0)
            assert lock is not None
            lock.release()
        samples = []
        clock = time.perf_counter_ns
        for _ in range(pairs):
            started = clock()
            lock = try_lock("bench/key", "bench-owner", 30.0)
            assert lock is not None
            lock.release()
            samples.append((clock() - started) / 1000.0)
    return samples


def shm_overhead_us(url: str, pairs: int) -> tuple[float, float]:
    """Median microseconds of a store pair and of a bare LockTable pair on one fleet.

    The two are timed pair by pair, alternately, after a warm-up of each.
    """
    with open_store(url) as store, contextlib.ExitStack() as stack:
        member = stack.enter_context(Fleet.join(urlsplit(url).netloc, capacity=SHM_CAPACITY))
        table = stack.enter_context(LockTable(member))
        try_lock, acquire, release = store.try_lock, table.try_acquire, table.release
        key, owner = LockKey("bench", "key"), LockOwner(b"bench-owner")

        def store_pair() -> None:
            lock = try_lock("bench/key", "bench-owner", 30.0)
            assert lock is not None
            lock.release()

        def table_pair() -> None:
            release(acquire(key, owner, 30.0).lease)

        samples = interleaved_us((store_pair, table_pair), pairs)
    store_us, table_us = (statistics.median(times) for times in samples)
    return store_us, table_us


def shm_async_us(url: str, pairs: int) -> tuple[float, float]:
    """Median microseconds of an asyncio pair and of a sync pair, interleaved in one loop."""

    async def measure() -> list[list[float]]:
        with open_store(url) as store:
            try_lock, try_lock_async = store.try_lock, store.try_lock_async
            for _ in range(min(pairs, 5000)):  # warm-up of both
                lock = try_lock("bench/key", "bench-owner", 30.0)
                assert lock is not None
                lock.release()
                handle = await try_lock_async("bench/key", "bench-owner", 30.0)
                assert handle is not None
                await handle.release()
            samples: list[list[float]] = [[], []]
            clock = time.perf_counter_ns
            for _ in range(pairs):
                started = clock()
                handle = await try_lock_async("bench/key", "bench-owner", 30.0)
                assert handle is not None
                await handle.release()
                middle = clock()
                lock = try_lock("bench/key", "bench-owner", 30.0)
                assert lock is not None
                lock.release()
                samples[0].append((middle - started) / 1000.0)
                samples[1].append((clock() - middle) / 1000.0)
            return samples

    async_us, sync_us = (statistics.median(times) for times in asyncio.run(measure()))
    return async_us, sync_us


def redis_ratio(url: str, pairs: int) -> tuple[float, float]:
    """Median microseconds of a store pair and of a redis-py Lock pair on one server.

    The two are timed pair by pair, alternately, after a warm-up of each.
    """
    import redis  # noqa: PLC0415 - only this engine needs it

    client = redis.Redis.from_url(url.partition("?")[0])
    with open_store(url) as store, contextlib.closing(client):
        try_lock = store.try_lock
        lock = client.lock("bench/redis-py", timeout=30.0)

        def store_pair() -> None:
            held = try_lock("bench/key", "bench-owner", 30.0)
            assert held is not None
            held.release()

        def redis_py_pair() -> None:
            assert lock.acquire(blocking=False)
            lock.release()

        samples = interleaved_us((store_pair, redis_py_pair), pairs)
    store_us, lock_us = (statistics.median(times) for times in samples)
    return store_us, lock_us


def helper_ratio(url: str, pairs: int) -> tuple[float, float]:
    """Median microseconds of ``with store.lock()`` and of a try_lock + release pair."""
    with open_store(url) as store:
        try_lock, lock = store.try_lock, store.lock

        def pair() -> None:
            held = try_lock("bench/key", "bench-owner", 30.0)
            assert held is not None
            held.release()

        def helper() -> None:
            with lock("bench/key", ttl=30.0, timeout=10.0):
                pass

        samples = interleaved_us((helper, pair), pairs)
    helper_us, pair_us = (statistics.median(times) for times in samples)
    return helper_us, pair_us


def async_helper_ratio(url: str, pairs: int) -> tuple[float, float]:
    """Median microseconds of ``async with store.lock_async()`` and of an asyncio pair,
    interleaved in one running loop."""

    async def measure() -> list[list[float]]:
        async with open_store(url) as store:
            try_lock_async, lock_async = store.try_lock_async, store.lock_async

            async def pair() -> None:
                held = await try_lock_async("bench/key", "bench-owner", 30.0)
                assert held is not None
                await held.release()

            async def helper() -> None:
                async with lock_async("bench/key", ttl=30.0, timeout=10.0):
                    pass

            for _ in range(min(pairs, 2000)):  # warm-up of both
                await helper()
                await pair()
            samples: list[list[float]] = [[], []]
            clock = time.perf_counter_ns
            for _ in range(pairs):
                for cycle, times in zip((helper, pair), samples, strict=True):
                    started = clock()
                    await cycle()
                    times.append((clock() - started) / 1000.0)
            return samples

    helper_us, pair_us = (statistics.median(times) for times in asyncio.run(measure()))
    return helper_us, pair_us


def interleaved_us(cycles: tuple[Callable[[], None], ...], rounds: int) -> list[list[float]]:
    """Microseconds of each call of each cycle: ``rounds`` rounds, one call of each per round."""
    for cycle in cycles:
        for _ in range(min(rounds, 5000)):
            cycle()
    samples: list[list[float]] = [[] for _ in cycles]
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for cycle, times in zip(cycles, samples, strict=True):
            started = clock()
            cycle()
            times.append((clock() - started) / 1000.0)
    return samples


@contextlib.contextmanager
def engine_url(engine: str, postgres: str | None) -> Iterator[str]:
    """A temporary store URL for ``engine``, removed afterwards."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield f"sqlite://{directory}/bench.db"
    elif engine == "shm":
        fleet = f"benchstore{os.getpid()}"
        try:
            yield f"shm://{fleet}?capacity={SHM_CAPACITY}"
        finally:
            remove_fleet_files(fleet)
    elif engine == "redis":
        redis_server = TempRedis.start()
        try:
            yield f"{redis_server.url}?prefix=bench:"
        finally:
            redis_server.stop()
    elif postgres is not None:
        yield postgres
    else:
        server = TempPostgres.start()
        try:
            yield server.url
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--engines", default="sqlite,postgres,shm,redis")
    parser.add_argument("--postgres", default=None, metavar="URL")
    args = parser.parse_args()
    for engine in args.engines.split(","):
        pairs = args.pairs if engine not in NETWORK else max(args.pairs // 10, 100)
        try:
            with engine_url(engine, args.postgres) as url:
                samples = pair_times_us(url, pairs)
                overhead = shm_overhead_us(url, pairs) if engine == "shm" else None
                asyncio_us = shm_async_us(url, pairs) if engine == "shm" else None
                versus = redis_ratio(url, pairs) if engine == "redis" else None
                helper = helper_ratio(url, pairs)
                async_helper = async_helper_ratio(url, pairs)
        except ServerUnavailable as error:
            print(f"{engine:<9} skipped: {error}")
            continue
        report(engine, pairs, samples)
        if overhead is not None:
            store_us, table_us = overhead
            print(
                f"{engine:<9} store {store_us:.2f} us - LockTable {table_us:.2f} us "
                f"= contract overhead {store_us - table_us:.2f} us  (medians, interleaved)"
            )
        if asyncio_us is not None:
            async_us, sync_us = asyncio_us
            ratio = async_us / sync_us
            verdict = "ok" if ratio <= ASYNC_RATIO_TARGET else "MISSES"
            print(
                f"{engine:<9} asyncio pair {async_us:.2f} us / sync pair {sync_us:.2f} us "
                f"= {ratio:.2f}x  (medians, interleaved in one loop; "
                f"target <= {ASYNC_RATIO_TARGET:g}x: {verdict})"
            )
        if versus is not None:
            store_us, lock_us = versus
            ratio = store_us / lock_us
            verdict = "ok" if ratio <= REDIS_TARGET_RATIO else "MISSES"
            print(
                f"{engine:<9} store {store_us:.1f} us / redis-py Lock {lock_us:.1f} us "
                f"= {ratio:.2f}x  (medians, interleaved; target <= {REDIS_TARGET_RATIO}x: "
                f"{verdict})"
            )
        for form, (held_us, pair_us), target in (
            ("with store.lock()", helper, HELPER_TARGET_RATIO[engine]),
            ("async with store.lock_async()", async_helper, 2.0 if engine == "shm" else None),
        ):
            ratio = held_us / pair_us
            verdict = (
                ""
                if target is None
                else f"; target <= {target:g}x: " + ("ok" if ratio <= target else "MISSES")
            )
            print(
                f"{engine:<9} {form} {held_us:.2f} us / its pair {pair_us:.2f} us "
                f"= {ratio:.2f}x  (medians, interleaved{verdict})"
            )


def report(engine: str, pairs: int, samples: list[float]) -> None:
    """One line: median, p10 and p90 of the pairs, and the verdict on the engine's target."""
    deciles = statistics.quantiles(samples, n=10)
    median = statistics.median(samples)
    target = TARGETS_US.get(engine)
    verdict = "ok" if target is None or median <= target else "MISSES"
    note = "" if target is None else f"; target <= {target:g} us: {verdict}"
    print(
        f"{engine:<9} median {median:8.2f} us  p10 {deciles[0]:8.2f}  p90 {deciles[-1]:8.2f}"
        f"  ({pairs} pairs{note})"
    )


if __name__ == "__main__":
    main()
