"""What makes :mod:`orbitive.clients.psycopg` a psycopg_pool look-alike.

* Its errors: :class:`PoolTimeout`, :class:`PoolClosed` and :class:`TooManyRequests`
  are orbitive's own (``except orbitive.clients.PoolTimeout`` catches them) and
  psycopg_pool's too when psycopg_pool is installed, so an application's
  ``except psycopg_pool.PoolTimeout`` keeps working (without psycopg_pool, they
  are ``psycopg.OperationalError``\\s, as psycopg_pool's are).
* psycopg_pool's arguments: those whose meaning carries over set the
  :class:`~orbitive.clients.PoolOptions` field that has it; those whose meaning
  cannot (``min_size``, ``max_size``: sizes of one process's pool) raise
  :class:`~orbitive.clients.InvalidPoolOptions` naming the host-wide equivalent.
* ``get_stats()``: psycopg_pool's keys, with their meaning for a host-wide pool.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import psycopg

from .._core import _errors
from .._core._errors import InvalidPoolOptions, OrbitError, shown
from ._options import SIZE_MAX, PoolOptions
from ._statistics import ClientPoolStatistics

if TYPE_CHECKING:
    _TimeoutBase = psycopg.OperationalError
    _ClosedBase = psycopg.OperationalError
    _TooManyBase = psycopg.OperationalError
else:
    try:  # psycopg_pool's own classes, when it is installed; never a dependency
        from psycopg_pool import PoolClosed as _ClosedBase
        from psycopg_pool import PoolTimeout as _TimeoutBase
        from psycopg_pool import TooManyRequests as _TooManyBase
    except ImportError:
        _TimeoutBase = _ClosedBase = _TooManyBase = psycopg.OperationalError


class _PsycopgError:
    """What ``psycopg.Error`` expects of an instance that its ``__init__`` never saw."""

    _info: Any = None
    _encoding: str = "utf-8"
    _pgconn: Any = None


class PoolTimeout(_errors.PoolTimeout, _TimeoutBase, _PsycopgError):
    """No connection within the timeout: an ``orbitive.clients.PoolTimeout`` (a
    ``TimeoutError``), and a ``psycopg_pool.PoolTimeout`` when psycopg_pool is installed."""


class PoolClosed(_errors.PoolClosed, _ClosedBase, _PsycopgError):
    """The pool is closed, or not open yet: an ``orbitive.clients.PoolClosed``, and a
    ``psycopg_pool.PoolClosed`` when psycopg_pool is installed."""


class TooManyRequests(_errors.TooManyRequests, _TooManyBase, _PsycopgError):
    """``max_waiting`` callers of this process already wait: an
    ``orbitive.clients.TooManyRequests``, and a ``psycopg_pool.TooManyRequests`` when
    psycopg_pool is installed."""


_ADAPTED: Final[dict[type[OrbitError], type[OrbitError]]] = {
    _errors.PoolTimeout: PoolTimeout,
    _errors.PoolClosed: PoolClosed,
    _errors.TooManyRequests: TooManyRequests,
}


def adapted(error: OrbitError) -> OrbitError:
    """``error`` as the adapter's class of it (same message and attributes), or itself."""
    cls = _ADAPTED.get(type(error))
    if cls is None:
        return error
    twin = cls(error.message)
    twin.__dict__.update(error.__dict__)
    return twin


# -- psycopg_pool's arguments -----------------------------------------------------------

#: Not given (None is a value for some of psycopg_pool's arguments).
UNSET: Final[Any] = object()

#: psycopg_pool arguments whose meaning cannot carry over, and what to use instead.
REFUSED: Final = {
    "min_size": "psycopg_pool's min_size is one process's floor; the floor here is host-wide: "
    "options=PoolOptions(min_idle=N), idle connections the whole fleet keeps warm",
    "max_size": "psycopg_pool's max_size caps one process; the cap here is host-wide: "
    "options=PoolOptions(max_live=N), connections of every process of the fleet together",
    "num_workers": "there are no worker threads: a connection is made by the caller that "
    "needs one, within max_live",
    "reconnect_timeout": "a connect that fails raises ClientCreateError at once (its error "
    "is the __cause__); nothing reconnects in the background",
    "reconnect_failed": "a connect that fails raises ClientCreateError at once (its error "
    "is the __cause__); nothing reconnects in the background",
}


def refuse(given: dict[str, object]) -> None:
    """Raise for the first psycopg_pool argument of :data:`REFUSED` that was given.

    Raises:
        InvalidPoolOptions: naming the argument and its host-wide equivalent.
    """
    for name, value in given.items():
        if value is not UNSET:
            raise InvalidPoolOptions(f"{name}={shown(value)}: {REFUSED[name]}", key=name)


def options_with(
    options: PoolOptions | None,
    *,
    timeout: object,
    max_waiting: object,
    max_lifetime: object,
    max_idle: object,
) -> PoolOptions:
    """``options`` with psycopg_pool's arguments that carry over, where given.

    ``timeout`` (seconds) is ``acquire_timeout``; ``max_waiting`` (this process's
    waiting callers; 0: no limit) is ``max_waiting``; ``max_lifetime`` (seconds)
    is ``max_lifetime``; ``max_idle`` (seconds a connection may stay idle, as in
    psycopg_pool, not a count) is ``idle_timeout``.

    Raises:
        InvalidPoolOptions: a value breaks the ``PoolOptions`` rule it lands in.
    """
    changes: dict[str, Any] = {}
    for field, value in (
        ("acquire_timeout", timeout),
        ("max_lifetime", max_lifetime),
        ("idle_timeout", max_idle),
    ):
        if value is not UNSET:
            changes[field] = value
    if max_waiting is not UNSET:
        changes["max_waiting"] = SIZE_MAX if max_waiting == 0 else max_waiting
    base = PoolOptions() if options is None else options
    return dataclasses.replace(base, **changes) if changes else base


# -- get_stats -------------------------------------------------------------------------------


class Stats:
    """psycopg_pool's statistics, kept by one adapter pool.

    Counters count what this process's pool object did since it was built or
    last popped, and appear, as in psycopg_pool, once counted (``requests_queued``
    and ``requests_wait_ms`` once a checkout waited); measures are read at the
    call, host-wide (see ``ConnectionPool.get_stats``).
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._popped: Counter[str] = Counter()  # the pool's own counters at the last pop

    def snapshot(
        self, options: PoolOptions, statistics: ClientPoolStatistics | None, *, pop: bool
    ) -> dict[str, int]:
        """The counters and the measures; ``pop`` starts the counters again at zero."""
        counts = {**self.counts, **self._pool_counts(statistics)}
        if pop:
            self.counts = Counter()
            self._popped.update(self._pool_counts(statistics))
        measures = {
            "pool_min": options.min_idle,
            "pool_max": options.max_live,
            "pool_size": 0 if statistics is None else statistics.live + statistics.creating,
            "pool_available": 0 if statistics is None else statistics.idle,
            "requests_waiting": 0 if statistics is None else statistics.waiting,
        }
        return {**counts, **measures}

    def _pool_counts(self, statistics: ClientPoolStatistics | None) -> dict[str, int]:
        """What the ClientPool counted that psycopg_pool's keys name, since the last pop:
        its checkouts that waited at ``max_live`` (whatever came of it), and their wait."""
        if statistics is None:
            return {}
        queued = statistics.queued_count - self._popped["requests_queued"]
        if not queued:
            return {}
        waited = round(statistics.waited_s * 1000.0) - self._popped["requests_wait_ms"]
        return {"requests_queued": queued, "requests_wait_ms": waited}
