"""Type stub of the C robust mutex in ``_robust.c`` (its twin is ``_robust.py``)."""

from mmap import mmap

MUTEX_BYTES: int
#: Where glibc links a held mutex into its locker's robust list (0 without glibc).
MUTEX_LIST_AT: int
#: The layout constants of ``_robust.h``, by name.
LAYOUT: dict[str, int]
GLIBC: int

class RobustMutex:
    def __init__(self, block: mmap, stripes: int = 1) -> None: ...
    def create(self) -> None: ...
    def acquire(self) -> int: ...
    def release(self) -> None: ...
    def release_mine(self) -> int: ...
