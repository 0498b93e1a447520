"""Transaction mode's reference router: many driver connections served on a few server
connections of a pool, first come first served, with what each client's session keeps
kept for it, and a client that leaves mid-transaction leaving nothing half done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import struct
import threading
import time

import asyncpg
import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, _wire
from orbitive.clients._router import Router
from orbitive.clients._wire import Framer, Message

from .._processes import Processes
from .._servers import TempPostgres
from ._router_pool import (
    PORT,
    ROUNDS,
    conninfo_of,
    routed,
    routing_process,
    server_pool,
    sessions,
    until,
)


def test_eight_clients_share_two_server_connections(
    router: Router, postgres_server: TempPostgres, tag: str
) -> None:
    errors: list[BaseException] = []
    pids: set[int] = set()
    peak = [0]

    def client(number: int) -> None:
        try:
            with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
                for value in range(25):
                    with conn.transaction():
                        row = conn.execute(
                            "SELECT %s::int * 2, pg_backend_pid()", (number * 100 + value,)
                        ).fetchone()
                    assert row is not None and row[0] == (number * 100 + value) * 2
                    pids.add(row[1])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        peak[0] = max(peak[0], sessions(postgres_server, tag))
        time.sleep(0.05)
    assert errors == []
    assert len(pids) == 2 and peak[0] == 2
    assert router.server_connections == 0  # each went back to the pool between transactions


def test_waiting_clients_are_served_in_the_order_they_asked(
    fleet: Fleet,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = str(tmp_path_factory.mktemp("router"))
    with routed(fleet, postgres_server.url, tag, folder, 1) as (router, _):
        holder = psycopg.connect(conninfo_of(router))
        holder.execute("SELECT 1")  # a transaction open: the only connection is taken
        served: list[tuple[int, float]] = []
        threads = []
        for number in range(4):

            def ask(number: int = number) -> None:
                with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
                    now = "SELECT extract(epoch FROM clock_timestamp())"
                    row = conn.execute(now).fetchone()
                    assert row is not None
                    served.append((number, float(row[0])))

            threads.append(threading.Thread(target=ask))
            threads[-1].start()
            until(functools.partial(_waits, router, number + 1))  # it asked
        holder.commit()
        holder.close()
        for thread in threads:
            thread.join(10)
    assert [number for number, _ in sorted(served, key=lambda item: item[1])] == [0, 1, 2, 3]


def _waits(router: Router, count: int) -> bool:
    return router.waiting == count


def test_a_client_gone_mid_transaction_leaves_nothing_and_the_rest_go_on(
    router: Router, router_pool: ClientPool[psycopg.Connection], postgres_server: TempPostgres
) -> None:
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS routed (n int)")
        admin.execute("TRUNCATE routed")
        leaver = psycopg.connect(conninfo_of(router))
        leaver.execute("INSERT INTO routed VALUES (1)")
        leaver.pgconn.finish()  # the socket closes inside the transaction
        with psycopg.connect(conninfo_of(router), autocommit=True) as other:
            other.execute("INSERT INTO routed VALUES (2)")
            row = other.execute("SELECT array_agg(n ORDER BY n) FROM routed").fetchone()
        assert row == ([2],)
        admin.execute("DROP TABLE routed")
    until(lambda: router_pool.statistics().closed_count == 1)  # the one it held: rolled back


def test_a_pinned_client_keeps_its_connection_and_leaves_it_clean(
    router: Router, router_pool: ClientPool[psycopg.Connection]
) -> None:
    with psycopg.connect(conninfo_of(router), autocommit=True) as listener:
        listener.execute("LISTEN news")
        pid = listener.execute("SELECT pg_backend_pid()").fetchone()
        assert pid == listener.execute("SELECT pg_backend_pid()").fetchone()
    channels = "SELECT count(*) FROM pg_listening_channels()"
    for _ in range(4):
        with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
            assert conn.execute(channels).fetchone() == (0,)  # no one inherits the LISTEN
    assert router_pool.statistics().closed_count == 0  # cleaned, not closed


def test_asyncpg_is_served_by_the_router(router: Router) -> None:
    async def body() -> list[int]:
        folder = router.path.rsplit("/", 1)[0]
        conns = [
            await asyncpg.connect(host=folder, port=PORT, user="postgres", database="postgres")
            for _ in range(4)
        ]
        try:
            values = await asyncio.gather(
                *(conn.fetchval("SELECT $1::int + 1", n) for n, conn in enumerate(conns))
            )
            async with conns[0].transaction():
                await conns[0].execute("SELECT 1")
            return list(values)
        finally:
            for conn in conns:
                await conn.close()

    assert asyncio.run(asyncio.wait_for(body(), 30)) == [1, 2, 3, 4]


def test_copy_both_ways_and_large_rows_pass_through_the_router(router: Router) -> None:
    big = "x" * 3_000_000  # a row larger than any socket buffer
    with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE copied (n int, s text)")  # pins: one connection
        with conn.cursor() as cursor, cursor.copy("COPY copied FROM STDIN") as copy:
            for n in range(1000):
                copy.write_row((n, big if n == 500 else f"row {n}"))
        with conn.cursor() as cursor, cursor.copy("COPY copied TO STDOUT") as copy:
            size = sum(len(block) for block in copy)
        assert size > 3_000_000
        row = conn.execute("SELECT count(*), max(length(s)) FROM copied").fetchone()
        assert row == (1000, 3_000_000)
        echoed = conn.execute("SELECT %s::text", (big,)).fetchone()
        assert echoed == (big,)


def test_clients_that_prepare_the_same_statement_share_it_on_a_connection(
    router: Router,
) -> None:
    conns = [
        psycopg.connect(conninfo_of(router), autocommit=True, prepare_threshold=0) for _ in range(3)
    ]
    try:
        for round_ in range(4):
            for number, conn in enumerate(conns):
                row = conn.execute("SELECT %s::int + %s::int", (round_, number)).fetchone()
                assert row == (round_ + number,)
        counted = (
            conns[0]
            .execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'orb_%%'")
            .fetchone()
        )
    finally:
        for conn in conns:
            conn.close()
    assert counted is not None and counted[0] <= 2  # this query's and the shared one


def test_a_cancel_request_cancels_the_statement_where_it_runs(
    router: Router, postgres_server: TempPostgres
) -> None:
    """(``cancel_safe``: the blocking ``cancel()`` holds the GIL while it waits for the
    router's answer, and the reference router shares this process.)"""
    running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'"
    with (
        psycopg.connect(conninfo_of(router), autocommit=True) as conn,
        psycopg.connect(postgres_server.url, autocommit=True) as admin,
    ):

        def cancel_once_running() -> None:
            until(lambda: admin.execute(running).fetchone() == (1,))
            conn.cancel_safe()

        canceller = threading.Thread(target=cancel_once_running)
        canceller.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(60)")
        canceller.join(30)
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(conninfo_of(router), autocommit=True) as other:
        assert other.pgconn.backend_pid == os.getpid()  # the router's process: its own key


def test_a_fast_path_function_call_runs_as_a_query_does(router: Router) -> None:
    """libpq's large-object functions use the fast path (FunctionCall): it runs on a
    server connection and ends with ReadyForQuery, as a simple query."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    with sock:
        sock.connect(router.path)
        body = b"user\0postgres\0database\0postgres\0\0"
        sock.sendall(struct.pack("!II", len(body) + 8, 3 << 16) + body)
        framer = Framer(_wire.BACKEND | {ord("R"), ord("K")})
        assert _read_until_ready(sock, framer)[0].kind == ord("R")
        oid = 2026  # pg_backend_pid(): no arguments, an int4 in binary
        call = struct.pack("!IHHH", oid, 0, 0, 1)
        sock.sendall(Message(_wire.FUNCTION_CALL, call).frame())
        answers = _read_until_ready(sock, framer)
        assert [m.kind for m in answers] == [ord("V"), _wire.READY_FOR_QUERY]
        assert struct.unpack("!i", answers[0].body[:4]) == (4,)  # four bytes of int4


def _read_until_ready(sock: socket.socket, framer: Framer) -> list[Message]:
    messages: list[Message] = []
    while not messages or messages[-1].kind != _wire.READY_FOR_QUERY:
        data = sock.recv(65536)
        assert data, "the router closed the connection"
        messages += framer.feed(data)
    return messages


def test_the_routers_of_two_processes_share_max_live_and_serve_every_client(
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Each process's router asks the key's pool: a transaction runs on a connection of
    its process, on the other's as a loan, or on one opened when a connection given
    back while the other waits at ``max_live`` is closed for it there; the server never
    holds more than two."""
    clients = 3
    with Processes("fork") as procs:
        children = [
            procs.start(
                routing_process,
                fleet_name,
                postgres_server.url,
                tag,
                str(tmp_path_factory.mktemp("router")),
                clients,
                2,
            )
            for _ in range(2)
        ]
        assert [child.recv() for child in children] == ["ready", "ready"]
        for child in children:
            child.send("go")
        reports: list[tuple[list[int], list[str], int, int]] = []
        peak = 0
        deadline = time.monotonic() + 120
        while len(reports) < len(children):
            peak = max(peak, sessions(postgres_server, tag))
            with contextlib.suppress(TimeoutError):
                reports.append(children[len(reports)].recv(0.02))
            assert time.monotonic() < deadline, "the routing processes never finished"
    assert [report[1] for report in reports] == [[], []]
    assert [len(report[0]) for report in reports] == [clients * ROUNDS] * 2
    assert peak <= 2


def test_a_process_without_a_connection_runs_its_transactions_on_anothers(
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """With ``max_live`` 1 held by this process's idle connection, every transaction of
    the other process runs on it, carried there (a loan): one server session all along,
    and the other process opens nothing after its first (which it gave up to us)."""
    with Processes("fork") as procs:
        folder = str(tmp_path_factory.mktemp("router"))
        borrower = procs.start(routing_process, fleet_name, postgres_server.url, tag, folder, 2, 1)
        assert borrower.recv() == "ready"  # it opened the only connection, idle now
        with server_pool(fleet, postgres_server.url, tag, 1) as pool:
            owner = Router(str(tmp_path_factory.mktemp("router")), PORT, pool)  # ours now
            try:
                with psycopg.connect(conninfo_of(owner), autocommit=True) as conn:
                    row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                borrower.send("go")
                peak = 0
                deadline = time.monotonic() + 120
                while True:
                    peak = max(peak, sessions(postgres_server, tag))
                    with contextlib.suppress(TimeoutError):
                        served, errors, borrowed, created = borrower.recv(0.02)
                        break
                    assert time.monotonic() < deadline, "the borrower never finished"
            finally:
                owner.close()
    assert errors == []
    assert set(served) == {row[0]} and len(served) == 2 * ROUNDS
    assert borrowed == 2 * ROUNDS and created == 1
    assert peak == 1
