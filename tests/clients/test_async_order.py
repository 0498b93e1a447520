"""Asyncio callers of one process that wait on a saturated pool are served in arrival order,
and a cancelled waiter neither loses a later waiter's place nor leaks a unit.

The test holds the only client (``max_live=1``); tasks queue one after another, and
every return hands the client on. Before the gate, the waiters a return woke were
resumed last first: 5, 4, 3, 2, 1, 0 in 3 of 3 runs.
"""

from __future__ import annotations

import asyncio
import functools

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions

from ._fakes import FakeClient, close

#: Tasks queued behind the held client.
WAITERS = 6
#: Seconds between two tasks' arrivals.
APART_S = 0.02


async def queued_in_turn(pool: ClientPool[FakeClient], count: int) -> list[asyncio.Task[int]]:
    """``count`` tasks that each check a client out, hold it a moment and hand it back,
    started :data:`APART_S` apart (a task queues within its first few loop steps)."""
    served: list[asyncio.Task[int]] = []
    for index in range(count):
        served.append(asyncio.create_task(served_as(pool, index)))
        await asyncio.sleep(APART_S)
    assert not any(task.done() for task in served)  # every one waits
    return served


async def served_as(pool: ClientPool[FakeClient], index: int) -> int:
    async with pool.client_async(timeout=30.0):
        await asyncio.sleep(0.01)
    return index


def test_async_waiters_are_served_in_arrival_order(fleet: Fleet) -> None:
    async def main() -> None:
        options = PoolOptions(max_live=1, acquire_timeout=30.0)
        with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
            held = await pool.getconn_async()
            order: list[int] = []
            tasks = await queued_in_turn(pool, WAITERS)
            for task in tasks:
                task.add_done_callback(lambda done: order.append(done.result()))
            await pool.putconn_async(held)
            await asyncio.gather(*tasks)
            assert order == list(range(WAITERS))

    asyncio.run(main())


def served_in(order: list[int], done: asyncio.Task[int]) -> None:
    """A done callback: the index a task that was served returned, appended to ``order``."""
    if not done.cancelled():
        order.append(done.result())


async def all_units_back(pool: ClientPool[FakeClient], max_live: int) -> None:
    """Every unit of the key and every place of the queue is free again: ``max_live``
    checkouts at once are served within a second."""
    taken = await asyncio.gather(*(pool.getconn_async(timeout=1.0) for _ in range(max_live)))
    stats = pool.statistics()
    assert (stats.local_in_use, stats.in_use, stats.local_waiting) == (max_live, max_live, 0)
    for client in taken:
        await pool.putconn_async(client)


def test_a_waiter_cancelled_in_the_queue_keeps_the_others_places_and_leaks_nothing(
    fleet: Fleet,
) -> None:
    async def main() -> None:
        options = PoolOptions(max_live=1, acquire_timeout=30.0)
        with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
            held = await pool.getconn_async()
            order: list[int] = []
            tasks = await queued_in_turn(pool, WAITERS)
            tasks[2].cancel()
            for task in tasks:
                task.add_done_callback(functools.partial(served_in, order))
            await pool.putconn_async(held)
            await asyncio.gather(*tasks, return_exceptions=True)
            assert tasks[2].cancelled() and order == [0, 1, 3, 4, 5]
            await all_units_back(pool, 1)

    asyncio.run(main())


def test_a_waiter_cancelled_once_handed_its_place_passes_it_on_and_leaks_nothing(
    fleet: Fleet,
) -> None:
    async def main() -> None:
        options = PoolOptions(max_live=1, acquire_timeout=30.0)
        with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
            held = await pool.getconn_async()
            order: list[int] = []
            tasks = await queued_in_turn(pool, WAITERS)
            for task in tasks:
                task.add_done_callback(functools.partial(served_in, order))
            await pool.putconn_async(held)  # hands the place to task 0, not yet resumed
            tasks[0].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert tasks[0].cancelled() and order == [1, 2, 3, 4, 5]
            await all_units_back(pool, 1)

    asyncio.run(main())


def test_a_waiter_cancelled_while_its_client_is_created_passes_its_place_on(
    fleet: Fleet,
) -> None:
    async def main() -> None:
        started, go = asyncio.Event(), asyncio.Event()

        async def create() -> FakeClient:
            started.set()
            await go.wait()
            return FakeClient()

        options = PoolOptions(max_live=1, acquire_timeout=30.0)
        with ClientPool(fleet, "fake", create=create, close=close, options=options) as pool:
            first = asyncio.create_task(pool.getconn_async())
            await started.wait()  # the first checkout creates; the others queue behind it
            tasks = await queued_in_turn(pool, 3)
            first.cancel()
            await asyncio.sleep(0.05)
            go.set()  # the created client joins the idle ones and goes to the next in turn
            assert await asyncio.gather(*tasks) == [0, 1, 2]
            assert first.cancelled()
            await all_units_back(pool, 1)

    asyncio.run(main())
