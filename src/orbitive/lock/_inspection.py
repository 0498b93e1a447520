"""Inspection of the lock table: every live lease, and the counts of its slots.

Read-only steps over :class:`~._steps.ReferenceSteps`, run inside the table's
critical section (every stripe) in the ``(a, b, c, now)`` shape of the other
steps, so what they return is one consistent picture. ``orbit locks`` prints these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ._layout import (
    CONFLICTS,
    CONFLICTS_OFFSET,
    COUNTERS,
    COUNTERS_OFFSET,
    HEADER_SIZE,
    OCCUPIED,
    TOMBSTONE,
)
from ._steps import ReferenceSteps
from ._types import LockLease


@final
@dataclass(frozen=True, slots=True)
class LockTableStatistics:
    """A snapshot of the state table and this handle's ring position.

    Fleet-wide, since the table was created or its transport reset:
    ``last_fencing_token`` is also the count of acquisitions (each takes the
    next token), ``conflicts_count`` the ``try_acquire`` calls that found a
    live holder, and ``recoveries_count`` the stripe mutexes of the table's
    critical section that a process found held by a dead process and repaired
    (a holder killed inside a step that held every stripe counts once per
    stripe; always 0 for a ``Fleet.local`` table, or a section of ``flock``,
    which the kernel frees).
    """

    capacity: int
    occupied_count: int
    expired_count: int
    tombstone_count: int
    max_probe: int
    last_fencing_token: int
    last_state_revision: int
    ring_heads: tuple[int, ...]
    conflicts_count: int = 0
    recoveries_count: int = 0


def _live(steps: ReferenceSteps, slot: int, now: int) -> bool:
    """A valid, unexpired entry whose stored digest matches its stored key."""
    fields = steps.read_live(slot, now)
    return fields is not None and steps.lease_at(slot).key.digest == fields[4]


def leases(steps: ReferenceSteps, _: None, __: int, now: int) -> list[LockLease]:
    """Every live lease, in slot order."""
    return [steps.lease_at(slot) for slot in range(steps.mask + 1) if _live(steps, slot, now)]


def statistics(steps: ReferenceSteps, _: None, __: int, now: int) -> LockTableStatistics:
    """Counts of occupied, expired and tombstoned slots, the probe bound and the counters."""
    occupied = expired = tombstones = 0
    for slot in range(steps.mask + 1):
        state = steps.buf[HEADER_SIZE + slot * steps.stride]
        if state == TOMBSTONE:
            tombstones += 1
        elif state == OCCUPIED:
            if _live(steps, slot, now):
                occupied += 1
            else:
                expired += 1
    token, revision = COUNTERS.unpack_from(steps.buf, COUNTERS_OFFSET)
    (conflicts,) = CONFLICTS.unpack_from(steps.buf, CONFLICTS_OFFSET)
    return LockTableStatistics(
        steps.mask + 1,
        occupied,
        expired,
        tombstones,
        steps.bound(),
        token,
        revision,
        tuple(steps.ring.heads()),
        conflicts,
    )
