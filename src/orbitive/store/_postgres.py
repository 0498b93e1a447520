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
  transaction-scoped advisory lock; that is the only advisory lock used. It is
  created only when it is not in place at :data:`SCHEMA_VERSION` (one catalog
  read): the DDL's table locks would make every store open wait behind the
  transactions in flight, and hold up those that follow.
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
* Semaphores are rows of ``orbitive_semaphores``, one per held slot, keyed by
  name and slot, with the limit each was granted under. The grant function
  ``orbitive_semaphore_acquire`` first takes a transaction-scoped advisory lock
  on the name's hash (two names that collide only wait for each other), so the
  grants of one name are serialised: the count of live rows, the limit check and
  the choice of the lowest free slot see every earlier grant, and the token,
  drawn from ``orbitive_lock_fence`` under that lock, is larger than every
  earlier token of the name. Renew and release take no lock beyond their rows.
* A release of semaphore units sends ``NOTIFY orbitive_semaphore`` with the
  name as payload, delivered at commit; the engine's listening connection
  (see ``_notifications``) wakes the waiters of that name. Stores on other
  schemas of the database hear the same channel: a waiter woken by another
  store's release only attempts once more.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._core import _fork
from .._core._errors import ErrorKind, StoreError
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
from ._network import Deadline, attempt_id, gave_up, timed_out, unavailable
from ._notifications import Notifications, Subscription

if TYPE_CHECKING:
    import psycopg

    from ._postgres_wait import DeadlineConnection

_T = TypeVar("_T")

#: libpq's smallest connect timeout, in whole seconds.
CONNECT_TIMEOUT_MIN_S: Final = 2
_SCHEMA_LOCK: Final = 0x6F72_6269_7374_6F72  # "orbistor": serialises schema creation only
#: First key of the two-key advisory lock that serialises the grants of one semaphore
#: name (the second is the name's hash); the two-key space never meets the one-key one.
_SEMAPHORE_LOCK: Final = 0x6F72_6273  # "orbs"
#: The channel a release of semaphore units notifies, with the name as payload.
CHANNEL: Final = "orbitive_semaphore"
#: A listening connection that heard nothing for this long is probed, in seconds.
_LISTENER_PROBE_S: Final = 5.0
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
_UNIT_EPOCH: Final = "extract(epoch FROM s.expires_at)::float8"
_UNIT_LEFT: Final = "extract(epoch FROM s.expires_at - clock_timestamp())::float8"
_UNIT_ROW: Final = (
    f"s.slot, s.semaphore_limit, s.owner, s.fencing_token, {_UNIT_EPOCH}, {_UNIT_LEFT}"
)
# The grant of a semaphore slot as a server-side function: serialised per name by the
# advisory lock, then one read of the name's live rows (count, another limit, a retry of
# this attempt, the slots taken) and the write of the lowest free slot. Renewals do not
# take the advisory lock: one that began before a slot's deadline and commits after the
# read keeps its slot (the write replaces only a lapsed row), and the grant reads again.
_UNIT_ACQUIRE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION orbitive_semaphore_acquire(
    p_name text, p_limit integer, p_owner text, p_ttl float8, p_attempt text)
RETURNS TABLE (outcome text, unit_slot integer, unit_limit integer, holder text,
               token bigint, expires float8, remaining float8)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz;
    live integer;
    other integer;
    mine integer;
    taken integer[];
    free integer;
