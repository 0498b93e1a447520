"""The engine's ``DatabaseWrapper``: Django's PostgreSQL backend over a host-wide pool.

Django loads this module for ``"ENGINE": "orbitive.clients.django"``. The
wrapper is Django's own PostgreSQL wrapper (psycopg 3) with the connection's
source changed: a connection is checked out of this process's
:class:`~orbitive.clients.psycopg.ConnectionPool` for the alias, whose
``max_live`` counts every process of the fleet, and :meth:`close` hands it
back, as with Django 5.1's own pool. See :mod:`orbitive.clients.django` for
the settings and the rules.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, ProgrammingError
from django.db.backends.base.base import NO_DB_ALIAS, BaseDatabaseWrapper
from django.db.backends.postgresql import base as postgresql
from django.utils.asyncio import async_unsafe
from psycopg import IsolationLevel

from ..._core import _fork
from ..._core._errors import ClientCreateError, PoolClosed, PoolTimeout, TooManyRequests
from ..psycopg import ConnectionPool, check_connection
from ._pools import POOLS, Pools
from ._settings import pool_settings
from .creation import DatabaseCreation
from .features import DatabaseFeatures

__all__ = ["DatabaseWrapper"]

#: Django 5.1 and later configure a pooled connection once, when it is made (time
#: zone, role); Django 4.2 configures every connection it opens.
_CONFIGURES_ONCE: Final = hasattr(postgresql.DatabaseWrapper, "_configure_connection")


class DatabaseWrapper(postgresql.DatabaseWrapper):
    """Django's PostgreSQL ``DatabaseWrapper`` with a connection pool capped host-wide.

    Django builds it from a ``DATABASES`` entry whose ``ENGINE`` is
    ``"orbitive.clients.django"``; ``OPTIONS["pool"]`` is checked then, so a
    bad setting fails before any connection is opened.

    Args:
        settings_dict: the ``DATABASES`` entry (Django has filled in its defaults).
        alias: the database's alias.

    Raises:
        ImproperlyConfigured: a bad ``OPTIONS["pool"]`` (see
            :func:`~orbitive.clients.django._settings.pool_settings`).
    """

    creation_class = DatabaseCreation
    features_class = DatabaseFeatures

    def __init__(self, settings_dict: dict[str, Any], alias: str = DEFAULT_DB_ALIAS) -> None:
        super().__init__(settings_dict, alias)
        self._orbit_pool: ConnectionPool | None = None  # the pool self.connection came from
        self._orbit_unusable = False  # a close now is for a failed health check
        pool_settings(self.settings_dict, alias)
        _fork.register(self)

    # -- the pool ----------------------------------------------------------------------

    @property
    def pool(self) -> ConnectionPool | None:
        """This process's pool for the alias, built on first use (Django 5.1's name).

        Returns:
            The :class:`~orbitive.clients.psycopg.ConnectionPool`, or None when
            ``OPTIONS["pool"]`` is False or None, and for Django's connection
            to no database (``_nodb_cursor``), which opens its own.

        Raises:
            ImproperlyConfigured: bad ``OPTIONS["pool"]``, ``CONN_MAX_AGE`` not 0
                when the pool is built, or a fleet that cannot be joined (its
                capacity differs, or every node is held).
        """
        if self._orbit_pool is not None:
            return self._orbit_pool
        return self._pooled(self.get_connection_params())

    def close_pool(self) -> None:
        """Close this process's pool for the alias (Django 5.1's name); the next
        connection builds a new one. Connections checked out of it close when
        they are handed back."""
        POOLS.close(self.alias)

    def _pooled(self, params: dict[str, Any]) -> ConnectionPool | None:
        options = self.settings_dict.get("OPTIONS") or {}
        given = options.get("pool", True)  # missing: pool_settings() says what to give
        if self.alias == NO_DB_ALIAS or given is False or given is None:
            return None
        return POOLS.get(self.alias, params, options, lambda pools: self._build(pools, params))

    def _build(self, pools: Pools, params: dict[str, Any]) -> ConnectionPool:
        settings = pool_settings(self.settings_dict, self.alias)
        if settings is None:  # the settings changed while the pool was being looked up
            raise ImproperlyConfigured(f"DATABASES[{self.alias!r}] asks for no pool")
        return ConnectionPool(
            fleet=pools.fleet(settings),
            kwargs={**params, "autocommit": True},  # Django sets it on each checkout
            options=settings.options,
            configure=self._configure if _CONFIGURES_ONCE else None,
            check=check_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
            key=_key(self.alias, params),
            budget=settings.budget,
        )

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        self._configure_connection(conn)  # type: ignore[attr-defined]  # Django >= 5.1

    # -- Django's connection life ------------------------------------------------------

    def get_connection_params(self) -> dict[str, Any]:
        """Django's connect arguments, without ``"pool"`` (Django 4.2 would pass it on).

        Raises:
            ImproperlyConfigured: as Django's (no NAME, a name too long).
        """
        params = super().get_connection_params()
        params.pop("pool", None)
        return params

    @async_unsafe
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        """A connection for Django: checked out of the pool, else opened directly.

        Raises:
            django.db.OperationalError (through Django's error wrapper): no
                connection within the pool's ``timeout`` (the cause chain holds
                :class:`~orbitive.clients.PoolTimeout`), the pool is closed, or
                too many callers of this process wait; a failed connect raises
                psycopg's error, as without a pool.
            ImproperlyConfigured: as :attr:`pool`, or a bad
                ``OPTIONS["isolation_level"]``.
        """
        pool = self._pooled(conn_params)
        if pool is None:
            return super().get_new_connection(conn_params)
        level = _isolation_level(self.settings_dict["OPTIONS"])
        self.isolation_level = IsolationLevel.READ_COMMITTED if level is None else level
        conn = _checkout(pool)
        if level is not None:
            try:
                conn.isolation_level = level
            except BaseException:
                pool.putconn(conn)
                raise
        self._orbit_pool = pool
        return conn

    def _close(self) -> None:
        pool, self._orbit_pool = self._orbit_pool, None
        conn = self.connection
        if conn is None:
            return
        with self.wrap_database_errors:
            if pool is None:  # opened directly: closed as without a pool
                conn.close()
                return
            self.connection = None  # never handed back twice, whatever putconn raises
            if self._orbit_unusable:
                pool.clients.discard(conn)
            else:
                pool.putconn(conn)

    # Django 5.1 added the next two checks for its pool, whose close leaves no
    # connection behind; the engine needs them on Django 4.2 as well.

    @async_unsafe
    def ensure_connection(self) -> None:
        """Connect unless connected; never inside an atomic block whose connection closed.

        Raises:
            django.db.ProgrammingError: the connection was closed inside the
                atomic block that is still open.
            As :meth:`get_new_connection`.
        """
        if self.connection is None and self.in_atomic_block and self.closed_in_transaction:
            raise ProgrammingError("Cannot open a new connection in an atomic block.")
        super().ensure_connection()

    def is_usable(self) -> bool:
        """Whether the connection answers a query; False when there is none."""
        return self.connection is not None and super().is_usable()

    def close_if_health_check_failed(self) -> None:
        """As without a pool: a connection that fails the check is closed, not handed back.

        Django 5.1's pool skips this check. Here a pooled connection outlives
        a request only when ``CONN_MAX_AGE`` was changed after the pool was
        built; it is then checked as Django checks a persistent one. Each
        checkout is checked by the pool when ``CONN_HEALTH_CHECKS`` is True.
        """
        self._orbit_unusable = True  # the check calls close() only for a failed connection
        try:
            BaseDatabaseWrapper.close_if_health_check_failed(self)
        finally:
            self._orbit_unusable = False

    def _after_fork_in_child(self) -> None:
        """In a forked child, let go of the parent's connection without a word on its socket.

        The connection is kept (never closed or collected here); inside an
        atomic block the wrapper is left as :meth:`close` leaves it there.
        """
        if self.connection is None:
            return
        POOLS.keep(self.connection)
        self.connection = None
        self._orbit_pool = None
        if self.in_atomic_block:
            self.closed_in_transaction = True
            self.needs_rollback = True


def _checkout(pool: ConnectionPool) -> psycopg.Connection[Any]:
    """``pool.getconn()`` with the errors Django maps: psycopg's, as a connect raises them."""
    try:
        return pool.getconn()
    except ClientCreateError as error:
        if isinstance(error.__cause__, psycopg.Error):
            raise error.__cause__ from None  # the connect's own error, as without a pool
        raise
    except (PoolTimeout, PoolClosed, TooManyRequests) as error:
        raise psycopg.OperationalError(str(error)) from error


def _isolation_level(options: dict[str, Any]) -> IsolationLevel | None:
    """``OPTIONS["isolation_level"]`` as Django reads it; None when not given.

    Raises:
        ImproperlyConfigured: not one of psycopg's isolation levels.
    """
    if "isolation_level" not in options:
        return None
    value = options["isolation_level"]
    try:
        return IsolationLevel(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"Invalid transaction isolation level {value} specified. "
            "Use one of the psycopg.IsolationLevel values."
        ) from None


def _key(alias: str, params: dict[str, Any]) -> str:
    """The pool key: the alias and the server, database and user (never the password)."""
    parts = [params.get(name, "") for name in ("host", "port", "dbname", "user", "service")]
    return "\0".join(["django", alias, *map(str, parts)])
