"""SQLAlchemy over :class:`~orbitive.clients.ClientPool`: an engine capped host-wide.

An existing application changes one line, the ``create_engine`` call::

    from orbitive.clients import PoolOptions
    from orbitive.clients.sqlalchemy import FleetPool

    engine = create_engine(
        "postgresql+psycopg://app@db/main",
        poolclass=FleetPool, fleet=fleet, fleet_key="main-db",
        fleet_options=PoolOptions(max_live=10, max_idle=4),
    )

``create_engine`` hands ``fleet``, ``fleet_key``, ``fleet_options`` and
``fleet_kind`` to the pool class (it passes on every argument the pool's
constructor names), together with the usual ``pool_pre_ping``,
``pool_reset_on_return`` and ``echo_pool``. SQLAlchemy keeps its own checkout
machinery (pre-ping, reset on return, invalidation); the fleet decides how many
connections exist: each is one client of the ClientPool, and a connection
SQLAlchemy invalidates reconnects in the same slot, so the count never grows.

Errors keep SQLAlchemy's types, so existing handlers still catch them: a failed
connect raises the DB-API error, which the engine wraps as usual
(``sqlalchemy.exc.OperationalError``), and no connection within the timeout
raises ``sqlalchemy.exc.TimeoutError``, as ``QueuePool`` does (its cause is
the pool's :class:`~orbitive.clients.PoolTimeout`).

Needs SQLAlchemy (2.0 or later); imported only when this module is.
"""

from __future__ import annotations

import sys
from typing import Any, cast

from sqlalchemy import exc
from sqlalchemy.pool import ConnectionPoolEntry, Pool

from .._core._bytes import exact_bytes
from .._core._errors import ClientCreateError, InvalidPoolOptions, PoolTimeout, shown
from .._core._fleet import Fleet
from ..pool import POOL_KIND, Key
from ._client_pool import ClientPool
from ._options import PoolOptions, pool_key

__all__ = ["FleetPool"]


def _engine_key(key: object) -> Key:
    """Keys given as text or bytes are digested apart from the psycopg adapter's."""
    if issubclass(type(key), str):  # type(), not isinstance: __class__ may lie
        key = str.__str__(cast(str, key)).encode("utf-8", "surrogatepass")
    raw = exact_bytes(key)
    if raw:
        return Key.digest(b"sqlalchemy\0" + raw)
    return pool_key(key)


def _close_record(record: ConnectionPoolEntry) -> None:
    """Close a pooled connection; a psycopg one waits until the server ended it."""
    dbapi = record.dbapi_connection
    if dbapi is None or "psycopg" not in sys.modules or not hasattr(dbapi, "pgconn"):
        record.close()
        return
    from . import psycopg as adapter  # noqa: PLC0415 - only for psycopg connections

    fd = adapter.watch_socket(dbapi)  # type: ignore[arg-type]  # a psycopg Connection
    try:
        record.close()
    finally:
        adapter.await_gone(fd)


class FleetPool(Pool):
    """A SQLAlchemy pool whose connections are counted across the fleet's processes.

    Args:
        creator: the DB-API connect function (``create_engine`` supplies it).
        fleet: this process's joined fleet.
        fleet_key: what makes connections interchangeable: a Key, or text or
            bytes (the URL, say) that is digested.
        fleet_options: host-wide sizes and timeouts (:class:`PoolOptions`).
        fleet_kind: the pool table's SHM kind number.
        **kw: :class:`sqlalchemy.pool.Pool`'s own arguments.

    Raises:
        InvalidPoolOptions, and as :class:`~orbitive.clients.ClientPool`; a checkout
        raises SQLAlchemy's errors (see the module).
    """

    def __init__(  # create_engine passes only arguments it finds named positionally here
        self,
        creator: Any,
        fleet: Fleet | None = None,
        fleet_key: object = None,
        fleet_options: PoolOptions | None = None,
        fleet_kind: int = POOL_KIND,
        **kw: Any,
    ) -> None:
        if not isinstance(fleet, Fleet):
            raise InvalidPoolOptions(
                f"FleetPool needs fleet=<a joined Fleet>, got {shown(fleet)}", key="fleet"
            )
        super().__init__(creator, **kw)
        self._fleet_args: dict[str, Any] = {
            "fleet": fleet,
            "fleet_key": fleet_key,
            "fleet_options": fleet_options,
            "fleet_kind": fleet_kind,
        }
        self.clients: ClientPool[ConnectionPoolEntry] = ClientPool(
            fleet,
            _engine_key(fleet_key),
            create=self._create_connection,
            close=_close_record,
            options=fleet_options,
            kind=fleet_kind,
        )

    def _do_get(self) -> ConnectionPoolEntry:
        try:
            record: ConnectionPoolEntry = self.clients.getconn()
        except ClientCreateError as error:
            cause = error.__cause__
            if isinstance(cause, Exception):  # the DB-API error: the engine wraps it
                raise cause from None  # (error's own cause: chaining both ways would loop)
            raise
        except PoolTimeout as error:
            raise exc.TimeoutError(str(error)) from error
        return record

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        self.clients.putconn(record)

    def dispose(self) -> None:
        """Close this process's idle connections; checked-out ones close when returned."""
        self.clients.close()

    def recreate(self) -> FleetPool:
        """A new pool with the same arguments (``engine.dispose()`` uses it)."""
        return self.__class__(
            self._creator,
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
        stats = self.clients.statistics()
        return (
            f"FleetPool max_live {stats.max_live}: {stats.live} live, {stats.idle} idle, "
            f"{stats.in_use} in use, {stats.waiting} waiting fleet-wide; here "
            f"{stats.local_idle} idle, {stats.local_in_use} checked out"
        )
