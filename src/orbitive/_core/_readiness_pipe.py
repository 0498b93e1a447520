"""Portable readiness: poll the shared u32 word in short steps, signal through a pipe.

Where no futex is available (or ``ORBIT_READINESS=pipe`` forces this backend) a
thread cannot sleep *on* a word in shared memory, so waiting is a bounded poll:
read the word, sleep, read again. The sleeps start at 0.5 ms after each call
and double up to 2 ms, so a change is seen within about 2 ms while an idle
waiter wakes about 500 times a second (a few microseconds of CPU each). There
is nothing to wake, so :func:`wake_word` does nothing and :func:`bump` only
increments the word.

The descriptor is a non-blocking, close-on-exec pipe (``os.pipe`` makes both
ends non-inheritable, PEP 446): a notification writes one byte, a drain reads
until ``EAGAIN`` and returns how many bytes it found, a coalesced count like the
eventfd's. A full pipe (``EAGAIN`` on write) is already readable.

A fleet should run one backend in every process: a futex driver elsewhere is not
woken by this module's :func:`bump` and only notices the change at its one-second
safety timeout.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Final

NAME: Final = "pipe"
#: Drivers of this backend poll, so they never set a parked byte.
PARKED: Final = None

_U32: Final = struct.Struct("<I")
_FIRST_STEP: Final = 0.0005
_LONGEST_STEP: Final = 0.002


def _poll_word(
    buf: mmap.mmap,
    offset: int,
    expected: int,
    timeout: float | None,
    sleep: Callable[[float], object],
) -> bool:
    """Look at the word every step until it differs (True), or the timeout passes or
    ``sleep`` returns True (False). The word is read once more after the last sleep."""
    expected &= 0xFFFFFFFF
    deadline = None if timeout is None else time.monotonic() + (timeout if timeout > 0 else 0.0)
    step = _FIRST_STEP
    while _U32.unpack_from(buf, offset)[0] == expected:
        left = step if deadline is None else min(step, deadline - time.monotonic())
        if left <= 0 or sleep(left) is True:
            return False
        step = min(step * 2, _LONGEST_STEP)
    return True


def wait_word(buf: mmap.mmap, offset: int, expected: int, timeout: float | None) -> bool:
    """Wait while the u32 at ``offset`` equals ``expected``, by polling (see the module text).

    Args:
        buf: the mapping holding the word.
        offset: byte offset of a little-endian u32.
        expected: the value last seen.
        timeout: relative seconds (float); None waits without a bound.

    Returns:
        True if the word changed; False if the timeout passed. ``time.sleep``
        releases the GIL between looks.
    """
    return _poll_word(buf, offset, expected, timeout, time.sleep)


def wake_word(buf: mmap.mmap, offset: int) -> None:
    """Nothing to do: pollers notice a change at their next look."""
    del buf, offset


def bump(buf: mmap.mmap, word_offset: int, parked_offset: int, capacity: int) -> None:
    """Publisher side: word += 1 (mod 2**32), inside the region's critical section.

    The parked bytes are not consulted: nobody here sleeps in the kernel.
    """
    del parked_offset, capacity
    word = (_U32.unpack_from(buf, word_offset)[0] + 1) & 0xFFFFFFFF
    buf[word_offset : word_offset + 4] = _U32.pack(word)  # as _region.store


def driver_wait(
    buf: mmap.mmap, offset: int, expected: int, timeout: float, stopping: threading.Event
) -> None:
    """A readiness driver's sleep: poll, returning early once ``stopping`` is set."""
    _poll_word(buf, offset, expected, timeout, stopping.wait)


class Signal:
    """The per-process descriptor: the read end of a non-blocking close-on-exec pipe."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        return self._read

    def notify(self) -> None:
        """Make the read end readable; EAGAIN (pipe full) means it already is."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"\x01")

    def drain(self) -> int:
        """Read until EAGAIN; return how many notifications were pending (coalesced)."""
        count = 0
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._read, 4096):
                count += len(chunk)
        return count

    def close(self) -> None:
        for fd in (self._read, self._write):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read = self._write = -1


def probe() -> None:
    """Check that this process can use the backend.

    Raises:
        OSError: a pipe cannot be made non-blocking here.
    """
    Signal().close()
