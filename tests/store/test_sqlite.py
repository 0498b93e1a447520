"""SQLite engine specifics: WAL, busy handling, threads, token persistence, file modes."""

from __future__ import annotations

import re
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from orbitive._core._errors import AccessDenied
from orbitive.store import ErrorKind, Store, StoreError, _sqlite, open_store


def test_database_is_in_wal_mode(sqlite_url: str, tmp_path: Path) -> None:
    open_store(sqlite_url).close()
    conn = sqlite3.connect(tmp_path / "locks.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_statements_bound_to_sequences_use_bare_placeholders() -> None:
    """The engine binds tuples, so its statements use bare ``?`` placeholders only: a sequence
    bound to numbered (``?1``) or named ones is deprecated from Python 3.12 (a warning, an
    error under this suite's ``filterwarnings``) and refused from 3.14."""
    statements = [
        value
        for name, value in vars(_sqlite).items()
        if name.lstrip("_").isupper() and isinstance(value, str) and "?" in value
    ]
    assert len(statements) >= 9  # the locks' and the semaphores' statements
    for statement in statements:
        assert "?" in statement
        assert re.search(r"\?\d|[:@$][A-Za-z_]", statement) is None, statement


def test_new_file_is_created_0600(tmp_path: Path) -> None:
    open_store(f"sqlite://{tmp_path}/new.db").close()
    assert stat.S_IMODE((tmp_path / "new.db").stat().st_mode) == 0o600


def hold_write_lock(path: Path, seconds: float) -> threading.Thread:
    """Another connection holding the database's write lock for a while."""
    started = threading.Event()

    def run() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        started.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    return thread


def test_contention_waits_instead_of_leaking_database_is_locked(
    sqlite_url: str, tmp_path: Path
) -> None:
    with open_store(sqlite_url) as store:
        thread = hold_write_lock(tmp_path / "locks.db", 0.5)
        start = time.monotonic()
        lock = store.try_lock("busy-db", "w1", 60.0)
        thread.join()
        assert lock is not None
        assert time.monotonic() - start > 0.3


def test_contention_past_the_budget_is_unavailable(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(_sqlite, "BUSY_BUDGET_S", 0.3)
    with open_store(sqlite_url) as store:
        thread = hold_write_lock(tmp_path / "locks.db", 1.5)
        try:
            with pytest.raises(StoreError) as caught:
                store.try_lock("busy-db", "w1", 60.0)
        finally:
            thread.join()
        assert caught.value.kind is ErrorKind.UNAVAILABLE
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert store.try_lock("busy-db", "w1", 60.0) is not None  # usable afterwards


def test_tokens_are_never_reused_across_releases_and_reopen(sqlite_url: str) -> None:
    tokens = []
    for _ in range(3):
        with open_store(sqlite_url) as store:
            for _ in range(3):
                lock = store.try_lock("same", "w1", 60.0)
                assert lock is not None
                tokens.append(lock.fencing_token)
                assert lock.release()
    assert tokens == list(range(tokens[0], tokens[0] + 9))


def test_threads_share_one_store_safely(sqlite_url: str) -> None:
    holders = [0]
    errors: list[BaseException] = []
    guard = threading.Lock()

    def worker(store: Store, index: int) -> None:
        try:
            for _ in range(100):
                lock = store.try_lock("shared", f"t{index}", 60.0)
                if lock is None:
                    continue
                with guard:
                    holders[0] += 1
                    assert holders[0] == 1
                with guard:
                    holders[0] -= 1
                assert lock.release()
        except BaseException as error:  # reported to the main thread
            errors.append(error)

    with open_store(sqlite_url) as store:
        threads = [threading.Thread(target=worker, args=(store, i)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert store.statistics().acquired_count > 0


def test_default_store_refuses_a_group_writable_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "orbitive").mkdir(mode=0o770)
    (tmp_path / "orbitive").chmod(0o770)
    with pytest.raises(AccessDenied):
        open_store()


def test_default_store_lives_in_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with open_store() as store:
        assert store.url == f"sqlite://{tmp_path}/orbitive/locks.db"
        assert store.try_lock("x", "w1", 1.0) is not None
    assert stat.S_IMODE((tmp_path / "orbitive" / "locks.db").stat().st_mode) == 0o600
