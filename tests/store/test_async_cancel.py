"""Cancellation safety of the asyncio store (issue 12 item 1), on every engine.

* A task cancelled while acquiring leaves no lock behind, even when the engine
  commits the grant after the cancellation arrived.
* A task cancelled while releasing leaves the handle true to the store: released
  and saying so, or still held and releasable; never held in the store while the
  handle says it is not.

The ``blocked`` fixture holds the engine's write path (SQLite's write lock, a
PostgreSQL row lock) so that a cancellation lands while a statement is in flight;
the SHM table's steps never suspend, so there a cancellation can land only
between steps, which the step-by-step tests cover.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
import redis

from orbitive.store import AsyncLock, Store
from orbitive.store._shm import ShmEngine

LONG = 60.0
_T = TypeVar("_T")
#: Loop steps before the cancellation, spread over a whole acquire or release.
STEPS = [0, 1, 2, 3, 5, 8, 13]

Blocker = Callable[[str], contextlib.AbstractContextManager[None]]


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(asyncio.wait_for(coro, 60.0))


async def cancelled_after(steps: int, coro: Coroutine[Any, Any, _T]) -> _T | None:
    """Start ``coro`` as a task, cancel it after ``steps`` loop steps; its result or None."""
    task = asyncio.create_task(coro)
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


def assert_true_to_the_store(store: Store, lock: AsyncLock) -> None:
    """The invariant after a cancelled release: held in the store iff the handle holds."""
    in_store = store.inspect(lock.name)
    if lock._released:
        assert in_store is None or in_store.fencing_token != lock.fencing_token
        assert run(lock.release()) is False
    else:
        assert in_store is not None and in_store.fencing_token == lock.fencing_token
        assert run(lock.release()) is True  # still owned and releasable
    assert store.inspect(lock.name) is None


@pytest.fixture
def blocked(store_url: str) -> Blocker:
    """A context manager that holds the engine's write path for one name while open."""
    if store_url.startswith("shm:"):
        pytest.skip("SHM table steps never suspend: nothing to cancel inside one")
    if store_url.startswith("sqlite:"):
        return lambda name: _sqlite_write_lock(store_url[len("sqlite://") :])
    if store_url.startswith("redis:"):
        return lambda name: _redis_write_pause(store_url)
    return lambda name: _postgres_row_lock(store_url, name)


@contextlib.contextmanager
def _sqlite_write_lock(path: str) -> Iterator[None]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("COMMIT")
    finally:
        conn.close()


@contextlib.contextmanager
def _postgres_row_lock(url: str, name: str) -> Iterator[None]:
    with psycopg.connect(url) as conn:  # a transaction: the row stays locked until commit
        row = conn.execute(
            "SELECT 1 FROM orbitive_locks WHERE name = %s FOR UPDATE", (name,)
        ).fetchone()
        assert row is not None, "the row to lock must exist"
        yield


@contextlib.contextmanager
def _redis_write_pause(url: str) -> Iterator[None]:
    client = redis.Redis.from_url(url.split("?", maxsplit=1)[0])
    try:
        client.client_pause(60_000, all=False)  # WRITE: scripts that write wait
        yield
        client.client_unpause()
    finally:
        client.close()


def release_soon(block: contextlib.AbstractContextManager[None], delay: float) -> threading.Thread:
    """Leave ``block`` (already entered) from a thread after ``delay`` seconds."""

    def leave() -> None:
        time.sleep(delay)
        block.__exit__(None, None, None)

    thread = threading.Thread(target=leave)
    thread.start()
    return thread


# -- acquire -------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", STEPS)
def test_an_acquire_cancelled_at_any_step_leaves_no_lock(store: Store, steps: int) -> None:
    lock = run(cancelled_after(steps, store.try_lock_async("c", "w1", LONG)))
    if lock is None:  # the cancellation landed: nothing may be left
        assert store.inspect("c") is None
        assert store.statistics().held_count == 0
    else:  # it finished first: an ordinary, releasable lock
        assert run(lock.release()) is True
    assert store.inspect("c") is None


