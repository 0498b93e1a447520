"""ClientPool in one process: reuse, bounds, timeouts, errors, callbacks, asyncio and fork."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import (
    ClientCreateError,
    ClientPool,
    InvalidPoolOptions,
    PoolClosed,
    PoolOptions,
    PoolTimeout,
    TooManyRequests,
    UnknownClient,
)
from orbitive.clients._retiring import MOST_THREADS

from ._fakes import FakeClient, close, retired


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def _pool(fleet: Fleet, **options: object) -> ClientPool[FakeClient]:
    return ClientPool(fleet, "fake", create=FakeClient, close=close, options=PoolOptions(**options))  # type: ignore[arg-type]


def test_a_returned_client_is_reused_and_created_once(fleet: Fleet) -> None:
    with _pool(fleet, max_live=2) as pool:
        with pool.client() as first:
            pass
        with pool.client() as second:
            assert second is first
        stats = pool.statistics()
        assert (stats.live, stats.idle, stats.in_use, stats.created_count) == (1, 1, 0, 1)
    assert first.closed  # close() closes the idle ones


def test_take_idle_hands_out_only_an_idle_client_never_creating_or_waiting(
    fleet: Fleet,
) -> None:
    with _pool(fleet, max_live=1) as pool:
        assert pool.take_idle() is None  # none idle: nothing created
        assert pool.statistics().created_count == 0
        held = pool.getconn()
        started = time.monotonic()
        assert pool.take_idle() is None  # at max_live: no wait either
        assert time.monotonic() - started < 1.0
        pool.putconn(held)
        assert pool.take_idle() is held
        assert pool.statistics().in_use == 1
        pool.putconn(held)
    assert pool.take_idle() is None  # closed


def test_take_idle_checks_what_it_hands_out_and_retires_what_fails(fleet: Fleet) -> None:
    broken: set[int] = set()
    pool = ClientPool(
        fleet,
        "fake",
        create=FakeClient,
        close=close,
        check=lambda client: client.serial not in broken,
        options=PoolOptions(max_live=2),
    )
    with pool:
        first, second = pool.getconn(), pool.getconn()
        pool.putconn(first)
        pool.putconn(second)
        broken.add(second.serial)  # the newest idle one, taken first
        assert pool.take_idle() is first
        assert retired(pool, 1) and second.closed


def test_max_idle_closes_what_would_exceed_it(fleet: Fleet) -> None:
    with _pool(fleet, max_live=3, max_idle=1) as pool:
        held = [pool.getconn() for _ in range(3)]
        assert pool.statistics().in_use == 3
        for client in held:
            pool.putconn(client)
        assert retired(pool, 2)
        stats = pool.statistics()
        assert (stats.live, stats.idle, stats.local_idle) == (1, 1, 1)
        assert sum(client.closed for client in held) == 2
        assert FakeClient.open_now == 1


def test_a_return_that_closes_its_client_does_not_wait_for_the_close(fleet: Fleet) -> None:
    """The close runs after the return, in the pool's closing thread; the budget stays
    held until it is done, and close() waits for it."""
    let_go = threading.Event()

    def slow_close(client: FakeClient) -> None:
        assert let_go.wait(10.0)
        client.close()

    options = PoolOptions(max_live=1, max_idle=0)  # every return closes its client
    pool = ClientPool(fleet, "fake", create=FakeClient, close=slow_close, options=options)
    first = pool.getconn()
    started = time.monotonic()
    pool.putconn(first)
    assert time.monotonic() - started < 5.0  # returned while its close is blocked
    assert not first.closed and pool.statistics().live == 1  # the budget is still held
    let_go.set()
    assert retired(pool, 1)
    assert first.closed and pool.statistics().live == 0
    let_go.clear()
    second = pool.getconn()
    pool.putconn(second)
    threading.Timer(0.3, let_go.set).start()
    pool.close()  # waits for the queued close
    assert second.closed and FakeClient.open_now == 0


def test_a_close_that_hangs_holds_its_own_closing_thread_only(fleet: Fleet) -> None:
    """While one close blocks (a server that never answers), later returns are closed
    in other closing threads and their budgets return; close() waits for the blocked one."""
    let_go = threading.Event()
    hanging: list[FakeClient] = []

    def close_first_slowly(client: FakeClient) -> None:
        if not hanging:
            hanging.append(client)
            assert let_go.wait(10.0)
        client.close()

    options = PoolOptions(max_live=3, max_idle=0)  # every return closes its client
    pool = ClientPool(fleet, "fake", create=FakeClient, close=close_first_slowly, options=options)
    held = [pool.getconn() for _ in range(3)]
    for client in held:
        pool.putconn(client)
    assert retired(pool, 2)  # the two behind the blocked close
    assert [client.closed for client in held] == [False, True, True]
    assert pool.statistics().live == 1  # only the blocked one still holds its budget
    threading.Timer(0.3, let_go.set).start()
    pool.close()  # waits for the blocked close
    assert held[0].closed and FakeClient.open_now == 0


def test_closes_beyond_the_closing_threads_queue_and_close_waits_for_all(fleet: Fleet) -> None:
    let_go = threading.Event()

    def slow_close(client: FakeClient) -> None:
        assert let_go.wait(10.0)
        client.close()

    options = PoolOptions(max_live=MOST_THREADS + 4, max_idle=0)  # every return closes
    pool = ClientPool(fleet, "fake", create=FakeClient, close=slow_close, options=options)
    held = [pool.getconn() for _ in range(MOST_THREADS + 4)]
    for client in held:
        pool.putconn(client)
    time.sleep(0.2)
    assert len(pool._retiring._threads) == MOST_THREADS  # four closes wait for a thread
    assert pool.statistics().live == MOST_THREADS + 4  # every budget held until closed
    threading.Timer(0.3, let_go.set).start()
    pool.close()
    assert all(client.closed for client in held) and pool.counters.closed == len(held)


def test_the_closing_threads_of_a_pool_dropped_unclosed_end(fleet: Fleet) -> None:
    """Up to MOST_THREADS closing threads per pool: a pool that is dropped without
    close() must not leave them blocked for the rest of the process."""
    let_go = threading.Event()

    def slow_close(client: FakeClient) -> None:
        assert let_go.wait(10.0)
        client.close()

    options = PoolOptions(max_live=MOST_THREADS, max_idle=0)  # every return closes its client
    pool = ClientPool(fleet, "fake", create=FakeClient, close=slow_close, options=options)
    for client in [pool.getconn() for _ in range(MOST_THREADS)]:
        pool.putconn(client)  # each close blocks in a closing thread of its own
    threads = list(pool._retiring._threads)
    assert len(threads) == MOST_THREADS
    del pool
    let_go.set()
    deadline = time.monotonic() + 10.0
    while any(thread.is_alive() for thread in threads):
        assert time.monotonic() < deadline, sum(thread.is_alive() for thread in threads)
        gc.collect()
        time.sleep(0.05)
    assert FakeClient.open_now == 0


def test_a_close_that_raises_base_exception_in_the_closing_thread_stops_no_later_close(
    fleet: Fleet,
) -> None:
    """A close raising SystemExit (no caller to reach in the closing thread) counts as
    a close error; its budget returns, and so do the later ones."""
    raised: list[FakeClient] = []

    def exiting_close(client: FakeClient) -> None:
        if not raised:
            raised.append(client)
            raise SystemExit("close")
        client.close()

    options = PoolOptions(max_live=2, max_idle=0)  # every return closes its client
    pool = ClientPool(fleet, "fake", create=FakeClient, close=exiting_close, options=options)
    pool.putconn(pool.getconn())
    assert retired(pool, 1) and pool.counters.close_errors == 1
    second = pool.getconn()
    pool.putconn(second)
    assert retired(pool, 2)
    assert second.closed and pool.statistics().live == 0
    third = pool.getconn()
    pool.putconn(third)
    pool.close()  # waits for the queued close
    assert third.closed


def test_a_close_raising_base_exception_in_the_callers_thread_still_returns_the_budget(
    fleet: Fleet,
) -> None:
    """discard() closes in the caller's thread: the close's KeyboardInterrupt reaches the
    caller, and the client's unit of max_live comes back all the same."""

    def interrupted_close(client: FakeClient) -> None:
        client.close()
        raise KeyboardInterrupt

    options = PoolOptions(max_live=1)
    with ClientPool(
        fleet, "fake", create=FakeClient, close=interrupted_close, options=options
    ) as pool:
        client = pool.getconn()
        with pytest.raises(KeyboardInterrupt):
            pool.discard(client)
        assert client.closed and pool.statistics().live == 0
        again = pool.getconn(timeout=2.0)  # the one unit of max_live is free
        with pytest.raises(KeyboardInterrupt):
            pool.discard(again)


