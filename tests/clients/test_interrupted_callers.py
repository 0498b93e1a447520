"""A caller that is interrupted or cancelled while a user callable runs: the client is
given back or closed exactly once, never closed under the callable, and its unit of
``max_live`` comes back.

The sweeps of every injection point are ``test_cancellation.py`` and
``test_interrupts.py``; these are the cases by name, each of which leaked a unit
for good (or closed a client under a running callable) before the pool's exit
paths covered ``BaseException``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions

from ._fakes import FakeClient, close, retired

#: Generous bound for what happens in a closing thread or a task after the caller left.
SETTLE_S = 5.0


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def _pool(fleet: Fleet, **callables: object) -> ClientPool[FakeClient]:
    return ClientPool(
        fleet, "interrupts", create=FakeClient, close=close,
        options=PoolOptions(max_live=1), **callables,  # type: ignore[arg-type]
    )  # fmt: skip


def _interrupt_once(calls: list[str], name: str) -> None:
    calls.append(name)
    if len(calls) == 1:
        raise KeyboardInterrupt


def test_a_keyboard_interrupt_in_a_sync_check_closes_the_client_and_returns_its_unit(
    fleet: Fleet,
) -> None:
    calls: list[str] = []
    with _pool(fleet, check=lambda client: _interrupt_once(calls, "check")) as pool:
        first = pool.getconn()
        pool.putconn(first)
        with pytest.raises(KeyboardInterrupt):
            pool.getconn()
        assert retired(pool, 1) and first.closed  # its state is unknown: closed
        again = pool.getconn(timeout=SETTLE_S)  # the one unit of max_live is free
        assert again is not first
        pool.putconn(again)


def test_a_keyboard_interrupt_in_a_sync_reset_closes_the_client_and_returns_its_unit(
    fleet: Fleet,
) -> None:
    calls: list[str] = []
    with _pool(fleet, reset=lambda client: _interrupt_once(calls, "reset")) as pool:
        first = pool.getconn()
        with pytest.raises(KeyboardInterrupt):
            pool.putconn(first)
        assert retired(pool, 1) and first.closed
        again = pool.getconn(timeout=SETTLE_S)
        assert again is not first
        pool.putconn(again)


@pytest.mark.parametrize("in_thread", [False, True], ids=["coroutine check", "sync check"])
def test_a_checkout_cancelled_during_its_check_keeps_the_client_once_the_check_passes(
    fleet: Fleet, in_thread: bool
) -> None:
    """asyncio.wait_for giving up while the check runs: the check goes on (a sync one in
    its worker thread cannot be stopped), the client is not closed under it, and once it
    passes the client is idle again."""
    gate = threading.Event()
    checking = threading.Event()

    def check(client: FakeClient) -> bool:
        checking.set()
        assert gate.wait(SETTLE_S)
        return not client.closed

    async def check_async(client: FakeClient) -> bool:
        checking.set()
        while not gate.is_set():
            await asyncio.sleep(0.005)
        return not client.closed

    pool = _pool(fleet, check=check if in_thread else check_async)

    async def scenario() -> None:
        first = await pool.getconn_async()
        await pool.putconn_async(first)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool.getconn_async(), 0.2)
        assert checking.is_set() and not first.closed  # still checked, not closed
        assert pool.statistics().in_use == 1
        gate.set()
        deadline = time.monotonic() + SETTLE_S
        while pool.statistics().in_use:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await pool.getconn_async(timeout=SETTLE_S) is first  # idle again, reused
        await pool.putconn_async(first)
        await pool.close_async()

    asyncio.run(scenario())
    assert FakeClient.open_now == 0 and pool.counters.close_errors == 0


def test_a_return_cancelled_during_its_reset_keeps_the_client_once_the_reset_is_done(
    fleet: Fleet,
) -> None:
    async def reset(client: FakeClient) -> None:
        await asyncio.sleep(0.3)

    pool = _pool(fleet, reset=reset)

    async def scenario() -> None:
        first = await pool.getconn_async()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool.putconn_async(first), 0.05)
        assert pool.statistics().in_use == 1 and not first.closed  # being reset
        deadline = time.monotonic() + SETTLE_S
        while pool.statistics().in_use:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await pool.getconn_async(timeout=SETTLE_S) is first
        await pool.putconn_async(first)
        await pool.close_async()

    asyncio.run(scenario())
    assert FakeClient.open_now == 0


def test_a_close_interrupted_part_way_still_closes_every_idle_client(fleet: Fleet) -> None:
    closes: list[FakeClient] = []

    def interrupted_close(client: FakeClient) -> None:
        client.close()
        closes.append(client)
        if len(closes) == 1:
            raise KeyboardInterrupt

    options = PoolOptions(max_live=3)
    pool = ClientPool(fleet, "interrupts", create=FakeClient, close=interrupted_close,
                      options=options)  # fmt: skip
    held = [pool.getconn() for _ in range(3)]
    for client in held:
        pool.putconn(client)
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    deadline = time.monotonic() + SETTLE_S
    while FakeClient.open_now:  # the rest are closed in a closing thread
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with _pool(fleet) as other:
        assert other.statistics().live == 0


def test_a_request_cancelled_mid_handler_lets_it_finish_then_closes_its_client(
    fleet: Fleet,
) -> None:
    """The handler may be half way through a protocol exchange: its client is never
    reused, and never closed under it."""
    finished: list[FakeClient] = []

    async def handler(client: FakeClient, request: bytes) -> bytes:
        await asyncio.sleep(0.3)
        assert not client.closed
        finished.append(client)
        return request

    pool = _pool(fleet, handler=handler)

    async def scenario() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool.request_async(b"ping"), 0.05)
        deadline = time.monotonic() + SETTLE_S
        while not (finished and finished[0].closed):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await pool.request_async(b"pong", timeout=SETTLE_S) == b"pong"
        await pool.close_async()

    asyncio.run(scenario())
    assert len(finished) == 2 and finished[1] is not finished[0]
    assert FakeClient.open_now == 0
