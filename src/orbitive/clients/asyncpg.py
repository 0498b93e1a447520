"""asyncpg over :class:`~orbitive.clients.ClientPool`: an asyncpg pool capped host-wide.

Follows asyncpg's :class:`asyncpg.pool.Pool`: ``create_pool`` returns a pool to
await (or enter with ``async with``); ``async with pool.acquire(timeout=...) as
conn`` yields a real :class:`asyncpg.Connection` (or the ``connection_class``
given); ``acquire``/``release``; the ``fetch``, ``fetchrow``, ``fetchval``,
``fetchmany``, ``execute`` and ``executemany`` shortcuts; the ``connect``,
``init``, ``setup`` and ``reset`` hooks; ``close``, ``terminate`` and
``expire_connections``. But ``max_live``, ``min_idle`` and ``max_idle`` count
every process of the fleet::

    from orbitive import Fleet
    from orbitive.clients import PoolOptions
    from orbitive.clients.asyncpg import create_pool

    pool = await create_pool("postgresql://app@db/main", fleet=Fleet.join("api", 16),
                             options=PoolOptions(max_live=8, max_idle=4))
    async with pool.acquire(timeout=5.0) as conn:
        await conn.fetchval("SELECT 1")

What differs from asyncpg, and why:

* ``min_size``, ``max_size`` and ``init_size`` count one process's connections;
  here the counts are the fleet's, so they raise :class:`InvalidPoolOptions`
  naming ``PoolOptions(max_live=..., min_idle=...)``;
  ``max_inactive_connection_lifetime`` is ``PoolOptions(idle_timeout=...)``.
* ``acquire(timeout=None)`` waits at most ``PoolOptions.acquire_timeout``, not
  for ever, and raises :class:`PoolTimeout` (a ``TimeoutError``, which is
  ``asyncio.TimeoutError`` on Python 3.11 and later).
* A connection's own errors keep asyncpg's types: a failed connect, ``init``
  or ``setup`` raises what asyncpg raises. The pool's own conditions raise
  :class:`PoolClosed`, :class:`TooManyRequests` and :class:`UnknownClient`.

On release, as asyncpg does, an open transaction is rolled back and the
session is reset (``Connection.reset()``: advisory locks, cursors, ``LISTEN``,
settings), or your ``reset`` runs after the rollback; a connection whose reset
fails, or that has run ``max_queries`` queries, is closed. A closed connection
is replaced on checkout. A connection is closed gracefully (the server has
ended the session before its unit of ``max_live`` returns), on the loop that
opened it whatever thread retires it.

``options=PoolOptions(mode="transaction")`` sends the connections to the process's
router of the key, which runs each transaction on an idle server connection of any
process of the fleet (docs/clients.md, "Transaction mode"); its server connections
are psycopg's, so that mode needs psycopg too (the ``postgres`` extra).

Needs the ``asyncpg`` extra; imported only when this module is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import inspect
import socket
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, final

import asyncpg
from asyncpg import exceptions

from .._core._errors import (
    ClientCreateError,
    InvalidPoolOptions,
    PoolClosed,
    UnknownClient,
    shown,
)
from .._core._fleet import Fleet
from ..pool import POOL_KIND
from ._budget import Budget
from ._client_pool import ClientPool
from ._database import database_key, dsn_target, target_label
from ._home_loop import HomeLoop, LoopGone
from ._options import PoolOptions, key_label, pool_key
from ._statistics import ClientPoolStatistics

if TYPE_CHECKING:
    from ._transaction import TransactionRouter

__all__ = ["Pool", "PoolAcquireContext", "create_pool"]

Connection = asyncpg.Connection
Hook = Callable[[Any], Awaitable[None]]

#: Seconds a graceful close may take before the connection is aborted.
CLOSE_WAIT_S: Final = 2.0
#: asyncpg's arguments whose per-process meaning cannot carry over, and what to write.
HOST_WIDE: Final = {
    "min_size": "PoolOptions(min_idle=...), the fleet's warm floor",
    "max_size": "PoolOptions(max_live=...), the fleet's cap",
    "init_size": "PoolOptions(min_idle=...), the fleet's warm floor",
    "max_inactive_connection_lifetime": "PoolOptions(idle_timeout=...)",
}
#: Connect arguments the pool passes itself.
OWN: Final = frozenset({"loop", "connection_class", "record_class"})


def create_pool(
    dsn: str | None = None,
    *,
    fleet: Fleet,
    options: PoolOptions | None = None,
    max_queries: int = 50_000,
    connect: Callable[..., Awaitable[Any]] | None = None,
    setup: Hook | None = None,
    init: Hook | None = None,
    reset: Hook | None = None,
    connection_class: type[Any] = Connection,
    record_class: type[Any] = asyncpg.Record,
    key: object = None,
    kind: int = POOL_KIND,
    budget: Budget | None = None,
    **connect_kwargs: Any,
) -> Pool:
    """An asyncpg-like pool whose limits hold across the fleet's processes.

    Await the result, or enter it with ``async with``, before use (as with
    asyncpg): that binds the pool to the running loop.

    Args:
        dsn: a ``postgresql://`` URL, or None (the target from ``connect_kwargs``
            and the ``PG*`` environment).
        fleet: this process's joined fleet.
        options: host-wide sizes and timeouts (:class:`PoolOptions`). With
            ``mode="transaction"`` the connections go to the process's router of the
            key, which runs each transaction on an idle server connection of any
            process of the fleet (``max_live`` counts those): the DSN and the
            arguments that reach the server (host, port, user, password, passfile,
            database) make its server connections, psycopg's, as libpq reads them.
        max_queries: queries a connection runs before it is closed (int >= 1).
        connect: a coroutine used instead of ``asyncpg.connect``, called as
            asyncpg's pool calls it.
        setup: ``await setup(conn)`` on every acquire; if it raises, the
            connection is closed and the error propagates.
        init: ``await init(conn)`` once per new connection; if it raises, the
            connection is closed and the error propagates.
        reset: ``await reset(conn)`` on release instead of
            ``Connection.reset()``'s query (the rollback runs first).
        connection_class: a subclass of :class:`asyncpg.Connection`.
        record_class: a subclass of :class:`asyncpg.Record`.
        key: overrides the key derived from the target (see
            :mod:`orbitive.clients._database`: one database and role, one budget).
        kind: the pool table's SHM kind number.
        budget: a :class:`~orbitive.clients.Budget` shared with other hosts (the
            key is then the budget's); a connection in use when the host's units
            may lapse is severed (its socket shut down: its query fails with a
            connection error), and discarded when released.
        **connect_kwargs: ``asyncpg.connect``'s arguments (``user``,
            ``password``, ``statement_cache_size``, ``server_settings``, ...).

    Returns:
        A :class:`Pool`, not yet opened.

    Raises:
        InvalidPoolOptions: ``min_size``, ``max_size``, ``init_size`` or
            ``max_inactive_connection_lifetime`` (named with the host-wide
            equivalent), ``loop``, a hook that is not callable, a bad class, DSN,
            ``max_queries`` or options, transaction mode with a ``connect`` callback
            or a budget (or, when awaited, a DSN libpq refuses); as
            :class:`~orbitive.clients.ClientPool`.
        InvalidBudget, BudgetMismatch, BudgetUnavailable, UnsafeCoordinator: as
            :class:`~orbitive.clients.ClientPool`, when the pool is awaited.
    """
    return Pool(
        dsn,
        fleet=fleet,
        options=options,
        max_queries=max_queries,
        connect=connect,
        setup=setup,
        init=init,
        reset=reset,
        connection_class=connection_class,
        record_class=record_class,
        key=key,
        kind=kind,
        budget=budget,
        **connect_kwargs,
    )


@final
class Pool:
    """An asyncpg connection pool whose limits hold across the fleet (see the module).

    Build it with :func:`create_pool`; the arguments and errors are that function's.
    """

    def __init__(
        self,
        dsn: str | None,
        *,
        fleet: Fleet,
        options: PoolOptions | None,
        max_queries: int,
        connect: Callable[..., Awaitable[Any]] | None,
        setup: Hook | None,
        init: Hook | None,
        reset: Hook | None,
        connection_class: type[Any],
        record_class: type[Any],
        key: object,
        kind: int,
        budget: Budget | None = None,
        **connect_kwargs: Any,
    ) -> None:
        _refuse_per_process(connect_kwargs)
        for name, hook in (
            ("connect", connect),
            ("setup", setup),
            ("init", init),
            ("reset", reset),
        ):
            _check_hook(name, hook)
        if connect is None:
            _check_connect_arguments(dsn, connect_kwargs)
        _check_class("connection_class", connection_class, Connection)
        _check_class("record_class", record_class, asyncpg.Record)
        if type(max_queries) is not int or max_queries < 1:
            raise InvalidPoolOptions(
                f"max_queries must be an int >= 1, got {shown(max_queries)}", key="max_queries"
            )
        if options is not None and type(options) is not PoolOptions:
            raise InvalidPoolOptions(
                f"options must be a PoolOptions, got {shown(options)}", key="options"
            )
        if options is not None and options.mode == "transaction":
            _check_transaction_mode(connect, budget)
        target = _target(dsn, connect_kwargs)
        self._key = database_key(**target) if key is None else key
        #: The key's label: the target's user@host:port/database (or a str key's own).
        self._label = target_label(target) if key is None else key_label(key, None) or None
        self._fleet, self._options, self._kind = fleet, options, kind
        self._budget = budget
        self._dsn, self._connect_kwargs = dsn, connect_kwargs
        self._connect = asyncpg.connect if connect is None else connect
        self._setup, self._init, self._reset = setup, init, reset
        self._connection_class, self._record_class = connection_class, record_class
        self._max_queries = max_queries
        self._home = HomeLoop()
        self._clients: ClientPool[Any] | None = None
        #: Every connection this pool made and has not closed: id -> (conn, generation).
        self._made: dict[int, tuple[Any, int]] = {}
        #: Connections acquired and not yet released: id -> (conn, acquire timeout).
        self._out: dict[int, tuple[Any, float | None]] = {}
        self._released = asyncio.Event()
        self._generation = 0
        self._closing = self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._router: TransactionRouter | None = None  # transaction mode's, once open
        self._opening = asyncio.Lock()

    # -- opening ---------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Pool]:
        return self._open().__await__()

    async def __aenter__(self) -> Pool:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self) -> Pool:
        """Bind to the running loop and join the fleet's pool table (once); in transaction
        mode, first start (or share) the process's router of the key, off the loop."""
        if self._closed:
            raise PoolClosed("the asyncpg pool is closed", key=self._key)
        async with self._opening:
            if self._clients is not None:
                return self
            self._home.bind()
            options, key, label = self._options, self._key, self._label
            if options is not None and options.mode == "transaction":
                from . import _transaction  # noqa: PLC0415 - psycopg, for this mode only

                await self._attach_router(options)
                options = _transaction.client_options(options)
                key = _transaction.clients_key(pool_key(self._key))
                label = _transaction.clients_label(self._label or "")
            try:
                self._clients = ClientPool(
                    self._fleet, key, self._new_connection, self._close_connection,
                    check=self._usable, options=options, kind=self._kind, label=label,
                    budget=self._budget, sever=_drop,
                )  # fmt: skip
            except BaseException:
                await self._detach_router()
                raise
        return self

    async def _attach_router(self, options: PoolOptions) -> None:
        """Start (or share) the router; the connections go to its socket from now on."""
        from . import _transaction  # noqa: PLC0415 - psycopg, for transaction mode only

        target = _target(self._dsn, self._connect_kwargs)
        server, routed = _transaction.asyncpg_arguments(self._dsn, self._connect_kwargs, target)
        attach = functools.partial(
            _transaction.attach, self._fleet, server, pool_key(self._key), options,
            self._kind, self._label or "",
        )  # fmt: skip
        router = await _transaction.in_a_thread(attach, undo=_transaction.detach)
        self._router = router
        self._dsn = None
        self._connect_kwargs = {**routed, "host": router.folder, "port": router.port}

    async def _detach_router(self) -> None:
        router, self._router = self._router, None
        if router is not None:
            await asyncio.to_thread(_detach, router)  # it joins the router

    @property
    def clients(self) -> ClientPool[Any]:
        """The underlying :class:`~orbitive.clients.ClientPool`.

        Raises:
            PoolClosed: the pool was not awaited (opened) yet.
        """
        if self._clients is None:
            raise PoolClosed(
                "the asyncpg pool is not open yet: await create_pool(...) first", key=self._key
            )
        return self._clients

    # -- the ClientPool's callables --------------------------------------------------------

    async def _new_connection(self) -> Any:
        """A new connection, opened on the home loop, ``init`` run (ClientPool's create)."""
        conn = await self._home.run(self._connected)
        self._made[id(conn)] = (conn, self._generation)
        return conn

    async def _connected(self) -> Any:
        conn = await self._connect(
            self._dsn,
            loop=self._home.loop,
            connection_class=self._connection_class,
            record_class=self._record_class,
            **self._connect_kwargs,
        )
        if not isinstance(conn, self._connection_class):
            conn.terminate()
            raise exceptions.InterfaceError(
                f"expected pool connect callback to return an instance of "
                f"{self._connection_class.__qualname__!r}, got {type(conn).__qualname__!r}"
            )
        if self._init is not None:
            try:
                await self._init(conn)
            except BaseException:
                conn.terminate()
                raise
        return conn

    async def _usable(self, conn: Any) -> bool:
        """The checkout's check: one of ours, of the current generation, and open."""
        made = self._made.get(id(conn))
        return made is not None and made[1] == self._generation and not conn.is_closed()

    async def _close_connection(self, conn: Any) -> None:
        """Close ``conn`` gracefully on its loop (the server has ended the session once
        this returns), or end its socket when that loop is gone (ClientPool's close)."""
        self._made.pop(id(conn), None)
        try:
            await self._home.run(lambda: conn.close(timeout=CLOSE_WAIT_S), 2 * CLOSE_WAIT_S)
        except LoopGone:
            _drop(conn)

    # -- acquire and release ---------------------------------------------------------------

    def acquire(self, *, timeout: float | None = None) -> PoolAcquireContext:
        """A connection: ``async with pool.acquire() as conn`` or ``await pool.acquire()``.

        Args:
            timeout: seconds to wait for a connection at most (float > 0); None:
                ``PoolOptions.acquire_timeout``. It is also the release's
                default bound for the reset.

        Returns:
            A context that yields (or an awaitable that returns) a connection of
            ``connection_class``; ``await``-ed, hand it back with :meth:`release`.

        Raises:
            (on entering or awaiting) PoolTimeout: no connection within the
            timeout. PoolClosed: the pool is closed, closing or not open yet.
            TooManyRequests: ``max_waiting`` callers of this process already
            wait. InvalidPoolOptions: a bad timeout. The connect, ``init`` and
            ``setup`` errors as asyncpg raises them.
        """
        return PoolAcquireContext(self, timeout)

    async def _acquire(self, timeout: float | None) -> Any:
        if self._closing or self._closed:
            raise PoolClosed("the asyncpg pool is closed", key=self._key)
        clients = self.clients
        try:  # the ClientPool queues this loop's tasks in arrival order (its gate)
            conn = await clients.getconn_async(timeout)
        except ClientCreateError as error:
            cause = error.__cause__
            if isinstance(cause, Exception):  # asyncpg's own error, as asyncpg raises it
                raise cause from None
            raise
        self._out[id(conn)] = (conn, timeout)
        self._released.clear()
        if self._setup is not None:
            try:
                await self._setup(conn)
            except BaseException:
                self._out.pop(id(conn), None)
                await clients.discard_async(conn)
                raise
        return conn

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:
        """Hand a connection back: rolled back and reset, then kept or closed.

        A task cancelled during the reset closes the connection instead (its
        state is unknown); either way its unit of ``max_live`` returns once.

        Args:
            connection: a connection :meth:`acquire` gave.
            timeout: seconds the reset may take (None: the acquire's timeout,
                else no bound).

        Raises:
            UnknownClient: not acquired from this pool, or released already
                (after :meth:`terminate`, a release is a no-op).
            The reset's error (the connection is then closed).
        """
        out = self._out.pop(id(connection), None)
        if out is None or out[0] is not connection:
            if self._closed:
                return
            raise UnknownClient(
                f"{type(connection).__name__} object was not acquired from this pool",
                key=self._key,
            )
        if not self._out:
            self._released.set()
        await self._give_back(connection, out[1] if timeout is None else timeout)

    async def _give_back(self, connection: Any, timeout: float | None) -> None:
        """Reset ``connection`` and hand it to the ClientPool, or retire it (once)."""
        clients = self.clients
        connection._on_release()  # asyncpg's pool does: listeners warned, statements expired
        made = self._made.get(id(connection))
        if (
            made is None
            or made[1] != self._generation
            or connection.is_closed()
            or connection._protocol.queries_count >= self._max_queries
        ):
            await clients.discard_async(connection)
            return
        try:
            await self._reset_connection(connection, timeout)
        except BaseException:
            connection.terminate()
            await clients.discard_async(connection)
            raise
        await clients.putconn_async(connection)

    async def _reset_connection(self, conn: Any, timeout: float | None) -> None:
        if self._reset is None:
            await conn.reset(timeout=timeout)
            return
        await asyncio.wait_for(self._reset_with_hook(conn), timeout)

    async def _reset_with_hook(self, conn: Any) -> None:
        await conn._reset()  # the rollback and listener cleanup of Connection.reset()
        assert self._reset is not None
        await self._reset(conn)

    # -- the shortcuts -----------------------------------------------------------------------

    async def execute(self, query: str, *args: object, timeout: float | None = None) -> str:
        """``Connection.execute`` on a pooled connection; returns its status string.

        Raises:
            As :meth:`acquire`, and the query's errors.
        """
        async with self.acquire() as conn:
            status: str = await conn.execute(query, *args, timeout=timeout)
            return status

    async def executemany(
        self, command: str, args: Iterable[Sequence[object]], *, timeout: float | None = None
    ) -> None:
        """``Connection.executemany`` on a pooled connection.

        Raises:
            As :meth:`acquire`, and the query's errors.
        """
        async with self.acquire() as conn:
            await conn.executemany(command, args, timeout=timeout)

    async def fetch(
        self, query: str, *args: object, timeout: float | None = None, record_class: Any = None
    ) -> list[Any]:
        """``Connection.fetch`` on a pooled connection; a list of records.

        Raises:
            As :meth:`acquire`, and the query's errors.
        """
        async with self.acquire() as conn:
            rows: list[Any] = await conn.fetch(
                query, *args, timeout=timeout, record_class=record_class
            )
            return rows

    async def fetchval(
        self, query: str, *args: object, column: int | str = 0, timeout: float | None = None
    ) -> Any:
        """``Connection.fetchval`` on a pooled connection; one value or None.

        Raises:
            As :meth:`acquire`, and the query's errors.
        """
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args, column=column, timeout=timeout)

    async def fetchrow(
        self, query: str, *args: object, timeout: float | None = None, record_class: Any = None
    ) -> Any:
        """``Connection.fetchrow`` on a pooled connection; one record or None.

        Raises:
            As :meth:`acquire`, and the query's errors.
        """
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args, timeout=timeout, record_class=record_class)

    async def fetchmany(
        self,
        query: str,
        args: Iterable[Sequence[object]],
        *,
        timeout: float | None = None,
        record_class: Any = None,
    ) -> list[Any]:
        """``Connection.fetchmany`` on a pooled connection; a list of records.

        Raises:
            As :meth:`acquire`, and the query's errors.
        """
        async with self.acquire() as conn:
            rows: list[Any] = await conn.fetchmany(
                query, args, timeout=timeout, record_class=record_class
            )
            return rows

    # -- sizes -----------------------------------------------------------------------------

    def get_size(self) -> int:
        """Connections of the key alive across the fleet (every process), idle or in use.

        Raises:
            PoolClosed: not open yet, or closed.
        """
        return self.statistics().live

    def get_idle_size(self) -> int:
        """Idle connections of the key across the fleet (every process)."""
        return self.statistics().idle

    def get_min_size(self) -> int:
        """The fleet's warm floor, ``PoolOptions.min_idle`` (not a per-process count)."""
        return self.clients.options.min_idle

    def get_max_size(self) -> int:
        """The fleet's cap, ``PoolOptions.max_live`` (not a per-process count)."""
        return self.clients.options.max_live

    def statistics(self) -> ClientPoolStatistics:
        """As :meth:`ClientPool.statistics` (fleet-wide counts and this process's own)."""
        return self.clients.statistics()

    # -- lifecycle -------------------------------------------------------------------------

    def is_closing(self) -> bool:
        """True once :meth:`close` or :meth:`terminate` began."""
        return self._closing or self._closed

    async def expire_connections(self) -> None:
        """Replace every open connection: each is closed at its next acquire or release."""
        self._generation += 1

    async def close(self) -> None:
        """Wait until every acquired connection is released, then close them all.

        Any error, a cancellation included, terminates the pool (as asyncpg's
        does) and propagates. Idempotent.
        """
        if self._closed or self._clients is None:
            self._closed = True
            return
        self._closing = True
        try:
            while self._out:
                await self._released.wait()
            await self._clients.close_async()
            await self._detach_router()
        except BaseException:
            self.terminate()
            raise
        finally:
            self._closed, self._closing = True, False

    def terminate(self) -> None:
        """Close every connection of this pool at once, acquired ones too; a later
        :meth:`release` of one is a no-op. Their units return as the closes finish."""
        if self._closed:
            return
        self._closed = True
        clients = self._clients
        if clients is None:
            return
        for conn, _ in list(self._made.values()):
            conn.terminate()
        out = [conn for conn, _ in self._out.values()]
        self._out.clear()
        self._released.set()
        router, self._router = self._router, None
        if self._home.here():
            task = asyncio.get_running_loop().create_task(_retire_all(clients, out, router))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            for conn in out:
                clients.discard(conn)
            clients.close()
            if router is not None:
                _detach(router)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self._closing else "open"
        return f"<orbitive.clients.asyncpg.Pool key={self._key} {state}>"