async def _close_async(client: FakeClient) -> None:
    await asyncio.sleep(0)
    client.close()


@pytest.mark.parametrize("closer", [close, _close_async], ids=["sync", "async"])
def test_a_client_retired_as_the_loop_ends_is_closed_and_its_budget_returns(
    fleet: Fleet, closer: Callable[[FakeClient], object]
) -> None:
    """asyncio.run cancels the tasks left once its coroutine returns: the close a return
    handed over is done all the same, and only then does the budget return."""
    options = PoolOptions(max_live=1, max_idle=0)  # every return closes its client
    pool = ClientPool[FakeClient](fleet, "fake", create=FakeClient, close=closer, options=options)

    async def use() -> FakeClient:
        client = await pool.getconn_async()
        await pool.putconn_async(client)
        return client

    client = asyncio.run(use())
    assert retired(pool, 1)
    assert client.closed and pool.statistics().live == 0
    assert pool.counters.close_errors == 0  # closed once
    pool.close()
    assert FakeClient.open_now == 0


def test_a_client_failing_its_check_after_close_is_closed_on_the_checkouts_loop(
    fleet: Fleet,
) -> None:
    """An asyncio checkout whose check fails once the pool closed (the check closes it
    here) awaits the coroutine close on its own loop, as before the close."""
    loops: list[asyncio.AbstractEventLoop] = []

    async def close_here(client: FakeClient) -> None:
        loops.append(asyncio.get_running_loop())
        client.close()

    async def check_closing_the_pool(client: FakeClient) -> bool:
        await pool.close_async()
        return False

    pool = ClientPool[FakeClient](
        fleet, "fake", create=FakeClient, close=close_here, check=check_closing_the_pool
    )

    async def scenario() -> asyncio.AbstractEventLoop:
        await pool.putconn_async(await pool.getconn_async())
        with pytest.raises(PoolClosed):
            await pool.getconn_async(timeout=5.0)
        return asyncio.get_running_loop()

    loop = asyncio.run(scenario())
    assert loops == [loop] and FakeClient.open_now == 0
    with _pool(fleet, max_live=1) as other:
        assert other.statistics().live == 0


