"""Opening a Pool: who may open one, on which table geometry, bound to which process life.

A member with a node owns and leases resources; an observer (a shared fleet
without a node) may only read the table, through ``orbit pool``. The geometry
is the fleet's capacity and the key and lane capacities, explicit or from the
environment (:func:`~._layout.env_geometry`). The table is the process's one
instance for that fleet and geometry (:func:`table_for`), bound to this node and
process life; :func:`operations_for` makes the C operations a Pool binds over it.
"""

from __future__ import annotations

import weakref
from typing import Final

from .._core import _fork, _native
from .._core._errors import FleetError, MalformedError, shown
from .._core._fleet import Fleet
from .._core._readiness import BACKEND
from .._core._region import Region
from .._core._section import ROBUST_MUTEX
from ._layout import Layout, check_capacity, env_geometry
from ._table import Table
from ._values import Incarnation, Lease, ResourceId

#: What a pool without its C operations costs (``bench/instructions.py``, docs/performance.md).
PYTHON_COST: Final = (
    "the pool table's operations run in Python: a local reuse cycle (reserve, accept, "
    "complete) costs about 30 times as many instructions as its C calls"
)

try:
    from ._fastpath import Operations
except ImportError:  # not built (no C compiler): the Python operations are used
    Operations = None  # type: ignore[assignment, misc]


def open_table(
    fleet: Fleet,
    incarnation: Incarnation | None,
    kind: int,
    key_capacity: int | None,
    lane_capacity: int | None,
) -> Table:
    """The table a new ``Pool(fleet, incarnation, ...)`` binds (raises as ``Pool`` documents)."""
    if not isinstance(fleet, Fleet):
        raise MalformedError(f"Pool needs a Fleet, got {type(fleet).__name__}")
    if incarnation is not None and type(incarnation) is not Incarnation:
        raise MalformedError(f"incarnation must be an Incarnation, got {shown(incarnation)}")
    if type(kind) is not int or not 0 <= kind <= 255:
        raise MalformedError(f"pool kind must be an int in 0..255, got {shown(kind)}")
    if fleet.shared and fleet.node < 0:
        raise FleetError(
            f"fleet {fleet.name!r} is an observer (no node): it cannot own or lease "
            "resources; use `orbit pool` to inspect the table",
            fleet=fleet.name,
        )
    keys, lane = env_geometry()
    layout = Layout(
        kind,
        fleet.capacity,
        keys if key_capacity is None else check_capacity(key_capacity, "key_capacity"),
        lane if lane_capacity is None else check_capacity(lane_capacity, "lane_capacity"),
    )
    table = table_for(fleet, layout)
    life = fleet.incarnation
    table.bind(fleet.node, life if incarnation is None else incarnation.value, life)
    return table


_tables: weakref.WeakKeyDictionary[Region, Table] = weakref.WeakKeyDictionary()


def operations_for(pool: object, table: Table) -> Operations | None:
    """``pool``'s reserve and accept over ``table`` as C calls, where they can run.

    They need the C module, the table's section to be the robust mutex (the C
    operations lock it themselves) and readiness to wake by futex (they bump
    the key's change word themselves); otherwise None: the Python operations run.
    A missing module also warns (:func:`~.._core._native.warn_python_steps`, once
    per process).
    """
    section = table.region.section
    if section is None or section.mechanism != ROBUST_MUTEX:
        return None
    if BACKEND.NAME != "futex" or table.node < 0:
        return None
    if Operations is None:
        _native.warn_python_steps("orbitive.pool._fastpath", PYTHON_COST)
        return None
    return Operations(
        table.buf,
        table.region.block,
        table.res_base,
        table.layout.size,
        table.kind,
        table.fleet_capacity,
        table.lane_capacity,
        table.key_base,
        table.key_stride,
        table.key_capacity,
        table.key_interest,
        table.key_claims,
        table.key_waiters,
        table.key_members,
        table.bell,
        table.node,
        table.incarnation,
        ResourceId,
        Lease,
        _fork,
        pool,
        table,
        table.region.report_repaired,
    )


def table_for(fleet: Fleet, layout: Layout) -> Table:
    """This process's Table for ``fleet``'s pool region of ``layout`` (one per region)."""
    region = fleet.region(layout.kind, layout.size, layout.init, layout.validate)
    table = _tables.get(region)
    if table is None:
        table = _tables[region] = Table(region, layout)
    elif table.layout != layout:
        raise MalformedError(
            f"this process opened pool kind {layout.kind} of fleet {fleet.name!r} with "
            f"another geometry ({table.layout})",
            fleet=fleet.name,
            kind=layout.kind,
        )
    return table
