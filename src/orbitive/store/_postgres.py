"""PostgreSQL engine (``postgresql://...``): named locks shared by several hosts.

Facts this engine relies on:

* Leases are rows of ``orbitive_locks`` keyed by the full name, not advisory
  locks: an advisory lock belongs to one session (it dies with a recycled
  connection) and takes a 64-bit key, so hashed names can collide. A row lives
  independently of any connection; renew and release match name, owner and
  fencing token, so a new connection continues the same tenure.
* The server's ``clock_timestamp()`` is the only clock: every expiry is written
  and compared by the server, so clients on other hosts may drift freely.
  ``expires_at`` is returned as Unix epoch seconds of that clock.
* ``INSERT ... ON CONFLICT DO UPDATE ... WHERE expired`` grants atomically: a
  concurrent acquirer of the same name waits for the row lock and then sees the
  committed lease. The fencing token is drawn from the ``orbitive_lock_fence``
  sequence by a second statement of the same transaction, *after* the row is
  locked, so tokens are strictly increasing per name in commit order (drawing
  it in the INSERT itself could hand an older value to a statement that stalled
  while a faster peer acquired and released the same name). Both statements
  run in the function ``orbitive_lock_acquire``: one round trip per acquire.
* ``CREATE TABLE IF NOT EXISTS`` (and ``CREATE OR REPLACE FUNCTION``) are not
  safe against a concurrent creator, so the schema is created under a
  transaction-scoped advisory lock; that is the only advisory lock used.
* A psycopg connection must not be used across ``fork``: a forked child points
  its copy of the socket at ``/dev/null`` before dropping it (so nothing it
  sends reaches the parent's session) and connects anew on first use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .. import _fork
from .._errors import ErrorKind, StoreError
from ._engine import Busy, Engine, Granted, LockInfo

if TYPE_CHECKING:
    import psycopg

    from ._postgres_async import PostgresAsyncEngine

_T = TypeVar("_T")

#: Seconds to wait for a connection.
CONNECT_TIMEOUT_S: Final = 10
_SCHEMA_LOCK: Final = 0x6F72_6269_7374_6F72  # "orbistor": serialises schema creation only
_EPOCH: Final = "extract(epoch FROM l.expires_at)::float8"
_LEFT: Final = "extract(epoch FROM l.expires_at - clock_timestamp())::float8"
# The acquire step as a server-side function: one round trip, one transaction.
# The token is drawn only after the INSERT has granted and locked the row.
_ACQUIRE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION orbitive_lock_acquire(p_name text, p_owner text, p_ttl float8)
RETURNS TABLE (granted boolean, holder text, token bigint, expires float8, remaining float8)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    INSERT INTO orbitive_locks AS l (name, owner, fencing_token, acquired_at, expires_at)
    VALUES (p_name, p_owner, 0, t, t + make_interval(secs => p_ttl))
    ON CONFLICT (name) DO UPDATE
    SET owner = EXCLUDED.owner, fencing_token = 0,
        acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= EXCLUDED.acquired_at;
    IF FOUND THEN
        RETURN QUERY
        UPDATE orbitive_locks AS l SET fencing_token = nextval('orbitive_lock_fence')
        WHERE l.name = p_name
        RETURNING true, l.owner, l.fencing_token, {_EPOCH}, {_LEFT};
    ELSE
        RETURN QUERY
        SELECT false, l.owner, l.fencing_token, {_EPOCH}, {_LEFT}
        FROM orbitive_locks AS l WHERE l.name = p_name AND l.expires_at > clock_timestamp();
    END IF;
END $$"""
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS orbitive_locks (
        name text PRIMARY KEY,
        owner text NOT NULL CHECK (owner <> ''),
        fencing_token bigint NOT NULL CHECK (fencing_token >= 0),
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL CHECK (expires_at > acquired_at)
    )""",
    "CREATE SEQUENCE IF NOT EXISTS orbitive_lock_fence AS bigint",
    _ACQUIRE_FUNCTION,
)
_ACQUIRE: Final = "SELECT * FROM orbitive_lock_acquire(%(name)s, %(owner)s, %(ttl)s)"
_RENEW: Final = f"""
UPDATE orbitive_locks AS l SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND owner = %(owner)s AND fencing_token = %(token)s
  AND expires_at > clock_timestamp()
