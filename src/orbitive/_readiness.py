"""Temporary stand-in; replaced by the futex/eventfd and pipe backends."""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import time

_U32 = struct.Struct("<I")


def wait_word(buf: mmap.mmap, offset: int, expected: int, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while _U32.unpack_from(buf, offset)[0] == expected:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def wake_word(buf: mmap.mmap, offset: int) -> None:
    del buf, offset


def bump(buf: mmap.mmap, word_offset: int, parked_offset: int, capacity: int) -> None:
    del parked_offset, capacity
    _U32.pack_into(buf, word_offset, (_U32.unpack_from(buf, word_offset)[0] + 1) & 0xFFFFFFFF)


class Readiness:
    def __init__(
        self, buf: mmap.mmap, word_offset: int, parked_offset: int, node: int, name: str
    ) -> None:
        del parked_offset, node
        self._buf = buf
        self._offset = word_offset
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = _U32.unpack_from(self._buf, self._offset)[0]
        while not self._stop:
            now = _U32.unpack_from(self._buf, self._offset)[0]
            if now != last:
                last = now
                with contextlib.suppress(BlockingIOError):
                    os.write(self._w, b"\x01")
            time.sleep(0.001)

    def fileno(self) -> int:
        return self._r

    def drain(self) -> int:
        n = 0
        try:
            while chunk := os.read(self._r, 4096):
                n += len(chunk)
        except BlockingIOError:
            pass
        return n

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        os.close(self._r)
        os.close(self._w)
