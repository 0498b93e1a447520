"""Loans between transaction mode's routers: a process whose key's only connection
(``max_live`` 1) another process holds runs its transactions there. What a driver
sees is what it sees on a connection of its own (prepared statements, pins, errors);
the owner killed mid-loan leaves its borrower a named error and nothing committed,
and the borrower killed mid-loan leaves the owner's connection rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

import asyncpg
import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, _loans, _wire
from orbitive.clients._kept_loans import KeptLoans
from orbitive.clients._router import Router
from orbitive.clients._router_ends import Borrower, Endpoint
from orbitive.clients._upkeep import LOAN_DELIVERY_GRACE_S
from orbitive.pool import NotReservedError

from .._processes import Child, Processes
from .._servers import TempPostgres
from ._router_pool import (
    PORT,
    ROWS_PER_TRANSACTION,
    borrowing_process,
    conninfo_of,
    overstaying_borrower,
    owning_process,
    pinned_borrower,
    restarting_owner,
    run_transactions,
    server_pool,
    sessions,
    streaming_borrower,
    transactions_whole,
    until,
)


@pytest.fixture
def table(postgres_server: TempPostgres) -> Iterator[str]:
    """An empty table of this test's own."""
    name = f"loaned_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {name} (n int)")
        yield name
        admin.execute(f"DROP TABLE {name}")


@pytest.fixture
def pool(
    fleet: Fleet, postgres_server: TempPostgres, tag: str
) -> Iterator[ClientPool[psycopg.Connection]]:
    with server_pool(fleet, postgres_server.url, tag, 1) as opened:
        yield opened


