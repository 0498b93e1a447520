"""SQLAlchemy over :class:`~orbitive.clients.ClientPool`: engines capped host-wide.

An existing application changes one line, the ``create_engine`` or
``create_async_engine`` call::

    from orbitive.clients import PoolOptions
    from orbitive.clients.sqlalchemy import AsyncFleetPool, FleetPool

    engine = create_engine(
        "postgresql+psycopg://app@db/main",
        poolclass=FleetPool, fleet=fleet,
        fleet_options=PoolOptions(max_live=10, max_idle=4),
    )
    async_engine = create_async_engine(
        "postgresql+asyncpg://app@db/main",
        poolclass=AsyncFleetPool, fleet=fleet,
        fleet_options=PoolOptions(max_live=10, max_idle=4),
    )

``create_engine`` hands ``fleet``, ``fleet_key``, ``fleet_options``,
``fleet_kind`` and ``fleet_budget`` to the pool class (it passes on every argument the pool's
constructor names), together with the usual ``pool_pre_ping``,
``pool_reset_on_return`` and ``echo_pool``. SQLAlchemy keeps its own checkout
machinery (pre-ping, reset on return, invalidation); the fleet decides how many
connections exist: each is one client of the ClientPool, and a connection
SQLAlchemy invalidates reconnects in the same slot, so the count never grows.

Without ``fleet_key``, a PostgreSQL engine's key is its database's (server,
database and role, :mod:`orbitive.clients._database`): the sync and the
asyncio engine of one database, on psycopg or asyncpg, share one budget, and so
do an engine and an :mod:`orbitive.clients.asyncpg` pool of it. Each pool only
ever checks out connections it made itself.

:class:`AsyncFleetPool` is the asyncio twin, for ``create_async_engine`` with the
``postgresql+asyncpg`` or ``postgresql+psycopg`` dialect: a checkout that waits
for the cap waits on the event loop (through SQLAlchemy's greenlet bridge), never
blocking it, and a connection is opened and closed on the loop that first used
the pool, whichever thread retires it. As with SQLAlchemy's own asyncio pool,
an engine serves one event loop (``await engine.dispose()`` before another).

Errors keep SQLAlchemy's types, so existing handlers still catch them: a failed
connect raises the DB-API error, which the engine wraps as usual
(``sqlalchemy.exc.OperationalError``), and no connection within the timeout
raises ``sqlalchemy.exc.TimeoutError``, as ``QueuePool`` does (its cause is
the pool's :class:`~orbitive.clients.PoolTimeout`).

Needs SQLAlchemy (2.0 or later; the asyncio pool also its ``asyncio`` extra,
greenlet); imported only when this module is.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar, cast

from sqlalchemy import exc
from sqlalchemy.pool import ConnectionPoolEntry, Pool
from sqlalchemy.util.concurrency import await_only, greenlet_spawn, in_greenlet

from .._core._bytes import exact_bytes
from .._core._errors import ClientCreateError, InvalidPoolOptions, PoolClosed, PoolTimeout, shown
from .._core._fleet import Fleet
from ..pool import POOL_KIND, Key
from ._budget import Budget
from ._client_pool import ClientPool
from ._database import database_key, target_label
from ._home_loop import HomeLoop, LoopGone
from ._options import PoolOptions, key_label, pool_key

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import Dialect

    from ._transaction import TransactionRouter

__all__ = ["AsyncFleetPool", "FleetPool"]

_T = TypeVar("_T")


class _Blocking(Protocol):
    """Runs a blocking call where it may block: this thread, or one off the loop (where
    ``undo`` gets what the call returns if the caller is cancelled meanwhile)."""

    def __call__(
        self, call: Callable[[], _T], /, undo: Callable[[_T], object] | None = None
    ) -> _T: ...


def _in_this_thread(call: Callable[[], _T], undo: Callable[[_T], object] | None = None) -> _T:
    del undo  # nothing runs between the call's return and its caller's
    return call()


#: Seconds the home loop may take to close a connection for another thread.
CLOSE_WAIT_S: Final = 4.0


def _engine_key(key: object, creator: object, dialect: object) -> Key:
    """``fleet_key`` as a Key (text or bytes digested apart from other adapters' keys), or
    when None the key of the PostgreSQL database ``create_engine`` connects to.

    Raises:
        InvalidPoolOptions: a bad ``fleet_key``, or None where no PostgreSQL target can
            be read (another database, or a ``creator=`` of your own).
    """
    if key is None:
        return _target_key(creator, dialect)
    if issubclass(type(key), str):  # type(), not isinstance: __class__ may lie
        key = str.__str__(cast(str, key)).encode("utf-8", "surrogatepass")
    raw = exact_bytes(key)
    if raw:
        return Key.digest(b"sqlalchemy\0" + raw)
    return pool_key(key)


def _engine_label(key: object, creator: object, dialect: object) -> str | None:
    """The key's label: a str ``fleet_key`` (a URL shown without its password), else the
    database's ``user@host:port/dbname``; None when there is none to show."""
    if key is not None:
        return key_label(key, None) or None
    params = _target(creator, dialect)
    return target_label({**params, "database": params.get("dbname", params.get("database"))})


def _target_key(creator: object, dialect: object) -> Key:
    """The database key of ``create_engine``'s connect function (see :func:`_target`).

    Raises:
        InvalidPoolOptions: not a PostgreSQL dialect, or a creator of your own.
    """
    params = _target(creator, dialect)
    return database_key(
        host=params.get("host"),
        port=params.get("port"),
        database=params.get("dbname", params.get("database")),
        user=params.get("user"),
        service=params.get("service"),
    )


def _target(creator: object, dialect: object) -> Mapping[str, Any]:
    """The arguments the dialect made from the URL (``cparams``), which ``create_engine``'s
    connect function holds.

    Raises:
        InvalidPoolOptions: not a PostgreSQL dialect, or a creator of your own.
    """
    return _connect_args(creator, dialect)[1]


def _connect_args(creator: object, dialect: object) -> tuple[tuple[Any, ...], Mapping[str, Any]]:
    """The positional and keyword arguments the dialect made from the URL (``cargs``,
    ``cparams``), which ``create_engine``'s connect function holds.

    Raises:
        InvalidPoolOptions: not a PostgreSQL dialect, or a creator of your own.
    """
    try:
        held = inspect.getclosurevars(cast(Callable[..., Any], creator)).nonlocals
    except TypeError:  # not a function: a creator of the user's own
        held = {}
    params = held.get("cparams")
    if getattr(dialect, "name", None) != "postgresql" or not isinstance(params, Mapping):
        raise InvalidPoolOptions(
            "the pool reads its key from the PostgreSQL URL given to create_engine; with "
            "another database or a creator= of your own, pass fleet_key=",
            key="fleet_key",
        )
    return tuple(held.get("cargs_tup", ())), params


def _transaction_mode(options: object) -> bool:
    """Whether ``fleet_options`` asks for transaction mode (bad options: ClientPool's to
    refuse by name)."""
    return type(options) is PoolOptions and options.mode == "transaction"


def _check_transaction_mode(dialect: object, budget: Budget | None) -> None:
    """Refuse what transaction mode does not take in SQLAlchemy yet.

    Raises:
        InvalidPoolOptions: another driver than psycopg (3), or a budget.
    """
    if getattr(dialect, "driver", None) != "psycopg":
        raise InvalidPoolOptions(
            "mode='transaction' takes the postgresql+psycopg dialect so far; with another "
            "driver use mode='session'",
            key="mode",
        )
    if budget is not None:
        raise InvalidPoolOptions(
            "mode='transaction' takes no budget yet: use one without it", key="budget"
        )


def _psycopg_socket(record: ConnectionPoolEntry) -> int:
    """A duplicate of a psycopg connection's socket, to see the server end it; else -1."""
    driver = record.driver_connection
    if driver is None or "psycopg" not in sys.modules or not hasattr(driver, "pgconn"):
        return -1
    from . import _psycopg_connections as adapter  # noqa: PLC0415 - only for psycopg ones

    return adapter.watch_socket(driver)


def _sever_record(record: ConnectionPoolEntry) -> None:
    """Sever a psycopg connection in use (its units of a budget may lapse); a connection
    of another driver is left to be retired when handed back."""
    driver = record.driver_connection
    if driver is not None and "psycopg" in sys.modules and hasattr(driver, "pgconn"):
        from . import _psycopg_connections as adapter  # noqa: PLC0415 - only for psycopg ones

        adapter.sever_connection(driver)


def _await_gone(fd: int) -> None:
    if fd >= 0:
        from . import _psycopg_connections as adapter  # noqa: PLC0415 - only for psycopg ones

        adapter.await_gone(fd)


def _close_record(record: ConnectionPoolEntry) -> None:
    """Close a pooled connection; a psycopg one waits until the server ended it."""
    fd = _psycopg_socket(record)
    try:
        record.close()
    finally:
        _await_gone(fd)


def _checked_out(get: Callable[[], ConnectionPoolEntry]) -> ConnectionPoolEntry:
    """``get()``, its errors in SQLAlchemy's types (see the module)."""
    try:
        return get()
    except ClientCreateError as error:
        cause = error.__cause__
        if isinstance(cause, Exception):  # the DB-API error: the engine wraps it
            raise cause from None  # (error's own cause: chaining both ways would loop)
        raise
    except PoolTimeout as error:
        raise exc.TimeoutError(str(error)) from error


class FleetPool(Pool):
    """A SQLAlchemy pool whose connections are counted across the fleet's processes.

    Args:
        creator: the DB-API connect function (``create_engine`` supplies it).
        fleet: this process's joined fleet.
        fleet_key: what shares the budget: a Key, or text or bytes that is
            digested; None: the key of the PostgreSQL database in the engine's URL
            (server, database, role), the one every API of this package derives.
        fleet_options: host-wide sizes and timeouts (:class:`PoolOptions`). With
            ``mode="transaction"`` (the ``postgresql+psycopg`` dialect) the engine's
            connections go to the process's router of the key, which runs each
            transaction on an idle server connection of any process of the fleet
            (``max_live`` counts those); ``do_connect`` event hooks then shape only
            the connections to the router, not the server connections.
        fleet_kind: the pool table's SHM kind number.
        fleet_budget: a :class:`~orbitive.clients.Budget` shared with other hosts
            (the key is then the budget's). A psycopg connection in use when the
            host's units may lapse is severed (its socket shut down); another
            driver's is retired only when handed back.
        **kw: :class:`sqlalchemy.pool.Pool`'s own arguments.

    Raises:
        InvalidPoolOptions: no fleet, a bad key or options, no key to read from the
            URL (see ``fleet_key``), an asyncio engine (it takes
            :class:`AsyncFleetPool`), transaction mode with another driver than
            psycopg or with a budget; as :class:`~orbitive.clients.ClientPool`. A
            checkout raises SQLAlchemy's errors (see the module).
        InvalidBudget, BudgetMismatch, BudgetUnavailable, UnsafeCoordinator: as
            :class:`~orbitive.clients.ClientPool` (an :class:`AsyncFleetPool`'s at its
            first checkout).
    """

    #: Whether the pool serves asyncio engines (``create_async_engine``).
    for_asyncio: ClassVar[bool] = False

    def __init__(  # create_engine passes only arguments it finds named positionally here
        self,
        creator: Any,
        fleet: Fleet | None = None,
        fleet_key: object = None,
        fleet_options: PoolOptions | None = None,
        fleet_kind: int = POOL_KIND,
        fleet_budget: Budget | None = None,
        **kw: Any,
    ) -> None:
        name = type(self).__name__
        if not isinstance(fleet, Fleet):
            raise InvalidPoolOptions(
                f"{name} needs fleet=<a joined Fleet>, got {shown(fleet)}", key="fleet"
            )
        dialect = kw.get("dialect")
        if dialect is not None and bool(dialect.is_async) is not self.for_asyncio:
            twin = "FleetPool" if self.for_asyncio else "AsyncFleetPool"
            engine = "create_async_engine" if dialect.is_async else "create_engine"
            raise InvalidPoolOptions(
                f"{name} cannot serve {engine}; use poolclass={twin}", key="poolclass"
            )
        super().__init__(creator, **kw)
        self._fleet_args: dict[str, Any] = {
            "fleet": fleet,
            "fleet_key": fleet_key,
            "fleet_options": fleet_options,
            "fleet_kind": fleet_kind,
            "fleet_budget": fleet_budget,
        }
        self._key = _engine_key(fleet_key, creator, dialect)
        self._label = _engine_label(fleet_key, creator, dialect)
        self._mine: set[int] = set()  # ids of the records this pool made and did not close
        self._clients: ClientPool[ConnectionPoolEntry] | None = None
        self._disposed = False
        self._home = HomeLoop()  # the asyncio pool's: the loop its connections live on
        self._server_creator = creator  # create_engine's; in transaction mode, not _creator
        self._router: TransactionRouter | None = None
        self._opening = threading.Lock()  # held only while no await can happen
        if _transaction_mode(fleet_options):
            _check_transaction_mode(dialect, fleet_budget)
        elif not self.for_asyncio:
            self._open(self._new_record, self._close, self._ours)  # no router to start yet

    def _open(
        self,
        create: Callable[[], Any],
        close: Callable[[ConnectionPoolEntry], Any],
        check: Callable[[ConnectionPoolEntry], Any],
        blocking: _Blocking = _in_this_thread,
    ) -> ClientPool[ConnectionPoolEntry]:
        """The ClientPool of the engine's connections, made on first use: to the server
        (session mode), or to the process's router of the key (transaction mode), which
        ``blocking(call)`` starts (the asyncio pool's runs it off the loop). In a forked
        child a pool opened in transaction mode opens anew: its router, and the
        connections to it, are the parent's."""
        if self._router is not None and self._router.inherited:
            self._clients, self._router, self._creator = None, None, self._server_creator
        if self._clients is not None:
            return self._clients
        args = self._fleet_args
        options = args["fleet_options"]
        if not _transaction_mode(options):  # ClientPool checks the options
            self._clients = ClientPool(
                args["fleet"], self._key, create, close, check=check, options=options,
                kind=args["fleet_kind"], label=self._label, budget=args["fleet_budget"],
                sever=_sever_record,
            )  # fmt: skip
            return self._clients
        from . import _transaction  # noqa: PLC0415 - psycopg, for transaction mode only

        cargs, params = _connect_args(self._server_creator, self._dialect)
        conninfo = _transaction.server_conninfo(params)
        router = blocking(
            lambda: _transaction.attach(
                args["fleet"], conninfo, self._key, options, args["fleet_kind"], self._label or ""
            ),
            undo=_transaction.detach,
        )
        # Several first checkouts (threads, or tasks while one awaited the router) may get
        # here; one opens the pool, the others give back the router they attached.
        kept = False
        try:
            with self._opening:
                if self._clients is None:
                    self._creator = functools.partial(
                        cast("Dialect", self._dialect).connect,
                        *cargs,
                        **router.client_params(dict(params)),
                    )
                    self._clients = ClientPool(
                        args["fleet"], _transaction.clients_key(self._key), create, close,
                        check=check, options=_transaction.client_options(options),
                        kind=args["fleet_kind"],
                        label=_transaction.clients_label(self._label or ""),
                    )  # fmt: skip
                    self._router, kept = router, True
        finally:
            if not kept:
                blocking(lambda: _transaction.detach(router))
        return self._clients

    @property
    def clients(self) -> ClientPool[ConnectionPoolEntry]:
        """The underlying :class:`~orbitive.clients.ClientPool`.

        Raises:
            PoolClosed: a pool that no checkout opened yet (an :class:`AsyncFleetPool`, or
                one in transaction mode).
        """
        if self._clients is None:
            raise PoolClosed(f"{type(self).__name__} opens at its first checkout", key=self._key)
        return self._clients

    def _new_record(self) -> ConnectionPoolEntry:
        record = self._create_connection()
        self._mine.add(id(record))
        return record

    def _ours(self, record: ConnectionPoolEntry) -> bool:
        """The checkout's check: a record this pool made (a pool of the same key elsewhere
        in the process may have made it; SQLAlchemy's records belong to one pool)."""
        return id(record) in self._mine

    def _close(self, record: ConnectionPoolEntry) -> None:
        self._mine.discard(id(record))
        _close_record(record)

    def _do_get(self) -> ConnectionPoolEntry:
        # In transaction mode the pool opens here: engine.dispose() makes a new pool at
        # once, which must not start a router it may never use.
        return _checked_out(self._open(self._new_record, self._close, self._ours).getconn)

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        self.clients.putconn(record)

    def dispose(self) -> None:
        """Close this process's idle connections; checked-out ones close when returned
        (in transaction mode the process's router of the key stops with the last pool
        that uses it)."""
        self._disposed = True
        if self._clients is not None:
            self._clients.close()
        self._detach(_in_this_thread)

    def _detach(self, blocking: _Blocking) -> None:
        """Give the router back (transaction mode), with ``blocking`` as in :meth:`_open`."""
        router, self._router = self._router, None
        if router is not None:
            from . import _transaction  # noqa: PLC0415 - psycopg, for transaction mode only

            blocking(lambda: _transaction.detach(router))

    def recreate(self) -> FleetPool:
        """A new pool with the same arguments (``engine.dispose()`` uses it)."""
        return self.__class__(
            self._server_creator,
            recycle=self._recycle,
            echo=self.echo,
            logging_name=self._orig_logging_name,
            reset_on_return=self._reset_on_return,
            pre_ping=self._pre_ping,
            _dispatch=self.dispatch,
            dialect=self._dialect,
            **self._fleet_args,
        )

    def status(self) -> str:
        """One line of the key's fleet-wide and local counts."""
        name = type(self).__name__
        if self._clients is None:
            return f"{name}: not used yet"
        stats = self._clients.statistics()
        return (
            f"{name} max_live {stats.max_live}: {stats.live} live, {stats.idle} idle, "
            f"{stats.in_use} in use, {stats.waiting} waiting fleet-wide; here "
            f"{stats.local_idle} idle, {stats.local_in_use} checked out"
        )


class AsyncFleetPool(FleetPool):
    """The asyncio twin of :class:`FleetPool`, for ``create_async_engine``.

    Takes :class:`FleetPool`'s arguments. A checkout waits for the cap on the
    event loop (never blocking it); connections open and close on the loop of
    the first checkout (the pool opens there), whichever thread retires them.

    Raises:
        As :class:`FleetPool` (a sync engine takes :class:`FleetPool`).
    """

    for_asyncio: ClassVar[bool] = True

    def _do_get(self) -> ConnectionPoolEntry:  # in SQLAlchemy's greenlet, on the loop
        self._home.bind()
        clients = self._open(
            self._new_record_async, self._close_async, self._ours_async, _off_the_loop
        )

        def get() -> ConnectionPoolEntry:  # queued in arrival order (the ClientPool's gate)
            record: ConnectionPoolEntry = await_only(clients.getconn_async())
            return record

        return _checked_out(get)

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        clients = self.clients
        if self._disposed and in_greenlet():  # its close runs on this loop, awaited
            await_only(clients.putconn_async(record))
        else:  # no I/O here: a record handed over closes in a closing thread
            clients.putconn(record)

    async def _new_record_async(self) -> ConnectionPoolEntry:
        record: ConnectionPoolEntry = await self._home.run(
            lambda: greenlet_spawn(self._create_connection)
        )
        self._mine.add(id(record))
        return record

    async def _ours_async(self, record: ConnectionPoolEntry) -> bool:
        return id(record) in self._mine

    async def _close_async(self, record: ConnectionPoolEntry) -> None:
        """Close on the home loop (asyncpg's connections are that loop's); when it is gone,
        here (psycopg's are not bound to a loop). A psycopg one waits for the server."""
        self._mine.discard(id(record))
        fd = _psycopg_socket(record)
        try:
            try:
                await self._home.run(lambda: greenlet_spawn(record.close), CLOSE_WAIT_S)
            except LoopGone:
                await greenlet_spawn(record.close)
        finally:
            if fd >= 0:
                await asyncio.to_thread(_await_gone, fd)

    def dispose(self) -> None:
        """Close this process's idle connections (awaited on the loop inside
        ``await engine.dispose()``); checked-out ones close when returned."""
        self._disposed = True
        if self._clients is not None and in_greenlet():
            await_only(self._clients.close_async())
        elif self._clients is not None:
            self._clients.close()
        self._detach(_off_the_loop if in_greenlet() else _in_this_thread)


def _off_the_loop(call: Callable[[], _T], undo: Callable[[_T], object] | None = None) -> _T:
    """``call()`` in a thread, awaited from SQLAlchemy's greenlet: a router starts and
    stops (threads joined, server connections closed) without blocking the loop; a
    cancelled checkout leaves ``undo`` to give back what it started."""
    from . import _transaction  # noqa: PLC0415 - psycopg, for transaction mode only

    result: _T = await_only(_transaction.in_a_thread(call, undo))
    return result