def test_a_client_returned_after_close_async_is_closed_on_the_returning_loop(
    fleet: Fleet,
) -> None:
    """putconn_async of a client checked out before close_async() awaits its coroutine
    close on the caller's loop (never a helper loop that blocks this one)."""
    loops: list[asyncio.AbstractEventLoop] = []

    async def close_here(client: FakeClient) -> None:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        client.close()

    pool = ClientPool[FakeClient](fleet, "fake", create=FakeClient, close=close_here)

    async def scenario() -> asyncio.AbstractEventLoop:
        held = await pool.getconn_async()
        await pool.close_async()
        await pool.putconn_async(held)
        assert held.closed
        return asyncio.get_running_loop()

    loop = asyncio.run(scenario())
    assert loops == [loop] and FakeClient.open_now == 0
    with _pool(fleet, max_live=1) as other:
        assert other.statistics().live == 0


def _slow_close(client: FakeClient) -> None:
    time.sleep(0.3)
    client.close()


async def _slow_close_async(client: FakeClient) -> None:
    await asyncio.sleep(0.3)
    client.close()


@pytest.mark.parametrize("closer", [_slow_close, _slow_close_async], ids=["sync", "async"])
def test_a_discard_cancelled_during_its_close_still_closes_and_returns_the_budget(
    fleet: Fleet, closer: Callable[[FakeClient], object]
) -> None:
    """A caller that gives up (asyncio.wait_for) while discard_async awaits the close
    leaves the close running; once it is done, the budget returns."""
    options = PoolOptions(max_live=1)
    pool = ClientPool[FakeClient](fleet, "fake", create=FakeClient, close=closer, options=options)

    async def scenario() -> FakeClient:
        client = await pool.getconn_async()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool.discard_async(client), 0.05)
        again = await pool.getconn_async(timeout=10.0)  # the unit comes back
        assert client.closed and pool.statistics().live == 1
        await pool.discard_async(again)
        return client

    asyncio.run(scenario())
    assert pool.counters.close_errors == 0 and FakeClient.open_now == 0  # closed once each
    pool.close()