@pytest.fixture
def borrower(
    pool: ClientPool[psycopg.Connection], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    """This process's router, holding no connection: another process took it over."""
    router = Router(str(tmp_path_factory.mktemp("router")), PORT, pool)  # opens the only one
    yield router
    router.close()


@pytest.fixture
def owner(
    borrower: Router,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Child]:
    """Another process of the fleet whose router took the only connection over."""
    del borrower  # started first: it opened the connection the owner takes over
    folder = str(tmp_path_factory.mktemp("owner"))
    with Processes("fork") as procs:
        child = procs.start(owning_process, fleet_name, postgres_server.url, tag, folder)
        assert child.recv() == "ready"
        yield child


@contextlib.contextmanager
def _lending_to(
    borrowing: Callable[..., None],
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    table: str,
) -> Iterator[tuple[Child, Router, ClientPool[psycopg.Connection]]]:
    """A child of the fleet running ``borrowing`` (:func:`borrowing_process` or
    :func:`streaming_borrower`), which opened the key's only connection, and this
    process's router, which took it over and lends it to the child once it is told
    to go."""
    with (
        tempfile.TemporaryDirectory() as borrower,
        tempfile.TemporaryDirectory() as owner,
        Processes("fork") as procs,
    ):
        child = procs.start(borrowing, fleet_name, postgres_server.url, tag, borrower, table)
        assert child.recv() == "ready"  # it opened the only connection
        with server_pool(fleet, postgres_server.url, tag, 1) as pool:
            router = Router(owner, PORT, pool)  # takes it over
            try:
                yield child, router, pool
            finally:
                router.close()


def test_prepared_statements_of_psycopg_and_asyncpg_run_on_a_loan(
    borrower: Router, owner: Child, pool: ClientPool[psycopg.Connection]
) -> None:
    del owner
    conns = [
        psycopg.connect(conninfo_of(borrower), autocommit=True, prepare_threshold=0)
        for _ in range(2)
    ]
    try:
        for round_ in range(4):
            for number, conn in enumerate(conns):
                row = conn.execute("SELECT %s::int * %s::int", (round_, number)).fetchone()
                assert row == (round_ * number,)
        with conns[0].transaction():
            with pytest.raises(psycopg.errors.DivisionByZero), conns[0].transaction():
                conns[0].execute("SELECT 1 / %s::int", (0,))
            assert conns[0].execute("SELECT %s::int", (7,)).fetchone() == (7,)
    finally:
        for conn in conns:
            conn.close()

    async def with_asyncpg() -> list[int]:
        folder = borrower.path.rsplit("/", 1)[0]
        conn = await asyncpg.connect(host=folder, port=PORT, user="postgres", database="postgres")
        try:
            return [await conn.fetchval("SELECT $1::int + 1", n) for n in range(5)]
        finally:
            await conn.close()

    assert asyncio.run(asyncio.wait_for(with_asyncpg(), 30)) == [1, 2, 3, 4, 5]
    stats = pool.statistics()
    assert stats.created_count == 1 and stats.borrowed_count > 10  # all on the owner's


def test_one_taker_thread_is_kept_for_checkouts_one_after_the_other(
    borrower: Router, owner: Child, pool: ClientPool[psycopg.Connection]
) -> None:
    """Each transaction of a client without a connection of its process is a checkout
    run off the router's thread; one after the other, they reuse one taker thread."""
    del owner
    with psycopg.connect(conninfo_of(borrower), autocommit=True) as conn:
        for n in range(20):
            assert conn.execute("SELECT %s::int", (n,)).fetchone() == (n,)
    assert pool.statistics().borrowed_count >= 20  # each one a checkout, and a loan
    takers = [t for t in threading.enumerate() if t.name == "orbitive-router-take"]
    assert len(takers) == 1  # kept, not one started (and ended) per checkout


def test_loans_one_after_the_other_go_on_one_socket_and_a_closed_one_is_replaced(
    borrower: Router,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loan that ended released leaves its socket to the owner open, and the next loan
    to that owner goes on it; one its owner closed meanwhile (its router restarted) is
    found out when the lease goes on it, and the lease goes on a new one."""
    kept: list[bool] = []  # per loan: whether a kept socket was there to take
    take = KeptLoans.take

    def noting(self: KeptLoans, owner: str) -> socket.socket | None:
        sock = take(self, owner)
        kept.append(sock is not None)
        return sock

    monkeypatch.setattr(KeptLoans, "take", noting)
    folder = str(tmp_path_factory.mktemp("owner"))
    with (
        Processes("fork") as procs,
        psycopg.connect(conninfo_of(borrower), autocommit=True, prepare_threshold=None) as conn,
    ):  # every statement one loan (a statement psycopg prepares is two)
        child = procs.start(restarting_owner, fleet_name, postgres_server.url, tag, folder)
        assert child.recv() == "ready"  # it took the only connection over
        for n in range(10):
            assert conn.execute("SELECT %s::int", (n,)).fetchone() == (n,)
        assert kept == [False] + [True] * 9  # one socket carried every loan
        child.send("restart")
        assert child.recv() == "ready"
        for n in range(2):
            assert conn.execute("SELECT %s::int", (n,)).fetchone() == (n,)
        assert kept == [False] + [True] * 11  # the closed one (replaced), then the new one
        child.kill()


def test_clients_of_other_settings_share_a_loaned_connection_and_keep_theirs(
    borrower: Router, owner: Child, postgres_server: TempPostgres, tag: str
) -> None:
    """Clients with different settings, all waiting for loans of the owner's only
    connection: each loan goes to a client with the settings the owner was told (no
    accepted loan ends unused, which would cost the owner its connection), and each
    client sees its own settings."""
    del owner
    pids: set[int] = set()
    failed: list[BaseException] = []

    def client(zone: str) -> None:
        try:
            with psycopg.connect(conninfo_of(borrower), autocommit=True) as conn:
                conn.execute(f"SET TimeZone TO '{zone}'")  # tracked: restored on each
                for _ in range(15):
                    row = conn.execute(
                        "SELECT pg_backend_pid(), current_setting('TimeZone')"
                    ).fetchone()
                    assert row is not None and row[1] == zone
                    pids.add(row[0])
        except BaseException as error:  # reported below
            failed.append(error)

    zones = ["Asia/Tokyo", "America/New_York"] * 2
    clients = [threading.Thread(target=client, args=(zone,)) for zone in zones]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert failed == []
    assert len(pids) == 1  # the owner's one connection throughout, never closed
    assert sessions(postgres_server, tag) == 1


def test_a_pin_keeps_the_loan_and_ends_clean(
    borrower: Router, owner: Child, pool: ClientPool[psycopg.Connection]
) -> None:
    del owner
    with psycopg.connect(conninfo_of(borrower), autocommit=True) as listener:
        listener.execute("LISTEN news")  # pins: the loan stays this client's
        pid = listener.execute("SELECT pg_backend_pid()").fetchone()
        assert listener.execute("SELECT pg_backend_pid()").fetchone() == pid
        borrowed = pool.statistics().borrowed_count
        assert listener.execute("SELECT 1").fetchone() == (1,)
        assert pool.statistics().borrowed_count == borrowed  # the same loan
    channels = "SELECT count(*) FROM pg_listening_channels()"
    with psycopg.connect(conninfo_of(borrower), autocommit=True) as other:
        assert other.execute(channels).fetchone() == (0,)  # the owner cleaned it
        assert other.execute("SELECT pg_backend_pid()").fetchone() == pid


def test_the_owner_killed_mid_loan_tells_the_client_and_commits_nothing(
    borrower: Router,
    owner: Child,
    pool: ClientPool[psycopg.Connection],
    postgres_server: TempPostgres,
    tag: str,
    table: str,
) -> None:
    with psycopg.connect(conninfo_of(borrower)) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (1)")  # inside a transaction, on a loan
        assert pool.statistics().borrowed_count == 1
        owner.kill()
        with pytest.raises(psycopg.OperationalError, match="lost"):
            conn.execute("SELECT 1")
    until(lambda: sessions(postgres_server, tag) == 0)  # the server rolled it back
    with psycopg.connect(conninfo_of(borrower), autocommit=True) as after:
        assert after.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    assert sessions(postgres_server, tag) == 1  # the pool opened its own once the owner died


def test_the_borrower_killed_mid_loan_leaves_the_owners_connection_rolled_back(
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    table: str,
) -> None:
    with _lending_to(borrowing_process, fleet, fleet_name, postgres_server, tag, table) as (
        child,
        router,
        pool,
    ):
        child.send("go")
        _, borrowed = child.recv()
        assert borrowed == 1  # its transaction runs on our connection
        child.kill()
        until(lambda: pool.statistics().closed_count == 1)  # closed: rolled back
        with psycopg.connect(conninfo_of(router), autocommit=True) as after:
            assert after.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        assert sessions(postgres_server, tag) == 1


#: Kills at random moments per test run: the soak (scripts/soak) runs them 50 times over.
RANDOM_KILLS: Final = 5


@pytest.mark.parametrize("seed", range(RANDOM_KILLS))
def test_the_owner_killed_at_a_random_moment_of_a_loan_stream_commits_only_whole_transactions(
    borrower: Router,
    owner: Child,
    pool: ClientPool[psycopg.Connection],
    postgres_server: TempPostgres,
    tag: str,
    table: str,
    seed: int,
) -> None:
    committed: list[int] = []
    stop = threading.Event()
    client = threading.Thread(
        target=run_transactions, args=(conninfo_of(borrower), table, committed, stop)
    )
    client.start()
    try:
        until(lambda: len(committed) >= 1)  # the loan runs
        time.sleep(random.Random(seed).uniform(0.0, 0.2))
        owner.kill()
        # A kill inside a transaction fails it (OperationalError ends the client); one
        # between two leaves the client unaware: its next runs on a connection anew.
        running = len(committed)
        until(lambda: not client.is_alive() or len(committed) > running + 2)
    finally:
        stop.set()
        client.join(60)
    assert not client.is_alive()  # never left hanging
    counts = transactions_whole(postgres_server, table)
    assert set(committed) <= set(counts)  # every commit that returned is there
    assert len(set(counts) - set(committed)) <= 1  # at most the one whose answer was lost
    assert sessions(postgres_server, tag) <= 1  # the cap held
    with psycopg.connect(conninfo_of(borrower), autocommit=True) as after:
        assert after.execute("SELECT 1").fetchone() == (1,)  # the router serves on
    assert sessions(postgres_server, tag) == 1


@pytest.mark.parametrize("seed", range(RANDOM_KILLS))
def test_the_borrower_killed_at_a_random_moment_of_a_loan_stream_leaves_whole_transactions(
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    table: str,
    seed: int,
) -> None:
    with _lending_to(streaming_borrower, fleet, fleet_name, postgres_server, tag, table) as (
        child,
        router,
        _,
    ):
        child.send("go")
        until(lambda: bool(transactions_whole(postgres_server, table)))  # it streams
        time.sleep(random.Random(seed).uniform(0.0, 0.2))
        child.kill()
        with psycopg.connect(conninfo_of(router), autocommit=True) as after:
            assert after.execute("SELECT 1").fetchone() == (1,)  # clean, or anew
        transactions_whole(postgres_server, table)
        assert sessions(postgres_server, tag) == 1  # the cap held


def test_a_loan_past_its_lease_is_ended_and_its_transaction_rolled_back(
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A borrower that stays inside its transaction past the loan's lease (its header's
    lease_ms) loses it as a vanished borrower would: the owner closes the connection
    (the server rolls back), the borrower's client gets an OperationalError, and the
    owner serves on."""
    monkeypatch.setattr(_loans, "LEASE_MS", 1000)  # what the forked borrower asks for
    with _lending_to(overstaying_borrower, fleet, fleet_name, postgres_server, tag, table) as (
        child,
        router,
        _,
    ):
        child.send("go")
        assert child.recv() == "inside"
        inside = time.monotonic()
        until(lambda: sessions(postgres_server, tag) == 0)  # closed: rolled back
        assert time.monotonic() - inside >= 0.9  # not before the lease ended
        child.send("try")
        assert child.recv() == (True, "57014")  # an OperationalError: query_canceled
        with psycopg.connect(conninfo_of(router), autocommit=True) as after:
            assert after.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        assert sessions(postgres_server, tag) == 1


def test_the_owner_waits_idle_while_it_cleans_a_pinned_loan_past_its_lease(
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pinned loan past its lease is ended and its connection cleaned (``DISCARD
    ALL``); while the clean-up waits (here for a lock on the borrower's temporary
    table), the owner's router waits for it without spinning, then serves on."""
    monkeypatch.setattr(_loans, "LEASE_MS", 500)  # what the forked borrower asks for
    with (
        _lending_to(pinned_borrower, fleet, fleet_name, postgres_server, tag, table) as (
            child,
            router,
            _,
        ),
        psycopg.connect(postgres_server.url) as locker,
    ):
        child.send("go")
        schema = child.recv()
        locker.execute(f"LOCK TABLE {schema}.pinned IN ACCESS SHARE MODE")  # DISCARD waits
        time.sleep(1.0)  # the lease ended: the clean-up waits for the lock
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(1.0)
        busy = (time.process_time() - cpu) / (time.monotonic() - wall)
        assert busy < 0.25, f"the router spun: {busy:.0%} of a core while waiting"
        locker.rollback()  # the clean-up goes on
        with psycopg.connect(conninfo_of(router), autocommit=True) as after:
            assert after.execute(
                "SELECT count(*) FROM pg_tables WHERE tablename = 'pinned'"
            ).fetchone() == (0,)


def test_an_answer_goes_to_the_borrower_in_one_write_with_its_ready_for_query(
    fleet: Fleet,
    fleet_name: str,
    postgres_server: TempPostgres,
    tag: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the server sent at once goes on in one write: an owner killed between two
    writes would leave the borrower a command's completion without its ReadyForQuery,
    and then the loan's loss, which psycopg reads as a second result ("received 2
    results from command 'BEGIN'", an InternalError) instead of a lost connection."""
    streams: dict[Endpoint, tuple[bytearray, list[int]]] = {}  # what went, where writes ended
    flush = Router._flush

    def recording(router: Router, endpoint: Endpoint) -> None:
        before = bytes(endpoint.out)
        flush(router, endpoint)
        if isinstance(endpoint, Borrower) and before:
            stream, ends = streams.setdefault(endpoint, (bytearray(), []))
            stream += before[: len(before) - len(endpoint.out)]
            ends.append(len(stream))

    monkeypatch.setattr(Router, "_flush", recording)
    with _lending_to(streaming_borrower, fleet, fleet_name, postgres_server, tag, table) as (
        child,
        _,
        _,
    ):
        child.send("go")
        until(lambda: len(transactions_whole(postgres_server, table)) >= 5)
        child.kill()
    completions = 0
    for stream, ends in streams.values():
        completed = None  # where the last CommandComplete ended, until its ReadyForQuery
        at = 0
        while at + 5 <= len(stream):
            kind, end = stream[at], at + 1 + int.from_bytes(stream[at + 1 : at + 5], "big")
            if kind == _wire.COMMAND_COMPLETE:
                completions += 1
                completed = end
            elif kind == _wire.READY_FOR_QUERY and completed is not None:
                assert not [e for e in ends if completed <= e < end]  # no write between
                completed = None
            at = end
    assert completions >= 5 * (ROWS_PER_TRANSACTION + 2)  # BEGIN, the inserts, COMMIT


@pytest.mark.parametrize(
    "sent",
    [
        b"\x00" * 48 + b"PTXN",  # a lease frame of zeros
        os.urandom(200),
        b"",  # connects and leaves
    ],
    ids=["zero-frame", "random", "nothing"],
)
def test_a_loan_socket_refuses_what_no_router_sends_and_serves_on(
    borrower: Router, owner: Child, sent: bytes
) -> None:
    del owner
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hostile:
        hostile.settimeout(10)
        hostile.connect(borrower.loan_path)
        hostile.sendall(sent)
        hostile.shutdown(socket.SHUT_WR)
        assert hostile.recv(65536)[:1] != bytes([_loans.ACCEPTED])  # refused, or an error
    with psycopg.connect(conninfo_of(borrower), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_reservation_no_borrower_delivers_ages_out_and_the_connection_serves(
    pool: ClientPool[psycopg.Connection],
) -> None:
    """A borrower killed between its reservation of the owner's idle connection and the
    delivery of its lease: the owner's upkeep ages the reservation out (after
    LOAN_DELIVERY_GRACE_S), the connection serves again, the late lease is refused."""
    conn = pool.getconn()
    pool.putconn(conn)  # the key's only connection, idle here
    (entry,) = pool._family.idle
    lease = pool.pool.reserve(entry.rid)  # as the borrower did before it was killed
    started = time.monotonic()
    again = pool.getconn(timeout=30)  # no reservation ages out: PoolTimeout
    assert again is conn
    assert time.monotonic() - started >= LOAN_DELIVERY_GRACE_S  # the reservation held
    pool.putconn(again)
    with pytest.raises(NotReservedError):
        pool.pool.accept(lease)  # delivered late: refused
