"""Type stub of the C steps in ``_fastpath.c`` (see that file and ``_table.py``)."""

from mmap import mmap

class Steps:
    def __init__(
        self,
        state: mmap,
        ring: mmap,
        capacity: int,
        stride: int,
        payload_max: int,
        lanes: int,
        heads_at: int,
        slots_at: int,
        ring_capacity: int,
        ring_stride: int,
        frame_bytes: int,
    ) -> None: ...
    def acquire(
        self,
        digest: int,
        ident: bytes,
        ns_len: int,
        owner: bytes,
        node: int,
        now: int,
        expires: int,
        id_base: int,
        /,
    ) -> tuple[int, int, int, int, int]: ...
    def release(
        self,
        digest: int,
        ident: bytes,
        ns_len: int,
        owner: bytes,
        node: int,
        now: int,
        lock_id: int,
        slot: int,
        /,
    ) -> tuple[int, int]: ...