RETURNING {_EPOCH}"""
_RELEASE: Final = """
DELETE FROM orbitive_locks
WHERE name = %(name)s AND owner = %(owner)s AND fencing_token = %(token)s
RETURNING expires_at > clock_timestamp()"""
_FORCE: Final = """
DELETE FROM orbitive_locks WHERE name = %(name)s RETURNING expires_at > clock_timestamp()"""
_LIVE: Final = f"""
SELECT name, owner, fencing_token, {_EPOCH}, {_LEFT} FROM orbitive_locks AS l
WHERE expires_at > clock_timestamp()"""


def _psycopg() -> ModuleType:
    try:
        import psycopg  # noqa: PLC0415 - optional dependency, loaded on first use
    except ImportError as error:
        raise StoreError(
            "the PostgreSQL store needs psycopg 3: pip install 'orbitive[postgres]'",
            kind=ErrorKind.UNAVAILABLE,
        ) from error
    return psycopg


class PostgresEngine(Engine[Granted]):
    """Named locks as rows of one PostgreSQL table, timed by the server's clock."""

    kind = "postgres"
    poll_cap_s = 0.1

    def __init__(self, conninfo: str) -> None:
        self._pg = _psycopg()
        self._conninfo = conninfo
        self._mutex = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._run(_ensure_schema, retry=False)
        _fork.register(self)

    # -- the primitives ---------------------------------------------------------------------

    def acquire(self, name: str, owner: str, ttl: float) -> Granted | Busy:
        params = {"name": name, "owner": owner, "ttl": ttl}
        row = self._run(lambda conn: conn.execute(_ACQUIRE, params).fetchone())
        if row is None:
            return Busy(None)
        granted, holder, token, expires_at, remaining = row
        if granted:
            return Granted(token, expires_at)
        return Busy(LockInfo(name, holder, token, expires_at, remaining))

    def renew(self, name: str, owner: str, grant: Granted, ttl: float) -> Granted | None:
        token = grant.fencing_token
        params = {"name": name, "owner": owner, "token": token, "ttl": ttl}
        row = self._run(lambda conn: conn.execute(_RENEW, params).fetchone())
        return None if row is None else Granted(token, row[0])

    def release(self, name: str, owner: str, grant: Granted) -> bool:
        params = {"name": name, "owner": owner, "token": grant.fencing_token}
        row = self._run(lambda conn: conn.execute(_RELEASE, params).fetchone())
        return row is not None and bool(row[0])

    def force_release(self, name: str) -> bool:
        row = self._run(lambda conn: conn.execute(_FORCE, {"name": name}).fetchone())
        return row is not None and bool(row[0])

    def inspect(self, name: str) -> LockInfo | None:
        sql = _LIVE + " AND name = %(name)s"
        rows = self._run(lambda conn: conn.execute(sql, {"name": name}).fetchall())
        return LockInfo(*rows[0]) if rows else None

    def locks(self) -> list[LockInfo]:
        rows = self._run(lambda conn: conn.execute(_LIVE + " ORDER BY name").fetchall())
        return [LockInfo(*row) for row in rows]

    # -- connection, retries, errors ----------------------------------------------------------

    def _run(self, step: Callable[[psycopg.Connection[Any]], _T], *, retry: bool = True) -> _T:
        """Run one step; a connection found broken is re-established and the step retried once.

        Every step is one transaction and safe to repeat: a lease belongs to no
        connection, so a lost connection loses no lock.
        """
        with self._mutex:
            for attempt in (1, 2):
                conn = self._connection()
                try:
                    return step(conn)
                except self._pg.OperationalError as error:
                    self._drop()
                    if not retry or attempt == 2:
                        raise StoreError(
                            f"postgres store unavailable: {error}", kind=ErrorKind.UNAVAILABLE
                        ) from error
                except self._pg.Error as error:
                    raise StoreError(f"postgres store: {error}", kind=ErrorKind.DATABASE) from error
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError("postgres store is closed", kind=ErrorKind.CLOSED)
        conn = self._conn
        if conn is None or conn.closed:
            try:
                conn = self._pg.connect(
                    self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                )
            except self._pg.Error as error:
                raise StoreError(
                    f"postgres store unavailable: {error}", kind=ErrorKind.UNAVAILABLE
                ) from error
            self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _after_fork_in_child(self) -> None:
        conn, self._conn = self._conn, None
        self._mutex = threading.Lock()
        if conn is not None and not conn.closed:
            devnull = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(devnull, conn.fileno())  # the parent's session never sees our goodbye
            finally:
                os.close(devnull)
            conn.close()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            self._drop()

    def async_engine(self) -> PostgresAsyncEngine:
        """The same statements over ``psycopg.AsyncConnection`` (``_postgres_async``)."""
        from ._postgres_async import PostgresAsyncEngine  # noqa: PLC0415 - it imports this module

        return PostgresAsyncEngine(self)

    def __repr__(self) -> str:
        return "<PostgresEngine>"


def _ensure_schema(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        for statement in _SCHEMA:
            conn.execute(statement)
