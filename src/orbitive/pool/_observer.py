"""A pool table read from outside the fleet: ``orbit pool`` and :mod:`orbitive.metrics`.

:func:`observe` attaches read-only (no node, no member: a sidecar that only
watches never holds a node) and tells, for each key, what a client pool counts:
resources of owners that are alive, and apart from them the ones whose owner
died but whose death nobody reported yet (within the upkeep interval, 0.2 s,
while a client pool of the key runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from .._core._fleet import Fleet
from ._deaths import live_lives
from ._stats import KeyStatistics, PoolStatistics, inspect
from ._values import Key


@final
@dataclass(frozen=True, slots=True)
class KeyCounts:
    """One key's resources, dead owners apart.

    ``live`` resources of owners that are alive, ``idle`` of their free units,
    ``in_use`` = ``live - idle``, and ``dead`` resources still listed for
    owners whose life is over.
    """

    live: int
    idle: int
    in_use: int
    dead: int


@final
@dataclass(frozen=True, slots=True)
class Observation:
    """A snapshot of a pool table and the (node, incarnation) lives alive then."""

    statistics: PoolStatistics
    alive: frozenset[tuple[int, int]]

    def counts(self, key: KeyStatistics) -> KeyCounts:
        """``key``'s counts, the resources of dead owners apart."""
        dead = dead_idle = 0
        for res in self.statistics.resources:
            if res.key != key.key or (res.owner_node, res.owner_incarnation) in self.alive:
                continue
            if res.state == "live":
                dead += 1
                dead_idle += max(0, res.capacity - res.reserved - res.active)
        live, idle = key.live - dead, key.idle - dead_idle
        return KeyCounts(live, idle, max(0, live - idle), dead)

    def names(self) -> dict[Key, str]:
        """Each key's name for people: its label, with the digest's first 8 hex digits
        added when two keys share it; the digest for a key without one."""
        labels = [key.label for key in self.statistics.keys if key.label]
        return {
            key.key: f"{key.label} [{str(key.key)[:8]}]"
            if key.label and labels.count(key.label) > 1
            else key.name
            for key in self.statistics.keys
        }


def observe(fleet: str, kind: int) -> Observation | None:
    """Read the fleet's pool table of ``kind`` without joining the fleet; None if absent.

    Raises:
        LayoutMismatch: the object is not a valid pool table of this version.
        AccessDenied: the object is not exclusively ours.
    """
    statistics = inspect(fleet, kind)
    if statistics is None:
        return None
    with Fleet.observe(fleet, statistics.fleet_capacity) as observer:
        alive = live_lives(statistics, observer)
    return Observation(statistics, frozenset(alive))