async def _retire_all(
    clients: ClientPool[Any], out: list[Any], router: TransactionRouter | None
) -> None:
    """Hand every terminated connection's unit back: acquired ones and idle ones; then
    give the router back (transaction mode), off the loop."""
    for conn in out:
        await clients.discard_async(conn)
    await clients.close_async()
    if router is not None:
        await asyncio.to_thread(_detach, router)


def _detach(router: TransactionRouter) -> None:
    from . import _transaction  # noqa: PLC0415 - psycopg, for transaction mode only

    _transaction.detach(router)


def _check_transaction_mode(connect: object, budget: Budget | None) -> None:
    """Refuse what transaction mode does not take yet.

    Raises:
        InvalidPoolOptions: a ``connect`` callback (the pool must connect to its router
            itself), a budget, or no psycopg installed.
    """
    if connect is not None:
        raise InvalidPoolOptions(
            "mode='transaction' connects to the process's router itself: it takes no "
            "connect callback (use init or setup)",
            key="connect",
        )
    if budget is not None:
        raise InvalidPoolOptions(
            "mode='transaction' takes no budget yet: use one without it", key="budget"
        )
    if importlib.util.find_spec("psycopg") is None:
        raise InvalidPoolOptions(
            "mode='transaction' needs psycopg for the router's server connections: "
            "pip install 'orbitive[postgres]'",
            key="mode",
        )


