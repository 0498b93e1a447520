"""Server connections for transaction mode's router in tests: a real ClientPool of
psycopg connections in autocommit mode, tagged with the test's ``application_name``,
the server's own count of them, and a process that routes its own clients."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions, _transaction
from orbitive.clients._router import Router

from .._processes import Channel
from .._servers import TempPostgres

#: The port in the name of a test router's socket (each has a folder of its own).
PORT: Final = 6434
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


@contextlib.contextmanager
def routed(
    fleet: Fleet, server_url: str, tag: str, folder: str, max_live: int, **router: Any
) -> Iterator[tuple[Router, ClientPool[psycopg.Connection]]]:
    """A router on ``folder`` (:data:`PORT`) on a :func:`server_pool`; both closed after.
    ``router``: more of :class:`~orbitive.clients._router.Router`'s arguments."""
    with server_pool(fleet, server_url, tag, max_live) as pool:
        started = Router(folder, PORT, pool, **router)
        try:
            yield started, pool
        finally:
            started.close()


def conninfo_of(router: Router, **extra: str) -> str:
    """How a driver reaches ``router`` (``extra``: more connection parameters)."""
    folder = router.path.rsplit("/", 1)[0]
    more = "".join(f" {name}={value}" for name, value in extra.items())
    return f"host={folder} port={PORT} user=postgres dbname=postgres{more}"


@contextlib.contextmanager
def _routing(
    fleet_name: str, server_url: str, tag: str, folder: str, max_live: int
) -> Iterator[tuple[Router, ClientPool[psycopg.Connection]]]:
    """:func:`routed` in a process of its own, on its own member of the fleet."""
    with (
        Fleet.join(fleet_name, 16) as fleet,
        routed(fleet, server_url, tag, folder, max_live) as ends,
    ):
        yield ends


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
    with _routing(fleet_name, server_url, tag, folder, max_live) as (router, pool):
        channel.send("ready")
        channel.recv()
        served: list[int] = []
        errors: list[str] = []

        def client() -> None:
            try:
                with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
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


def until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Wait until ``condition()`` holds (fails the test after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


async def cancel_while_a_router_starts(opening: Awaitable[object]) -> None:
    """Run ``opening`` (a pool's first open or checkout in transaction mode) and cancel
    it while the thread that starts the process's router runs (held up meanwhile:
    this holds the lock of the process's routers): it raises CancelledError."""
    with _transaction._ROUTERS.lock:
        task = asyncio.ensure_future(opening)
        await asyncio.sleep(0.1)  # the task awaits the thread, the thread the lock
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def owning_process(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str
) -> None:
    """A process of the fleet whose router, started once another process's router
    holds the key's only connection (``max_live`` 1), takes it over (that idle one is
    closed for it) and lends it: it runs nothing of its own, until killed."""
    with _routing(fleet_name, server_url, tag, folder, 1):
        channel.send("ready")
        channel.recv(None)


def restarting_owner(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str
) -> None:
    """As :func:`owning_process`, but each time it is told, its router closes (with its
    pool: the connection closes) and starts again, on the same loan socket."""
    with Fleet.join(fleet_name, 16) as fleet:
        while True:
            with routed(fleet, server_url, tag, folder, 1):
                channel.send("ready")
                channel.recv(None)


def borrowing_process(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str, table: str
) -> None:
    """A process of the fleet whose router opens the key's only connection (``max_live``
    1); once another process took it over and it is told to go, one of its clients
    inserts a row into ``table`` inside a transaction, on a loan, reports the server
    process, and stays inside the transaction until killed."""
    with _routing(fleet_name, server_url, tag, folder, 1) as (router, pool):
        channel.send("ready")
        channel.recv()
        with psycopg.connect(conninfo_of(router)) as conn:
            conn.execute(f"INSERT INTO {table} VALUES (1)")
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            channel.send((row[0], pool.statistics().borrowed_count))
            channel.recv(None)


def overstaying_borrower(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str, table: str
) -> None:
    """As :func:`borrowing_process`, but once inside its transaction it says so, waits
    until told, then runs one more statement there and reports how it failed:
    (whether an ``OperationalError``, its SQLSTATE), or None if it did not."""
    with _routing(fleet_name, server_url, tag, folder, 1) as (router, _):
        channel.send("ready")
        channel.recv()
        with psycopg.connect(conninfo_of(router)) as conn:
            conn.execute(f"INSERT INTO {table} VALUES (1)")
            channel.send("inside")
            channel.recv()
            try:
                conn.execute("SELECT 1")
            except psycopg.Error as error:
                channel.send((isinstance(error, psycopg.OperationalError), error.sqlstate))
            else:
                channel.send(None)
        channel.recv(None)


def pinned_borrower(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str, table: str
) -> None:
    """As :func:`borrowing_process`, but once told to go its client creates a temporary
    table ``pinned`` (which pins the loan), reports the table's schema, and stays,
    idle, until killed."""
    del table
    with _routing(fleet_name, server_url, tag, folder, 1) as (router, _):
        channel.send("ready")
        channel.recv()
        with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
            conn.execute("CREATE TEMP TABLE pinned (n int)")
            row = conn.execute("SELECT pg_my_temp_schema()::regnamespace::text").fetchone()
            assert row is not None
            channel.send(row[0])
            channel.recv(None)


#: Rows each transaction of :func:`run_transactions` inserts, all with its number.
ROWS_PER_TRANSACTION: Final = 5


def run_transactions(
    conninfo: str, table: str, committed: list[int], stop: threading.Event | None = None
) -> None:
    """Run transactions on ``conninfo`` until ``stop`` is set or the connection fails:
    each inserts :data:`ROWS_PER_TRANSACTION` rows numbered by it, then commits; the
    number of each whose commit returned goes to ``committed``. A failure of the
    connection ends it (what a kill in the middle of a transaction causes); any other
    error is raised."""
    with contextlib.suppress(psycopg.OperationalError), psycopg.connect(conninfo) as conn:
        for number in itertools.count():
            if stop is not None and stop.is_set():
                return
            for _ in range(ROWS_PER_TRANSACTION):
                conn.execute(f"INSERT INTO {table} VALUES (%s)", (number,))
            conn.commit()
            committed.append(number)


def streaming_borrower(
    channel: Channel, fleet_name: str, server_url: str, tag: str, folder: str, table: str
) -> None:
    """As :func:`borrowing_process`, but once told to go its client runs
    :func:`run_transactions` on the loan until the process is killed."""
    with _routing(fleet_name, server_url, tag, folder, 1) as (router, _):
        channel.send("ready")
        channel.recv()
        run_transactions(conninfo_of(router), table, [])


def transactions_whole(postgres_server: TempPostgres, table: str) -> dict[int, int]:
    """The rows of ``table`` per transaction number, each checked whole: either all
    :data:`ROWS_PER_TRANSACTION` rows of a transaction are there, or none."""
    with psycopg.connect(postgres_server.url) as conn:
        rows = conn.execute(f"SELECT n, count(*) FROM {table} GROUP BY n").fetchall()
    counts = {int(n): int(count) for n, count in rows}
    assert set(counts.values()) <= {ROWS_PER_TRANSACTION}, counts  # nothing half-committed
    return counts
