"""Type stub of the C operations in ``_fastpath.c`` (see that file and ``_steps.py``)."""

from collections.abc import Callable
from mmap import mmap
from types import ModuleType

from ._types import Acquired, LockKey, LockLease, Occupied

#: The layout constants the C steps share with their Python twin, by name.
LAYOUT: dict[str, int]

class Steps:
    def __init__(
        self,
        state: mmap,
        ring: mmap,
        block: mmap,
        capacity: int,
        stride: int,
        payload_max: int,
        lanes: int,
        heads_at: int,
        slots_at: int,
        ring_capacity: int,
        ring_stride: int,
        frame_bytes: int,
        node: int,
        id_base: int,
        wake: Callable[[], None],
        stripes: int,
        types: tuple[type, ...],
        fork_module: ModuleType,
        table: object,
        steps_module: ModuleType,
        repaired: Callable[[int], None],
    ) -> None: ...
    def try_acquire(self, key: LockKey, owner: object, ttl: object, /) -> Acquired | Occupied: ...
    def release(self, lease: object, /) -> bool: ...
    def release_handing(self, lease: object, /) -> tuple[int, int]: ...
    def renew(self, lease: object, ttl: object, /) -> LockLease | None: ...
    def close(self) -> None: ...
