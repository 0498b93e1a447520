"""The event loop is never blocked (issue 12 item 1): its lag while a task waits.

Another process holds the lock for a while; a task waits for it with
``lock_async`` while a ticker task measures how late its 10 ms sleeps wake up.
The bound is generous (a noisy 2-core VM); a blocking wait stalls the loop for
the whole hold, which the control test shows the meter catches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from orbitive.store import Store, open_store

from .._processes import Processes
from ._async_workers import hold

HOLD_S = 1.5
TICK_S = 0.01
#: Largest lag a tick may see while a task waits without blocking the loop, in seconds.
LAG_BOUND_S = 0.3


async def lag_while(wait: Callable[[], Awaitable[int]]) -> tuple[float, int, int]:
    """Run ``wait`` while a ticker measures the loop: (largest lag s, ticks, wait's result)."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            started = loop.time()
            await asyncio.sleep(TICK_S)
            lags.append(loop.time() - started - TICK_S)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(TICK_S * 3)  # the ticker is running before the wait starts
    try:
        result = await wait()
    finally:
        done.set()
        await ticker
    return max(lags), len(lags), result


def waited_for_another_process(
    store_url: str, ttl: float, hold_s: float, kill: bool, wait: Callable[[Store], Awaitable[int]]
) -> tuple[float, int, int, int]:
    """A child holds the lock; ``wait`` takes it: (lag, ticks, the child's token, wait's)."""
    with Processes("fork") as procs:
        holder = procs.start(hold, store_url, "busy", ttl, hold_s)
        assert holder.recv() == "held"
        with open_store(store_url) as store:
            info = store.inspect("busy")
            assert info is not None and info.owner == "other-process"
            if kill:
                holder.kill()  # kill -9: its lease is left to lapse
            lag, ticks, token = asyncio.run(lag_while(lambda: wait(store)))
        if not kill:
            assert holder.recv() == "released"
    return lag, ticks, info.fencing_token, token


async def take_async(store: Store) -> int:
    async with store.lock_async("busy", ttl=10.0, timeout=30.0) as lock:
        return lock.fencing_token


def test_the_loop_keeps_running_while_a_task_waits_for_another_process(store_url: str) -> None:
    lag, ticks, held_token, token = waited_for_another_process(
        store_url, 60.0, HOLD_S, False, take_async
    )
    assert token > held_token
    assert lag < LAG_BOUND_S, f"the loop stalled {lag:.3f} s"
    assert ticks >= (HOLD_S / TICK_S) / 4  # it really ticked through the whole hold


def test_a_task_waiting_on_a_killed_holder_gets_the_lock_at_its_expiry(store_url: str) -> None:
    started = time.monotonic()
    lag, _, held_token, token = waited_for_another_process(
        store_url, HOLD_S, 60.0, True, take_async
    )
    assert token > held_token
    assert lag < LAG_BOUND_S, f"the loop stalled {lag:.3f} s"
    assert time.monotonic() - started < HOLD_S + 10.0


def test_control_a_blocking_wait_in_the_loop_is_caught_by_the_meter(store_url: str) -> None:
    async def take_blocking(store: Store) -> int:
        with store.lock("busy", ttl=10.0, timeout=30.0) as lock:  # blocks the loop on purpose
            return lock.fencing_token

    lag, _, _, _ = waited_for_another_process(store_url, 60.0, HOLD_S, False, take_blocking)
    assert lag > HOLD_S / 2
