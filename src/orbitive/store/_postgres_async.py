"""The PostgreSQL engine's asyncio form: the same statements over ``psycopg.AsyncConnection``.

The SQL, the schema and the server-side acquire function are the sync engine's
(:mod:`._postgres`, imported, not copied); the schema exists already, since the
sync engine created it when the store was opened. So the two forms agree on
every rule by construction, and a lock taken by one is renewed by the other.

Facts this form relies on:

* An ``AsyncConnection`` serialises the statements of the tasks that share it,
  and waits through the loop that runs the statement. Each event loop gets its
  own connection (loops of other threads, or a later ``asyncio.run``); one whose
  loop has closed is closed when the next connection is made.
* A statement is never cancelled half-way by a cancelled task: the helpers run
  it to completion (:func:`._engine_async.run_to_completion`), since the server
  may commit it anyway, and act on its result.
* Errors and time map as in the sync engine: every call ends within the store's
  ``?timeout=`` (a statement still waiting then is abandoned with its
  connection); a broken or abandoned connection is re-established and the
  statement retried while time is left (``StoreError(UNAVAILABLE)`` after
  that), and a grant or release carries an attempt id, so a retry recognises
  its own committed work; any other database error is ``StoreError(DATABASE)``.
* After ``fork`` the child points its copies of the sockets at ``/dev/null``
  before dropping them, as the sync engine does.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._core import _fork
from .._core._errors import ErrorKind, StoreError
from ._engine import Busy, Granted, LockInfo, UnitGranted
from ._engine_async import AsyncEngine
from ._network import Deadline, attempt_id, gave_up, timed_out
from ._postgres import (
    _ACQUIRE,
    _RELEASE,
    _RENEW,
    _UNIT_ACQUIRE,
    _UNIT_RELEASE,
    _UNIT_RENEW,
    CONNECT_TIMEOUT_MIN_S,
    PostgresEngine,
    forget_in_child,
    released_units,
    renewed_units,
    unit_outcome,
    unit_params,
)
from ._postgres_wait import AsyncDeadlineConnection

if TYPE_CHECKING:
    import psycopg

_Loop = asyncio.AbstractEventLoop


class PostgresAsyncEngine(AsyncEngine[Granted, UnitGranted]):
    """Named locks and semaphores as rows of PostgreSQL tables, through
    ``psycopg.AsyncConnection`` (waiters hear releases through the sync engine's
    listening connection)."""

    def __init__(self, engine: PostgresEngine) -> None:
        super().__init__(engine)
        self._pg = engine._pg
        self._conninfo = engine._conninfo
        self._timeout = engine._timeout
        self._reachability = engine._reachability  # one server: its sync form's state
        self._mutex = threading.Lock()  # guards the map of connections, never awaited
        self._connections: dict[_Loop, AsyncDeadlineConnection] = {}
        self._closed = False
        _fork.register(self)

    async def acquire(self, name: str, owner: str, ttl: float) -> Granted | Busy:
        params = {"name": name, "owner": owner, "ttl": ttl, "attempt": attempt_id()}
        row = await self._fetch(_ACQUIRE, params)
        if row is None:
            return Busy(None)
        granted, holder, token, expires_at, remaining = row
        if granted:
            return Granted(token, expires_at)
        return Busy(LockInfo(name, holder, token, expires_at, remaining))

    async def renew(self, name: str, owner: str, grant: Granted, ttl: float) -> Granted | None:
        token = grant.fencing_token
        params = {"name": name, "owner": owner, "token": token, "ttl": ttl}
        row = await self._fetch(_RENEW, params)
        return None if row is None else Granted(token, row[0])

    async def release(self, name: str, owner: str, grant: Granted) -> bool:
        params = {
            "name": name,
            "owner": owner,
            "token": grant.fencing_token,
            "attempt": attempt_id(),
        }
        row = await self._fetch(_RELEASE, params)
        return row is not None and bool(row[0])

    async def acquire_unit(
        self, name: str, limit: int, owner: str, ttl: float
    ) -> UnitGranted | Busy:
        params = {"name": name, "limit": limit, "owner": owner, "ttl": ttl, "attempt": attempt_id()}
        return unit_outcome(name, limit, await self._fetch(_UNIT_ACQUIRE, params))

    async def renew_units(
        self, name: str, owner: str, grants: Sequence[UnitGranted], ttl: float
    ) -> list[UnitGranted | None]:
        rows = await self._rows(_UNIT_RENEW, unit_params(name, owner, grants, ttl=ttl))
        return renewed_units(grants, rows)

    async def release_units(
        self, name: str, owner: str, grants: Sequence[UnitGranted]
    ) -> list[bool]:
        params = unit_params(name, owner, grants, attempt=attempt_id())
        return released_units(grants, await self._fetch(_UNIT_RELEASE, params))

    async def rows(self, sql: str, params: dict[str, object] | None) -> list[tuple[Any, ...]]:
        """One statement and its rows, as this form's own primitives run it: within the
        call timeout, a broken connection replaced and the statement retried while time
        is left. For callers with tables of their own on the same server
        (``orbitive.limits``); ``params`` None sends ``sql`` as it is (no placeholders).

        Raises:
            StoreError: ``UNAVAILABLE`` when the server cannot be reached within the
                timeout, ``DATABASE`` for any other error of the driver, ``CLOSED``
                once the form is closed.
        """
        return await self._rows(sql, params)

    async def _fetch(self, sql: str, params: dict[str, object]) -> tuple[Any, ...] | None:
        """The first row of :meth:`_rows`, or None."""
        rows = await self._rows(sql, params)
        return rows[0] if rows else None

    async def _rows(self, sql: str, params: dict[str, object] | None) -> list[tuple[Any, ...]]:
        """One statement, its rows, within the call timeout; a broken connection is
        replaced and the statement retried while time is left (it is safe to repeat)."""
        with self._reachability:
            deadline = Deadline(self._timeout)
            failure: BaseException | None = None
            for _ in deadline.attempts():
                try:
                    conn = await self._connection(deadline)
                except StoreError as error:  # no connection this attempt: the next one may make it
                    if error.kind is not ErrorKind.UNAVAILABLE:
                        raise
                    failure = error.__cause__ or error  # the driver's reason, wrapped once below
                    continue
                conn.deadline = deadline.at
                try:
                    return await self._execute(conn, sql, params)
                except self._pg.OperationalError as error:  # also the wait's timeout
                    self._drop(conn)
                    failure = error
                except self._pg.Error as error:
                    raise StoreError(f"postgres store: {error}", kind=ErrorKind.DATABASE) from error
            assert failure is not None  # the loop either returned or failed at least once
            raise gave_up("postgres", deadline, failure) from failure

    @staticmethod
    async def _execute(
        conn: AsyncDeadlineConnection, sql: str, params: dict[str, object] | None
    ) -> list[tuple[Any, ...]]:
        cursor = await conn.execute(sql, params)
        return [] if cursor.description is None else await cursor.fetchall()  # no result: none

    async def _connection(self, deadline: Deadline) -> AsyncDeadlineConnection:
        if self._closed:
            raise StoreError("postgres store is closed", kind=ErrorKind.CLOSED)
        loop = asyncio.get_running_loop()
        conn = self._connections.get(loop)
        if conn is not None and not conn.closed:
            return conn
        seconds = max(CONNECT_TIMEOUT_MIN_S, math.ceil(deadline.left()))
        try:
            fresh: AsyncDeadlineConnection = await asyncio.wait_for(
                AsyncDeadlineConnection.connect(
                    self._conninfo, autocommit=True, connect_timeout=seconds
                ),
                max(deadline.left(), 0.0) + CONNECT_TIMEOUT_MIN_S,
            )
        except asyncio.TimeoutError:
            raise timed_out("postgres", deadline) from None
        except self._pg.Error as error:
            raise StoreError(
                f"postgres store unavailable: {error}", kind=ErrorKind.UNAVAILABLE
            ) from error
        with self._mutex:
            kept = self._connections.get(loop)
            if kept is None or kept.closed or self._closed:
                kept = self._connections[loop] = fresh
            stale = [loop for loop in self._connections if loop.is_closed()]
            finished = [self._connections.pop(loop) for loop in stale]
        if kept is not fresh:  # another task of this loop connected first
            finished.append(fresh)
        for old in finished:
            old.pgconn.finish()
        return kept

    def _drop(self, conn: psycopg.AsyncConnection[Any]) -> None:
        with self._mutex:
            for loop, found in list(self._connections.items()):
                if found is conn:
                    del self._connections[loop]
        conn.pgconn.finish()

    def close(self) -> None:
        """Close every connection of this form (a statement in flight fails)."""
        with self._mutex:
            self._closed = True
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.pgconn.finish()  # what AsyncConnection.close() does, callable without a loop

    def _after_fork_in_child(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        self._mutex = threading.Lock()
        for conn in connections:
            if not conn.closed:
                forget_in_child(conn)

    def __repr__(self) -> str:
        return "<PostgresAsyncEngine>"