BEGIN
    PERFORM pg_advisory_xact_lock({_SEMAPHORE_LOCK}, hashtext(p_name));
    LOOP
        t := clock_timestamp();
        SELECT count(*), max(s.semaphore_limit) FILTER (WHERE s.semaphore_limit <> p_limit),
               min(s.slot) FILTER (WHERE s.attempt = p_attempt), array_agg(s.slot)
        INTO live, other, mine, taken
        FROM orbitive_semaphores AS s WHERE s.name = p_name AND s.expires_at > t;
        IF mine IS NOT NULL THEN  -- a retry whose first try committed
            RETURN QUERY SELECT 'granted', {_UNIT_ROW} FROM orbitive_semaphores AS s
            WHERE s.name = p_name AND s.slot = mine;
            RETURN;
        END IF;
        IF other IS NOT NULL THEN
            RETURN QUERY SELECT 'mismatch', NULL::integer, other, NULL::text, NULL::bigint,
                NULL::float8, NULL::float8;
            RETURN;
        END IF;
        IF live >= p_limit THEN
            RETURN QUERY SELECT 'busy', {_UNIT_ROW} FROM orbitive_semaphores AS s
            WHERE s.name = p_name AND s.expires_at > t ORDER BY s.expires_at LIMIT 1;
            RETURN;
        END IF;
        free := 0;
        WHILE free = ANY(taken) LOOP
            free := free + 1;
        END LOOP;
        RETURN QUERY
        INSERT INTO orbitive_semaphores AS s (name, slot, semaphore_limit, owner,
                                              fencing_token, acquired_at, expires_at, attempt)
        VALUES (p_name, free, p_limit, p_owner, nextval('orbitive_lock_fence'), t,
                t + make_interval(secs => p_ttl), p_attempt)
        ON CONFLICT (name, slot) DO UPDATE
        SET semaphore_limit = EXCLUDED.semaphore_limit, owner = EXCLUDED.owner,
            fencing_token = EXCLUDED.fencing_token, acquired_at = EXCLUDED.acquired_at,
            expires_at = EXCLUDED.expires_at, attempt = EXCLUDED.attempt
        WHERE s.expires_at <= EXCLUDED.acquired_at
        RETURNING 'granted', {_UNIT_ROW};
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END $$"""
# Release a batch of one owner's units of one name, one DELETE per unit; a receipt of the
# attempt keeps the answer for a retry (which removes nothing and reads it), and the
# name is notified when a live unit was freed.
_UNIT_RELEASE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION orbitive_semaphore_release(
    p_name text, p_owner text, p_slots integer[], p_tokens bigint[], p_attempt text)
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    done boolean[] := '{{}}';
    live boolean;
BEGIN
    FOR at IN 1 .. coalesce(array_length(p_slots, 1), 0) LOOP
        live := NULL;
        DELETE FROM orbitive_semaphores AS s
        WHERE s.name = p_name AND s.slot = p_slots[at] AND s.owner = p_owner
          AND s.fencing_token = p_tokens[at]
        RETURNING s.expires_at > clock_timestamp() INTO live;
        done := done || coalesce(live, false);
    END LOOP;
    IF true = ANY(done) THEN
        INSERT INTO orbitive_semaphore_receipts (attempt, released) VALUES (p_attempt, done);
        PERFORM pg_notify('{CHANNEL}', p_name);
        IF random() < 0.01 THEN
            DELETE FROM orbitive_semaphore_receipts
            WHERE done_at < clock_timestamp() - interval '1 hour';
        END IF;
        RETURN done;
    END IF;
    RETURN coalesce(
        (SELECT r.released FROM orbitive_semaphore_receipts AS r WHERE r.attempt = p_attempt),
        done);
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
    """CREATE TABLE IF NOT EXISTS orbitive_semaphores (
        name text NOT NULL,
        slot integer NOT NULL CHECK (slot >= 0),
        semaphore_limit integer NOT NULL CHECK (semaphore_limit > slot),
        owner text NOT NULL CHECK (owner <> ''),
        fencing_token bigint NOT NULL CHECK (fencing_token > 0),
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL CHECK (expires_at > acquired_at),
        attempt text NOT NULL,
        PRIMARY KEY (name, slot)
    )""",
    """CREATE TABLE IF NOT EXISTS orbitive_semaphore_receipts (
        attempt text PRIMARY KEY,
        released boolean[] NOT NULL,
        done_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )""",
    "CREATE INDEX IF NOT EXISTS orbitive_semaphore_receipts_done "
    "ON orbitive_semaphore_receipts (done_at)",
    _UNIT_ACQUIRE_FUNCTION,
    _UNIT_RELEASE_FUNCTION,
)
#: The schema's version, kept as the comment of every function: a schema of this
#: version in place is used as it is, with no DDL and no lock (a store opened by every
#: worker of a fleet would otherwise take each table's DDL locks, and wait behind every
#: transaction in flight on them); another one is brought up to it.
SCHEMA_VERSION: Final = "orbitive.store schema 1"
_FUNCTIONS: Final = (
    "orbitive_lock_acquire(text, text, float8, text)",
    "orbitive_lock_release(text, text, bigint, text)",
    "orbitive_semaphore_acquire(text, integer, text, float8, text)",
    "orbitive_semaphore_release(text, text, integer[], bigint[], text)",
)
_TABLES: Final = (
    "orbitive_locks",
    "orbitive_lock_receipts",
    "orbitive_semaphores",
    "orbitive_semaphore_receipts",
)
#: The schema is in place at this version in the schema it would be created in (the
#: first of the search path: a store's schema must not borrow another's tables).
_SCHEMA_CURRENT: Final = "SELECT " + " AND ".join(
    [f"to_regclass(format('%I.{table}', current_schema())) IS NOT NULL" for table in _TABLES]
    + [
        f"obj_description(to_regprocedure(format('%I.{function}', current_schema())), 'pg_proc')"
        f" IS NOT DISTINCT FROM '{SCHEMA_VERSION}'"
        for function in _FUNCTIONS
    ]
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
_UNIT_ACQUIRE: Final = (
    "SELECT * FROM orbitive_semaphore_acquire(%(name)s, %(limit)s, %(owner)s, %(ttl)s, %(attempt)s)"
)
_UNIT_RENEW: Final = f"""
UPDATE orbitive_semaphores AS s
SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
FROM unnest(%(slots)s::integer[], %(tokens)s::bigint[]) AS u(slot, token)
WHERE s.name = %(name)s AND s.slot = u.slot AND s.owner = %(owner)s
  AND s.fencing_token = u.token AND s.expires_at > clock_timestamp()
