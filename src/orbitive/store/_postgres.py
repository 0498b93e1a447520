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
* A retried call never changes the answer (see ``_remote``): the grant stores
  its attempt id in the row, so a retry whose first try committed finds a live
  row of its own attempt and reports it granted; release and force-release
  insert a receipt row keyed by their attempt id into ``orbitive_lock_receipts``
  in the same transaction, so a retry finds it. Receipts older than an hour are
  purged by one release in a hundred.
* Every call ends within the URL's ``?timeout=S`` (default 5 s): waits on the
  socket end at the call's deadline (``_postgres_wait``), the mutex is awaited
  only that long, and a reconnect uses the time left as ``connect_timeout``.
  libpq counts that in whole seconds and never below 2, so a call that must
  reconnect may take up to 2 s more than ``S``.
* A psycopg connection must not be used across ``fork``: a forked child points
  its copy of the socket at ``/dev/null`` before dropping it (so nothing it
  sends reaches the parent's session) and connects anew on first use.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._core import _fork
from .._core._errors import ErrorKind, StoreError
from ._engine import Busy, Engine, Granted, LockInfo
from ._health import Reachability
from ._network import Deadline, attempt_id, gave_up, timed_out, unavailable

if TYPE_CHECKING:
    import psycopg

    from ._postgres_wait import DeadlineConnection

_T = TypeVar("_T")

#: libpq's smallest connect timeout, in whole seconds.
CONNECT_TIMEOUT_MIN_S: Final = 2
_SCHEMA_LOCK: Final = 0x6F72_6269_7374_6F72  # "orbistor": serialises schema creation only
_EPOCH: Final = "extract(epoch FROM l.expires_at)::float8"
_LEFT: Final = "extract(epoch FROM l.expires_at - clock_timestamp())::float8"
# The acquire step as a server-side function: one round trip, one transaction.
# The token is drawn only after the INSERT has granted and locked the row.
_ACQUIRE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION orbitive_lock_acquire(
    p_name text, p_owner text, p_ttl float8, p_attempt text)
RETURNS TABLE (granted boolean, holder text, token bigint, expires float8, remaining float8)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    INSERT INTO orbitive_locks AS l (name, owner, fencing_token, acquired_at, expires_at, attempt)
    VALUES (p_name, p_owner, 0, t, t + make_interval(secs => p_ttl), p_attempt)
    ON CONFLICT (name) DO UPDATE
    SET owner = EXCLUDED.owner, fencing_token = 0, acquired_at = EXCLUDED.acquired_at,
        expires_at = EXCLUDED.expires_at, attempt = EXCLUDED.attempt
    WHERE l.expires_at <= EXCLUDED.acquired_at;
    IF FOUND THEN
        RETURN QUERY
        UPDATE orbitive_locks AS l SET fencing_token = nextval('orbitive_lock_fence')
        WHERE l.name = p_name
        RETURNING true, l.owner, l.fencing_token, {_EPOCH}, {_LEFT};
    ELSE
        RETURN QUERY  -- granted only to a retry of the attempt that holds it
        SELECT l.attempt = p_attempt, l.owner, l.fencing_token, {_EPOCH}, {_LEFT}
        FROM orbitive_locks AS l WHERE l.name = p_name AND l.expires_at > clock_timestamp();
    END IF;
END $$"""
# Release (p_owner and p_token given) or force-release (both NULL) in one transaction,
# leaving a receipt of the attempt when it removed a live lease; a retry that removes
# nothing reports what its receipt says.
_RELEASE_FUNCTION: Final = """
CREATE OR REPLACE FUNCTION orbitive_lock_release(
    p_name text, p_owner text, p_token bigint, p_attempt text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    live boolean;
BEGIN
    DELETE FROM orbitive_locks AS l
    WHERE l.name = p_name
      AND (p_owner IS NULL OR (l.owner = p_owner AND l.fencing_token = p_token))
    RETURNING l.expires_at > clock_timestamp() INTO live;
    IF live THEN
        INSERT INTO orbitive_lock_receipts (attempt) VALUES (p_attempt) ON CONFLICT DO NOTHING;
        IF random() < 0.01 THEN
            DELETE FROM orbitive_lock_receipts
            WHERE done_at < clock_timestamp() - interval '1 hour';
        END IF;
        RETURN true;
    END IF;
    RETURN live IS NULL
        AND EXISTS (SELECT 1 FROM orbitive_lock_receipts WHERE attempt = p_attempt);
END $$"""
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS orbitive_locks (
        name text PRIMARY KEY,
        owner text NOT NULL CHECK (owner <> ''),
        fencing_token bigint NOT NULL CHECK (fencing_token >= 0),
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL CHECK (expires_at > acquired_at)
    )""",
    "ALTER TABLE orbitive_locks ADD COLUMN IF NOT EXISTS attempt text NOT NULL DEFAULT ''",
    """CREATE TABLE IF NOT EXISTS orbitive_lock_receipts (
        attempt text PRIMARY KEY,
        done_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )""",
    "CREATE INDEX IF NOT EXISTS orbitive_lock_receipts_done ON orbitive_lock_receipts (done_at)",
    "CREATE SEQUENCE IF NOT EXISTS orbitive_lock_fence AS bigint",
    _ACQUIRE_FUNCTION,
    _RELEASE_FUNCTION,
)
_ACQUIRE: Final = "SELECT * FROM orbitive_lock_acquire(%(name)s, %(owner)s, %(ttl)s, %(attempt)s)"
_RENEW: Final = f"""
UPDATE orbitive_locks AS l SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND owner = %(owner)s AND fencing_token = %(token)s
  AND expires_at > clock_timestamp()
RETURNING {_EPOCH}"""
_RELEASE: Final = (
    "SELECT orbitive_lock_release(%(name)s, %(owner)s, %(token)s::bigint, %(attempt)s)"
)
_LIVE: Final = f"""
SELECT name, owner, fencing_token, {_EPOCH}, {_LEFT} FROM orbitive_locks AS l
WHERE expires_at > clock_timestamp()"""


def _psycopg() -> tuple[ModuleType, type[DeadlineConnection]]:
    try:
        import psycopg  # noqa: PLC0415 - optional dependency, loaded on first use

        from ._postgres_wait import DeadlineConnection  # noqa: PLC0415 - imports psycopg
    except ImportError as error:
        raise StoreError(
            "the PostgreSQL store needs psycopg 3.2 or later: pip install 'orbitive[postgres]'",
            kind=ErrorKind.UNAVAILABLE,
        ) from error
    return psycopg, DeadlineConnection


class PostgresEngine(Engine[Granted]):
    """Named locks as rows of one PostgreSQL table, timed by the server's clock."""

    kind = "postgres"
    poll_cap_s = 0.1

    def __init__(self, conninfo: str, *, timeout: float) -> None:
        self._pg, self._connection_class = _psycopg()
        self._conninfo = conninfo
        self._timeout = timeout
        self._reachability = Reachability("postgres store")
        self._mutex = threading.Lock()
        self._conn: DeadlineConnection | None = None
        self._closed = False
        self._run(_ensure_schema, retry=False)
        _fork.register(self)

    # -- the primitives ---------------------------------------------------------------------

    def acquire(self, name: str, owner: str, ttl: float) -> Granted | Busy:
        params = {"name": name, "owner": owner, "ttl": ttl, "attempt": attempt_id()}
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
        return self._release(name, owner, grant.fencing_token)

    def force_release(self, name: str) -> bool:
        return self._release(name, None, None)

    def _release(self, name: str, owner: str | None, token: int | None) -> bool:
        params = {"name": name, "owner": owner, "token": token, "attempt": attempt_id()}
        row = self._run(lambda conn: conn.execute(_RELEASE, params).fetchone())
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
        """Run one step within the call timeout; a broken connection is replaced and the
        step retried once while time is left.

        Every step is one transaction and safe to repeat: a lease belongs to no
        connection, and the grant and release recognise their own attempt.
        """
        with self._reachability:
            deadline = Deadline(self._timeout)
            if not self._mutex.acquire(timeout=max(deadline.left(), 0.0)):
                raise timed_out(self.kind, deadline)
            try:
                failure: BaseException | None = None
                for _ in deadline.attempts():
                    conn = self._connection(deadline)
                    conn.deadline = deadline.at
                    try:
                        return step(conn)
                    except self._pg.OperationalError as error:
                        self._drop()
                        failure = error
                    except self._pg.Error as error:
                        raise StoreError(
                            f"postgres store: {error}", kind=ErrorKind.DATABASE
                        ) from error
                    if not retry:
                        break
                assert failure is not None  # the loop either returned or failed at least once
                raise gave_up(self.kind, deadline, failure) from failure
            finally:
                self._mutex.release()

    def _connection(self, deadline: Deadline) -> DeadlineConnection:
        if self._closed:
            raise StoreError("postgres store is closed", kind=ErrorKind.CLOSED)
        conn = self._conn
        if conn is None or conn.closed:
            seconds = max(CONNECT_TIMEOUT_MIN_S, math.ceil(deadline.left()))
            try:
                conn = self._connection_class.connect(
                    self._conninfo, autocommit=True, connect_timeout=seconds
                )
            except self._pg.Error as error:
                raise unavailable(self.kind, error) from error
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

    def __repr__(self) -> str:
        return "<PostgresEngine>"


def _ensure_schema(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        for statement in _SCHEMA:
            conn.execute(statement)
