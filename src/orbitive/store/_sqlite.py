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
* SQLite's unix VFS shares one mutex per database file among every connection of
  a process, the child's new ones included: a fork while another thread (the
  renewer) is inside SQLite left it held in the child, whose first step then hung.
  Every call into SQLite holds :data:`SQLITE_CALLS`, a :class:`~.._core._fork.ForkGate`,
  so a fork waits for it; SQLite's own busy wait is kept to :data:`BUSY_TIMEOUT_S`
  (the rest of the wait for a write lock is the retry loop's, outside the gate).

Invariant: a new token is ``orbitive_fence.last_token + 1``, and triggers copy
every token written back into that single row within the same statement; a
released row is deleted but the counter never goes back, so tokens strictly
increase per file, across locks and semaphores.

Semaphores are rows of ``orbitive_semaphores``, one per held slot, keyed by name
and slot; the limit each was granted under is stored with it. A grant reads the
name's live rows and writes the lowest free slot in one ``BEGIN IMMEDIATE``
transaction, so grants of every process are serialised by the write lock.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeVar

from .._core import _fork
from .._core._access import open_checked
from .._core._errors import AccessDenied, ErrorKind, InvalidStoreUrl, StoreError
from ._engine import (
    Busy,
    Engine,
    Granted,
    LockInfo,
    SlotInfo,
    UnitGranted,
    limit_mismatch,
)
from ._health import Reachability

_T = TypeVar("_T")

#: SQLite's own wait for the write lock in one attempt, in seconds: a fork in another
#: thread waits for it (see :data:`SQLITE_CALLS`); the retry loop waits the rest.
BUSY_TIMEOUT_S: Final = 0.1
#: Total time one primitive keeps retrying a busy database, in seconds.
BUSY_BUDGET_S: Final = 15.0
_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)
_NOT_A_DATABASE: Final = 26  # SQLITE_NOTADB

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
    # Invariant: the fence row follows every token written, within the same statement.
    """CREATE TRIGGER IF NOT EXISTS orbitive_fence_on_insert AFTER INSERT ON orbitive_locks
        BEGIN UPDATE orbitive_fence SET last_token = NEW.fencing_token WHERE id = 1; END""",
    """CREATE TRIGGER IF NOT EXISTS orbitive_fence_on_update
        AFTER UPDATE OF fencing_token ON orbitive_locks
        BEGIN UPDATE orbitive_fence SET last_token = NEW.fencing_token WHERE id = 1; END""",
    """CREATE TABLE IF NOT EXISTS orbitive_semaphores (
        name TEXT NOT NULL,
        slot INTEGER NOT NULL CHECK (slot >= 0),
        semaphore_limit INTEGER NOT NULL CHECK (semaphore_limit > slot),
        owner TEXT NOT NULL CHECK (owner <> ''),
        fencing_token INTEGER NOT NULL CHECK (fencing_token > 0),
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL CHECK (expires_at > acquired_at),
        PRIMARY KEY (name, slot)
    ) WITHOUT ROWID""",
    """CREATE TRIGGER IF NOT EXISTS orbitive_fence_on_unit_insert
        AFTER INSERT ON orbitive_semaphores
        BEGIN UPDATE orbitive_fence SET last_token = NEW.fencing_token WHERE id = 1; END""",
    """CREATE TRIGGER IF NOT EXISTS orbitive_fence_on_unit_update
        AFTER UPDATE OF fencing_token ON orbitive_semaphores
        BEGIN UPDATE orbitive_fence SET last_token = NEW.fencing_token WHERE id = 1; END""",
)
# One statement grants: insert, or take over an expired row, with the next token.
_GRANT: Final = """INSERT INTO orbitive_locks
    SELECT ?, ?, last_token + 1, ?, ? FROM orbitive_fence WHERE id = 1
    ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,
        fencing_token = excluded.fencing_token, acquired_at = excluded.acquired_at,
        expires_at = excluded.expires_at
    WHERE orbitive_locks.expires_at <= excluded.acquired_at
    RETURNING fencing_token"""
_HOLDER: Final = "SELECT owner, fencing_token, expires_at FROM orbitive_locks WHERE name = ?"
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
# A semaphore slot: insert, or take over a lapsed row, with the next token.
_UNIT_GRANT: Final = """INSERT INTO orbitive_semaphores
    SELECT ?, ?, ?, ?, last_token + 1, ?, ? FROM orbitive_fence WHERE id = 1
    ON CONFLICT (name, slot) DO UPDATE SET semaphore_limit = excluded.semaphore_limit,
        owner = excluded.owner, fencing_token = excluded.fencing_token,
        acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
    RETURNING fencing_token"""
