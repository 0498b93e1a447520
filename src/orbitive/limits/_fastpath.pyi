"""Type stub of the C steps in ``_fastpath.c`` (see that file and ``_table.py``)."""

from collections.abc import Callable
from mmap import mmap

#: The layout constants the C steps share with their Python twin, by name.
LAYOUT: dict[str, int]

class Steps:
    def __init__(
        self,
        buf: mmap,
        block: mmap,
        report: Callable[[int], None],
        capacity: int,
        probe: int,
        windows: int,
        window_probe: int,
        window: int,
        windows_at: int,
        slot_size: int,
    ) -> None: ...
    def incr(self, lo: int, hi: int, expiry: float, amount: int) -> int | None: ...
    def acquire(self, lo: int, hi: int, limit: int, expiry: float, amount: int) -> bool | None: ...
    def sliding(
        self,
        previous_lo: int,
        previous_hi: int,
        current_lo: int,
        current_hi: int,
        limit: int,
        expiry: float,
        amount: int,
        now: float,
    ) -> bool | None: ...
