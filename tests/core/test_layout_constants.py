"""Every layout constant a C module states equals its Python twin's value.

Each C module exports the offsets, sizes and codes of its enums and macros as
``LAYOUT`` (``_core/_layout.h``); the table below names the Python value each one
mirrors, so a hand copy on either side cannot drift unnoticed.
"""

from __future__ import annotations

import importlib
import struct
from types import ModuleType

import pytest

from orbitive._core import _clock, _robust
from orbitive.lock import _events, _layout, _ring, _types
from orbitive.pool import _layout as pool_layout

from .._structs import fields


def offsets(layout: struct.Struct) -> list[int]:
    """The offset of every field of a little-endian ``struct`` format, in order."""
    return [offset for offset, _ in fields(layout)]


RES = offsets(pool_layout.RES_HOT)  # state, node, generation, incarnation, ..., epoch (11)

TWINS: dict[str, dict[str, float]] = {
    "orbitive._core._robust_c": {
        "SECTION_RECOVERIES_AT": _robust.SECTION_RECOVERIES_AT,
        "SECTION_MUTEX_AT": _robust.SECTION_MUTEX_AT,
        "SECTION_STRIPE_BYTES": _robust.SECTION_STRIPE_BYTES,
        "SECTION_STRIPES_MAX": _robust.SECTION_STRIPES_MAX,
        "SECTION_BYTES": _robust.SECTION_BYTES,
        "ROBUST_TID_MASK": _robust._TID_MASK,
        "ROBUST_OWNER_DIED": _robust._OWNER_DIED,
    },
    "orbitive.lock._fastpath": {
        "EMPTY": _layout.EMPTY,
        "OCCUPIED": _layout.OCCUPIED,
        "TOMBSTONE": _layout.TOMBSTONE,
        "STATE_HEADER": _layout.HEADER_SIZE,
        "SLOT_HEADER": _layout.SLOT_HEADER_SIZE,
        "MAX_PROBE_AT": _layout.MAX_PROBE_OFFSET,
        "TOKEN_AT": _layout.COUNTERS_OFFSET,
        "REVISION_AT": _layout.COUNTERS_OFFSET + struct.calcsize("<Q"),
        "CONFLICTS_AT": _layout.CONFLICTS_OFFSET,
        "RING_HEADER": _ring.HEADER_SIZE,
        "LANE_HEAD": _ring.LANE_HEAD_SIZE,
        "FRAME_HEADER": _ring.SLOT_HEADER_SIZE,
        "EVENT_HEADER": _events.EVENT_HEADER.size,
        "GENERATION_AT": _ring._GENERATION_OFFSET,
        "ACQUIRED": _events.ACQUIRED,
        "RENEWED": _events.RENEWED,
        "RELEASED": _events.RELEASED,
        "EVENT_MAGIC": _events.EVENT_MAGIC,
        "EVENT_VERSION": _events.EVENT_VERSION,
        "TOKEN_MASK": _types.TOKEN_MASK,
        "COUNTER_LIMIT": _ring._COUNTER_LIMIT,
        "TTL_MAX_S": _clock.TTL_MAX_S,
    },
    "orbitive.pool._fastpath": {
        "RESOURCE_SIZE": pool_layout.RESOURCE_SIZE,
        "PENDING": pool_layout.PENDING,
        "LIVE": pool_layout.LIVE,
        "DRAINING": pool_layout.DRAINING,
        "NODE_AT": RES[1],
        "GENERATION_AT": RES[2],
        "INCARNATION_AT": RES[3],
        "CAPACITY_AT": RES[6],
        "KEY_INDEX_AT": pool_layout.RES_KEY_INDEX,
        "ACTIVE_AT": pool_layout.RES_ACTIVE,
        "FENCE_AT": pool_layout.RES_FENCE,
        "LAST_RESERVE_AT": RES[10],
        "EPOCH_AT": RES[11],
        "FENCES_AT": pool_layout.RES_FENCES,
        "SINCE_AT": pool_layout.RES_SINCE,
        "KEY_CHANGES": pool_layout.KEY_CHANGES,
        "KEY_PARKED": pool_layout.KEY_PARKED,
        "BELL_PARKED": pool_layout.BELL_PARKED,
    },
}


def c_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} was not built (no C compiler)")


def test_the_offsets_reader_reads_a_known_format() -> None:
    assert offsets(struct.Struct("<BxHI4sQ")) == [0, 2, 4, 8, 12]
    assert RES[10] == pool_layout.RES_FENCE + 8  # last_reserve_ms follows the fence


@pytest.mark.parametrize("name", sorted(TWINS))
def test_every_c_layout_constant_equals_its_python_twin(name: str) -> None:
    exported = c_module(name).LAYOUT
    assert set(exported) == set(TWINS[name])  # a new C constant needs its Python twin here
    differ = {
        key: (value, TWINS[name][key])
        for key, value in exported.items()
        if value != TWINS[name][key]
    }
    assert not differ, f"C value vs Python value: {differ}"
