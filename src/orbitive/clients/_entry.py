"""One client of this process and its resource in the pool table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..pool import ResourceId

C = TypeVar("C")


@dataclass(slots=True, eq=False)
class Entry(Generic[C]):
    """A client, its resource id, the ``close`` of the pool that created it, its
    ``time.monotonic()`` creation and idle times, and how many checkouts it served."""

    client: C
    rid: ResourceId
    close: Callable[[C], Any]
    created_at: float
    idle_since: float = 0.0
    uses: int = 0

    def in_turn(self, now: float, turn: float, turn_uses: int) -> bool:
        """Whether the client may still serve its own process while another process waits:
        younger than ``turn`` seconds, and its uses not a multiple of ``turn_uses``."""
        return now - self.created_at < turn and self.uses % turn_uses != 0