def test_a_checkout_at_max_live_times_out_with_pool_timeout_and_leaves_no_waiter(
    fleet: Fleet,
) -> None:
    with _pool(fleet, max_live=1) as pool, pool.client():
        started = time.monotonic()
        with pytest.raises(PoolTimeout):
            pool.getconn(timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 5.0
        stats = pool.statistics()
        assert (stats.waiting, stats.local_waiting, stats.timeouts_count) == (0, 0, 1)


def test_a_waiter_gets_the_client_another_thread_returns(fleet: Fleet) -> None:
    with _pool(fleet, max_live=1) as pool:
        held = pool.getconn()
        got: list[FakeClient] = []
        waiter = threading.Thread(target=lambda: got.append(pool.getconn(timeout=10.0)))
        waiter.start()
        time.sleep(0.1)
        assert pool.statistics().waiting == 1
        pool.putconn(held)
        waiter.join(10.0)
        assert got == [held]
        pool.putconn(held)


def test_max_waiting_refuses_one_more_waiter_of_this_process(fleet: Fleet) -> None:
    with _pool(fleet, max_live=1, max_waiting=1) as pool, pool.client():

        def wait() -> None:
            with pytest.raises(PoolTimeout):
                pool.getconn(1.0)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 5.0
        while pool.statistics().local_waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(TooManyRequests):
            pool.getconn(timeout=1.0)
        waiter.join()
        assert pool.statistics().refused_count == 1


def test_a_failing_create_raises_client_create_error_and_returns_its_claim(
    fleet: Fleet,
) -> None:
    calls = []

    def create() -> FakeClient:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionRefusedError("nobody listens")
        return FakeClient()

    with ClientPool(fleet, "fake", create=create, close=close) as pool:
        with pytest.raises(ClientCreateError) as caught:
            pool.getconn()
        assert isinstance(caught.value.__cause__, ConnectionRefusedError)
        stats = pool.statistics()
        assert (stats.live, stats.creating, stats.create_errors_count) == (0, 0, 1)
        with pool.client() as client:
            assert isinstance(client, FakeClient)


def test_check_and_reset_failures_discard_the_client(fleet: Fleet) -> None:
    verdict = {"healthy": True}
    with ClientPool(
        fleet, "fake", create=FakeClient, close=close,
        check=lambda client: verdict["healthy"],
        reset=lambda client: client.uses == 0 or (_ for _ in ()).throw(OSError("dirty")),
    ) as pool:  # fmt: skip
        with pool.client() as first:
            pass
        verdict["healthy"] = False
        with pool.client() as second:  # the check fails on first: a new one is made
            verdict["healthy"] = True
            second.uses = 1  # reset refuses it on return
        assert first.closed and second is not first
        stats = pool.statistics()
        assert (stats.check_failures_count, stats.reset_failures_count) == (1, 1)
        assert (stats.live, stats.idle) == (0, 0)
        assert second.closed


class _InterruptOnce:
    """A check or reset that raises KeyboardInterrupt on its first call, as Ctrl-C would."""

    def __init__(self) -> None:
        self.armed = True

    def __call__(self, client: FakeClient) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


@pytest.mark.parametrize("callback", ["check", "reset"])
def test_an_interrupted_check_or_reset_closes_the_client_and_returns_its_budget(
    fleet: Fleet, callback: str
) -> None:
    interrupt = _InterruptOnce()
    with ClientPool(
        fleet, "fake", create=FakeClient, close=close, options=PoolOptions(max_live=1),
        check=interrupt if callback == "check" else None,
        reset=interrupt if callback == "reset" else None,
    ) as pool:  # fmt: skip
        first = pool.getconn()
        with pytest.raises(KeyboardInterrupt):
            pool.putconn(first)  # the reset is interrupted here,
            pool.getconn()  # the check here, on the idle client
        assert first.closed
        stats = pool.statistics()
        assert (stats.live, stats.in_use, stats.idle) == (0, 0, 0)
        # An interrupt is no verdict on the client: it is retired, not counted as a failure.
        assert stats.check_failures_count + stats.reset_failures_count == 0
        with pool.client(timeout=5.0) as second:  # max_live is free again
            assert second is not first


def test_unknown_and_twice_returned_clients_are_refused(fleet: Fleet) -> None:
    with _pool(fleet, max_live=1) as pool:
        with pytest.raises(UnknownClient):
            pool.putconn(FakeClient())
        client = pool.getconn()
        pool.putconn(client)
        with pytest.raises(UnknownClient):
            pool.putconn(client)


def test_a_closed_pool_refuses_checkouts_and_closes_what_comes_back(fleet: Fleet) -> None:
    pool = _pool(fleet, max_live=2)
    out = pool.getconn()
    pool.close()
    pool.close()
    with pytest.raises(PoolClosed):
        pool.getconn()
    pool.putconn(out)
    assert out.closed


def test_max_lifetime_and_idle_timeout_replace_and_close_clients(fleet: Fleet) -> None:
    with _pool(fleet, max_live=2, max_lifetime=0.2, idle_timeout=0.3) as pool:
        with pool.client() as first:
            time.sleep(0.25)
        assert first.closed  # too old when it came back
        with pool.client() as second:
            pass
        deadline = time.monotonic() + 5.0
        while not second.closed:  # the upkeep thread closes it after idle_timeout
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert pool.statistics().live == 0


def test_min_idle_is_a_warm_floor_refilled_by_the_upkeep_thread(fleet: Fleet) -> None:
    with _pool(fleet, max_live=3, min_idle=2, idle_timeout=0.1) as pool:
        deadline = time.monotonic() + 5.0
        while pool.statistics().idle < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.5)  # idle_timeout passes, but the floor is kept
        stats = pool.statistics()
        assert (stats.idle, stats.live) == (2, 2)


