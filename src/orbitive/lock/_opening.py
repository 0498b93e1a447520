"""Opening a LockTable: its arguments, its two shared objects and its C operations.

A table maps the fleet's state object (the slots, with a section of
``layout.stripes`` robust mutexes) and its transition ring. Where the C module
is built and the section is a robust mutex, :func:`c_steps` makes the C
operations for this process's node; a forked child makes its own (the parent's
are bound to the parent's node and fork generation).
"""

from __future__ import annotations

from typing import Final

from .._core import _fork, _native, _section
from .._core._errors import InvalidArgumentType
from .._core._fleet import Fleet
from .._core._region import Region
from . import _events, _steps
from ._layout import LockLayout
from ._ring import Ring
from ._types import Acquired, LockKey, LockLease, LockOwner, Occupied

try:
    from ._fastpath import Steps
except ImportError:  # not built (no C compiler): the Python steps are used
    Steps = None  # type: ignore[assignment, misc]

#: What a table without its C operations costs (``bench/instructions.py``, docs/performance.md).
PYTHON_COST: Final = (
    "the lock table's operations run in Python, holding its whole section: an acquire + "
    "release pair costs about 135 times as many instructions as its C call (some 85 us "
    "instead of 0.6 us)"
)
#: The value types the C operations read and build, in their order.
_TYPES = (LockKey, LockOwner, LockLease, Acquired, Occupied)


def not_a(what: str, expected: str, value: object) -> InvalidArgumentType:
    """The error for an argument ``value`` that is not the ``expected`` type."""
    return InvalidArgumentType(f"{what} must be a {expected}, not {type(value).__name__}")


def open_objects(fleet: Fleet, layout: LockLayout | None) -> tuple[LockLayout, Region, Ring]:
    """The checked layout (None: the default), the state object and the ring of ``fleet``.

    Raises:
        InvalidArgumentType: ``fleet`` is not a Fleet or ``layout`` not a LockLayout.
        LayoutMismatch: an existing object has another layout or section mechanism.
        AccessDenied: an object or ``/dev/shm`` is not exclusively ours.
        ShmFull: ``/dev/shm`` has no room for the new objects; neither is left behind.
    """
    if not isinstance(fleet, Fleet):
        raise not_a("fleet", "Fleet", fleet)
    if layout is None:
        layout = LockLayout.default()
    elif type(layout) is not LockLayout:
        raise not_a("layout", "LockLayout", layout)
    geometry = layout.ring_geometry(fleet.capacity)
    with fleet.creating([(layout.state_kind, layout.state_size), (geometry.kind, geometry.size)]):
        state = fleet.region(
            layout.state_kind,
            layout.state_size,
            layout.init_state,
            layout.validate_state,
            layout.stripes,
        )
        ring = Ring(fleet, geometry, _events.EVENT_HEADER)
    return layout, state, ring


def c_steps(
    state: Region, ring: Ring, reference: _steps.ReferenceSteps, table: object
) -> Steps | None:
    """The C operations of ``table`` for ``reference``'s node (None: the Python steps run).

    None when this process only observes (node -1), the state's section is not a
    robust mutex the C code can lock, or the module is not built; the last one also
    warns (:func:`~.._core._native.warn_python_steps`, once per process).
    """
    section = state.section
    if reference.node < 0 or section is None or section.mechanism != _section.ROBUST_MUTEX:
        return None
    if Steps is None:
        _native.warn_python_steps("orbitive.lock._fastpath", PYTHON_COST)
        return None
    geometry = ring.geometry
    steps = Steps(
        reference.buf,
        ring.buf,
        state.block,
        reference.mask + 1,
        reference.stride,
        reference.payload_max,
        geometry.lane_count,
        geometry.heads_offset,
        geometry.slots_offset,
        geometry.capacity,
        geometry.stride,
        geometry.frame_bytes,
        reference.node,
        reference.id_base,
        ring.channel.signal,
        section.stripes,
        _TYPES,
        _fork,
        table,
        _steps,
        state.report_repaired,
    )
    state.on_close(steps.close)
    return steps
