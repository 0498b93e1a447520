"""orbitive: keyed leases, a fleet-wide resource pool and named locks for sibling processes.

Public namespaces: :mod:`orbitive` (this module: :class:`Fleet`, :class:`OrbitError`),
:mod:`orbitive.lock`, :mod:`orbitive.store`, :mod:`orbitive.pool` and
:mod:`orbitive.pool.session`.
"""

from __future__ import annotations

from ._errors import OrbitError
from ._fleet import Fleet

__version__ = "0.1.0"
__all__ = ["Fleet", "OrbitError", "__version__"]

for _obj in (Fleet, OrbitError):
    _obj.__module__ = __name__
del _obj