RETURNING s.slot, s.fencing_token, {_UNIT_EPOCH}"""
_UNIT_RELEASE: Final = (
    "SELECT orbitive_semaphore_release(%(name)s, %(owner)s, %(slots)s::integer[], "
    "%(tokens)s::bigint[], %(attempt)s)"
)
_UNITS_LIVE: Final = f"""
SELECT s.name, {_UNIT_ROW} FROM orbitive_semaphores AS s
WHERE s.expires_at > clock_timestamp()"""


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


class PostgresEngine(Engine[Granted, UnitGranted]):
    """Named locks and semaphores as rows of PostgreSQL tables, timed by the server's clock.

    It is also the :class:`~._notifications.Channel` of its own notifications: a
    second connection, used only by their thread, that listens on :data:`CHANNEL`.
    """

    kind = "postgres"
    poll_cap_s = 0.1

    def __init__(
        self, conninfo: str, *, timeout: float, locks: bool = True, what: str = "postgres store"
    ) -> None:
        self._pg, self._connection_class = _psycopg()
        self._conninfo = conninfo
        self._timeout = timeout
        self._reachability = Reachability(what)
        self._mutex = threading.Lock()
        self._conn: DeadlineConnection | None = None
        self._closed = False
        if locks:  # orbitive.limits opens an engine for its own tables only (locks=False)
            self._run(_ensure_schema, retry=False)
        self._listener: DeadlineConnection | None = None
        self._heard = 0.0  # time.monotonic() the listener last heard from the server
        self._notifications = Notifications(self)
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

    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> UnitGranted | Busy:
        params = {"name": name, "limit": limit, "owner": owner, "ttl": ttl, "attempt": attempt_id()}
        row = self._run(lambda conn: conn.execute(_UNIT_ACQUIRE, params).fetchone())
        return unit_outcome(name, limit, row)

    def renew_units(
        self, name: str, owner: str, grants: Sequence[UnitGranted], ttl: float
    ) -> list[UnitGranted | None]:
        params = unit_params(name, owner, grants, ttl=ttl)
        rows = self._run(lambda conn: conn.execute(_UNIT_RENEW, params).fetchall())
        return renewed_units(grants, rows)

    def release_units(self, name: str, owner: str, grants: Sequence[UnitGranted]) -> list[bool]:
        params = unit_params(name, owner, grants, attempt=attempt_id())
        row = self._run(lambda conn: conn.execute(_UNIT_RELEASE, params).fetchone())
        return released_units(grants, row)

    def holders(self, name: str) -> list[SlotInfo]:
        sql = _UNITS_LIVE + " AND s.name = %(name)s"
        return slot_infos(self._run(lambda conn: conn.execute(sql, {"name": name}).fetchall()))

    def semaphores(self) -> list[SlotInfo]:
        return slot_infos(self._run(lambda conn: conn.execute(_UNITS_LIVE).fetchall()))

    def subscribe(self, name: str) -> Subscription:
        return self._notifications.subscribe(name)

    # -- the listening connection (the Channel of the notifications' thread) -----------------

    def listen(self) -> None:
        """Connect a second connection and ``LISTEN`` on :data:`CHANNEL`, within the timeout."""
        if self._closed:
            raise StoreError("postgres store is closed", kind=ErrorKind.CLOSED)
        deadline = Deadline(self._timeout)
        seconds = max(CONNECT_TIMEOUT_MIN_S, math.ceil(self._timeout))
        conn = self._connection_class.connect(
            self._conninfo, autocommit=True, connect_timeout=seconds
        )
        self._listener = conn
        conn.deadline = deadline.at
        conn.execute(f"LISTEN {CHANNEL}")
        conn.deadline = None
        self._heard = time.monotonic()

    def receive(self, timeout: float) -> list[str]:
        """Names notified within ``timeout`` seconds; a silent connection is probed."""
        conn = self._listener
        if conn is None:
            raise StoreError("postgres store: not listening", kind=ErrorKind.UNAVAILABLE)
        names = [notify.payload for notify in conn.notifies(timeout=timeout, stop_after=1)]
        now = time.monotonic()
        if names:
            self._heard = now
        elif now - self._heard > _LISTENER_PROBE_S:  # silent network: a probe must come back
            conn.deadline = now + self._timeout
            conn.execute("SELECT 1")
            conn.deadline = None
            self._heard = time.monotonic()
        return names

    def hang_up(self) -> None:
        """Close the listening connection; idempotent."""
        conn, self._listener = self._listener, None
        if conn is not None:
            conn.close()

    # -- connection, retries, errors ----------------------------------------------------------

    def run_step(self, step: Callable[[psycopg.Connection[Any]], _T], *, retry: bool = True) -> _T:
        """Run ``step(connection)`` on this engine's connection as its own primitives run:
        within the call timeout, one transaction per statement (autocommit), a broken
        connection replaced and the step retried once while time is left. For callers
        with tables of their own on the same server (``orbitive.limits``).

        Raises:
            StoreError: ``UNAVAILABLE`` when the server cannot be reached within the
                timeout, ``DATABASE`` for any other error of the driver, ``CLOSED``
                once the engine is closed.
        """
        return self._run(step, retry=retry)

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
        listener, self._listener = self._listener, None
        self._mutex = threading.Lock()
        for inherited in (conn, listener):
            if inherited is not None and not inherited.closed:
                forget_in_child(inherited)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            self._drop()
        self._notifications.close()

    def __repr__(self) -> str:
        return "<PostgresEngine>"


def forget_in_child(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Drop a connection a forked child inherited without the parent's session noticing.

    The child's copy of the socket is pointed at ``/dev/null`` first, so the
    goodbye the close sends never reaches the server.
    """
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, conn.fileno())
    finally:
        os.close(devnull)
    conn.pgconn.finish()