_UNIT_RENEW: Final = (
    "UPDATE orbitive_semaphores SET expires_at = ? WHERE name = ? AND slot = ? "
    "AND owner = ? AND fencing_token = ? AND expires_at > ?"
)
_UNIT_RELEASE: Final = (
    "DELETE FROM orbitive_semaphores WHERE name = ? AND slot = ? AND owner = ? "
    "AND fencing_token = ? RETURNING expires_at"
)
_UNITS_LIVE: Final = (
    "SELECT name, slot, semaphore_limit, owner, fencing_token, expires_at "
    "FROM orbitive_semaphores WHERE expires_at > ?"
)

#: Connections inherited across fork: kept referenced, never closed, never used.
_abandoned: list[sqlite3.Connection] = []
#: Held by every call into SQLite of this process: ``os.fork()`` waits until none runs.
SQLITE_CALLS: Final = _fork.ForkGate()


class SqliteEngine(Engine[Granted, UnitGranted]):
    """Named locks in one SQLite file (WAL, ``BEGIN IMMEDIATE`` for every write)."""

    kind = "sqlite"
    poll_cap_s = 0.05

    def __init__(self, path: Path, *, private: bool) -> None:
        self._path = path
        self._reachability = Reachability(f"sqlite store {str(path)!r}")
        self._mutex = threading.Lock()
        self._cur: sqlite3.Cursor | None = None
        self._closed = False
        _create_file(path, private=private)
        try:
            self._run(_ensure_schema)
        except StoreError as error:
            if not _is_not_a_database(error.__cause__):
                raise
            raise InvalidStoreUrl(
                f"sqlite store {str(path)!r}: the file is not a SQLite database"
            ) from error
        _fork.register(self)

    # -- the primitives ---------------------------------------------------------------------

    def acquire(self, name: str, owner: str, ttl: float) -> Granted | Busy:
        def step(cur: sqlite3.Cursor) -> Granted | Busy:
            with _write(cur) as now:
                granted = cur.execute(_GRANT, (name, owner, now, now + ttl)).fetchall()
                if not granted:
                    row = cur.execute(_HOLDER, (name,)).fetchone()
                    if row is None:
                        return Busy(None)
                    return Busy(LockInfo(name, row[0], row[1], row[2], row[2] - now))
            return Granted(granted[0][0], now + ttl)

        return self._run(step)

    def renew(self, name: str, owner: str, grant: Granted, ttl: float) -> Granted | None:
        token = grant.fencing_token

        def step(cur: sqlite3.Cursor) -> Granted | None:
            with _write(cur) as now:
                changed = cur.execute(_RENEW, (now + ttl, name, owner, token, now)).rowcount
            return Granted(token, now + ttl) if changed == 1 else None

        return self._run(step)

    def release(self, name: str, owner: str, grant: Granted) -> bool:
        params = (name, owner, grant.fencing_token)
        return self._run(lambda cur: _delete(cur, _RELEASE, params))

    def force_release(self, name: str) -> bool:
        return self._run(lambda cur: _delete(cur, _FORCE, (name,)))

    def inspect(self, name: str) -> LockInfo | None:
        found = self._run(lambda cur: _read(cur, " WHERE name = ? AND expires_at > ?", name))
        return found[0] if found else None

    def locks(self) -> list[LockInfo]:
        return self._run(lambda cur: _read(cur, " WHERE expires_at > ? ORDER BY name"))

    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> UnitGranted | Busy:
        def step(cur: sqlite3.Cursor) -> UnitGranted | Busy:
            with _write(cur) as now:
                live = _units(cur, " AND name = ? ORDER BY slot", now, name)
                slot = _free_slot(name, limit, live)
                if type(slot) is Busy:
                    return slot
                row = cur.execute(_UNIT_GRANT, (name, slot, limit, owner, now, now + ttl))
                token = row.fetchone()[0]
            return UnitGranted(slot, token, now + ttl)

        return self._run(step)

    def renew_units(
        self, name: str, owner: str, grants: Sequence[UnitGranted], ttl: float
    ) -> list[UnitGranted | None]:
        def step(cur: sqlite3.Cursor) -> list[UnitGranted | None]:
            renewed: list[UnitGranted | None] = []
            with _write(cur) as now:
                for grant in grants:
                    params = (now + ttl, name, grant.slot, owner, grant.fencing_token, now)
                    changed = cur.execute(_UNIT_RENEW, params).rowcount == 1
                    renewed.append(grant._replace(expires_at=now + ttl) if changed else None)
            return renewed

        return self._run(step)

    def release_units(self, name: str, owner: str, grants: Sequence[UnitGranted]) -> list[bool]:
        def step(cur: sqlite3.Cursor) -> list[bool]:
            released = []
            with _write(cur) as now:
                for grant in grants:
                    params = (name, grant.slot, owner, grant.fencing_token)
                    rows = cur.execute(_UNIT_RELEASE, params).fetchall()
                    released.append(bool(rows) and rows[0][0] > now)
            return released

        return self._run(step)

    def holders(self, name: str) -> list[SlotInfo]:
        return self._run(lambda cur: _units(cur, " AND name = ? ORDER BY slot", time.time(), name))

    def semaphores(self) -> list[SlotInfo]:
        return self._run(lambda cur: _units(cur, " ORDER BY name, slot", time.time()))

    # -- connection, retries, errors ----------------------------------------------------------

    def _run(self, step: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Run one transaction step, retrying a busy database within the budget."""
        with self._reachability, self._mutex:
            deadline = 0.0
            while True:
                try:
                    with SQLITE_CALLS.call():
                        return step(self._cursor())
                except sqlite3.Error as error:  # connecting too: "file is not a database"
                    with SQLITE_CALLS.call():
                        _rollback(self._cur)
                    deadline = deadline or time.monotonic() + BUSY_BUDGET_S
                    self._check_retry(error, deadline)
                time.sleep(random.uniform(0.001, 0.005))

    def _check_retry(self, error: sqlite3.Error, deadline: float) -> None:
        """Return if a failed step may be retried; else raise the StoreError for it."""
        where = f"sqlite store {str(self._path)!r}"
        if not _is_busy(error):
            raise StoreError(f"{where}: {error}", kind=ErrorKind.DATABASE) from error
        if time.monotonic() >= deadline:
            raise StoreError(
                f"{where} stayed busy for {BUSY_BUDGET_S:g} s", kind=ErrorKind.UNAVAILABLE
            ) from error

    def _cursor(self) -> sqlite3.Cursor:
        if self._cur is None:
            if self._closed:
                raise StoreError(
                    f"sqlite store {str(self._path)!r} is closed", kind=ErrorKind.CLOSED
                )
            self._cur = _connect(self._path).cursor()
        return self._cur

    def _after_fork_in_child(self) -> None:
        if self._cur is not None:
            _abandoned.append(self._cur.connection)
        self._cur = None
        self._mutex = threading.Lock()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            cur, self._cur = self._cur, None
        if cur is not None:
            with SQLITE_CALLS.call():
                cur.connection.close()

    def __repr__(self) -> str:
        return f"<SqliteEngine {str(self._path)!r}>"


class _write:  # noqa: N801 - used like a function: ``with _write(cur) as now``
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error); yields the time."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    def __enter__(self) -> float:
        self._cur.execute("BEGIN IMMEDIATE")
        return time.time()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._cur.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _delete(cur: sqlite3.Cursor, sql: str, params: tuple[object, ...]) -> bool:
    with _write(cur) as now:
        rows = cur.execute(sql, params).fetchall()
    return bool(rows) and rows[0][0] > now


def _read(cur: sqlite3.Cursor, where: str, *params: object) -> list[LockInfo]:
    now = time.time()
    rows = cur.execute(_LIVE + where, (*params, now)).fetchall()
    return [LockInfo(name, owner, token, exp, exp - now) for name, owner, token, exp in rows]


def _units(cur: sqlite3.Cursor, where: str, now: float, *params: object) -> list[SlotInfo]:
    """The live semaphore holders the ``where`` clause picks (``now`` is time.time())."""
    rows = cur.execute(_UNITS_LIVE + where, (now, *params)).fetchall()
    return [
        SlotInfo(name, slot, limit, owner, token, exp, exp - now)
        for name, slot, limit, owner, token, exp in rows
    ]


def _free_slot(name: str, limit: int, live: list[SlotInfo]) -> int | Busy:
    """The lowest slot no live holder has, or Busy with the holder that ends first.

    Raises:
        SemaphoreLimitMismatch: a live holder was granted under another limit.
    """
    for holder in live:
        if holder.limit != limit:
            raise limit_mismatch(name, limit, holder.limit)
    if len(live) >= limit:
        return Busy(min(live, key=lambda holder: holder.expires_at))
    taken = {holder.slot for holder in live}
    return next(slot for slot in range(limit) if slot not in taken)


def _ensure_schema(cur: sqlite3.Cursor) -> None:
    with _write(cur):
        for statement in _SCHEMA:
            cur.execute(statement)


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


def _rollback(cur: sqlite3.Cursor | None) -> None:
    if cur is not None and cur.connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            cur.execute("ROLLBACK")


def _is_not_a_database(error: BaseException | None) -> bool:
    if not isinstance(error, sqlite3.DatabaseError):
        return False
    code: int | None = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) == _NOT_A_DATABASE
    return "not a database" in str(error).lower()  # Python 3.10 has no sqlite_errorcode


def _is_busy(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    text = str(error).lower()  # Python 3.10 has no sqlite_errorcode
    return "locked" in text or "busy" in text
