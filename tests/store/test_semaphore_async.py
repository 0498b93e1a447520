"""Counting leases for asyncio code (issue 23 item 1), run on every engine.

``try_acquire_async``, ``acquire_async`` and :class:`AsyncSemaphoreLease` keep the
rules the sync suite pins (``test_semaphore_contract.py``); a cancelled acquire
leaves no slot held, also when the engine commits the grant after the cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
import redis

from orbitive.store import (
    AsyncSemaphoreLease,
    ErrorKind,
    LockTimeout,
    SemaphoreLimitMismatch,
    Store,
    StoreError,
)
from orbitive.store._postgres import _SEMAPHORE_LOCK

from .test_async_cancel import STEPS, cancelled_after, release_soon

LONG = 60.0
SHORT = 0.5
#: How soon a waiter woken by a release holds its slot, in seconds.
WOKEN_S = 0.2
_T = TypeVar("_T")


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run one coroutine on a fresh event loop, with an outer bound."""
    return asyncio.run(asyncio.wait_for(coro, 60.0))


async def held(
    store: Store, name: str, limit: int, owner: str = "w1", ttl: float = LONG
) -> AsyncSemaphoreLease:
    lease = await store.semaphore(name, limit).try_acquire_async(owner, ttl)
    assert lease is not None, f"a slot of {name!r} should have been free"
    return lease


def owners(store: Store, name: str) -> list[str]:
    return [info.owner for info in store.semaphore(name, 1).holders()]


# -- the handle --------------------------------------------------------------------------------


def test_try_acquire_async_counts_and_release_frees(store: Store, other: Store) -> None:
    async def body() -> None:
        sem = store.semaphore("pool", 2)
        first, second = await held(store, "pool", 2, "a"), await held(store, "pool", 2, "b")
        assert isinstance(first, AsyncSemaphoreLease)
        assert (first.slot, second.slot) == (0, 1)
        assert second.fencing_token > first.fencing_token
        assert await sem.try_acquire_async("c", LONG) is None
        assert other.semaphore("pool", 2).try_acquire("c", LONG) is None  # the sync path too
        assert await first.release() is True
        assert await first.release_async() is False  # the same method, the api.md name
        third = await held(other, "pool", 2, "c")
        assert third.slot == 0 and third.fencing_token > second.fencing_token

    run(body())


def test_renew_async_sets_a_new_full_window_and_keeps_token_and_slot(store: Store) -> None:
    async def body() -> None:
        lease = await held(store, "r", 3, ttl=30.0)
        token, first_expiry = lease.fencing_token, lease.expires_at
        assert await lease.renew(2.0) is True
        assert lease.remaining() <= 2.0 and lease.expires_at < first_expiry
        assert await lease.renew_async(40.0) is True
        assert 39.0 < lease.remaining() <= 40.0
        assert (lease.fencing_token, lease.slot) == (token, 0)

    run(body())


def test_a_lapsed_async_lease_renews_and_releases_false(store: Store) -> None:
    async def body() -> None:
        lease = await held(store, "lapse", 1, ttl=SHORT)
        await asyncio.sleep(lease.remaining() + 0.1)
        successor = await held(store, "lapse", 1, "w2")
        assert successor.fencing_token > lease.fencing_token
        assert await lease.renew(LONG) is False and lease.lost
        assert await lease.release() is False
        assert owners(store, "lapse") == ["w2"]

    run(body())


def test_another_limit_is_a_named_error_in_asyncio_too(store: Store) -> None:
    async def body() -> None:
        await held(store, "mixed", 2)
        with pytest.raises(SemaphoreLimitMismatch) as caught:
            await store.semaphore("mixed", 5).try_acquire_async("w2", LONG)
        assert (caught.value.limit, caught.value.found) == (5, 2)
        with pytest.raises(SemaphoreLimitMismatch):
            await store.semaphore("mixed", 1).acquire_async(ttl=LONG, timeout=5.0)

    run(body())
    assert owners(store, "mixed") == ["w1"]


