"""psycopg 3 over :class:`~orbitive.clients.ClientPool`: a pool capped host-wide.

Follows psycopg_pool's conventions (``with pool.connection() as conn`` yields
a real :class:`psycopg.Connection`, commits on a clean exit and rolls back on
an exception; ``getconn``/``putconn``; ``check``, ``reset`` and ``configure``
callbacks; ``PoolTimeout``, ``PoolClosed``, ``TooManyRequests``), but
``max_live``, ``min_idle`` and ``max_idle`` count every process of the fleet:

    from orbitive import Fleet
    from orbitive.clients import PoolOptions
    from orbitive.clients.psycopg import ConnectionPool

    pool = ConnectionPool("postgresql://app@db/main", fleet=Fleet.join("web", 16),
                          options=PoolOptions(max_live=10, max_idle=4))
    with pool.connection() as conn:
        conn.execute("SELECT 1")

On checkout a connection is checked (``check_connection``: an empty query,
one round trip) unless ``check=None``. On return a transaction left open or
failed is rolled back, a connection in an unknown state (a query still
running, a broken socket) or a closed one is discarded, then ``reset(conn)``
runs; a connection ``reset`` leaves in a transaction is discarded too.

Needs the ``postgres`` extra (psycopg); imported only when this module is.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final, cast

import psycopg
from psycopg import pq

from .._core._errors import InvalidPoolOptions, shown
from .._core._fleet import Fleet
from ..pool import POOL_KIND, Key
from ._budget import Budget
from ._client_pool import ClientPool
from ._options import PoolOptions
from ._statistics import ClientPoolStatistics

__all__ = ["AsyncConnectionPool", "ConnectionPool"]

_IDLE: Final = pq.TransactionStatus.IDLE
_OPEN: Final = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
#: Longest wait, in seconds, for the server to end a closed connection's session.
CLOSE_WAIT_S: Final = 2.0


#: Arguments of ``psycopg.Connection.connect`` that shape only this process's side of a
#: connection, not the server or the session: not part of the key (a row factory's
#: repr even holds an address, other in every process).
CLIENT_SIDE: Final = frozenset(
    {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}
)


def connection_key(conninfo: str, kwargs: dict[str, Any]) -> Key:
    """The pool key of a connection target: conninfo and connection parameters.

    The same for :class:`ConnectionPool` and :class:`AsyncConnectionPool`, and
    whatever :data:`CLIENT_SIDE` arguments they add: one database is one budget,
    whichever API opens it (a fleet of sync and asyncio workers shares
    ``max_live``). Each pool still checks out only connections it made itself.

    Raises:
        InvalidPoolOptions: ``conninfo`` is not a str, or has a NUL or no UTF-8 form
            (a lone surrogate); ``kwargs`` is not a dict of str names, or a
            connection parameter (any name but :data:`CLIENT_SIDE`'s) is not a str
            (UTF-8, no NUL), an int of at most 64 bits, a float or None.
    """
    conninfo = _text(conninfo, "conninfo", "conninfo")
    if not isinstance(kwargs, dict):
        raise InvalidPoolOptions(f"kwargs must be a dict, got {shown(kwargs)}", key="kwargs")
    parts = []
    for name, value in kwargs.items():
        if _text(name, "a kwargs name", "kwargs") not in CLIENT_SIDE:
            parts.append((name, _parameter(name, value)))
    return Key.digest(f"psycopg\0{conninfo}\0{sorted(parts)!r}".encode())


def _parameter(name: str, value: object) -> str:
    """A connection parameter's value as the key spells it.

    Raises:
        InvalidPoolOptions: not a str (UTF-8, no NUL), an int of at most 64 bits, a
            float or None.
    """
    if issubclass(type(value), str):
        return repr(_text(value, f"kwargs[{name!r}]", "kwargs"))
    if value is None or type(value) in (float, bool):
        return repr(value)
    if type(value) is int and value.bit_length() <= 64:
        return repr(value)
    raise InvalidPoolOptions(
        f"kwargs[{name!r}] is a connection parameter: a str, a 64-bit int, a float or "
        f"None, got {shown(value)}",
        key="kwargs",
    )


def _text(value: object, what: str, key: str) -> str:
    """``value`` as the exact text libpq gets (a str subclass's own methods not called).

    Raises:
        InvalidPoolOptions: not a str, a NUL, or no UTF-8 form (a lone surrogate),
            naming ``what``; its ``key`` is ``key``.
    """
    if not issubclass(type(value), str):  # type(), not isinstance: __class__ may lie
        raise InvalidPoolOptions(f"{what} must be a str, got {shown(value)}", key=key)
    text = str.__str__(cast(str, value))
    if "\x00" in text:
        raise InvalidPoolOptions(f"{what} has a NUL character", key=key)
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidPoolOptions(f"{what} has no UTF-8 form (a lone surrogate)", key=key) from None
    return text


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """psycopg_pool's check: an empty query outside any transaction; raises if broken."""
    if conn.autocommit:
        conn.execute("")
        return
    conn.autocommit = True
    try:
        conn.execute("")
    finally:
        conn.autocommit = False


async def check_connection_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """Asyncio twin of :func:`check_connection`."""
    if conn.autocommit:
        await conn.execute("")
        return
    await conn.set_autocommit(True)
    try:
        await conn.execute("")
    finally:
        await conn.set_autocommit(False)


def _status(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int:
    """The libpq transaction status as an int (``conn.info`` builds an enum per read)."""
    return conn.pgconn.transaction_status


def _returnable(status: int) -> bool:
    """False for a connection in an unknown state (discard it): a query still running,
    a broken socket, or closed (``UNKNOWN``)."""
    return status in (_IDLE, *_OPEN)


class _Base:
    """What both pools share: options, key, the ClientPool and its inspection."""

    _clients: ClientPool[Any]

    def _build(
        self,
        fleet: Fleet,
        key: object,
        create: Callable[[], Any],
        close: Callable[[Any], Any],
        check: Callable[[Any], Any] | None,
        reset: Callable[[Any], Any],
        options: PoolOptions | None,
        kind: int,
        budget: Budget | None,
    ) -> None:
        self._clients = ClientPool(
            fleet, key, create, close, check=check, reset=reset, options=options, kind=kind,
            budget=budget, sever=sever_connection,
        )  # fmt: skip

    @property
    def clients(self) -> ClientPool[Any]:
        """The underlying :class:`~orbitive.clients.ClientPool`."""
        return self._clients

    @property
    def options(self) -> PoolOptions:
        """The pool's options."""
        return self._clients.options

    def statistics(self) -> ClientPoolStatistics:
        """As :meth:`ClientPool.statistics`."""
        return self._clients.statistics()

    def get_stats(self) -> dict[str, int]:
        """psycopg_pool's spelling: :meth:`statistics` as a dict."""
        return self.statistics().as_dict()


class ConnectionPool(_Base):
    """A psycopg connection pool whose limits hold across the fleet's processes.

    Args:
        conninfo: the libpq connection string or URL.
        fleet: this process's joined fleet.
        kwargs: more arguments for ``psycopg.Connection.connect`` (for example
            ``{"application_name": "web"}``); its connection parameters (all but
            :data:`CLIENT_SIDE`) are part of the key, which an
            :class:`AsyncConnectionPool` of the same conninfo and parameters
            shares (one budget).
        options: host-wide sizes and timeouts (:class:`PoolOptions`).
        configure: called with each new connection before first use.
        check: called on checkout (default :func:`check_connection`; None skips).
        reset: called with each returned connection, after the rollback.
        key: overrides the key derived from conninfo and kwargs.
        kind: the pool table's SHM kind number.
        budget: a :class:`~orbitive.clients.Budget` shared with other hosts: the
            pools of every host that name it hold at most its ``total``
            connections between them (the key is then the budget's). A
            connection in use when the host's units may lapse is severed
            (:func:`sever_connection`): its statement fails, and it is discarded
            when handed back.

    Raises:
        InvalidPoolOptions: bad options, and as :class:`~orbitive.clients.ClientPool`.
        InvalidBudget, BudgetMismatch, BudgetUnavailable, UnsafeCoordinator: as
            :class:`~orbitive.clients.ClientPool`.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        fleet: Fleet,
        kwargs: dict[str, Any] | None = None,
        options: PoolOptions | None = None,
        configure: Callable[[psycopg.Connection[Any]], None] | None = None,
        check: Callable[[psycopg.Connection[Any]], None] | None = check_connection,
        reset: Callable[[psycopg.Connection[Any]], None] | None = None,
        key: object = None,
        kind: int = POOL_KIND,
        budget: Budget | None = None,
    ) -> None:
        kwargs = {} if kwargs is None else kwargs
        derived = connection_key(conninfo, kwargs) if key is None else key
        self.conninfo, self.kwargs = conninfo, dict(kwargs)
        self._configure, self._reset_hook = configure, reset
        self._build(
            fleet, derived, self._connect, _close, check, self._reset, options, kind, budget
        )

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.Connection.connect(self.conninfo, **self.kwargs)
        if self._configure is not None:
            try:
                self._configure(conn)
                if conn.info.transaction_status in _OPEN:
                    conn.rollback()
            except BaseException:
                conn.close()
                raise
        return conn

    def _reset(self, conn: psycopg.Connection[Any]) -> None:
        status = _status(conn)
        if not _returnable(status):
            raise psycopg.InterfaceError("connection closed or in an unknown state")
        if status in _OPEN:
            conn.rollback()
        if self._reset_hook is not None:
            self._reset_hook(conn)
            if conn.info.transaction_status != _IDLE:
                raise psycopg.ProgrammingError("reset() left the connection in a transaction")

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """``with pool.connection() as conn``: commit on a clean exit, roll back on error.

        Args:
            timeout: seconds to wait for a connection; None: ``acquire_timeout``.

        Raises:
            PoolTimeout, PoolClosed, TooManyRequests, InvalidPoolOptions: as
                :meth:`~orbitive.clients.ClientPool.getconn`.
            ClientCreateError: the connect failed (its error is the ``__cause__``).
        """
        conn = self.getconn(timeout)
        try:
            yield conn
            if _status(conn) == pq.TransactionStatus.INTRANS:
                conn.commit()
        finally:
            self.putconn(conn)

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """Check a connection out (give it back with :meth:`putconn`); raises as connection()."""
        conn: psycopg.Connection[Any] = self._clients.getconn(timeout)
        return conn

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        """Hand a connection back: rolled back, reset, kept idle or closed.

        Raises:
            UnknownClient: not checked out of this pool.
        """
        self._clients.putconn(conn)

    def close(self) -> None:
        """Close the idle connections of this process and stop using the pool. Idempotent."""
        self._clients.close()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncConnectionPool(_Base):
    """Asyncio twin of :class:`ConnectionPool` over :class:`psycopg.AsyncConnection`.

    ``configure``, ``check`` and ``reset`` are coroutine functions here. Every
    wait happens on the event loop; nothing blocks it.

    Raises:
        InvalidPoolOptions, InvalidBudget, BudgetMismatch, BudgetUnavailable,
            UnsafeCoordinator: as :class:`ConnectionPool`.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        fleet: Fleet,
        kwargs: dict[str, Any] | None = None,
        options: PoolOptions | None = None,
        configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
        check: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
        | None = check_connection_async,
        reset: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
        key: object = None,
        kind: int = POOL_KIND,
        budget: Budget | None = None,
    ) -> None:
        kwargs = {} if kwargs is None else kwargs
        derived = connection_key(conninfo, kwargs) if key is None else key
        self.conninfo, self.kwargs = conninfo, dict(kwargs)
        self._configure, self._reset_hook = configure, reset
        self._build(
            fleet, derived, self._connect, _close_async, check, self._reset, options, kind, budget
        )

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.kwargs)
        if self._configure is not None:
            try:
                await self._configure(conn)
                if conn.info.transaction_status in _OPEN:
                    await conn.rollback()
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _reset(self, conn: psycopg.AsyncConnection[Any]) -> None:
        status = _status(conn)
        if not _returnable(status):
            raise psycopg.InterfaceError("connection closed or in an unknown state")
        if status in _OPEN:
            await conn.rollback()
        if self._reset_hook is not None:
            await self._reset_hook(conn)
            if conn.info.transaction_status != _IDLE:
                raise psycopg.ProgrammingError("reset() left the connection in a transaction")

    @contextlib.asynccontextmanager
    async def connection(
        self, timeout: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``async with pool.connection() as conn``; as :meth:`ConnectionPool.connection`."""
        conn = await self.getconn(timeout)
        try:
            yield conn
            if _status(conn) == pq.TransactionStatus.INTRANS:
                await conn.commit()
        finally:
            await self.putconn(conn)

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        """Check a connection out; raises as :meth:`ConnectionPool.connection`."""
        conn: psycopg.AsyncConnection[Any] = await self._clients.getconn_async(timeout)
        return conn

    async def putconn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Hand a connection back (rolled back, reset, kept idle or closed).

        Raises:
            UnknownClient: not checked out of this pool.
        """
        await self._clients.putconn_async(conn)

    async def close(self) -> None:
        """Close the idle connections of this process and stop using the pool. Idempotent."""
        await self._clients.close_async()

    async def __aenter__(self) -> AsyncConnectionPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def sever_connection(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Shut a connection's socket down, from any thread, while its owner may be using it.

    A statement running on it fails at once (psycopg raises ``OperationalError``),
    the server sees the session end, and the pool discards the connection when it
    is handed back. The connection itself is not closed here: only the thread that
    uses it may free libpq's state.
    """
    try:
        fd = os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected any more: nothing to sever
        pass
    finally:
        sock.close()  # the duplicate only


def watch_socket(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int:
    """A duplicate of the connection's socket, to see the server end it; -1 if none."""
    try:
        return os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return -1


def await_gone(fd: int) -> None:
    """Wait (at most :data:`CLOSE_WAIT_S`) until the server closed its end, then close ``fd``.

    A backend leaves ``pg_stat_activity`` before it closes its socket, so once
    this returns the server no longer counts the connection: only then does
    the pool hand its budget to another process. The wait is a ``poll``, which
    takes any descriptor number (``select`` refuses 1024 and above, which a
    busy process's sockets get).
    """
    if fd < 0:
        return
    try:
        watch = select.poll()
        watch.register(fd, select.POLLIN)
        deadline = time.monotonic() + CLOSE_WAIT_S
        while (remaining := deadline - time.monotonic()) > 0:
            if not watch.poll(math.ceil(remaining * 1000.0)) or not os.read(fd, 65536):
                return
    except OSError:  # reset by the server: gone as well
        return
    finally:
        os.close(fd)


def _close(conn: psycopg.Connection[Any]) -> None:
    fd = watch_socket(conn)
    try:
        conn.close()
    finally:
        await_gone(fd)


async def _close_async(conn: psycopg.AsyncConnection[Any]) -> None:
    fd = watch_socket(conn)
    try:
        await conn.close()
    finally:
        await asyncio.to_thread(await_gone, fd)
