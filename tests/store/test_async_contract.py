"""The store contract for asyncio code (issue 12 item 1), run on every engine.

``try_lock_async``, ``lock_async`` and :class:`AsyncLock` keep the rules the sync
contract pins (``test_contract.py``, ``test_blocking.py``); each test drives its
coroutine with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

import pytest

from orbitive._core._errors import InvalidLockName, InvalidLockOwner, InvalidTtl, LockTimeout
from orbitive.store import AsyncLock, ErrorKind, Lock, Store, StoreError, open_store
from orbitive.store._shm_async import ShmAsyncEngine

LONG = 60.0
SHORT = 0.5
_T = TypeVar("_T")


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run one coroutine on a fresh event loop, with an outer bound."""
    return asyncio.run(asyncio.wait_for(coro, 60.0))


async def acquired(waiting: Awaitable[AsyncLock]) -> AsyncLock:
    """``await store.lock_async(...)`` as a coroutine (for ``run`` and ``create_task``)."""
    return await waiting


async def held(store: Store, name: str, owner: str = "w1", ttl: float = LONG) -> AsyncLock:
    lock = await store.try_lock_async(name, owner, ttl)
    assert lock is not None, f"{name!r} should have been free"
    return lock


async def lapse(*locks: AsyncLock | Lock) -> None:
    await asyncio.sleep(max(lock.remaining() for lock in locks) + 0.1)


# -- try_lock_async and the handle ------------------------------------------------------------


def test_try_lock_async_grants_exclusively_and_release_frees(store: Store, other: Store) -> None:
    async def body() -> None:
        lock = await held(store, "jobs/a", "worker-1", 30.0)
        assert isinstance(lock, AsyncLock)
        assert (lock.name, lock.owner) == ("jobs/a", "worker-1")
        assert 29.0 < lock.remaining() <= 30.0 and not lock.lost
        assert await other.try_lock_async("jobs/a", "w2", LONG) is None
        assert other.try_lock("jobs/a", "w2", LONG) is None  # the sync path sees it too
        assert await lock.release() is True
        assert await lock.release() is False
        again = await held(other, "jobs/a", "w2")
        assert again.fencing_token > lock.fencing_token
        assert await again.release_async() is True  # the api.md name of the same method

    run(body())


def test_a_sync_holder_refuses_an_async_acquirer(store: Store, other: Store) -> None:
    sync = other.try_lock("mixed", "sync", LONG)
    assert sync is not None
    assert run(store.try_lock_async("mixed", "async", LONG)) is None
    assert sync.release()
    lock = run(store.try_lock_async("mixed", "async", LONG))
    assert lock is not None and lock.fencing_token > sync.fencing_token


def test_renew_sets_a_new_full_window_and_keeps_the_token(store: Store) -> None:
    async def body() -> None:
        lock = await held(store, "r", ttl=30.0)
        first_expiry, token = lock.expires_at, lock.fencing_token
        assert await lock.renew(2.0)
        info = store.inspect("r")
        assert info is not None and info.remaining_s <= 2.0
        assert lock.expires_at < first_expiry and lock.remaining() <= 2.0
        assert await lock.renew_async(40.0)
        assert 39.0 < lock.remaining() <= 40.0 and lock.fencing_token == token
        assert store.statistics().renewed_count == 2

    run(body())


def test_renew_and_release_after_lapse_and_reacquire_return_false(
    store: Store, other: Store
) -> None:
    async def body() -> None:
        lock = await held(store, "lapse", ttl=SHORT)
        await lapse(lock)
        successor = await held(other, "lapse", "w2")
        assert await lock.renew(LONG) is False
        assert lock.lost
        assert await lock.release() is False
        info = other.inspect("lapse")
        assert info is not None and info.fencing_token == successor.fencing_token
        assert successor.fencing_token > lock.fencing_token

    run(body())


def test_force_release_makes_the_handle_lost(store: Store, other: Store) -> None:
    async def body() -> None:
        lock = await held(store, "f")
        assert other.force_release("f")
        assert await lock.renew(LONG) is False
        assert lock.lost and await lock.release() is False
        assert store.statistics().lost_count == 1

    run(body())


def test_async_with_on_the_handle_releases(store: Store) -> None:
    async def body() -> AsyncLock:
        async with await held(store, "ctx") as lock:
            assert store.inspect("ctx") is not None
        return lock

    lock = run(body())
    assert store.inspect("ctx") is None
    assert "released" in repr(lock)


def test_async_with_on_the_store_closes_it(store_url: str) -> None:
    async def body() -> Store:
        async with open_store(store_url) as store:
            assert await store.try_lock_async("ctx", "w", LONG) is not None
        return store

    store = run(body())
    assert "closed" in repr(store)
    with pytest.raises(StoreError) as caught:
        store.inspect("ctx")
    assert caught.value.kind is ErrorKind.CLOSED