def test_threads_of_one_process_share_max_live(fleet: Fleet) -> None:
    errors: list[BaseException] = []
    with _pool(fleet, max_live=2) as pool:

        def work() -> None:
            try:
                for _ in range(50):
                    with pool.client() as client:
                        client.uses += 1
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert FakeClient.highest <= 2


def test_asyncio_checkout_with_sync_and_async_create(fleet: Fleet) -> None:
    async def make() -> FakeClient:
        await asyncio.sleep(0)
        return FakeClient()

    async def scenario() -> None:
        with _pool(fleet, max_live=2) as sync_made:
            async with sync_made.client_async() as client:
                assert isinstance(client, FakeClient)
        with_async = ClientPool(fleet, "async", create=make, close=close)
        try:

            async def one() -> None:
                async with with_async.client_async() as client:
                    await asyncio.sleep(0.01)
                    client.uses += 1

            await asyncio.gather(*(one() for _ in range(10)))
            assert with_async.statistics().live <= 4
        finally:
            await with_async.close_async()

    asyncio.run(scenario())


def test_the_sync_path_refuses_an_async_create_and_returns_its_claim(fleet: Fleet) -> None:
    async def make() -> FakeClient:
        return FakeClient()

    with ClientPool(fleet, "async", create=make, close=close) as pool:
        with pytest.raises(InvalidPoolOptions):
            pool.getconn()
        assert pool.statistics().creating == 0


def test_an_idle_client_drained_in_the_table_is_closed_and_gives_its_budget_back(
    fleet: Fleet,
) -> None:
    with _pool(fleet, max_live=1) as pool:
        first = pool.getconn()
        pool.putconn(first)
        (entry,) = pool._family.idle
        pool.pool.drain(entry.rid)  # through the Pool handle: no new reservation or take
        again = pool.getconn(timeout=2.0)  # the drained one is closed, its unit returned
        assert again is not first and first.closed
        assert pool.statistics().live == 1
        pool.putconn(again)


def test_the_upkeep_retires_a_drained_idle_client_and_the_ones_behind_it(fleet: Fleet) -> None:
    with _pool(fleet, max_live=2, idle_timeout=0.05) as pool:
        first, second = pool.getconn(), pool.getconn()
        pool.putconn(first)
        pool.putconn(second)
        pool.pool.drain(pool._family.idle[0].rid)  # the oldest idle client: retired first
        deadline = time.monotonic() + 5.0
        while not (first.closed and second.closed):
            assert time.monotonic() < deadline, (first.closed, second.closed)
            time.sleep(0.01)
        assert pool.statistics().live == 0
