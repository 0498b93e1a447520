"""Opening a Pool: who may open one, on which table geometry, bound to which process life.

A member with a node owns and leases resources; an observer (a shared fleet
without a node) may only read the table, through ``orbit pool``. The geometry
is the fleet's capacity and the key and lane capacities, explicit or from the
environment (:func:`~._layout.env_geometry`). The table is the process's one
instance for that fleet and geometry, bound to this node and process life.
"""

from __future__ import annotations

from .._errors import FleetError, MalformedError, shown
from .._fleet import Fleet
from ._layout import Layout, check_capacity, env_geometry
from ._table import Table, table_for
from ._values import Incarnation


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
    table.bind(fleet.node, fleet.incarnation if incarnation is None else incarnation.value)
    return table
