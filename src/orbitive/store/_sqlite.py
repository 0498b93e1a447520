"""SQLite engine: the embedded default store, one file shared by processes on one host.

Facts this engine relies on:

* In WAL mode readers never block the writer and vice versa; writers are serialised
  by the database's write lock. ``BEGIN IMMEDIATE`` takes that lock at the start of
  every write transaction, so a transaction never has to upgrade a read lock
  (the upgrade is what fails with ``SQLITE_BUSY`` without consulting the busy
  handler). ``synchronous=NORMAL`` in WAL mode keeps the database consistent after
  a crash and skips the fsync per commit (a power cut may drop the last commits;
  leases are short-lived and lapse anyway).
* The busy timeout makes SQLite wait for the write lock; if it still reports busy
  the step is retried within :data:`BUSY_BUDGET_S` and then mapped to
  ``StoreError(kind=UNAVAILABLE)``, so ``sqlite3.OperationalError`` never escapes.
* Times are Unix epoch seconds of this host's clock (``time.time()``), read after
  the write lock is taken, so their order follows the order of transactions.
* A connection must not be used across ``fork``. A forked child abandons its
  inherited connection without closing it (closing could touch the parent's
  WAL state) and opens its own on first use.

Invariant: fencing tokens come from the single-row ``orbitive_fence`` counter,
incremented in the same transaction that writes the lease; a released row is
deleted but the counter never goes back, so tokens strictly increase per file.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from .. import _fork
from .._access import open_checked
from .._errors import AccessDenied, ErrorKind, StoreError
from ._base import Busy, Engine, Granted, LockInfo

_T = TypeVar("_T")

#: SQLite's own wait for the write lock, in seconds.
BUSY_TIMEOUT_S: Final = 5.0
#: Total time one primitive keeps retrying a busy database, in seconds.
BUSY_BUDGET_S: Final = 15.0
_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS orbitive_locks (
        name TEXT PRIMARY KEY NOT NULL,
        owner TEXT NOT NULL CHECK (owner <> ''),
        fencing_token INTEGER NOT NULL CHECK (fencing_token > 0),
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL CHECK (expires_at > acquired_at)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS orbitive_fence (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        last_token INTEGER NOT NULL
    )""",
    "INSERT OR IGNORE INTO orbitive_fence (id, last_token) VALUES (1, 0)",
)
_HOLDER: Final = "SELECT owner, fencing_token, expires_at FROM orbitive_locks WHERE name = ?"
_NEXT_TOKEN: Final = "UPDATE orbitive_fence SET last_token = last_token + 1 RETURNING last_token"
_WRITE: Final = "INSERT OR REPLACE INTO orbitive_locks VALUES (?, ?, ?, ?, ?)"
_RENEW: Final = (
    "UPDATE orbitive_locks SET expires_at = ? "
    "WHERE name = ? AND owner = ? AND fencing_token = ? AND expires_at > ?"
)
_RELEASE: Final = (
    "DELETE FROM orbitive_locks WHERE name = ? AND owner = ? AND fencing_token = ? "
    "RETURNING expires_at"
)
_FORCE: Final = "DELETE FROM orbitive_locks WHERE name = ? RETURNING expires_at"
_LIVE: Final = "SELECT name, owner, fencing_token, expires_at FROM orbitive_locks"

#: Connections inherited across fork: kept referenced, never closed, never used.
_abandoned: list[sqlite3.Connection] = []


