"""Server connections for transaction mode's router in tests: a real ClientPool of
psycopg connections in autocommit mode, tagged with the test's ``application_name``,
the server's own count of them, and a process that routes its own clients."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Final

import psycopg

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions
from orbitive.clients._router import Router

from .._processes import Channel
from .._servers import TempPostgres

#: The port in the name of a routing process's socket.
ROUTING_PORT: Final = 6434
#: Transactions each client of a routing process runs.
ROUNDS: Final = 30


def server_pool(
    fleet: Fleet, server_url: str, tag: str, max_live: int
) -> ClientPool[psycopg.Connection]:
    """A pool of at most ``max_live`` server connections, every one kept idle between
    transactions (``max_idle`` is ``max_live``), as transaction mode's router needs."""
    url = f"{server_url}?application_name={tag}"
    return ClientPool(
        fleet,
        url,
        create=functools.partial(psycopg.connect, url, autocommit=True),
        close=psycopg.Connection.close,
        options=PoolOptions(max_live=max_live, max_idle=max_live),
        lends=True,
    )


def sessions(postgres_server: TempPostgres, tag: str) -> int:
    """How many sessions of the test's pool the server has now."""
    with psycopg.connect(postgres_server.url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def routing_process(
    channel: Channel,
    fleet_name: str,
    server_url: str,
    tag: str,
    folder: str,
    clients: int,
    max_live: int,
) -> None:
    """A process of the fleet with its own router on a pool of at most ``max_live``
    server connections, and ``clients`` client connections to it: once told to go,
    each runs :data:`ROUNDS` transactions. Reports the server processes that served
    them, the errors its clients met, and how many connections its pool borrowed and
    created."""
    with (
        Fleet.join(fleet_name, 16) as fleet,
        server_pool(fleet, server_url, tag, max_live) as pool,
    ):
        router = Router(folder, ROUTING_PORT, pool)
        try:
            channel.send("ready")
            channel.recv()
            served: list[int] = []
            errors: list[str] = []

            def client() -> None:
                conninfo = f"host={folder} port={ROUTING_PORT} user=postgres dbname=postgres"
                try:
                    with psycopg.connect(conninfo, autocommit=True) as conn:
                        for _ in range(ROUNDS):
                            with conn.transaction():
                                row = conn.execute("SELECT pg_backend_pid(), pg_sleep(0.002)")
                                served.append(row.fetchall()[0][0])
                except Exception as error:  # the test sees it
                    errors.append(repr(error))

            threads = [threading.Thread(target=client) for _ in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            stats = pool.statistics()
            channel.send((served, errors, stats.borrowed_count, stats.created_count))
        finally:
            router.close()


def until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Wait until ``condition()`` holds (fails the test after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def owning_process(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str
) -> None:
    """A process of the fleet whose router, started once another process's router
    holds the key's only connection (``max_live`` 1), takes it over (that idle one is
    closed for it) and lends it: it runs nothing of its own, until killed."""
    with (
        Fleet.join(fleet_name, 16) as fleet,
        server_pool(fleet, server_url, tag, 1) as pool,
    ):
        router = Router(folder, ROUTING_PORT, pool)
        try:
            channel.send("ready")
            channel.recv(None)
        finally:
            router.close()


def borrowing_process(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str, table: str
) -> None:
    """A process of the fleet whose router opens the key's only connection (``max_live``
    1); once another process took it over and it is told to go, one of its clients
    inserts a row into ``table`` inside a transaction, on a loan, reports the server
    process, and stays inside the transaction until killed."""
    with (
        Fleet.join(fleet_name, 16) as fleet,
        server_pool(fleet, server_url, tag, 1) as pool,
    ):
        router = Router(folder, ROUTING_PORT, pool)
        try:
            channel.send("ready")
            channel.recv()
            conninfo = f"host={folder} port={ROUTING_PORT} user=postgres dbname=postgres"
            with psycopg.connect(conninfo) as conn:
                conn.execute(f"INSERT INTO {table} VALUES (1)")
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                channel.send((row[0], pool.statistics().borrowed_count))
                channel.recv(None)
        finally:
            router.close()
