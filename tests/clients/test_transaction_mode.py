"""``PoolOptions(mode="transaction")`` in the psycopg pool: the user's code is unchanged,
its connections go to the process's router, and ``max_live`` counts the server
connections the fleet's transactions share.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import Budget, ClientPool, InvalidPoolOptions, PoolOptions, _transaction
from orbitive.clients.psycopg import AsyncConnectionPool, ConnectionPool

from .._processes import Channel, Processes
from .._servers import TempPostgres
from ._router_pool import sessions
from ._sampling import ServerConnections
from ._workers import transaction_mode_worker

ROUNDS = 20


@pytest.fixture
def url(postgres_server: TempPostgres, tag: str) -> Iterator[str]:
    """The server's URL, its connections tagged, and a table of the test's own."""
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE TABLE "{tag}" (worker int, n int)')
        yield f"{postgres_server.url}?application_name={tag}"
        admin.execute(f'DROP TABLE "{tag}"')


def test_threads_share_max_live_server_connections_and_every_commit_lands(
    fleet: Fleet, url: str, postgres_server: TempPostgres, tag: str
) -> None:
    errors: list[BaseException] = []
    options = PoolOptions(max_live=2, mode="transaction")
    with ConnectionPool(url, fleet=fleet, options=options) as pool:

        def work(worker: int) -> None:
            try:
                for n in range(ROUNDS):
                    with pool.connection() as conn:  # commits at the end of the block
                        conn.execute(f'INSERT INTO "{tag}" VALUES (%s, %s)', (worker, n))
                        conn.execute("SELECT pg_sleep(0.001)")
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
        for thread in threads:
            thread.start()
        peak = 0
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, sessions(postgres_server, tag))
            time.sleep(0.02)
        with pool.connection() as conn:
            rows = conn.execute(f'SELECT count(DISTINCT (worker, n)) FROM "{tag}"').fetchone()
    assert errors == []
    assert rows == (8 * ROUNDS,)
    assert peak <= 2
    until_closed = time.monotonic() + 10
    while sessions(postgres_server, tag) and time.monotonic() < until_closed:
        time.sleep(0.02)
    assert sessions(postgres_server, tag) == 0  # closing the pool closed its router's


def test_the_processes_of_a_fleet_share_max_live_in_transaction_mode(
    fleet_name: str, url: str, postgres_server: TempPostgres, tag: str
) -> None:
    with Processes("fork") as procs:
        workers = [
            procs.start(transaction_mode_worker, fleet_name, url, tag, worker, ROUNDS)
            for worker in range(3)
        ]
        peak = 0
        done: list[object] = []
        deadline = time.monotonic() + 120
        while len(done) < len(workers):
            peak = max(peak, sessions(postgres_server, tag))
            with contextlib.suppress(TimeoutError):
                done.append(workers[len(done)].recv(0.02))
            assert time.monotonic() < deadline, "the workers never finished"
    assert done == ["done"] * 3
    assert peak <= 2
    with psycopg.connect(postgres_server.url) as conn:
        rows = conn.execute(f'SELECT count(DISTINCT (worker, n)) FROM "{tag}"').fetchone()
    assert rows == (3 * 4 * ROUNDS,)


def test_session_state_pins_and_is_never_found_by_another_transaction(
    fleet: Fleet, url: str
) -> None:
    options = PoolOptions(max_live=2, mode="transaction")
    with (
        ConnectionPool(url, fleet=fleet, options=options) as pool,
        pool.connection() as listener,
    ):
        listener.autocommit = True
        listener.execute("LISTEN news")
        listener.execute("CREATE TEMP TABLE mine (n int)")
        pid = listener.execute("SELECT pg_backend_pid()").fetchone()
        for _ in range(3):
            with pool.connection() as other:
                row = other.execute(
                    "SELECT pg_backend_pid(), count(*) FROM pg_listening_channels()"
                ).fetchone()
                assert row is not None and (row[0],) != pid and row[1] == 0
        assert listener.execute("SELECT pg_backend_pid()").fetchone() == pid


def test_asyncio_tasks_share_max_live_server_connections(
    fleet: Fleet, url: str, postgres_server: TempPostgres, tag: str
) -> None:
    async def body() -> int:
        options = PoolOptions(max_live=2, mode="transaction")
        async with AsyncConnectionPool(url, fleet=fleet, options=options) as pool:

            async def work(worker: int) -> None:
                for n in range(ROUNDS):
                    async with pool.connection() as conn:
                        await conn.execute(f'INSERT INTO "{tag}" VALUES (%s, %s)', (worker, n))
                        await conn.execute("SELECT pg_sleep(0.001)")

            await asyncio.gather(*(work(worker) for worker in range(6)))
            async with pool.connection() as conn:
                cursor = await conn.execute(f'SELECT count(DISTINCT (worker, n)) FROM "{tag}"')
                row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    with ServerConnections(postgres_server.url, tag) as server:
        assert asyncio.run(asyncio.wait_for(body(), 60)) == 6 * ROUNDS
    assert 1 <= server.highest <= 2


def test_transaction_mode_refuses_what_it_does_not_take_yet(
    fleet: Fleet, url: str, postgres_server: TempPostgres
) -> None:
    options = PoolOptions(mode="transaction")
    with pytest.raises(InvalidPoolOptions, match="mode"):
        ClientPool(fleet, "k", create=object, close=lambda client: None, options=options)
    budget = Budget(postgres_server.url, "transaction-mode", total=2)
    with pytest.raises(InvalidPoolOptions, match="budget"):
        ConnectionPool(url, fleet=fleet, options=options, budget=budget)
    for bad in ("Transaction", "", None, 1):
        with pytest.raises(InvalidPoolOptions, match="mode must be one of"):
            PoolOptions(mode=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidPoolOptions, match="on_session_state"):
        PoolOptions(on_session_state="ignore")


def _transact_when_told(channel: Channel, pool: ConnectionPool, tag: str) -> None:
    """In a forked child: once told, write one row through the parent's pool."""
    channel.recv()
    with pool.connection() as conn:
        conn.execute(f'INSERT INTO "{tag}" VALUES (%s, 0)', (os.getpid(),))
    channel.send("written")


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+: fork with threads
def test_a_forked_child_opens_its_own_router(fleet_name: str, url: str, tag: str) -> None:
    """A pool used before a fork (gunicorn's --preload): the child's connections go to a
    router of its own, not to the parent's, which may be gone."""
    options = PoolOptions(max_live=2, mode="transaction")
    pool = ConnectionPool(url, fleet=Fleet.join(fleet_name, 16), options=options)
    with pool.connection() as conn:  # the parent's router starts
        conn.execute(f'INSERT INTO "{tag}" VALUES (0, 0)')
    with Processes("fork") as processes:
        child = processes.start(_transact_when_told, pool, tag)
        pool.close()  # the parent's router and its socket are gone
        child.send("go")
        assert child.recv(60) == "written"
    with psycopg.connect(url) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{tag}"').fetchone() == (2,)


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_router_start_cancelled_midway_is_given_back_once_and_never_logged(
    outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``in_a_thread``, cancelled while its call runs: the call finishes in its thread;
    what it returns goes to ``undo`` once, and an error it raises is nobody's (asyncio
    logs no "exception was never retrieved")."""
    go_on = threading.Event()
    undone: list[str] = []

    def call() -> str:
        go_on.wait(10)
        if outcome == "raises":
            raise ValueError("the router did not start")
        return "router"

    async def body() -> None:
        task = asyncio.ensure_future(_transaction.in_a_thread(call, undo=undone.append))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go_on.set()
        await asyncio.sleep(0.2)  # the call ended; its outcome reached the loop
        gc.collect()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(body())
    deadline = time.monotonic() + 10
    while outcome == "returns" and not undone and time.monotonic() < deadline:
        time.sleep(0.01)
    assert undone == (["router"] if outcome == "returns" else [])
    assert "never retrieved" not in caplog.text
