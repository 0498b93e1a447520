"""psycopg 3 over :class:`~orbitive.clients.ClientPool`: psycopg_pool's API, capped host-wide.

A psycopg_pool look-alike: the calls an application makes on
``psycopg_pool.ConnectionPool`` and ``AsyncConnectionPool`` behave the same
here (``connection()``, ``getconn``/``putconn``, ``open``/``close``/``wait``,
``check()``, ``closed``, ``name``, ``get_stats()``/``pop_stats()`` with
psycopg_pool's keys), and its errors are psycopg_pool's (``except
psycopg_pool.PoolTimeout`` catches :class:`PoolTimeout` when psycopg_pool is
installed). But ``max_live``, ``min_idle`` and ``max_idle`` count every
process of the fleet::

    from orbitive import Fleet
    from orbitive.clients import PoolOptions
    from orbitive.clients.psycopg import ConnectionPool

    pool = ConnectionPool("postgresql://app@db/main", fleet=Fleet.join("web", 16),
                          options=PoolOptions(max_live=10, max_idle=4))
    with pool.connection() as conn:
        conn.execute("SELECT 1")

psycopg_pool's ``min_size`` and ``max_size`` size one process's pool, so they
raise :class:`~orbitive.clients.InvalidPoolOptions` naming the host-wide
``PoolOptions`` field to use; so do ``num_workers``, ``reconnect_timeout`` and
``reconnect_failed`` (nothing connects in the background here) and
``resize()``. ``timeout``, ``max_waiting``, ``max_lifetime`` and ``max_idle``
(seconds, as in psycopg_pool) set ``PoolOptions``' ``acquire_timeout``,
``max_waiting``, ``max_lifetime`` and ``idle_timeout``.

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
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final

import psycopg

from .._core import _errors
from .._core._errors import InvalidPoolOptions, OrbitError, UnknownClient, shown
from .._core._fleet import Fleet
from ..pool import POOL_KIND, Key
from . import _transaction
from ._budget import Budget
from ._client_pool import ClientPool
from ._options import PoolOptions, pool_key
from ._psycopg_compat import (
    REFUSED,
    UNSET,
    PoolClosed,
    PoolTimeout,
    Stats,
    TooManyRequests,
    adapted,
    options_with,
    refuse,
)
from ._psycopg_connections import (
    CLIENT_SIDE,
    IDLE,
    OPEN,
    check_connection,
    check_connection_async,
    close,
    close_async,
    connection_key,
    conninfo_label,
    returnable,
    sever_connection,
    status,
)
from ._statistics import ClientPoolStatistics

__all__ = [
    "AsyncConnectionPool",
    "ConnectionPool",
    "PoolClosed",
    "PoolTimeout",
    "TooManyRequests",
    "check_connection",
    "check_connection_async",
]
for _cls in (PoolClosed, PoolTimeout, TooManyRequests):
    _cls.__module__ = __name__
del _cls

#: How often ``wait()`` looks at the warm floor, in seconds.
WAIT_POLL_S: Final = 0.01
#: The errors of a checkout that the adapter raises as its own classes.
_CHECKOUT_ERRORS: Final = (_errors.PoolTimeout, _errors.PoolClosed, _errors.TooManyRequests)


class _Base:
    """What both pools share: arguments, name, open and closed states, statistics."""

    name: str
    _clients: ClientPool[Any] | None
    _build: Callable[[], ClientPool[Any]]
    _connect: Callable[[], Any]
    _reset: Callable[[Any], Any]

    def _setup(
        self,
        conninfo: str,
        kwargs: dict[str, Any] | None,
        options: PoolOptions | None,
        name: str | None,
        key: object,
        psycopg_pool: dict[str, Any],
    ) -> Key | object:
        """Check the arguments and keep them; the key.

        Raises:
            InvalidPoolOptions: a psycopg_pool argument that cannot carry over, or
                any other bad argument.
        """
        refuse({arg: psycopg_pool.pop(arg) for arg in REFUSED})
        kwargs = {} if kwargs is None else kwargs
        derived = connection_key(conninfo, kwargs) if key is None else key
        self._options = options_with(options, **psycopg_pool)
        self.name = conninfo_label(conninfo, kwargs) if name is None else name
        self.conninfo, self.kwargs = conninfo, dict(kwargs)
        self._clients, self._opened = None, False
        self._stats = Stats()
        #: What ``connect`` gets: the conninfo and kwargs, or, in transaction mode,
        #: the process's router's socket and the client-side kwargs.
        self._target, self._target_kwargs = self.conninfo, self.kwargs
        self._router: _transaction.TransactionRouter | None = None
        self._reopening = threading.Lock()  # a forked child's first use (transaction mode)
        return derived

    def _client_pool(
        self,
        fleet: Fleet,
        key: object,
        check: Callable[[Any], Any] | None,
        kind: int,
        budget: Budget | None,
        close: Callable[[Any], Any],
    ) -> ClientPool[Any]:
        """The ClientPool of the pool's connections: to the server (session mode), or
        to the process's router of the key (transaction mode, :mod:`._transaction`)."""
        if self._options.mode == "session":
            return ClientPool(
                fleet, key, self._connect, close, check=check, reset=self._reset,
                options=self._options, kind=kind, label=self.name, budget=budget,
                sever=sever_connection,
            )  # fmt: skip
        if budget is not None:
            raise InvalidPoolOptions(
                "mode='transaction' takes no budget yet: use one without it", key="budget"
            )
        servers = pool_key(key)
        params = {name: value for name, value in self.kwargs.items() if name not in CLIENT_SIDE}
        conninfo = psycopg.conninfo.make_conninfo(self.conninfo, **params)
        router = _transaction.attach(fleet, conninfo, servers, self._options, kind, self.name)
        try:
            self._target = router.client_conninfo(conninfo)
            self._target_kwargs = {
                name: value for name, value in self.kwargs.items() if name in CLIENT_SIDE
            }
            clients: ClientPool[Any] = ClientPool(
                fleet, _transaction.clients_key(servers), self._connect, close, check=check,
                reset=self._reset, options=_transaction.client_options(self._options),
                kind=kind, label=_transaction.clients_label(self.name),
            )  # fmt: skip
        except BaseException:
            _transaction.detach(router)
            raise
        self._router = router
        return clients

    @property
    def closed(self) -> bool:
        """True before :meth:`open` (with ``open=False``) and after :meth:`close`."""
        return self._clients is None or self._clients._closed

    @property
    def clients(self) -> ClientPool[Any]:
        """The underlying :class:`~orbitive.clients.ClientPool`.

        Raises:
            PoolClosed: the pool is not open yet, or closed.
        """
        return self._open_clients()

    @property
    def options(self) -> PoolOptions:
        """The pool's options (host-wide sizes, this process's ``max_waiting``, timeouts)."""
        return self._options

    @property
    def min_size(self) -> int:
        """psycopg_pool's ``min_size``, read as the host-wide warm floor ``min_idle``."""
        return self._options.min_idle

    @property
    def max_size(self) -> int:
        """psycopg_pool's ``max_size``, read as the host-wide cap ``max_live``."""
        return self._options.max_live

    @property
    def timeout(self) -> float:
        """Seconds a checkout waits by default (``acquire_timeout``)."""
        return self._options.acquire_timeout

    def _open_clients(self) -> ClientPool[Any]:
        """The ClientPool.

        Raises:
            PoolClosed: "not open yet", or "already closed".
        """
        clients = self._clients
        if clients is None or clients._closed:
            state = "already closed" if self._opened else "not open yet"
            raise PoolClosed(f"the pool {self.name!r} is {state}")
        if self._router is not None and self._router.inherited:  # a forked child's
            with self._reopening:  # the parent's router and connections to it: open anew
                if self._router is not None and self._router.inherited:
                    self._router = None
                    self._clients = clients = self._build()
        return clients

    def _start(self) -> None:
        """Open: build the ClientPool (it joins the pool table and starts its upkeep).

        Raises:
            PoolClosed: the pool was opened and closed before (it cannot be reused).
        """
        if not self.closed:
            return
        if self._opened:
            raise PoolClosed("pool has already been opened/closed and cannot be reused")
        self._clients = self._build()
        self._opened = True

    def _checked_out(self) -> ClientPool[Any]:
        """The ClientPool for a checkout, counted as psycopg_pool counts requests."""
        self._stats.counts["requests_num"] += 1
        return self._open_clients()

    def _adapted(self, error: OrbitError) -> OrbitError:
        """A checkout's error as the adapter raises it, counted as psycopg_pool counts it."""
        self._stats.counts["requests_errors"] += 1
        return adapted(error)

    def _ready(self) -> bool:
        """Whether the fleet holds the warm floor: ``min_idle`` live connections."""
        return self._open_clients().statistics().live >= self._options.min_idle

    def _timed_out(self, timeout: float) -> PoolTimeout:
        return PoolTimeout(f"pool initialization incomplete after {timeout} sec")

    def _returned(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
        """Whether ``conn``, just returned, has a transaction to roll back.

        Raises:
            psycopg.InterfaceError: it is closed or in an unknown state (counted as
                psycopg_pool's ``returns_bad``; the pool discards it).
        """
        state = status(conn)
        if not returnable(state):
            self._stats.counts["returns_bad"] += 1
            raise psycopg.InterfaceError("connection closed or in an unknown state")
        return state in OPEN

    def _never_opened(self, conn: object) -> UnknownClient:
        return UnknownClient(f"can't return {conn!r} to pool {self.name!r}: it was never open")

    def _used(self, began: float) -> None:
        self._stats.counts["usage_ms"] += int(1000.0 * (time.monotonic() - began))

    def _connecting(self) -> float:
        self._stats.counts["connections_num"] += 1
        return time.monotonic()

    def _connected(self, began: float, conn: Any) -> None:
        self._stats.counts["connections_ms"] += int(1000.0 * (time.monotonic() - began))
        conn._pool = None  # pooled: psycopg's warning about unclosed connections is not ours

    def resize(self, min_size: int, max_size: int | None = None) -> None:
        """psycopg_pool's resize: its meaning cannot carry over, so it always raises.

        ``max_live``, ``min_idle`` and ``max_idle`` are host-wide: every process
        of the fleet counts against the same numbers, so one process cannot
        change them at run time.

        Raises:
            InvalidPoolOptions: always, naming what to do instead.
        """
        raise InvalidPoolOptions(
            f"resize({shown(min_size)}, {shown(max_size)}) cannot apply to one process: "
            "max_live, min_idle and max_idle hold for every process of the fleet; restart "
            "the fleet's workers with the new PoolOptions(max_live=..., min_idle=...)",
            key="resize",
        )

    def statistics(self) -> ClientPoolStatistics:
        """As :meth:`ClientPool.statistics`.

        Raises:
            PoolClosed: the pool is not open, or closed.
        """
        return self._open_clients().statistics()

    def get_stats(self) -> dict[str, int]:
        """psycopg_pool's statistics, by psycopg_pool's keys, for a host-wide pool.

        Measures, read now: ``pool_min`` (``min_idle``, the host-wide warm
        floor), ``pool_max`` (``max_live``, the host-wide cap), ``pool_size``
        (connections open or being opened by every process of the fleet),
        ``pool_available`` (idle connections, host-wide), ``requests_waiting``
        (callers waiting at ``max_live``, host-wide). The last three read 0
        while the pool is not open.

        Counters, of this pool object since it was built or last popped (a
        counter appears once it is non-zero, as in psycopg_pool):
        ``requests_num`` (checkouts), ``requests_queued`` (checkouts that waited
        at ``max_live``), ``requests_wait_ms`` (their waits, ms),
        ``requests_errors`` (checkouts that failed: timeout, closed, too many
        waiting), ``returns_bad`` (connections returned closed or broken),
        ``connections_num``, ``connections_ms`` and ``connections_errors``
        (connection attempts, the ms they took, the failed ones),
        ``connections_lost`` (connections found broken by ``check``),
        ``usage_ms`` (ms connections spent in ``connection()`` blocks).

        Returns:
            A new dict of str to int.
        """
        return self._stats.snapshot(self._options, self._statistics(), pop=False)

    def pop_stats(self) -> dict[str, int]:
        """:meth:`get_stats`, then the counters start again at zero."""
        return self._stats.snapshot(self._options, self._statistics(), pop=True)

    def _statistics(self) -> ClientPoolStatistics | None:
        return None if self.closed else self.statistics()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__module__}.{type(self).__name__} {self.name!r} {state}>"


