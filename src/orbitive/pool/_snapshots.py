"""Snapshots of the pool table: a key's candidates and budget, and the lives owning resources.

Each is read in one critical section (``enter()``/``leave()``), so its numbers
agree with each other; the values returned are built after the section is left.
A slot no resource id can name (damaged bytes) is skipped, as in the statistics.
"""

from __future__ import annotations

from ._keys import M64, KeyTable
from ._layout import (
    DRAINING,
    GENERATION_MAX,
    LIVE,
    PENDING,
    PENDING_WORDS,
    RES_BODY_AT,
    RES_FENCES,
    RES_HOT,
    RES_OWNER,
    RESOURCE_SIZE,
)
from ._values import Candidate, Key, ResourceId

#: A snapshot row: (slot offset, node, slot, generation, epoch, incarnation,
#: state, capacity, reserved, active, last_reserve_ms).
Row = tuple[int, int, int, int, int, int, int, int, int, int, int]


def snapshot(
    table: KeyTable, key: Key, install: bool
) -> tuple[list[Candidate], int, int, int] | None:
    """(candidates, live, creating, version) of ``key`` in one section; None if absent."""
    with table:
        index = table.find_key(key, install)
        if index < 0:
            return None
        rows = _rows(table, table.members(index), key)
        live, creating = table.budget(index)
        version = table.changes(index)
    return [_candidate(table, row) for row in rows], live, creating, version


def _candidate(table: KeyTable, row: Row) -> Candidate:
    """A Candidate from a snapshot row (built outside the critical section)."""
    _, node, slot, generation, epoch, life, state, capacity, reserved, active, last = row
    return Candidate(
        ResourceId(table.kind, node, slot, generation, epoch),
        node,
        life,
        node == table.node and life == table.incarnation,
        "live" if state == LIVE else "draining",
        capacity,
        reserved,
        active,
        last / 1000.0,
    )


def _rows(table: KeyTable, members: int, key: Key) -> list[Row]:
    rows: list[Row] = []
    lo, hi = key.value & M64, key.value >> 64
    while members:
        low = members & -members
        members ^= low
        node, slot = divmod(low.bit_length() - 1, table.lane_capacity)
        offset = table.res_base + (node * table.lane_capacity + slot) * RESOURCE_SIZE
        hot = RES_HOT.unpack_from(table.buf, offset)
        if (
            LIVE <= hot[0] <= DRAINING
            and hot[1] == node
            and hot[4] == lo
            and hot[5] == hi
            and 1 <= hot[2] <= GENERATION_MAX
            and hot[11]
        ):  # else a slot no id can name (damage): skipped, as in the statistics
            free = PENDING_WORDS.unpack_from(table.buf, offset + RES_FENCES).count(0)
            rows.append(
                (offset, node, slot, hot[2], hot[11], hot[3], hot[0], hot[6],
                 PENDING - free, hot[8], hot[10])
            )  # fmt: skip
    return rows


def lives(table: KeyTable) -> dict[int, set[int]]:
    """Per node, the incarnations that own live or draining resources.

    A slot whose owner node is not its lane's (damage) names no life: skipped.
    """
    with table:
        states = table.buf[table.res_base : table.layout.size : RESOURCE_SIZE]
        found: dict[int, set[int]] = {}
        for global_index, state in enumerate(states):
            if LIVE <= state <= DRAINING:
                offset = table.res_base + global_index * RESOURCE_SIZE
                node, _, incarnation = RES_OWNER.unpack_from(table.buf, offset + RES_BODY_AT)
                if node == global_index // table.lane_capacity:
                    found.setdefault(node, set()).add(incarnation)
    return found