def unit_outcome(name: str, limit: int, row: tuple[Any, ...] | None) -> UnitGranted | Busy:
    """What ``orbitive_semaphore_acquire`` answered, as a grant or a refusal.

    Raises:
        SemaphoreLimitMismatch: the live holders of ``name`` have another limit.
    """
    if row is None:  # busy, but its holders were released between the count and the read
        return Busy(None)
    outcome, slot, found, holder, token, expires_at, remaining = row
    if outcome == "granted":
        return UnitGranted(slot, token, expires_at)
    if outcome == "mismatch":
        raise limit_mismatch(name, limit, found)
    return Busy(SlotInfo(name, slot, found, holder, token, expires_at, remaining))


def unit_params(
    name: str, owner: str, grants: Sequence[UnitGranted], **more: object
) -> dict[str, object]:
    """The parameters of a batch statement on ``grants`` (slots and tokens as arrays)."""
    slots = [grant.slot for grant in grants]
    tokens = [grant.fencing_token for grant in grants]
    return {"name": name, "owner": owner, "slots": slots, "tokens": tokens, **more}


def renewed_units(
    grants: Sequence[UnitGranted], rows: list[tuple[Any, ...]]
) -> list[UnitGranted | None]:
    """Each grant renewed to the expiry its row came back with, or None without a row.

    A row answers the grant of its slot *and* fencing token: a host granted a slot
    again after the coordinator lost its first tenure of it (rows deleted, a failover)
    holds both grants, and only the new one is renewed.
    """
    expiries = {(slot, token): expires for slot, token, expires in rows}
    return [
        None if (found := expiries.get((grant.slot, grant.fencing_token))) is None
        else grant._replace(expires_at=found)
        for grant in grants
    ]  # fmt: skip


def released_units(grants: Sequence[UnitGranted], row: tuple[Any, ...] | None) -> list[bool]:
    """The release function's answer, one bool per grant."""
    released = None if row is None else row[0]
    return [bool(flag) for flag in released] if released else [False] * len(grants)


def slot_infos(rows: list[tuple[Any, ...]]) -> list[SlotInfo]:
    """Holder rows (name first) as snapshots, by name (UTF-8 order) and slot."""
    infos = [SlotInfo(*row) for row in rows]
    return sorted(infos, key=lambda info: (info.name.encode(), info.slot))


def _ensure_schema(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        current = conn.execute(_SCHEMA_CURRENT).fetchone()
        if current is not None and current[0]:
            return  # in place: nothing to create, no lock taken
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        for statement in _SCHEMA:
            conn.execute(statement)
        for function in _FUNCTIONS:
            conn.execute(f"COMMENT ON FUNCTION {function} IS '{SCHEMA_VERSION}'")