# -- guards ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, -1.0, math.nan, math.inf, "5", None], ids=repr)
def test_bad_ttl_is_the_duration_guard_on_try_lock_and_renew(store: Store, ttl: object) -> None:
    async def body() -> None:
        with pytest.raises(StoreError) as caught:
            await store.try_lock_async("guarded", "w1", ttl)  # type: ignore[arg-type]
        assert caught.value.kind is ErrorKind.DATABASE
        assert isinstance(caught.value.__cause__, InvalidTtl)
        lock = await held(store, "kept")
        with pytest.raises(StoreError) as renewing:
            await lock.renew(ttl)  # type: ignore[arg-type]
        assert renewing.value.kind is ErrorKind.DATABASE
        assert not lock.lost and await lock.release()

    run(body())
    assert store.locks() == []


@pytest.mark.parametrize("name", ["", "x" * 256, "a\x00b", None, b"bytes"], ids=repr)
def test_bad_names_and_owners_are_refused_before_anything_is_awaited(
    store: Store, name: object
) -> None:
    with pytest.raises(InvalidLockName):
        store.lock_async(name)  # type: ignore[arg-type]  # raises at the call
    with pytest.raises(InvalidLockName):
        run(store.try_lock_async(name, "w1", LONG))  # type: ignore[arg-type]
    with pytest.raises(InvalidLockOwner):
        store.lock_async("n", owner="")
    with pytest.raises(InvalidTtl):
        store.lock_async("n", timeout=-1.0)
    assert store.locks() == []


# -- lock_async: waiting, timeouts ---------------------------------------------------------------


def test_lock_async_waits_for_a_release_by_another_task(store: Store, other: Store) -> None:
    async def body() -> float:
        holder = await held(other, "wait", "holder")

        async def release_later() -> None:
            await asyncio.sleep(0.3)
            await holder.release()

        releaser = asyncio.create_task(release_later())
        started = time.monotonic()
        async with store.lock_async("wait", ttl=10.0, timeout=20.0) as lock:
            waited = time.monotonic() - started
            assert lock.fencing_token > holder.fencing_token
        await releaser
        return waited

    assert 0.2 < run(body()) < 10.0
    assert store.inspect("wait") is None


def test_lock_async_waits_for_the_holders_expiry(store: Store, other: Store) -> None:
    holder = other.try_lock("expire", "holder", 0.4)
    assert holder is not None

    async def body() -> None:
        lock = await store.lock_async("expire", ttl=10.0, timeout=20.0)  # the await form
        assert holder.remaining() == 0.0 and lock.fencing_token > holder.fencing_token
        assert await lock.release()

    run(body())


def test_timeout_zero_is_exactly_one_attempt(store: Store, other: Store) -> None:
    assert other.try_lock("once", "holder", LONG) is not None
    before = store.statistics().busy_count
    with pytest.raises(LockTimeout) as caught:
        run(acquired(store.lock_async("once", timeout=0)))
    assert store.statistics().busy_count == before + 1
    assert "'holder'" in str(caught.value) and isinstance(caught.value, TimeoutError)


def test_timeout_raises_after_about_that_long(store: Store, other: Store) -> None:
    assert other.try_lock("busy", "holder", LONG) is not None

    async def body() -> None:
        async with store.lock_async("busy", ttl=5.0, timeout=0.3):
            raise AssertionError("the lock was held elsewhere")

    started = time.monotonic()
    with pytest.raises(LockTimeout):
        run(body())
    assert 0.25 < time.monotonic() - started < 5.0
    assert store.statistics().busy_count >= 2


def test_tasks_of_one_loop_take_turns(store: Store) -> None:
    inside = [0]
    turns = [0]

    async def worker() -> None:
        for _ in range(5):
            async with store.lock_async("turns", ttl=10.0, timeout=30.0):
                inside[0] += 1
                assert inside[0] == 1
                await asyncio.sleep(0.005)
                inside[0] -= 1
                turns[0] += 1

    async def body() -> None:
        await asyncio.gather(*(worker() for _ in range(4)))

    run(body())
    assert turns[0] == 20
    assert store.statistics().held_count == 0


# -- auto-renew and loss ----------------------------------------------------------------------


def test_auto_renew_task_keeps_the_lock_past_its_ttl(store: Store, other: Store) -> None:
    async def body() -> AsyncLock:
        async with store.lock_async("renewed", ttl=0.6, timeout=0) as lock:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                assert other.try_lock("renewed", "intruder", LONG) is None
                await asyncio.sleep(0.05)
            assert not lock.lost
        return lock

    lock = run(body())
    assert store.statistics().renewed_count >= 2
    assert store.inspect("renewed") is None
    assert run(lock.release()) is False