class ConnectionPool(_Base):
    """A psycopg connection pool whose limits hold across the fleet's processes.

    Args:
        conninfo: the libpq connection string or URL.
        fleet: this process's joined fleet.
        connection_class: the class whose ``connect`` makes connections
            (default ``psycopg.Connection``).
        kwargs: more arguments for ``connect`` (for example
            ``{"application_name": "web"}``); its connection parameters (all but
            ``CLIENT_SIDE``'s: ``autocommit``, ``row_factory``, ...) are part of the key, which an
            :class:`AsyncConnectionPool` of the same conninfo and parameters
            shares (one budget).
        options: host-wide sizes and timeouts (:class:`PoolOptions`).
        open: True or None (the default) opens the pool now; False leaves it
            closed until :meth:`open` (or ``with``).
        configure: called with each new connection before first use.
        check: called on checkout (default :func:`check_connection`; None skips).
        reset: called with each returned connection, after the rollback.
        name: the pool's name, also the key's label in ``orbit pool``, metrics
            and errors (1..127 bytes of UTF-8); None: ``user@host:port/dbname``
            from the conninfo, without the password.
        close_returns: ``conn.close()`` of a checked-out connection returns it
            to the pool (a bool; True needs psycopg 3.3 or later).
        timeout: psycopg_pool's: sets ``options``' ``acquire_timeout`` (seconds).
        max_waiting: psycopg_pool's: sets ``options``' ``max_waiting`` (this
            process's waiting callers; 0: no limit).
        max_lifetime: psycopg_pool's: sets ``options``' ``max_lifetime`` (seconds).
        max_idle: psycopg_pool's: sets ``options``' ``idle_timeout`` (seconds:
            psycopg_pool's ``max_idle`` is a time, not ``PoolOptions.max_idle``,
            a count).
        min_size: psycopg_pool's, refused: use ``PoolOptions(min_idle=...)``.
        max_size: psycopg_pool's, refused: use ``PoolOptions(max_live=...)``.
        num_workers: psycopg_pool's, refused (no worker threads here).
        reconnect_timeout: psycopg_pool's, refused (nothing reconnects in the
            background).
        reconnect_failed: psycopg_pool's, refused, as ``reconnect_timeout``.
        key: overrides the key derived from conninfo and kwargs.
        kind: the pool table's SHM kind number.
        budget: a :class:`~orbitive.clients.Budget` shared with other hosts: the
            pools of every host that name it hold at most its ``total``
            connections between them (the key is then the budget's). A
            connection in use when the host's units may lapse is severed
            (its socket is shut down): its statement fails, and it is discarded
            when handed back.

    Raises:
        InvalidPoolOptions: a psycopg_pool argument whose meaning cannot carry
            over (the message names the host-wide equivalent), or any bad
            argument; and as :class:`~orbitive.clients.ClientPool`.
        InvalidBudget, BudgetMismatch, BudgetUnavailable, UnsafeCoordinator: as
            :class:`~orbitive.clients.ClientPool`, when the pool opens.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        fleet: Fleet,
        connection_class: type[psycopg.Connection[Any]] = psycopg.Connection,
        kwargs: dict[str, Any] | None = None,
        options: PoolOptions | None = None,
        open: bool | None = None,
        configure: Callable[[psycopg.Connection[Any]], None] | None = None,
        check: Callable[[psycopg.Connection[Any]], None] | None = check_connection,
        reset: Callable[[psycopg.Connection[Any]], None] | None = None,
        name: str | None = None,
        close_returns: bool = False,
        timeout: float = UNSET,
        max_waiting: int = UNSET,
        max_lifetime: float = UNSET,
        max_idle: float = UNSET,
        min_size: int = UNSET,
        max_size: int | None = UNSET,
        num_workers: int = UNSET,
        reconnect_timeout: float = UNSET,
        reconnect_failed: Callable[[Any], None] | None = UNSET,
        key: object = None,
        kind: int = POOL_KIND,
        budget: Budget | None = None,
    ) -> None:
        derived = self._setup(conninfo, kwargs, options, name, key, {
            "timeout": timeout, "max_waiting": max_waiting, "max_lifetime": max_lifetime,
            "max_idle": max_idle, "min_size": min_size, "max_size": max_size,
            "num_workers": num_workers, "reconnect_timeout": reconnect_timeout,
            "reconnect_failed": reconnect_failed,
        })  # fmt: skip
        self.connection_class = connection_class
        self.close_returns = _close_returns(close_returns)
        self._configure, self._reset_hook = configure, reset
        self._lock = threading.Lock()
        counted = None if check is None else self._counted(check)
        self._build = lambda: self._client_pool(fleet, derived, counted, kind, budget, close)
        if open is None or open:
            self.open()

    def _counted(
        self, check: Callable[[psycopg.Connection[Any]], None]
    ) -> Callable[[psycopg.Connection[Any]], None]:
        """``check``, counting a connection it finds broken (``connections_lost``)."""
        counts = self._stats.counts

        def counted(conn: psycopg.Connection[Any]) -> None:
            try:
                check(conn)
            except Exception:
                counts["connections_lost"] += 1
                raise

        return counted

    def _connect(self) -> psycopg.Connection[Any]:
        began = self._connecting()
        try:
            conn = self.connection_class.connect(self._target, **self._target_kwargs)
        except Exception:
            self._stats.counts["connections_errors"] += 1
            raise
        self._connected(began, conn)
        if self._configure is not None:
            try:
                self._configure(conn)
                if conn.info.transaction_status in OPEN:
                    conn.rollback()
            except BaseException:
                close(conn)
                raise
        return conn

    def _reset(self, conn: psycopg.Connection[Any]) -> None:
        if self._returned(conn):
            conn.rollback()
        if self._reset_hook is not None:
            self._reset_hook(conn)
            if conn.info.transaction_status != IDLE:
                raise psycopg.ProgrammingError("reset() left the connection in a transaction")

    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        """Open the pool (a no-op when open); with ``wait``, then :meth:`wait`.

        Args:
            wait: wait for the warm floor, as :meth:`wait` does.
            timeout: seconds :meth:`wait` waits at most.

        Raises:
            PoolClosed: the pool was closed before: a closed pool cannot be reopened.
            PoolTimeout: as :meth:`wait`.
        """
        with self._lock:
            self._start()
        if wait:
            self.wait(timeout)

    def wait(self, timeout: float = 30.0) -> None:
        """Wait until the fleet holds the warm floor (``min_idle`` live connections).

        Returns at once when ``min_idle`` is 0. As psycopg_pool's, it closes the
        pool when the floor is not reached within ``timeout`` seconds (a float).

        Raises:
            PoolClosed: the pool is not open, or closed.
            PoolTimeout: not ready within ``timeout`` (the pool is closed then).
        """
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() >= deadline:
                self.close()
                raise self._timed_out(timeout)
            time.sleep(WAIT_POLL_S)

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """``with pool.connection() as conn``: as psycopg_pool's, the connection's own
        ``with`` (commit on a clean exit, roll back on an exception), then returned.

        Args:
            timeout: seconds to wait for a connection; None: ``acquire_timeout``.

        Raises:
            PoolTimeout, PoolClosed, TooManyRequests, InvalidPoolOptions: as
                :meth:`~orbitive.clients.ClientPool.getconn`.
            ClientCreateError: the connect failed (its error is the ``__cause__``).
        """
        conn = self.getconn(timeout)
        began = time.monotonic()
        try:
            with conn:
                yield conn
        finally:
            self.putconn(conn)
            self._used(began)

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """Check a connection out (give it back with :meth:`putconn`); raises as connection()."""
        clients = self._checked_out()
        try:
            conn: psycopg.Connection[Any] = clients.getconn(timeout)
        except _CHECKOUT_ERRORS as error:
            raise self._adapted(error) from error.__cause__
        conn._pool = self  # type: ignore[assignment]  # psycopg reads putconn, close_returns
        return conn

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        """Hand a connection back: rolled back, reset, kept idle or closed.

        Raises:
            UnknownClient: not checked out of this pool (a ``ValueError``).
        """
        if getattr(conn, "_pool", None) is self:
            conn._pool = None
        if self._clients is None:
            raise self._never_opened(conn)
        self._clients.putconn(conn)

    def close(self, timeout: float = 5.0) -> None:
        """Close the pool: this process's idle connections now, each checked-out one when
        it is returned; waiting and later checkouts raise :class:`PoolClosed`. Idempotent.

        ``timeout`` is psycopg_pool's bound on its worker threads, of which this
        pool has none: it returns once this process's idle connections are closed.
        """
        with self._lock:
            clients, router, self._router = self._clients, self._router, None
        if clients is not None:
            clients.close()
        if router is not None:
            _transaction.detach(router)

    def check(self) -> None:
        """Check this process's idle connections with :func:`check_connection`: those that
        fail are closed (``connections_lost``), the others stay idle. Other processes'
        connections are theirs to check.

        Raises:
            PoolClosed: the pool is not open, or closed.
        """
        self._open_clients().check_idle(self._counted(check_connection))

    @staticmethod
    def check_connection(conn: psycopg.Connection[Any]) -> None:
        """psycopg_pool's ``ConnectionPool.check_connection``: :func:`check_connection`."""
        check_connection(conn)

    def __enter__(self) -> ConnectionPool:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncConnectionPool(_Base):
    """Asyncio twin of :class:`ConnectionPool` over :class:`psycopg.AsyncConnection`.

    ``configure``, ``check`` and ``reset`` are coroutine functions here. Every
    wait happens on the event loop; nothing blocks it. Unlike psycopg_pool's,
    opening in the constructor (the default) is not deprecated: opening needs
    no event loop.

    Raises:
        InvalidPoolOptions: as :class:`ConnectionPool`.
        InvalidBudget, BudgetMismatch, BudgetUnavailable, UnsafeCoordinator: as
            :class:`ConnectionPool`, when the pool opens.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        fleet: Fleet,
        connection_class: type[psycopg.AsyncConnection[Any]] = psycopg.AsyncConnection,
        kwargs: dict[str, Any] | None = None,
        options: PoolOptions | None = None,
        open: bool | None = None,
        configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
        check: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
        | None = check_connection_async,
        reset: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
        name: str | None = None,
        close_returns: bool = False,
        timeout: float = UNSET,
        max_waiting: int = UNSET,
        max_lifetime: float = UNSET,
        max_idle: float = UNSET,
        min_size: int = UNSET,
        max_size: int | None = UNSET,
        num_workers: int = UNSET,
        reconnect_timeout: float = UNSET,
        reconnect_failed: Callable[[Any], None] | None = UNSET,
        key: object = None,
        kind: int = POOL_KIND,
        budget: Budget | None = None,
    ) -> None:
        derived = self._setup(conninfo, kwargs, options, name, key, {
            "timeout": timeout, "max_waiting": max_waiting, "max_lifetime": max_lifetime,
            "max_idle": max_idle, "min_size": min_size, "max_size": max_size,
            "num_workers": num_workers, "reconnect_timeout": reconnect_timeout,
            "reconnect_failed": reconnect_failed,
        })  # fmt: skip
        self.connection_class = connection_class
        self.close_returns = _close_returns(close_returns)
        self._configure, self._reset_hook = configure, reset
        counted = None if check is None else self._counted(check)
        self._build = lambda: self._client_pool(fleet, derived, counted, kind, budget, close_async)
        if open is None or open:
            self._start()

    def _counted(
        self, check: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
    ) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
        """``check``, counting a connection it finds broken (``connections_lost``)."""
        counts = self._stats.counts

        async def counted(conn: psycopg.AsyncConnection[Any]) -> None:
            try:
                await check(conn)
            except Exception:
                counts["connections_lost"] += 1
                raise

        return counted

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        began = self._connecting()
        try:
            conn = await self.connection_class.connect(self._target, **self._target_kwargs)
        except Exception:
            self._stats.counts["connections_errors"] += 1
            raise
        self._connected(began, conn)
        if self._configure is not None:
            try:
                await self._configure(conn)
                if conn.info.transaction_status in OPEN:
                    await conn.rollback()
            except BaseException:
                await close_async(conn)
                raise
        return conn

    async def _reset(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._returned(conn):
            await conn.rollback()
        if self._reset_hook is not None:
            await self._reset_hook(conn)
            if conn.info.transaction_status != IDLE:
                raise psycopg.ProgrammingError("reset() left the connection in a transaction")

    async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        """As :meth:`ConnectionPool.open` (in transaction mode the process's router may
        start, which connects once: in a thread, off the loop)."""
        if self._options.mode == "transaction":
            await asyncio.to_thread(self._start)
        else:
            self._start()
        if wait:
            await self.wait(timeout)

    async def wait(self, timeout: float = 30.0) -> None:
        """As :meth:`ConnectionPool.wait`, sleeping on the event loop."""
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() >= deadline:
                await self.close()
                raise self._timed_out(timeout)
            await asyncio.sleep(WAIT_POLL_S)

    @contextlib.asynccontextmanager
    async def connection(
        self, timeout: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``async with pool.connection() as conn``; as :meth:`ConnectionPool.connection`."""
        conn = await self.getconn(timeout)
        began = time.monotonic()
        try:
            async with conn:
                yield conn
        finally:
            await self.putconn(conn)
            self._used(began)

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        """Check a connection out; raises as :meth:`ConnectionPool.connection`."""
        clients = self._checked_out()
        try:
            conn: psycopg.AsyncConnection[Any] = await clients.getconn_async(timeout)
        except _CHECKOUT_ERRORS as error:
            raise self._adapted(error) from error.__cause__
        conn._pool = self  # type: ignore[assignment]  # psycopg reads putconn, close_returns
        return conn

    async def putconn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Hand a connection back (rolled back, reset, kept idle or closed).

        Raises:
            UnknownClient: not checked out of this pool (a ``ValueError``).
        """
        if getattr(conn, "_pool", None) is self:
            conn._pool = None
        if self._clients is None:
            raise self._never_opened(conn)
        await self._clients.putconn_async(conn)

    async def close(self, timeout: float = 5.0) -> None:
        """As :meth:`ConnectionPool.close`."""
        router, self._router = self._router, None
        if self._clients is not None:
            await self._clients.close_async()
        if router is not None:
            await asyncio.to_thread(_transaction.detach, router)  # it joins the router

    async def check(self) -> None:
        """As :meth:`ConnectionPool.check`, on the event loop."""
        await self._open_clients().check_idle_async(self._counted(check_connection_async))

    @staticmethod
    async def check_connection(conn: psycopg.AsyncConnection[Any]) -> None:
        """psycopg_pool's ``AsyncConnectionPool.check_connection``."""
        await check_connection_async(conn)

    async def __aenter__(self) -> AsyncConnectionPool:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _close_returns(value: object) -> bool:
    """``close_returns`` checked: a bool, and True only where psycopg's ``close()`` hands a
    pooled connection to its pool (psycopg 3.3 and later).

    Raises:
        InvalidPoolOptions: not a bool, or True under an older psycopg.
    """
    if type(value) is not bool:
        raise InvalidPoolOptions(f"close_returns must be a bool, got {shown(value)}")
    major, minor = (int(part) for part in psycopg.__version__.split(".")[:2])
    if value and (major, minor) < (3, 3):
        raise InvalidPoolOptions(f"close_returns=True needs psycopg 3.3, not {psycopg.__version__}")
    return value
