"""A fleet-wide client pool: cap a host's live connections across worker processes.

Every process keeps its own clients (connections), and the fleet's pool table
counts them all under one key, so ``max_live``, ``min_idle`` and ``max_idle``
hold host-wide: 8 gunicorn workers with ``max_live=4`` open at most 4
connections between them. A finished client stays idle only while the fleet
has fewer than ``max_idle`` idle ones, and an idle client is retired when
another process waits at ``max_live``, so it never strands that waiter. Dead
workers' clients and claims come back within a fraction of a second, with no
supervisor.

Adapters: :mod:`orbitive.clients.psycopg` (a psycopg_pool-like
``ConnectionPool``) and :mod:`orbitive.clients.sqlalchemy` (a pool for
``create_engine``).

Across hosts, a :class:`Budget` caps the pools of every host that name it:
their live clients never exceed its ``total`` between them, with the units
held as counting leases in PostgreSQL or Redis.
"""

from __future__ import annotations

from .._core._errors import (
    BudgetMismatch,
    BudgetUnavailable,
    ClientCreateError,
    InvalidBudget,
    InvalidPoolOptions,
    PoolClosed,
    PoolTimeout,
    RemoteRequestError,
    TooManyRequests,
    UnknownClient,
    UnsafeCoordinator,
)
from ._budget import Budget
from ._client_pool import ClientPool
from ._options import PoolOptions
from ._statistics import ClientPoolStatistics

__all__ = [
    "Budget",
    "BudgetMismatch",
    "BudgetUnavailable",
    "ClientCreateError",
    "ClientPool",
    "ClientPoolStatistics",
    "InvalidBudget",
    "InvalidPoolOptions",
    "PoolClosed",
    "PoolOptions",
    "PoolTimeout",
    "RemoteRequestError",
    "TooManyRequests",
    "UnknownClient",
    "UnsafeCoordinator",
]

for _cls in (
    Budget,
    BudgetMismatch,
    BudgetUnavailable,
    ClientCreateError,
    ClientPool,
    ClientPoolStatistics,
    InvalidBudget,
    InvalidPoolOptions,
    PoolClosed,
    PoolOptions,
    PoolTimeout,
    RemoteRequestError,
    TooManyRequests,
    UnknownClient,
    UnsafeCoordinator,
):
    _cls.__module__ = __name__
del _cls
