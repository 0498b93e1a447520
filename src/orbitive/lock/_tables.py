"""The lock tables of a fleet, found by their kinds and opened with the geometry they have.

A fleet can hold two: the default ``LockTable`` (kinds 228 and 229, the geometry of
whoever created it, ``ORBIT_LOCK_*`` included) and the ``shm://`` store's table
(kinds 230 and 231, ``orbitive.store``'s ``STORE_LAYOUT``). Both headers are read
first, so ``orbit locks``, ``watch``, ``force-release`` and :mod:`orbitive.metrics`
never need the creator's environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._core._errors import InvalidLayout, LayoutMismatch
from .._core._fleet import Fleet
from .._core._region import object_name, object_size, read_prefix
from ._layout import (
    DEFAULT_EVENT_KIND,
    DEFAULT_STATE_KIND,
    HEADER,
    STORE_EVENT_KIND,
    STORE_STATE_KIND,
    LockLayout,
)
from ._lock_table import LockTable
from ._ring import _HEADER as RING_HEADER
from ._ring import lane_count_of

#: (state kind, event kind) of every lock table a fleet may hold, in display order.
TABLE_KINDS = (
    (DEFAULT_STATE_KIND, DEFAULT_EVENT_KIND),
    (STORE_STATE_KIND, STORE_EVENT_KIND),
)


def existing_layout(fleet: str, state_kind: int, event_kind: int) -> tuple[LockLayout, int] | None:
    """The layout and lane count of the fleet's table at these kinds, or None if absent.

    Raises:
        LayoutMismatch: an object exists but its header is not a lock table's.
        AccessDenied: an object is not exclusively ours.
    """
    lanes = lane_count_of(fleet, event_kind)
    state_name = object_name(fleet, state_kind)
    if lanes is None or object_size(state_name) is None:
        return None
    *_, capacity, _slot_size, payload_max = HEADER.unpack_from(read_prefix(state_name, HEADER.size))
    ring = RING_HEADER.unpack_from(read_prefix(object_name(fleet, event_kind), RING_HEADER.size))
    try:
        layout = LockLayout(state_kind, event_kind, capacity, payload_max, ring[4], ring[5])
    except InvalidLayout as error:
        raise LayoutMismatch(
            f"fleet {fleet!r} kinds {state_kind}/{event_kind}: {error.message}", kind=state_kind
        ) from None
    return layout, lanes


@contextlib.contextmanager
def open_tables(fleet: str, *, observe: bool) -> Iterator[list[LockTable]]:
    """Every lock table of ``fleet`` (none: an empty list), on one observer view or one
    joined node; all closed, and the node given back, when the block ends.

    Raises:
        FleetError: ``observe`` is False and every node of the fleet is held.
        LayoutMismatch, AccessDenied: as for :func:`existing_layout`.
    """
    found = [existing_layout(fleet, *kinds) for kinds in TABLE_KINDS]
    layouts = [layout for layout in found if layout is not None]
    if not layouts:
        yield []
        return
    lanes = layouts[0][1]
    with Fleet.observe(fleet, lanes) if observe else Fleet.join(fleet, lanes) as member:
        tables: list[LockTable] = []
        try:
            for layout, _ in layouts:
                tables.append(LockTable(member, layout))
            yield tables
        finally:
            for table in tables:
                table.close()
