"""Type stub of the C steps in ``_fastpath.c`` (see that file and ``_table.py``)."""

from mmap import mmap

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
