"""orbitive: keyed leases, a fleet-wide resource pool and named locks for sibling processes.

Public namespaces: :mod:`orbitive` (this module: :class:`Fleet`, :class:`OrbitError`
and the errors shared by every layer), :mod:`orbitive.lock` (keyed leases in shared
memory), :mod:`orbitive.store` (named locks on SQLite, PostgreSQL, Redis or shared
memory), :mod:`orbitive.pool` and :mod:`orbitive.pool.session` (the fleet-wide
resource pool), and :mod:`orbitive.clients` (a connection pool capped host-wide, with
its psycopg and SQLAlchemy adapters).

orbitive logs its lifecycle events (a section repaired after its holder died, a
member's death found, a lease lost, a client retired or not created, a store that
went unavailable and came back) through :mod:`logging`, on the ``orbitive`` logger's
children (``orbitive.fleet``, ``orbitive.lock``, ``orbitive.pool``,
``orbitive.store``, ``orbitive.clients``), and nothing on a hot path's success. It
configures no handler but a :class:`logging.NullHandler`: the records go wherever
the application sends them, for example ``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

import logging

from ._core._errors import (
    AccessDenied,
    CapacityMismatch,
    FleetError,
    InvalidArgumentType,
    InvalidCapacity,
    InvalidLayout,
    InvalidName,
    LayoutMismatch,
    NodeOutsideFleet,
    OrbitError,
    ShmFull,
)
from ._core._fleet import Fleet
from ._core._native import native

__version__ = "0.1.0"
logging.getLogger(__name__).addHandler(logging.NullHandler())
__all__ = [
    "AccessDenied",
    "CapacityMismatch",
    "Fleet",
    "FleetError",
    "InvalidArgumentType",
    "InvalidCapacity",
    "InvalidLayout",
    "InvalidName",
    "LayoutMismatch",
    "NodeOutsideFleet",
    "OrbitError",
    "ShmFull",
    "__version__",
    "native",
]

for _name in __all__:  # tracebacks and reprs name the public module
    if isinstance(globals()[_name], type):
        globals()[_name].__module__ = __name__
del _name
