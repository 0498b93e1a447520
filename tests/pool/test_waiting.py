"""Waiting for capacity: parked threads, other processes, asyncio tasks, a poll set."""

from __future__ import annotations

import asyncio
import select
import threading
import time
from collections.abc import Callable

from orbitive.pool import Key, Pool

from ._agent import Agent

KEY = Key(42)


def test_waiter_in_another_process_wakes_when_owner_completes(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    rid = shm_pool.register(KEY, 1)
    execution = shm_pool.accept(shm_pool.reserve(rid))
    since = shm_pool.version(KEY)
    waiter = agents()
    waiter.send("wait", KEY, since, None)
    assert not waiter.conn.poll(0.3)  # parked, not returning early
    execution.complete()
    version, _ = waiter.reply(10.0)
    assert version == shm_pool.version(KEY) != since


def test_bounded_wait_times_out_near_its_bound(shm_pool: Pool, agents: Callable[[], Agent]) -> None:
    since = shm_pool.version(KEY)
    version, elapsed = agents().call("wait", KEY, since, 0.3)
    assert version is None
    assert 0.25 <= elapsed < 3.0


def test_wait_returns_at_once_when_the_version_already_moved(pool: Pool) -> None:
    since = pool.version(KEY)
    pool.register(KEY, 1)
    assert pool.wait_capacity(KEY, since, timeout=5.0) == since + 1


def test_threads_of_one_process_wake_on_completion(pool: Pool) -> None:
    rid = pool.register(KEY, 1)
    execution = pool.accept(pool.reserve(rid))
    since = pool.version(KEY)
    results: list[int | None] = []
    threads = [
        threading.Thread(target=lambda: results.append(pool.wait_capacity(KEY, since, 10.0)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    execution.complete()
    for thread in threads:
        thread.join(10.0)
    assert results == [since + 1] * 3


def test_poll_capacity_wakes_an_asyncio_task_on_completion(pool: Pool) -> None:
    rid = pool.register(KEY, 1)
    execution = pool.accept(pool.reserve(rid))
    since = pool.version(KEY)

    async def main() -> tuple[int | None, int | None]:
        task = asyncio.create_task(pool.poll_capacity(KEY, since))
        await asyncio.sleep(0.1)
        assert not task.done()
        execution.complete()
        woken = await asyncio.wait_for(task, 10.0)
        timed_out = await pool.poll_capacity(KEY, pool.version(KEY), timeout=0.2)
        return woken, timed_out

    assert asyncio.run(main()) == (since + 1, None)


def test_poll_capacity_wakes_on_a_change_from_another_process(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    member = agents()
    since = shm_pool.version(KEY)

    async def main() -> int | None:
        task = asyncio.create_task(shm_pool.poll_capacity(KEY, since))
        await asyncio.sleep(0.1)
        await asyncio.to_thread(member.call, "register", KEY, 1)
        return await asyncio.wait_for(task, 10.0)

    assert asyncio.run(main()) == since + 1


def test_descriptor_turns_readable_after_a_watched_key_changes(pool: Pool) -> None:
    fd = pool.fileno()
    pool.clear_readiness()
    since = pool.watch(KEY)
    assert select.select([fd], [], [], 0.1)[0] == []
    pool.register(KEY, 1)
    assert select.select([fd], [], [], 5.0)[0] == [fd]
    pool.clear_readiness()
    assert pool.version(KEY) != since
    pool.register(KEY, 1)  # interest is one-shot: no bell until watched again
    assert select.select([fd], [], [], 0.2)[0] == []
