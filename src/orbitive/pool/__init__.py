"""Fleet-wide resource leases over shared memory (seed 003).

Who has a free one, and may I have it: processes of one fleet register the
resources they own (a warm connection, say) under a :class:`Key`; any process
may reserve a unit of any of them as a :class:`Lease`, carry it to the owner
(see :mod:`orbitive.pool.session`), and the owner accepts it and completes the
:class:`Execution` when the work is over. Nothing moves between processes but
numbers: the resource stays where it is.
"""

from __future__ import annotations

from ._deaths import DeathWatch
from ._layout import POOL_KIND  # noqa: F401 - public outside __all__ (EXTRAS)
from ._plan import (
    Create,
    Decision,
    Limits,
    LocalFirst,
    LocalOnly,
    LocalReuse,
    Plan,  # noqa: F401 - public outside __all__ (EXTRAS)
    Policy,
    Reject,
    RemoteReuse,
    Wait,
)
from ._pool import CreationPermit, Execution, Pool
from ._stats import KeyStatistics, PoolStatistics, ResourceStatistics
from ._values import Candidate, Incarnation, Key, Lease, ResourceId

#: Exactly the names of the API contract (api.md). Also public, outside ``__all__``:
#: Decision (what a Policy returns), Plan, DeathWatch, the statistics classes and
#: POOL_KIND (listed in ``EXTRAS``).
__all__ = [
    "Candidate",
    "Create",
    "CreationPermit",
    "Execution",
    "Incarnation",
    "Key",
    "Lease",
    "Limits",
    "LocalFirst",
    "LocalOnly",
    "LocalReuse",
    "Policy",
    "Pool",
    "Reject",
    "RemoteReuse",
    "ResourceId",
    "Wait",
]

EXTRAS = ("Decision", "Plan", "DeathWatch", "KeyStatistics", "PoolStatistics",
          "ResourceStatistics", "POOL_KIND")  # fmt: skip
_PUBLIC_CLASSES = (
    *(globals()[_name] for _name in __all__),
    Decision,
    DeathWatch,
    KeyStatistics,
    PoolStatistics,
    ResourceStatistics,
)
for _cls in _PUBLIC_CLASSES:
    _cls.__module__ = __name__
del _cls
