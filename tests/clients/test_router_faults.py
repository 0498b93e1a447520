"""Transaction mode's reference router under what broke it once: a statement sent while
its own check runs, a check that fails, a client gone with messages unanswered or
that never reads, settings of one client seen by another, roles and temporary
objects, a Terminate behind a statement, what ``close()`` leaves to libpq, and a
pool that loses a connection or has none to give.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions, _wire
from orbitive.clients._router import Router
from orbitive.clients._wire import Framer, Message

from .._servers import TempPostgres
from ._router_pool import PORT, conninfo_of, routed, sessions, until


class _Raw:
    """A client speaking the protocol by hand, to send what drivers never do."""

    def __init__(self, router: Router) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(router.path)
        self.framer = Framer(_wire.BACKEND | {ord("R"), ord("K")})
        body = b"user\0postgres\0database\0postgres\0\0"
        self.sock.sendall(struct.pack("!II", len(body) + 8, 3 << 16) + body)
        self.until_ready()

    def __enter__(self) -> _Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, *messages: Message) -> None:
        self.sock.sendall(b"".join(message.frame() for message in messages))

    def until_ready(self) -> list[Message]:
        messages: list[Message] = []
        while not messages or messages[-1].kind != _wire.READY_FOR_QUERY:
            data = self.sock.recv(65536)
            assert data, "the router closed the connection"
            messages += self.framer.feed(data)
        return messages


@pytest.mark.parametrize(
    "statement",
    [
        "SET work_mem = '8MB'; RESET work_mem",
        "SELECT pg_advisory_lock(1), pg_advisory_unlock(1)",
        "CREATE TEMP TABLE t1 (a int); DROP TABLE t1",
        "SELECT set_config('work_mem', '9MB', false)",
    ],
)
def test_a_statement_sent_while_the_routers_check_runs_goes_on_after_it(
    router: Router, statement: str
) -> None:
    with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
        for _ in range(3):
            conn.execute(statement)
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_check_the_server_cancels_pins_and_costs_nothing_else(
    router: Router, router_pool: ClientPool[psycopg.Connection]
) -> None:
    with psycopg.connect(conninfo_of(router), autocommit=True) as conn:
        conn.execute("SET statement_timeout = 1")  # the settings check after it is cancelled
        conn.execute("SET statement_timeout = 0")
        assert conn.execute("SELECT 2").fetchone() == (2,)
    with psycopg.connect(conninfo_of(router), autocommit=True) as other:
        assert other.execute("SELECT 3").fetchone() == (3,)
    assert router_pool.statistics().closed_count == 0


def test_a_client_gone_with_statements_unsynced_commits_nothing(
    router: Router, router_pool: ClientPool[psycopg.Connection], postgres_server: TempPostgres
) -> None:
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS unsynced (n int)")
        admin.execute("TRUNCATE unsynced")
        with _Raw(router) as raw:
            insert = b"INSERT INTO unsynced VALUES (1)"
            raw.send(
                Message(_wire.PARSE, b"\0" + insert + b"\0\0\0"),
                Message(_wire.BIND, b"\0\0\0\0\0\0\0\0"),
                Message(_wire.EXECUTE, b"\0\0\0\0\0"),
                Message(_wire.FLUSH, b""),
            )
            raw.sock.recv(65536)  # its ParseComplete...: the statement ran, not committed
        with psycopg.connect(conninfo_of(router), autocommit=True) as other:
            assert other.execute("SELECT count(*) FROM unsynced").fetchone() == (0,)
            assert other.execute("SELECT count(*) FROM unsynced").fetchone() == (0,)
        admin.execute("DROP TABLE unsynced")
    until(lambda: router_pool.statistics().closed_count == 1)  # its connection: rolled back


def test_a_terminate_behind_a_statement_waits_for_its_answer(
    router: Router, router_pool: ClientPool[psycopg.Connection], postgres_server: TempPostgres
) -> None:
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS terminated (n int)")
        admin.execute("TRUNCATE terminated")
        for number in range(3):
            with _Raw(router) as raw:
                raw.send(
                    _wire.query(f"INSERT INTO terminated VALUES ({number})".encode()),
                    Message(_wire.TERMINATE, b""),
                )
                while raw.sock.recv(65536):
                    pass  # the router closes once the statement was answered
        rows = admin.execute("SELECT array_agg(n ORDER BY n) FROM terminated").fetchone()
        admin.execute("DROP TABLE terminated")
    assert rows == ([0, 1, 2],)
    assert router_pool.statistics().closed_count == 0  # each went back, none was closed


def test_a_client_that_never_reads_holds_up_only_its_own_connection(
    router: Router, router_pool: ClientPool[psycopg.Connection]
) -> None:
    with _Raw(router) as slow:
        _read_slowly(router, router_pool, slow)


def _read_slowly(router: Router, router_pool: ClientPool[psycopg.Connection], slow: _Raw) -> None:
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.send(_wire.query(b"SELECT repeat('x', 1000) FROM generate_series(1, 100000)"))
    with psycopg.connect(conninfo_of(router), autocommit=True) as other:
        for _ in range(5):
            assert other.execute("SELECT 1").fetchone() == (1,)
    until(lambda: router.server_connections == 1)  # the slow client still holds its own
    assert router_pool.statistics().closed_count == 0
    received = 0
    while received < 100_000_000:  # it reads at last: every row arrives
        data = slow.sock.recv(1 << 20)
        assert data
        received += len(data)
        if data.endswith(b"Z\x00\x00\x00\x05I"):
            break
    assert received > 100_000_000


def test_a_new_client_gets_the_fresh_settings_and_its_own_startup_ones(
    router: Router,
) -> None:
    with psycopg.connect(conninfo_of(router), autocommit=True) as first:
        first.execute("SET TimeZone = 'Asia/Tokyo'")
        first.execute("SET DateStyle = 'German'")
        fresh = psycopg.connect(conninfo_of(router), autocommit=True)
        named = psycopg.connect(conninfo_of(router, application_name="named"), autocommit=True)
        with fresh, named:
            show = "SELECT current_setting('TimeZone'), current_setting('application_name')"
            for _ in range(3):  # on either connection
                assert fresh.execute(show).fetchone() != ("Asia/Tokyo", "")
                assert fresh.info.parameter_status("TimeZone") != "Asia/Tokyo"
                row = named.execute(show).fetchone()
                assert row is not None and row[1] == "named"


@pytest.mark.parametrize(
    "statement",
    [
        "SET ROLE orbit_low",
        "SET SESSION AUTHORIZATION orbit_low",
        "SELECT set_config('role', 'orbit_low', false)",
        "CREATE TEMP VIEW v AS SELECT 1 AS x",
        "CREATE TEMP SEQUENCE s",
    ],
)
def test_a_role_taken_or_a_temporary_object_pins(
    router: Router, postgres_server: TempPostgres, statement: str
) -> None:
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(
            "DO $$ BEGIN CREATE ROLE orbit_low; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    with psycopg.connect(conninfo_of(router), autocommit=True) as pinned:
        pinned.execute(statement)
        pid = pinned.execute("SELECT pg_backend_pid()").fetchone()
        for _ in range(4):
            with psycopg.connect(conninfo_of(router), autocommit=True) as other:
                row = other.execute(
                    "SELECT pg_backend_pid(), current_user, to_regclass('v'), to_regclass('s')"
                ).fetchone()
                assert row is not None and row[1:] == ("postgres", None, None)
                assert (row[0],) != pid  # never served on the pinned connection


def test_close_tells_a_client_mid_transaction_and_closes_every_server_connection(
    router: Router, postgres_server: TempPostgres, tag: str
) -> None:
    with (
        psycopg.connect(conninfo_of(router)) as inside,
        psycopg.connect(conninfo_of(router), autocommit=True) as between,
    ):
        inside.execute("SELECT 1")  # a transaction open: one connection
        assert between.execute("SELECT 1").fetchone() == (1,)  # the other, given back
        assert sessions(postgres_server, tag) == 2
        router.close()
        with pytest.raises(psycopg.OperationalError):
            inside.execute("SELECT 2")
        with pytest.raises(psycopg.OperationalError):
            between.execute("SELECT 2")
    until(lambda: sessions(postgres_server, tag) == 0)


def test_a_server_connection_lost_is_replaced_for_the_waiting_client(
    fleet: Fleet,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = str(tmp_path_factory.mktemp("router"))
    with routed(fleet, postgres_server.url, tag, folder, 1) as (router, only):
        leaver = psycopg.connect(conninfo_of(router))
        leaver.execute("SELECT 1")  # in a transaction, on the only connection
        with psycopg.connect(conninfo_of(router), autocommit=True) as waiter:
            served: list[object] = []
            waiting = threading.Thread(
                target=lambda: served.append(waiter.execute("SELECT 2").fetchone())
            )
            waiting.start()
            until(lambda: router.waiting == 1)
            leaver.pgconn.finish()  # gone inside its transaction: the connection closes
            waiting.join(30)
        assert served == [(2,)]  # on a connection the pool opened in its place
        until(lambda: only.statistics().closed_count == 1)
        assert only.statistics().created_count == 2


def test_a_client_the_pool_has_no_connection_for_in_time_is_told_not_left_waiting(
    fleet: Fleet,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = str(tmp_path_factory.mktemp("router"))
    with (
        routed(fleet, postgres_server.url, tag, folder, 1, wait_timeout=0.3) as (router, _),
        psycopg.connect(conninfo_of(router)) as holder,
        psycopg.connect(conninfo_of(router), autocommit=True) as waiter,
    ):
        holder.execute("SELECT 1")  # in a transaction, on the only connection
        with pytest.raises(psycopg.errors.TooManyConnections, match="no server conn"):
            waiter.execute("SELECT 1")
        assert waiter.closed or waiter.broken
        assert holder.execute("SELECT 3").fetchone() == (3,)  # the holder goes on


def test_every_waiting_client_has_a_checkout_of_its_own(
    fleet: Fleet,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A client that waits behind another waiting client gets a checkout too: with room
    under ``max_live``, three clients hold three transactions at once, although each
    connection takes a while to open (the third arrives while the second's opens)."""
    url = f"{postgres_server.url}?application_name={tag}"

    def slowly() -> psycopg.Connection:
        time.sleep(0.3)
        return psycopg.connect(url, autocommit=True)

    options = PoolOptions(max_live=3, max_idle=3)
    folder = str(tmp_path_factory.mktemp("router"))
    together = threading.Barrier(3, timeout=15)
    failed: list[BaseException] = []

    def client(router: Router) -> None:
        try:
            with psycopg.connect(conninfo_of(router)) as conn:
                conn.execute("SELECT 1")  # inside a transaction: it holds a connection
                together.wait()  # all three inside at once
        except BaseException as error:  # reported below
            failed.append(error)

    pool: ClientPool[psycopg.Connection] = ClientPool(
        fleet, url, create=slowly, close=psycopg.Connection.close, options=options, lends=True
    )
    with pool:
        router = Router(folder, PORT, pool, wait_timeout=20)  # opens one
        try:
            clients = [threading.Thread(target=client, args=(router,)) for _ in range(3)]
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join()
            assert failed == []
            assert pool.statistics().created_count == 3
        finally:
            router.close()