class SqliteEngine(Engine):
    """Named locks in one SQLite file (WAL, ``BEGIN IMMEDIATE`` for every write)."""

    kind = "sqlite"
    poll_cap_s = 0.05

    def __init__(self, path: Path, *, private: bool) -> None:
        self._path = path
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        _create_file(path, private=private)
        self._run(_ensure_schema)
        _fork.register(self)

    # -- the primitives ---------------------------------------------------------------------

    def acquire(self, name: str, owner: str, ttl: float) -> Granted | Busy:
        def step(conn: sqlite3.Connection) -> Granted | Busy:
            with _write(conn) as now:
                row = conn.execute(_HOLDER, (name,)).fetchone()
                if row is not None and row[2] > now:
                    return Busy(LockInfo(name, row[0], row[1], row[2], row[2] - now))
                token = conn.execute(_NEXT_TOKEN).fetchone()[0]
                conn.execute(_WRITE, (name, owner, token, now, now + ttl))
            return Granted(LockInfo(name, owner, token, now + ttl, ttl))

        return self._run(step)

    def renew(self, tenure: Granted, ttl: float) -> Granted | None:
        info = tenure.info

        def step(conn: sqlite3.Connection) -> Granted | None:
            with _write(conn) as now:
                params = (now + ttl, info.name, info.owner, info.fencing_token, now)
                changed = conn.execute(_RENEW, params).rowcount
            if changed != 1:
                return None
            return Granted(LockInfo(info.name, info.owner, info.fencing_token, now + ttl, ttl))

        return self._run(step)

    def release(self, tenure: Granted) -> bool:
        info = tenure.info
        params = (info.name, info.owner, info.fencing_token)
        return self._run(lambda conn: _delete(conn, _RELEASE, params))

    def force_release(self, name: str) -> bool:
        return self._run(lambda conn: _delete(conn, _FORCE, (name,)))

    def inspect(self, name: str) -> LockInfo | None:
        found = self._run(lambda conn: _read(conn, " WHERE name = ? AND expires_at > ?", name))
        return found[0] if found else None

    def locks(self) -> list[LockInfo]:
        return self._run(lambda conn: _read(conn, " WHERE expires_at > ? ORDER BY name"))

    # -- connection, retries, errors ----------------------------------------------------------

    def _run(self, step: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run one transaction step, retrying a busy database within the budget."""
        deadline = time.monotonic() + BUSY_BUDGET_S
        with self._mutex:
            while True:
                conn = self._connection()
                try:
                    return step(conn)
                except sqlite3.Error as error:
                    _rollback(conn)
                    if not _is_busy(error):
                        raise StoreError(
                            f"sqlite store {str(self._path)!r}: {error}", kind=ErrorKind.DATABASE
                        ) from error
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            f"sqlite store {str(self._path)!r} stayed busy for {BUSY_BUDGET_S:g} s",
                            kind=ErrorKind.UNAVAILABLE,
                        ) from error
                time.sleep(random.uniform(0.001, 0.005))

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"sqlite store {str(self._path)!r} is closed", kind=ErrorKind.CLOSED)
        if self._conn is None:
            self._conn = _connect(self._path)
        return self._conn

    def _after_fork_in_child(self) -> None:
        if self._conn is not None:
            _abandoned.append(self._conn)
        self._conn = None
        self._mutex = threading.Lock()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __repr__(self) -> str:
        return f"<SqliteEngine {str(self._path)!r}>"


class _write:  # noqa: N801 - used like a function: ``with _write(conn) as now``
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error); yields the time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> float:
        self._conn.execute("BEGIN IMMEDIATE")
        return time.time()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _delete(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> bool:
    with _write(conn) as now:
        rows = conn.execute(sql, params).fetchall()
    return bool(rows) and rows[0][0] > now


def _read(conn: sqlite3.Connection, where: str, *params: object) -> list[LockInfo]:
    now = time.time()
    rows = conn.execute(_LIVE + where, (*params, now)).fetchall()
    return [LockInfo(name, owner, token, exp, exp - now) for name, owner, token, exp in rows]


def _ensure_schema(conn: sqlite3.Connection) -> None:
    with _write(conn):
        for statement in _SCHEMA:
            conn.execute(statement)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _create_file(path: Path, *, private: bool) -> None:
    """Create the database file 0600 when missing; the default file must be ours."""
    try:
        if private:
            os.close(open_checked(path, create=True))
        else:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except AccessDenied:
        raise
    except OSError as error:
        raise StoreError(
            f"sqlite store {str(path)!r} cannot be opened: {error}", kind=ErrorKind.UNAVAILABLE
        ) from error


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _is_busy(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    text = str(error).lower()  # Python 3.10 has no sqlite_errorcode
    return "locked" in text or "busy" in text
