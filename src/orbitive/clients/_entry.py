"""One client of this process and its resource in the pool table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ..pool import ResourceId

C = TypeVar("C")


@dataclass(slots=True, eq=False)
class Entry(Generic[C]):
    """A client, its resource id, its ``time.monotonic()`` creation and idle times, and
    how many checkouts it served."""

    client: C
    rid: ResourceId
    created_at: float
    idle_since: float = 0.0
    uses: int = 0