def test_bad_arguments_raise_at_the_call_before_anything_is_awaited(store: Store) -> None:
    sem = store.semaphore("n", 2)
    with pytest.raises(StoreError) as caught:
        sem.acquire_async(ttl=-1.0)
    assert caught.value.kind is ErrorKind.DATABASE
    with pytest.raises(TypeError):
        sem.acquire_async(auto_renew=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        sem.acquire_async(timeout=-1.0)


# -- the waiting helper ------------------------------------------------------------------------


def test_acquire_async_holds_renews_and_releases(store: Store) -> None:
    async def body() -> None:
        sem = store.semaphore("auto", 2)
        async with sem.acquire_async(ttl=0.3, timeout=5.0) as lease:
            assert isinstance(lease, AsyncSemaphoreLease)
            await asyncio.sleep(0.8)  # beyond the ttl: the renewal task kept it
            assert not lease.lost
            assert [info.fencing_token for info in sem.holders()] == [lease.fencing_token]
        assert sem.holders() == []
        lease = await sem.acquire_async("mine", ttl=LONG, timeout=0)
        assert owners(store, "auto") == ["mine"]
        assert await lease.release() is True

    run(body())


def test_acquire_async_times_out_naming_the_semaphore(store: Store) -> None:
    async def body() -> None:
        await held(store, "full", 1)
        with pytest.raises(LockTimeout, match="semaphore 'full'"):
            await store.semaphore("full", 1).acquire_async(ttl=LONG, timeout=0.3)

    run(body())


def woken_after_releases(store: Store, rounds: int) -> list[float]:
    """Seconds from each release in another thread to its async waiter holding the
    slot: ``rounds`` names and waiters of one loop, released as in the sync suite."""
    names = [f"wake-{n}" for n in range(rounds)]
    holders = [store.semaphore(name, 1).try_acquire("w1", LONG) for name in names]
    released: dict[str, float] = {}

    def release_later() -> None:
        time.sleep(2.0)
        for name, holder in zip(names, holders, strict=True):
            released[name] = time.monotonic()
            assert holder is not None and holder.release()
            time.sleep(0.33)

    async def wait(name: str) -> float:
        async with store.semaphore(name, 1).acquire_async(ttl=LONG, timeout=20.0):
            return time.monotonic()

    async def body() -> list[float]:
        return list(await asyncio.gather(*(wait(name) for name in names)))

    thread = threading.Thread(target=release_later)
    thread.start()
    woken = run(body())
    thread.join()
    return [at - released[name] for name, at in zip(names, woken, strict=True)]


def test_an_async_waiter_is_woken_by_a_release_from_another_thread(store: Store) -> None:
    for round_no, late in enumerate(woken_after_releases(store, 3)):  # as in the sync suite
        assert late < WOKEN_S, f"round {round_no}: woken {late:.3f} s after the release"


def test_an_async_waiter_is_freed_by_a_lapse_by_its_expiry(store: Store) -> None:
    async def body() -> float:
        await held(store, "dead", 1, ttl=1.5)
        started = time.monotonic()
        async with store.semaphore("dead", 1).acquire_async(ttl=LONG, timeout=20.0):
            return time.monotonic() - started

    waited = run(body())
    assert 1.0 < waited < 1.5 + 0.3, f"waited {waited:.3f} s for a lease of 1.5 s"


def test_many_waiters_of_one_loop_each_get_a_slot_as_slots_free(store: Store) -> None:
    async def body() -> list[int]:
        sem = store.semaphore("queue", 2)
        first, second = await held(store, "queue", 2, "a"), await held(store, "queue", 2, "b")

        inside: set[int] = set()  # the slots the waiters hold now

        async def wait(index: int) -> int:
            async with sem.acquire_async(f"waiter-{index}", ttl=LONG, timeout=20.0) as lease:
                assert lease.slot not in inside  # no slot has two holders
                inside.add(lease.slot)
                await asyncio.sleep(0.05)
                inside.discard(lease.slot)
                return lease.slot

        waiters = [asyncio.create_task(wait(index)) for index in range(4)]
        await asyncio.sleep(0.3)
        assert await first.release() and await second.release()
        return await asyncio.gather(*waiters)

    slots = run(body())  # which waiter gets which slot is the order of their wakes
    assert len(slots) == 4 and set(slots) <= {0, 1}
    assert owners(store, "queue") == []


# -- cancellation ------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", STEPS)
def test_an_acquire_cancelled_at_any_step_leaves_no_slot(store: Store, steps: int) -> None:
    sem = store.semaphore("c", 2)
    lease = run(cancelled_after(steps, sem.try_acquire_async("w1", LONG)))
    if lease is None:  # the cancellation landed: nothing may be left
        assert sem.holders() == []
        assert store.statistics().held_count == 0
    else:  # it finished first: an ordinary, releasable lease
        assert run(lease.release()) is True
    assert sem.holders() == []


@pytest.mark.parametrize("steps", [0, 1, 3, 8, 40])
def test_a_waiting_acquire_cancelled_leaves_no_slot_and_no_waiter(store: Store, steps: int) -> None:
    holder = store.semaphore("busy", 1).try_acquire("holder", LONG)
    assert holder is not None

    async def body() -> None:
        waiting = store.semaphore("busy", 1).acquire_async("waiter", ttl=LONG, timeout=20.0)
        assert await cancelled_after(steps, _awaited(waiting)) is None

    run(body())
    assert owners(store, "busy") == ["holder"]
    assert holder.release()
    assert owners(store, "busy") == []
    notifications = getattr(store._backend.engine, "_notifications", None)
    if notifications is not None:  # the cancelled waiter left the listener
        assert notifications._waiters == {}


async def _awaited(waiting: Any) -> AsyncSemaphoreLease:
    lease: AsyncSemaphoreLease = await waiting
    return lease


@contextlib.contextmanager
def _blocked(store_url: str, name: str) -> Iterator[None]:
    """Hold what a semaphore grant or release of ``name`` waits for, while open."""
    if store_url.startswith("sqlite:"):
        path = store_url[len("sqlite://") :]
        writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            writer.execute("BEGIN IMMEDIATE")
            yield
            writer.execute("COMMIT")
        finally:
            writer.close()
    elif store_url.startswith("redis:"):
        client = redis.Redis.from_url(store_url.split("?", maxsplit=1)[0])
        try:
            client.client_pause(60_000, all=False)  # WRITE: scripts that write wait
            yield
            client.client_unpause()
        finally:
            client.close()
    else:
        with psycopg.connect(store_url) as conn:  # the grant's advisory lock, the rows
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_SEMAPHORE_LOCK, name))
            conn.execute("SELECT 1 FROM orbitive_semaphores WHERE name = %s FOR UPDATE", (name,))
            yield


