"""orbitive: keyed leases, a fleet-wide resource pool and named locks for sibling processes.

Public namespaces: :mod:`orbitive` (this module: :class:`Fleet`, :class:`OrbitError`
and the errors shared by every layer), :mod:`orbitive.lock`, :mod:`orbitive.store`,
:mod:`orbitive.pool` and :mod:`orbitive.pool.session`.
"""

from __future__ import annotations

from ._core._errors import (
    AccessDenied,
    FleetError,
    InvalidArgumentType,
    InvalidCapacity,
    InvalidLayout,
    InvalidName,
    LayoutMismatch,
    NodeOutsideFleet,
    OrbitError,
)
from ._core._fleet import Fleet

__version__ = "0.1.0"
__all__ = [
    "AccessDenied",
    "Fleet",
    "FleetError",
    "InvalidArgumentType",
    "InvalidCapacity",
    "InvalidLayout",
    "InvalidName",
    "LayoutMismatch",
    "NodeOutsideFleet",
    "OrbitError",
    "__version__",
]

for _name in __all__:  # tracebacks and reprs name the public module
    if isinstance(globals()[_name], type):
        globals()[_name].__module__ = __name__
del _name
