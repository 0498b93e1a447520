"""This process's pools, one per database alias, and the fleets they count in.

Django keeps its psycopg_pool pools in a class-level dict, which a child forked
by a preloading server inherits together with the parent's sockets, so two
processes speak on one connection (Django tickets #36957 and #31637). Here the
pools and the fleets belong to one process life. A forked child starts with
none and builds its own on its first connection; what it inherited is kept,
untouched, for its whole life, so that neither a close nor a collection in the
child sends anything on the parent's sockets (the parent's connections are
closed by the parent alone). A pool is built once per alias and settings; a
change of settings (a test database, a new time zone) closes the old pool of
that alias in this process. At interpreter exit the process closes its pools:
their idle connections end at once and their share of ``max_live`` returns.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from django.core.exceptions import ImproperlyConfigured

from ..._core import _fork
from ..._core._errors import FleetError, InvalidCapacity
from ..._core._fleet import Fleet
from ..psycopg import ConnectionPool
from ._settings import PoolSettings


class _Built(NamedTuple):
    """A pool and copies of what it was made with."""

    pool: ConnectionPool
    params: dict[str, Any]
    options: dict[str, Any]


class Pools:
    """The pools and fleets of this process life, by alias and by fleet name."""

    def __init__(self) -> None:
        self._inherited: list[object] = []  # a forked child's parent state, never touched
        self._start()
        _fork.register(self)

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._fleets: dict[str, Fleet] = {}
        self._pools: dict[str, _Built] = {}

    def _after_fork_in_child(self) -> None:
        self._inherited.append((self._fleets, self._pools))
        self._start()

    def get(
        self,
        alias: str,
        params: dict[str, Any],
        options: dict[str, Any],
        build: Callable[[Pools], ConnectionPool],
    ) -> ConnectionPool:
        """The pool of ``alias`` made with ``params`` and ``options``, built now if there
        is none.

        A pool of the alias made with other ones (a test database's name, a new
        time zone) is closed first (in this process; connections checked out of
        it close as they come back), so one process never has two pools of one
        key. The two are compared with ``==`` (a dict comparison, a fraction of a
        microsecond: it runs on every checkout) against copies taken at build.

        Args:
            alias: the database alias.
            params: Django's connect arguments for the alias.
            options: the alias's ``OPTIONS`` (its ``"pool"`` among them).
            build: makes the pool; it joins the fleet with :meth:`fleet`.

        Returns:
            This process's pool of the alias.

        Raises:
            As ``build``.
        """
        found = self._pools.get(alias)  # one dict read: the hot path takes no lock
        if found is not None and found.params == params and found.options == options:
            return found.pool
        with self._lock:
            found = self._pools.pop(alias, None)
            if found is not None and found.params == params and found.options == options:
                self._pools[alias] = found
                return found.pool
            if found is not None:
                found.pool.close()
            pool = build(self)
            self._pools[alias] = _Built(pool, _copied(params), _copied(options))
        return pool

    def fleet(self, settings: PoolSettings) -> Fleet:
        """This process's member of the settings' fleet, joined on first use.

        Raises:
            ImproperlyConfigured: the fleet exists with another capacity, another
                database names it with another capacity, or every node is held.
        """
        fleet = self._fleets.get(settings.fleet)
        if fleet is not None:
            if settings.fleet_capacity not in (None, fleet.capacity):
                raise ImproperlyConfigured(
                    f"two databases name fleet {settings.fleet!r} with different "
                    f"fleet_capacity ({fleet.capacity} and {settings.fleet_capacity})"
                )
            return fleet
        try:
            fleet = Fleet.join(settings.fleet, settings.fleet_capacity)
        except (InvalidCapacity, FleetError) as error:
            raise ImproperlyConfigured(f"OPTIONS['pool']['fleet_capacity']: {error}") from error
        self._fleets[settings.fleet] = fleet
        return fleet

    def keep(self, inherited: object) -> None:
        """Hold ``inherited`` (a forked child's copy of a parent's connection) for this
        process's life, so that it is never closed or collected here."""
        self._inherited.append(inherited)

    def close(self, alias: str) -> None:
        """Close the pool of ``alias`` in this process, if it has one. Idempotent."""
        with self._lock:
            found = self._pools.pop(alias, None)
        if found is not None:
            found.pool.close()

    def close_all(self) -> None:
        """Close every pool of this process life, then leave its fleets."""
        with self._lock:
            pools, self._pools = self._pools, {}
            fleets, self._fleets = self._fleets, {}
        for built in pools.values():
            built.pool.close()
        for fleet in fleets.values():
            fleet.close()

    def __repr__(self) -> str:
        return f"<Pools aliases={sorted(self._pools)} fleets={sorted(self._fleets)}>"


def _copied(settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``settings`` whose dicts are copies too (a later change in place shows)."""
    return {
        name: _copied(value) if isinstance(value, dict) else value
        for name, value in settings.items()
    }


#: The one registry of this process.
POOLS: Final = Pools()
atexit.register(POOLS.close_all)