def test_without_auto_renew_the_lease_lapses(store: Store, other: Store) -> None:
    async def body() -> None:
        async with store.lock_async("plain", ttl=0.3, timeout=0, auto_renew=False) as lock:
            await asyncio.sleep(0.45)
            assert lock.lost
            assert other.try_lock("plain", "next", LONG) is not None

    run(body())
    assert store.statistics().renewed_count == 0


def test_loss_sets_the_flag_calls_back_in_the_loop_and_exit_does_not_raise(
    store: Store, other: Store
) -> None:
    lost: list[tuple[AsyncLock, bool]] = []

    async def body() -> AsyncLock:
        loop = asyncio.get_running_loop()
        called = asyncio.Event()

        def on_lost(lock: AsyncLock) -> None:
            lost.append((lock, asyncio.get_running_loop() is loop))
            called.set()

        async with store.lock_async("lose", ttl=1.5, timeout=0, on_lost=on_lost) as lock:
            assert other.force_release("lose")
            await asyncio.wait_for(called.wait(), 5.0)
            assert lock.lost
            assert other.try_lock("lose", "next", LONG) is not None
        return lock

    lock = run(body())
    assert lost == [(lock, True)]
    assert other.inspect("lose") is not None  # the successor kept its lease
    assert store.statistics().lost_count == 1


def test_default_owner_is_fresh_and_names_this_process(store: Store) -> None:
    async def body() -> None:
        async with store.lock_async("a", timeout=0) as first, store.lock_async("b") as second:
            assert first.owner != second.owner
            assert f":{os.getpid()}:" in first.owner

    run(body())


# -- store lifecycle -------------------------------------------------------------------------


def test_closing_the_store_stops_the_renewal_task_and_refuses_with_closed(
    store_url: str, other: Store
) -> None:
    async def body() -> None:
        store = open_store(store_url)
        lock = await store.lock_async("closing", ttl=0.3, timeout=0)
        store.close()
        await asyncio.sleep(0.5)
        assert lock.lost
        assert other.try_lock("closing", "next", LONG) is not None
        for call in (lambda: store.try_lock_async("x", "w", 1.0), lock.release):
            with pytest.raises(StoreError) as caught:
                await call()
            assert caught.value.kind is ErrorKind.CLOSED

    run(body())


def test_closing_the_store_ends_a_waiting_lock_async_with_closed(store_url: str) -> None:
    store = open_store(store_url)
    holder = store.try_lock("wanted", "holder", LONG)
    assert holder is not None

    async def body() -> None:
        waiter = asyncio.create_task(acquired(store.lock_async("wanted", ttl=1.0, timeout=10.0)))
        await asyncio.sleep(0.2)  # the waiter is in its wait loop
        store.close()
        with pytest.raises(StoreError) as caught:
            await asyncio.wait_for(waiter, 5.0)
        assert caught.value.kind is ErrorKind.CLOSED

    run(body())
    with open_store(store_url) as again:
        assert again.force_release("wanted")


def test_one_store_serves_two_event_loops_in_turn(store: Store) -> None:
    first = run(held(store, "loops-a"))
    second = run(held(store, "loops-b"))  # a new loop: the engine reconnects where it must
    assert run(first.release()) and run(second.release())
    assert store.locks() == []


def test_shm_waits_are_one_reader_per_loop_on_the_readiness_descriptor(shm_url: str) -> None:
    with open_store(shm_url) as store, open_store(shm_url) as other:
        holder = other.try_lock("ready", "holder", LONG)
        assert holder is not None

        async def body() -> None:
            loop = asyncio.get_running_loop()
            waiters = [asyncio.create_task(acquired(store.lock_async("ready"))) for _ in range(3)]
            await asyncio.sleep(0.3)
            engine = store._backend.asyncio()
            assert isinstance(engine, ShmAsyncEngine) and engine.atomic
            fd, waiting = engine._waiting[loop]  # one reader serves the loop's three waiters
            assert fd == store._backend.engine.fileno() and len(waiting) == 3  # type: ignore[attr-defined]
            assert holder.release()  # the transition wakes them through the descriptor
            locks = []
            for task in asyncio.as_completed(waiters):
                lock = await task
                locks.append(lock.fencing_token)
                await lock.release()
            assert len(set(locks)) == 3
            assert loop not in engine._waiting
            assert not loop.remove_reader(fd)  # nothing left registered on the loop

        run(body())


def test_a_forked_child_uses_the_async_form_on_its_own_connection(store: Store) -> None:
    parent = run(held(store, "parent"))
    pid = os.fork()
    if pid == 0:  # child: its exit status tells the parent what happened
        code = 1
        try:

            async def child() -> int:
                mine = await store.try_lock_async("child", "kid", LONG)
                refused = await store.try_lock_async("parent", "kid", LONG) is None
                return 0 if mine is not None and refused and await mine.release() else 2

            code = asyncio.run(child())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert run(parent.renew(LONG))  # the parent's connection is intact
    assert store.inspect("child") is None
    assert run(parent.release())
