"""PostgreSQL engine specifics: server clock, recycled connections, schema, missing driver."""

from __future__ import annotations

import sys
import threading
import time

import psycopg
import pytest

from orbitive.store import ErrorKind, StoreError, open_store
from orbitive.store._postgres import SCHEMA_VERSION

from .._processes import Processes
from .._servers import TempPostgres
from ._workers import PATIENCE_S, open_and_lock


def test_expiry_is_on_the_servers_clock(postgres_url: str) -> None:
    with open_store(postgres_url) as store, psycopg.connect(postgres_url) as conn:
        lock = store.try_lock("clock", "w1", 100.0)
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert lock is not None and row is not None
        assert abs(lock.expires_at - (row[0] + 100.0)) < 1.0


def kill_other_sessions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database() "
            "AND backend_type = 'client backend'"
        ).fetchall()
    return len(rows)


def test_lock_survives_the_connection_being_recycled(postgres_url: str) -> None:
    with open_store(postgres_url) as store, open_store(postgres_url) as other:
        lock = store.try_lock("survivor", "w1", 60.0)
        assert lock is not None
        assert kill_other_sessions(postgres_url) >= 2
        assert other.try_lock("survivor", "w2", 60.0) is None  # still held, new connection
        assert lock.renew(60.0)
        info = store.inspect("survivor")
        assert info is not None and info.fencing_token == lock.fencing_token
        assert kill_other_sessions(postgres_url) >= 1
        assert lock.release()


def test_a_renewal_in_flight_at_a_slots_deadline_keeps_the_slot_from_a_grant(
    postgres_url: str,
) -> None:
    """A renewal that began before the deadline and commits after a grant read the row as
    lapsed: the grant must not replace the renewed row (two holders of one slot)."""
    with open_store(postgres_url) as store, open_store(postgres_url) as other:
        lease = store.semaphore("renewing", 1).try_acquire("w1", 0.5)
        assert lease is not None
        granted: list[object] = []
        grant = threading.Thread(
            target=lambda: granted.append(other.semaphore("renewing", 1).try_acquire("w2", 60.0))
        )
        with psycopg.connect(postgres_url) as renewal:  # the renew statement, not committed
            renewal.execute(
                "UPDATE orbitive_semaphores SET expires_at = clock_timestamp() + interval '60 s' "
                "WHERE name = 'renewing' AND fencing_token = %s AND expires_at > clock_timestamp()",
                (lease.fencing_token,),
            )
            time.sleep(lease.remaining() + 0.2)  # the old deadline passes
            grant.start()
            time.sleep(0.5)  # the grant read the lapsed row and waits for its row lock
            assert grant.is_alive()
            renewal.commit()
        grant.join(10.0)
        assert granted == [None]  # busy: the one slot is still w1's
        (info,) = store.semaphore("renewing", 1).holders()
        assert (info.owner, info.fencing_token) == ("w1", lease.fencing_token)
        assert lease.release()


def test_server_down_is_unavailable(postgres_server: TempPostgres) -> None:
    server = TempPostgres.start()  # a server of its own, to stop (skips with the session's)
    try:
        store = open_store(server.url)
        lock = store.try_lock("down", "w1", 60.0)
        assert lock is not None
    finally:
        server.stop()
    with pytest.raises(StoreError) as caught:
        lock.renew(60.0)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    store.close()


def test_unreachable_server_is_unavailable() -> None:
    with pytest.raises(StoreError) as caught:
        open_store("postgresql://postgres@127.0.0.1:1/none?connect_timeout=2")
    assert caught.value.kind is ErrorKind.UNAVAILABLE


def test_schema_creation_is_safe_when_concurrent(postgres_url: str) -> None:
    with Processes("fork") as procs:
        children = [procs.start(open_and_lock, postgres_url, i) for i in range(8)]
        assert [child.recv(PATIENCE_S) for child in children] == ["done"] * 8
    with open_store(postgres_url) as store:
        assert store.locks() == []


def test_missing_psycopg_is_a_clear_store_error(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StoreError) as caught:
        open_store(postgres_url)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert "orbitive[postgres]" in str(caught.value)
    assert isinstance(caught.value.__cause__, ImportError)


def test_a_table_from_before_attempt_ids_is_upgraded_in_place(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orbitive_locks (name text PRIMARY KEY, owner text NOT NULL, "
            "fencing_token bigint NOT NULL, acquired_at timestamptz NOT NULL, "
            "expires_at timestamptz NOT NULL)"
        )
        conn.execute(
            "INSERT INTO orbitive_locks VALUES ('old', 'w0', 7, now(), now() + interval '1 hour')"
        )
    with open_store(postgres_url) as store:
        info = store.inspect("old")
        assert info is not None and (info.owner, info.fencing_token) == ("w0", 7)
        assert store.try_lock("old", "w1", 60.0) is None  # the old lease still holds
        assert store.force_release("old")
        lock = store.try_lock("old", "w1", 60.0)
        assert lock is not None and lock.release()


def test_a_store_opens_without_a_lock_once_its_schema_is_in_place(postgres_url: str) -> None:
    """Every worker of a fleet opens the store: with the schema in place at its version
    that is one catalog read, never DDL whose table locks wait behind the transactions
    in flight (a release holds its receipts table; CREATE INDEX IF NOT EXISTS would
    wait for it)."""
    open_store(postgres_url).close()
    with psycopg.connect(postgres_url) as holder:
        holder.execute("LOCK TABLE orbitive_semaphore_receipts IN ROW EXCLUSIVE MODE")
        holder.execute("LOCK TABLE orbitive_locks IN ROW EXCLUSIVE MODE")
        separator = "&" if "?" in postgres_url else "?"
        open_store(f"{postgres_url}{separator}timeout=10").close()  # would wait for ever


def test_a_schema_of_another_version_is_brought_up_to_this_one(postgres_url: str) -> None:
    open_store(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("COMMENT ON FUNCTION orbitive_lock_release(text, text, bigint, text) IS NULL")
        conn.execute("DROP INDEX orbitive_lock_receipts_done")
    with open_store(postgres_url) as store:
        lock = store.try_lock("a", "w0", 60.0)
        assert lock is not None and lock.release()
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT obj_description("
            "'orbitive_lock_release(text, text, bigint, text)'::regprocedure),"
            " to_regclass('orbitive_lock_receipts_done') IS NOT NULL"
        ).fetchone()
    assert row == (SCHEMA_VERSION, True)