@final
class PoolAcquireContext:
    """What :meth:`Pool.acquire` returns: an async context manager, or an awaitable."""

    __slots__ = ("connection", "done", "pool", "timeout")

    def __init__(self, pool: Pool, timeout: float | None) -> None:
        self.pool, self.timeout = pool, timeout
        self.connection: Any = None
        self.done = False

    async def __aenter__(self) -> Any:
        if self.connection is not None or self.done:
            raise exceptions.InterfaceError("a connection is already acquired")
        self.connection = await self.pool._acquire(self.timeout)
        return self.connection

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.done = True
        conn, self.connection = self.connection, None
        await self.pool.release(conn)

    def __await__(self) -> Generator[Any, None, Any]:
        self.done = True
        return self.pool._acquire(self.timeout).__await__()


def _target(dsn: object, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The target's parts: explicit arguments first, then the DSN (as asyncpg)."""
    target: dict[str, Any] = {} if dsn is None else dsn_target(dsn)
    for name in ("host", "port", "database", "user", "service"):
        if kwargs.get(name) is not None:
            target[name] = kwargs[name]
    return target


def _refuse_per_process(kwargs: dict[str, Any]) -> None:
    """Arguments that cannot carry over get a named error that says what to write."""
    for name, instead in HOST_WIDE.items():
        if name in kwargs:
            raise InvalidPoolOptions(
                f"{name} counts one process's connections; the fleet-wide equivalent is "
                f"{instead}, passed as options=",
                key=name,
            )
    for name in OWN & kwargs.keys():
        raise InvalidPoolOptions(
            f"{name} is the pool's own (the loop is the one that awaits the pool)", key=name
        )


def _check_connect_arguments(dsn: object, kwargs: dict[str, Any]) -> None:
    """Arguments ``asyncpg.connect`` does not take are refused now, not at the first connect."""
    try:
        inspect.signature(asyncpg.connect).bind(dsn, **kwargs)
    except TypeError as error:
        raise InvalidPoolOptions(
            f"asyncpg.connect refuses the arguments: {error}", key="kwargs"
        ) from None


def _check_hook(name: str, hook: object) -> None:
    if hook is not None and not callable(hook):
        raise InvalidPoolOptions(
            f"{name} must be a coroutine function, got {shown(hook)}", key=name
        )


def _check_class(name: str, value: object, base: type[Any]) -> None:
    if not (isinstance(value, type) and issubclass(value, base)):
        raise InvalidPoolOptions(
            f"{name} must be a subclass of {base.__module__}.{base.__qualname__}, "
            f"got {shown(value)}",
            key=name,
        )


def _drop(conn: Any) -> None:
    """End the socket of a connection, so the server ends its session: its loop is gone,
    or (from any thread) its units of a budget may lapse while it is in use."""
    transport = conn._transport
    if transport is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        transport.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
