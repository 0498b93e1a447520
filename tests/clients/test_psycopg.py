"""The psycopg adapter on a real PostgreSQL server, with real worker processes.

Every connection carries the test's ``application_name``; the server's own
``pg_stat_activity`` is the witness for the host-wide cap.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import (
    ClientCreateError,
    InvalidPoolOptions,
    PoolClosed,
    PoolOptions,
    PoolTimeout,
)
from orbitive.clients.psycopg import AsyncConnectionPool, ConnectionPool

from .._processes import Child, Processes
from ._sampling import ServerConnections
from ._workers import (
    FAST_QUERY,
    SLOW_QUERY,
    psycopg_async_requests,
    psycopg_holder,
    psycopg_idle_holder,
    psycopg_requests,
)
from .conftest import CAPACITY


def _start_requests(
    spawned: Processes,
    fleet_name: str,
    pg_url: str,
    tag: str,
    count: int,
    options: dict[str, Any],
    requests: int,
    query: str = SLOW_QUERY,
) -> list[Child]:
    children = [
        spawned.start(psycopg_requests, fleet_name, CAPACITY, pg_url, tag, options, requests, query)
        for _ in range(count)
    ]
    for child in children:
        assert child.recv(60) == "ready"
    return children


def _finish(children: list[Child]) -> list[tuple[int, list[str], dict[str, int]]]:
    results = [child.recv(120) for child in children]
    for child in children:
        child.send("close")
        assert child.wait(60) == 0
    return results


def test_eight_workers_never_exceed_a_host_wide_cap_of_four(
    spawned: Processes, fleet_name: str, pg_url: str, tag: str
) -> None:
    children = _start_requests(spawned, fleet_name, pg_url, tag, 8, {"max_live": 4}, 200)
    with ServerConnections(pg_url, tag) as server:
        for child in children:
            child.send("go")
        results = _finish(children)
    assert [ok for ok, _, _ in results] == [200] * 8
    assert all(errors == [] for _, errors, _ in results)
    assert server.samples > 10
    assert 1 <= server.highest <= 4, server.highest


def test_no_request_times_out_while_another_process_holds_idle_connections(
    spawned: Processes, fleet_name: str, pg_url: str, tag: str
) -> None:
    holder = spawned.start(psycopg_idle_holder, fleet_name, CAPACITY, pg_url, tag, {"max_live": 2})
    assert holder.recv(60) == 2  # both connections idle in the holder
    options = {"max_live": 2, "acquire_timeout": 5.0}
    children = _start_requests(spawned, fleet_name, pg_url, tag, 2, options, 30)
    with ServerConnections(pg_url, tag) as server:
        started = time.monotonic()
        for child in children:
            child.send("go")
        results = _finish(children)
        elapsed = time.monotonic() - started
    holder.send("report")
    held = holder.recv(60)
    assert [ok for ok, _, _ in results] == [30, 30]
    assert all(errors == [] for _, errors, _ in results), results
    assert held["retired_count"] >= 1  # the holder gave its idle connections up
    assert server.highest <= 2
    assert elapsed < 30.0


def test_a_killed_worker_holding_two_connections_frees_the_cap_within_a_second(
    spawned: Processes, fleet: Fleet, pg_url: str, tag: str
) -> None:
    holder = spawned.start(psycopg_holder, fleet.name, CAPACITY, pg_url, tag, 2, 2)
    assert holder.recv(60) == 2
    options = PoolOptions(max_live=2, acquire_timeout=10.0)
    with (
        ServerConnections(pg_url, tag) as server,
        ConnectionPool(
            pg_url, fleet=fleet, kwargs={"application_name": tag}, options=options
        ) as pool,
    ):
        assert server.count() == 2
        with pytest.raises(PoolTimeout):
            pool.getconn(timeout=0.3)  # the cap is held by the holder
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert holder.wait() == -signal.SIGKILL
        with pool.connection(timeout=5.0) as conn:
            created = time.monotonic() - killed
            conn.execute(FAST_QUERY)
        assert created < 1.0, created
        assert server.wait_at_most(2, timeout=10.0) <= 2
        assert pool.statistics().dead_owners_count == 0
    assert server.highest <= 3  # the dying holder's backends may linger a moment


def test_max_idle_and_min_idle_hold_fleet_wide_under_churn(
    spawned: Processes, fleet: Fleet, fleet_name: str, pg_url: str, tag: str
) -> None:
    options: dict[str, Any] = {"max_live": 4, "max_idle": 2, "min_idle": 1}
    children = _start_requests(spawned, fleet_name, pg_url, tag, 4, options, 150)
    idle_seen, live_seen = [], []
    with ConnectionPool(
        pg_url, fleet=fleet, kwargs={"application_name": tag}, options=PoolOptions(**options)
    ) as pool:
        for child in children:
            child.send("go")
        deadline = time.monotonic() + 120
        while not all(child.channel._conn.poll() for child in children):
            stats = pool.statistics()
            idle_seen.append(stats.idle)
            live_seen.append(stats.live)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        results = _finish_keep_open(children)
        floor = _wait_for(lambda: pool.statistics().idle >= 1, 5.0)
        settled = pool.statistics()
        for child in children:
            child.send("close")
            assert child.wait(60) == 0
    assert all(errors == [] for _, errors, _ in results)
    assert len(idle_seen) > 10
    assert max(idle_seen) <= 2, max(idle_seen)
    assert max(live_seen) <= 4
    assert floor, settled
    assert 1 <= settled.idle <= 2


def _finish_keep_open(children: list[Child]) -> list[tuple[int, list[str], dict[str, int]]]:
    return [child.recv(120) for child in children]


def _wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_four_asyncio_processes_of_fifty_tasks_keep_the_cap_and_a_small_loop_lag(
    spawned: Processes, fleet_name: str, pg_url: str, tag: str
) -> None:
    children = [
        spawned.start(psycopg_async_requests, fleet_name, CAPACITY, pg_url, tag, 4, 50, 4)
        for _ in range(4)
    ]
    for child in children:
        assert child.recv(60) == "ready"
    with ServerConnections(pg_url, tag) as server:
        for child in children:
            child.send("go")
        results = [child.recv(180) for child in children]
    for child in children:
        assert child.wait(60) == 0
    assert [ok for ok, _, _ in results] == [200] * 4
    assert all(errors == [] for _, errors, _ in results)
    assert server.highest <= 4
    worst_lag = max(lag for _, _, lag in results)
    assert worst_lag < 0.5, worst_lag


def test_the_adapter_rolls_back_an_open_transaction_and_discards_a_broken_connection(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    options = PoolOptions(max_live=1)
    with (
        ServerConnections(pg_url, tag) as server,
        ConnectionPool(
            pg_url, fleet=fleet, kwargs={"application_name": tag}, options=options
        ) as pool,
    ):
        conn = pool.getconn()
        conn.execute("CREATE TEMP TABLE t (x int)")  # a transaction left open
        pool.putconn(conn)
        with pool.connection() as again:
            assert again is conn  # the same, reused
            assert again.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with pytest.raises(psycopg.errors.UndefinedTable):
                again.execute("SELECT * FROM t")  # rolled back: the table is gone
        with pool.connection() as committed:
            committed.execute("CREATE TEMP TABLE kept (x int)")
        with pool.connection() as same:
            same.execute("SELECT * FROM kept")  # connection() committed it
        broken = pool.getconn()
        broken.close()
        pool.putconn(broken)  # closed: discarded, not kept
        with pool.connection() as fresh:
            assert fresh is not broken
        assert server.count() == 1


def test_bad_input_gives_named_errors_and_leaves_no_claim(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    with pytest.raises(InvalidPoolOptions):
        ConnectionPool(pg_url, fleet=fleet, options=PoolOptions(max_live=0))
    with pytest.raises(InvalidPoolOptions):
        ConnectionPool(42, fleet=fleet)  # type: ignore[arg-type]  # the error under test
    bad = pg_url.replace("@127.0.0.1:", "@127.0.0.1:1")  # a port nobody listens on
    with ConnectionPool(bad, fleet=fleet, options=PoolOptions(max_live=1)) as pool:
        for _ in range(3):
            with pytest.raises(ClientCreateError) as caught:
                pool.getconn(timeout=2.0)
            assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        stats = pool.statistics()
        assert (stats.live, stats.creating, stats.waiting) == (0, 0, 0)
        with pytest.raises(InvalidPoolOptions):
            pool.getconn(timeout=-1.0)
    with pytest.raises(PoolClosed):
        pool.getconn()


def test_the_async_adapter_rolls_back_and_reuses(fleet: Fleet, pg_url: str, tag: str) -> None:
    async def scenario() -> None:
        async with AsyncConnectionPool(
            pg_url, fleet=fleet, kwargs={"application_name": tag},
            options=PoolOptions(max_live=1),
        ) as pool:  # fmt: skip
            conn = await pool.getconn()
            await conn.execute("CREATE TEMP TABLE t (x int)")
            await pool.putconn(conn)
            async with pool.connection() as again:
                assert again is conn
                with pytest.raises(psycopg.errors.UndefinedTable):
                    await again.execute("SELECT * FROM t")
            assert pool.statistics().local_idle == 1

    asyncio.run(scenario())