def test_a_grant_committed_after_cancellation_is_released(store: Store, blocked: Blocker) -> None:
    if store.url.startswith("postgres"):
        lapsed = store.try_lock("late", "old", 0.05)  # the row the blocker locks
        assert lapsed is not None
        time.sleep(0.1)
    block = blocked("late")
    block.__enter__()

    async def body() -> None:
        task = asyncio.create_task(store.try_lock_async("late", "w1", LONG))
        await asyncio.sleep(0.3)  # the grant is waiting for the engine's write path
        task.cancel()
        leaving = release_soon(block, 0.3)  # the grant commits after the cancellation
        with pytest.raises(asyncio.CancelledError):
            await task
        leaving.join()

    run(body())
    stats = store.statistics()
    assert stats.acquired_count == 1 + store.url.startswith("postgres")  # it was granted ...
    assert stats.released_count == 1  # ... and released again before the task ended
    assert store.inspect("late") is None


@pytest.mark.parametrize("steps", STEPS)
def test_a_lock_async_cancelled_while_waiting_leaves_no_lock(store: Store, steps: int) -> None:
    holder = store.try_lock("wanted", "holder", LONG)
    assert holder is not None

    async def body() -> None:
        async def wait() -> None:
            async with store.lock_async("wanted", ttl=LONG, timeout=30.0):
                raise AssertionError("the holder never released")

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.2)  # well into the wait loop
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        engine = store._backend.engine
        if isinstance(engine, ShmEngine):  # no reader left on the readiness descriptor
            assert not asyncio.get_running_loop().remove_reader(engine.fileno())

    run(body())
    info = store.inspect("wanted")
    assert info is not None and info.owner == "holder"
    assert holder.release()
    time.sleep(0.2)
    assert store.inspect("wanted") is None  # no late grant appeared


# -- release -------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "renewing"])
def test_a_release_cancelled_at_any_step_is_true_to_the_store(
    store: Store, steps: int, auto_renew: bool
) -> None:
    async def body() -> AsyncLock:
        lock = await store.lock_async("rel", ttl=LONG, timeout=0, auto_renew=auto_renew)
        await cancelled_after(steps, lock.release())
        return lock

    assert_true_to_the_store(store, run(body()))


def test_a_release_cancelled_in_flight_is_finished_and_recorded(
    store: Store, blocked: Blocker
) -> None:
    async def body() -> AsyncLock:
        lock = await store.lock_async("inflight", ttl=LONG, timeout=0, auto_renew=False)
        block = blocked("inflight")
        block.__enter__()
        task = asyncio.create_task(lock.release())
        await asyncio.sleep(0.3)  # the release is waiting for the engine's write path
        task.cancel()
        leaving = release_soon(block, 0.3)
        with pytest.raises(asyncio.CancelledError):
            await task
        leaving.join()
        return lock

    lock = run(body())
    assert lock._released and not lock.lost  # released, and the handle says so
    assert store.inspect("inflight") is None
    assert store.statistics().released_count == 1


def test_a_renew_in_flight_when_release_stops_the_renewer_completes_first(
    store: Store, blocked: Blocker
) -> None:
    async def body() -> tuple[AsyncLock, float]:
        lock = await store.lock_async("renewing", ttl=0.9, timeout=0)
        block = blocked("renewing")
        block.__enter__()
        await asyncio.sleep(0.45)  # the renewer's renew (due at 0.3 s) is stuck behind it
        leaving = release_soon(block, 0.2)
        started = time.monotonic()
        assert await lock.release() is True  # after the renew finished, on its grant
        leaving.join()
        return lock, time.monotonic() - started

    lock, took = run(body())
    assert took >= 0.1  # the release waited for the renew in flight
    assert lock._released and not lock.lost
    assert store.inspect("renewing") is None
    assert store.statistics().renewed_count == 1
