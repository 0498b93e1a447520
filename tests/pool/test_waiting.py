"""Waiting for capacity: parked threads, other processes, asyncio tasks, a poll set."""

from __future__ import annotations

import asyncio
import math
import select
import threading
import time
from collections.abc import Callable

import pytest

from orbitive import Fleet
from orbitive._core._errors import MalformedError
from orbitive._core._readiness import BACKEND
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
    assert 0.28 <= elapsed < 1.5


@pytest.mark.skipif(
    BACKEND.NAME != "futex", reason="needs the futex backend (the pipe backend polls)"
)
def test_a_one_second_wait_with_nothing_happening_uses_little_cpu(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    waiter = agents()
    assert waiter.call("backend") == "futex"
    since = shm_pool.version(KEY)
    version, elapsed, thread_cpu, process_cpu = waiter.call("wait_cpu", KEY, since, 1.0)
    assert version is None
    assert 0.98 <= elapsed < 2.0
    # Parked in the kernel: about 0.5 ms of CPU. Polling with backoff to a few ms
    # (the pipe backend) costs about 35 ms per second, so these bounds tell them apart.
    assert thread_cpu < 0.02
    assert process_cpu < 0.05


def test_wait_returns_at_once_when_the_version_already_moved(pool: Pool) -> None:
    since = pool.version(KEY)
    pool.register(KEY, 1)
    assert pool.wait_capacity(KEY, since, timeout=5.0) == since + 1


@pytest.mark.parametrize("seconds", [1e9 + 1, 1e19, 2**63, 2**2000, 1e306, math.inf])
def test_seconds_past_the_maximum_are_malformed_for_every_verb(pool: Pool, seconds: float) -> None:
    """Never an OSError from the kernel, an overflow, or a timeout wrapped to another."""
    rid = pool.register(KEY, 1)
    version = pool.version(KEY)
    with pytest.raises(MalformedError, match="timeout"):
        pool.wait_capacity(KEY, version, seconds)
    with pytest.raises(MalformedError, match="timeout"):
        asyncio.run(pool.poll_capacity(KEY, version, seconds))
    with pytest.raises(MalformedError, match="grace"):
        pool.reconcile(rid, 0, seconds)
    assert pool.reconcile(rid, 0, 1e9) == 0  # the maximum itself is taken


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


def test_poll_capacity_from_many_tasks_and_loops_shares_one_descriptor_and_no_thread(
    fleet: Fleet,
) -> None:
    keys = [Key(100 + n) for n in range(4)]
    before = {thread.name for thread in threading.enumerate()}
    with Pool(fleet) as pool, Pool(fleet) as second:
        since = {key: pool.version(key) for key in keys}
        elsewhere: list[int | None] = []

        def other_loop() -> None:
            elsewhere.append(asyncio.run(second.poll_capacity(keys[0], since[keys[0]], 10.0)))

        async def main() -> tuple[set[str], list[int | None]]:
            tasks = [
                asyncio.create_task(handle.poll_capacity(key, since[key], timeout=10.0))
                for key in keys
                for handle in (pool, second)
                for _ in range(2)
            ]
            thread = threading.Thread(target=other_loop, name="test-other-loop")
            thread.start()
            await asyncio.sleep(0.2)
            assert not any(task.done() for task in tasks)
            started = {t.name for t in threading.enumerate()} - before - {"test-other-loop"}
            for key in keys:
                pool.register(key, 1)
            woken = await asyncio.wait_for(asyncio.gather(*tasks), 10.0)
            await asyncio.to_thread(thread.join, 10.0)
            return started, woken

        started, woken = asyncio.run(main())
        assert not {name for name in started if name.startswith("orbit-")}  # no driver thread
        assert pool.fileno() == second.fileno()  # one descriptor per process and table
        assert woken == [since[key] + 1 for key in keys for _ in range(4)]
        assert elsewhere == [since[keys[0]] + 1]
