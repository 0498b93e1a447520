"""Fleet-wide resource leases over shared memory (the pool contract, docs/architecture.md).

Who has a free one, and may I have it: processes of one fleet register the
resources they own (a warm connection, say) under a :class:`Key`; any process
may reserve a unit of any of them as a :class:`Lease`, carry it to the owner
(see :mod:`orbitive.pool.session`), and the owner accepts it and completes the
:class:`Execution` when the work is over. Nothing moves between processes but
numbers: the resource stays where it is.
"""

from __future__ import annotations

from .._core._errors import (
    BusyError,
    CreationBudgetError,
    DrainingError,
    KeyFullError,
    LaneFullError,
    LayoutMismatch,
    MalformedError,
    NotOwnerError,
    NotReservedError,
    StaleError,
)
from ._deaths import DeathWatch
from ._execution import CreationPermit, Execution
from ._layout import POOL_KIND
from ._plan import (
    Create,
    Decision,
    Limits,
    LocalFirst,
    LocalOnly,
    LocalReuse,
    Plan,
    Policy,
    Reject,
    RemoteReuse,
    Wait,
)
from ._pool import Pool
from ._stats import KeyStatistics, PoolStatistics, ResourceStatistics
from ._values import Candidate, Incarnation, Key, Lease, ResourceId

#: The names of the pool contract, then what a custom Policy, the death helper
#: and ``statistics()`` need, then the pool's errors.
__all__ = [
    "POOL_KIND",
    "BusyError",
    "Candidate",
    "Create",
    "CreationBudgetError",
    "CreationPermit",
    "DeathWatch",
    "Decision",
    "DrainingError",
    "Execution",
    "Incarnation",
    "Key",
    "KeyFullError",
    "KeyStatistics",
    "LaneFullError",
    "LayoutMismatch",
    "Lease",
    "Limits",
    "LocalFirst",
    "LocalOnly",
    "LocalReuse",
    "MalformedError",
    "NotOwnerError",
    "NotReservedError",
    "Plan",
    "Policy",
    "Pool",
    "PoolStatistics",
    "Reject",
    "RemoteReuse",
    "ResourceId",
    "ResourceStatistics",
    "StaleError",
    "Wait",
]

for _cls in (
    BusyError,
    Candidate,
    Create,
    CreationBudgetError,
    CreationPermit,
    DeathWatch,
    Decision,
    DrainingError,
    Execution,
    Incarnation,
    Key,
    KeyFullError,
    KeyStatistics,
    LaneFullError,
    Lease,
    Limits,
    LocalFirst,
    LocalOnly,
    LocalReuse,
    MalformedError,
    NotOwnerError,
    NotReservedError,
    Policy,
    Pool,
    PoolStatistics,
    Reject,
    RemoteReuse,
    ResourceId,
    ResourceStatistics,
    StaleError,
    Wait,
):
    if _cls.__module__ != __name__:  # the C Execution is named orbitive.pool.Execution already
        _cls.__module__ = __name__
del _cls