def test_a_grant_committed_after_cancellation_is_released(store: Store, store_url: str) -> None:
    if store_url.startswith("shm:"):
        pytest.skip("SHM table steps never suspend: nothing to cancel inside one")
    sem = store.semaphore("late", 2)
    block = _blocked(store_url, "late")
    block.__enter__()

    async def body() -> None:
        task = asyncio.create_task(sem.try_acquire_async("w1", LONG))
        await asyncio.sleep(0.3)  # the grant waits on the blocked engine
        task.cancel()
        leaving = release_soon(block, 0.2)
        with pytest.raises(asyncio.CancelledError):
            await task
        leaving.join()

    run(body())
    assert sem.holders() == []  # committed after the cancellation, then released
    assert store.statistics().held_count == 0


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "renewing"])
def test_a_release_cancelled_at_any_step_is_true_to_the_store(
    store: Store, steps: int, auto_renew: bool
) -> None:
    sem = store.semaphore("rel", 2)

    async def body() -> AsyncSemaphoreLease:
        lease = await sem.acquire_async("w1", ttl=LONG, timeout=0, auto_renew=auto_renew)
        await cancelled_after(steps, lease.release())
        return lease

    lease = run(body())
    tokens = [info.fencing_token for info in sem.holders()]
    if lease._released:  # released, and the handle says so
        assert tokens == [] and run(lease.release()) is False
    else:  # still held and releasable
        assert tokens == [lease.fencing_token] and run(lease.release()) is True
    assert sem.holders() == []


def test_a_release_cancelled_in_flight_is_finished_and_recorded(
    store: Store, store_url: str
) -> None:
    if store_url.startswith("shm:"):
        pytest.skip("SHM table steps never suspend: nothing to cancel inside one")
    sem = store.semaphore("inflight", 2)

    async def body() -> AsyncSemaphoreLease:
        lease = await held(store, "inflight", 2)
        block = _blocked(store_url, "inflight")
        block.__enter__()
        task = asyncio.create_task(lease.release())
        await asyncio.sleep(0.3)  # the release waits for the engine's write path
        task.cancel()
        leaving = release_soon(block, 0.3)
        with pytest.raises(asyncio.CancelledError):
            await task
        leaving.join()
        return lease

    lease = run(body())
    assert lease._released and not lease.lost
    assert sem.holders() == []
    assert store.statistics().released_count == 1
