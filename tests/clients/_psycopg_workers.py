"""Worker processes of the psycopg fault tests (module-level, so spawn finds them).

No test framework is imported here.
"""

from __future__ import annotations

import os
import resource
import time

from orbitive import Fleet
from orbitive.clients import ClientCreateError, PoolOptions
from orbitive.clients.psycopg import ConnectionPool

from .._processes import Channel

#: Descriptors a "busy process" holds open before it connects: its sockets get numbers
#: of 1024 and above, which ``select.select`` cannot watch.
BUSY_DESCRIPTORS = 1100


#: Work that makes a backend's exit take a few milliseconds (it drops its temporary
#: tables), so a connect that does not wait for it would meet it still counted.
EXIT_WORK = "CREATE TEMP TABLE exit_work AS SELECT generate_series(1, 20000) AS n"


def hold_many_descriptors() -> list[int]:
    """Open /dev/null until every descriptor below :data:`BUSY_DESCRIPTORS` is taken."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = BUSY_DESCRIPTORS + 64
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    held: list[int] = []
    while not held or held[-1] < BUSY_DESCRIPTORS:
        held.append(os.open(os.devnull, os.O_RDONLY))
    return held


def busy_reconnects(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, rounds: int
) -> None:
    """With 1,100 descriptors open, check a connection out and close it on return
    (``max_idle=0``), ``rounds`` times: each checkout connects anew within ``max_live=1``.

    Sends (refused connects, close errors, the lowest socket descriptor seen).
    """
    held = hold_many_descriptors()
    with Fleet.join(fleet_name, capacity) as fleet:
        options = PoolOptions(max_live=1, max_idle=0, acquire_timeout=10.0)
        pool = ConnectionPool(
            url, fleet=fleet, kwargs={"application_name": tag}, options=options, check=None
        )
        refused, lowest = 0, 1 << 30
        for _ in range(rounds):
            try:
                with pool.connection() as conn:
                    lowest = min(lowest, conn.pgconn.socket)
                    conn.execute(EXIT_WORK)
            except ClientCreateError:
                refused += 1  # the role's CONNECTION LIMIT: the last backend had not left
                time.sleep(0.01)
        close_errors = pool.statistics().close_errors_count
        pool.close()
    for fd in held:
        os.close(fd)
    channel.send((refused, close_errors, lowest))


def async_checkout(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, max_live: int
) -> None:
    """Check ``max_live`` connections out of an AsyncConnectionPool, each within 1 s.

    Sends how many it got, then the class names of the errors of the others.
    """
    import asyncio  # noqa: PLC0415 - spawn imports this module lean

    from orbitive.clients.psycopg import AsyncConnectionPool  # noqa: PLC0415

    async def run(fleet: Fleet) -> tuple[int, list[str]]:
        options = PoolOptions(max_live=max_live)
        pool = AsyncConnectionPool(
            url, fleet=fleet, kwargs={"application_name": tag}, options=options
        )
        held, errors = [], []
        for _ in range(max_live):
            try:
                held.append(await pool.getconn(timeout=1.0))
            except Exception as error:  # reported by name: the test decides
                errors.append(type(error).__name__)
        for conn in held:
            await pool.putconn(conn)
        await pool.close()
        return len(held), errors

    with Fleet.join(fleet_name, capacity) as fleet:
        channel.send(asyncio.run(run(fleet)))


def sleeping_holder(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, hold: int, query: str
) -> None:
    """Check out ``hold`` connections (``max_live=hold``) and run ``query`` on each from a
    thread of its own; send "running" once every thread has sent its query, then wait."""
    import threading  # noqa: PLC0415 - spawn imports this module lean

    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ConnectionPool(
            url, fleet=fleet, kwargs={"application_name": tag}, options=PoolOptions(max_live=hold)
        )
        held = [pool.getconn() for _ in range(hold)]
        threads = [
            threading.Thread(target=conn.execute, args=(query,), daemon=True) for conn in held
        ]
        for thread in threads:
            thread.start()
        channel.send("running")
        time.sleep(3600)


def key_with_row_factory(channel: Channel, conninfo: str) -> None:
    """Send the pool key of ``conninfo`` with a row factory, as this process derives it."""
    from psycopg.rows import dict_row  # noqa: PLC0415 - spawn imports this module lean

    from orbitive.clients._psycopg_connections import connection_key  # noqa: PLC0415

    channel.send(connection_key(conninfo, {"row_factory": dict_row, "application_name": "a"}))
