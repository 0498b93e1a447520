"""Type stub of the C steps, operations and Execution in ``_fastpath.c``."""

from collections.abc import Callable
from mmap import mmap
from types import ModuleType, TracebackType

from ._table import Table
from ._values import Lease, ResourceId

#: The layout constants the C steps share with their Python twin, by name.
LAYOUT: dict[str, int]

class Steps:
    def __init__(self, buf: mmap, first: int, end: int) -> None: ...
    def reserve(self, offset: int, node: int, generation: int, epoch: int, now: int, /) -> int: ...
    def accept(
        self,
        offset: int,
        node: int,
        generation: int,
        epoch: int,
        my_node: int,
        my_incarnation: int,
        fence: int,
        /,
    ) -> int: ...
    def complete(self, offset: int, generation: int, epoch: int, /) -> int: ...

class Operations:
    def __init__(
        self,
        buf: mmap,
        block: mmap,
        first: int,
        end: int,
        kind: int,
        fleet_capacity: int,
        lane_capacity: int,
        key_base: int,
        key_stride: int,
        key_capacity: int,
        key_interest: int,
        key_claims: int,
        key_waiters: int,
        key_members: int,
        bell: int,
        node: int,
        incarnation: int,
        rid_type: type[ResourceId],
        lease_type: type[Lease],
        fork_module: ModuleType,
        pool: object,
        table: Table,
        repaired: Callable[[int], None],
    ) -> None: ...
    def reserve(self, rid: ResourceId, /) -> Lease: ...
    def accept(self, lease: Lease, /) -> Execution: ...
    def take(self, rid: ResourceId, /) -> None: ...
    def give_back(
        self, rid: ResourceId, max_idle: int, max_live: int, in_turn: bool, borrowers: bool, /
    ) -> bool: ...
    def close(self) -> None: ...

class Execution:
    id: ResourceId
    fence: int
    def __init__(self, table: Table, rid: ResourceId, fence: int, offset: int) -> None: ...
    @property
    def done(self) -> bool: ...
    def complete(self) -> None: ...
    def __enter__(self) -> Execution: ...
    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None: ...
