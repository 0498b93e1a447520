"""Portable word waits: poll the shared u32 word in short steps.

Where no futex is available (or ``ORBIT_READINESS=pipe`` forces this backend) a
thread cannot sleep *on* a word in shared memory, so waiting is a bounded poll:
read the word, sleep, read again. The sleeps start at 0.5 ms after each call
and double up to 2 ms, so a change is seen within about 2 ms while an idle
waiter wakes about 500 times a second (a few microseconds of CPU each). There
is nothing to wake, so :func:`wake_word` does nothing and :func:`bump` only
increments the word.

The readiness descriptor does not depend on the backend (``_channel``: a
socket the publisher writes to). The name "pipe" is kept for
``ORBIT_READINESS=pipe``, which forces this backend.

A fleet should run one backend in every process: a futex waiter elsewhere is
not woken by this module's :func:`bump` and only notices the change at the end
of its own timeout.
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import Final

NAME: Final = "pipe"
#: Waiters of this backend poll, so they never set a parked byte.
PARKED: Final = None

_U32: Final = struct.Struct("<I")
_FIRST_STEP: Final = 0.0005
_LONGEST_STEP: Final = 0.002


def wait_word(buf: mmap.mmap, offset: int, expected: int, timeout: float | None) -> bool:
    """Wait while the u32 at ``offset`` equals ``expected``, by polling (see the module text).

    Args:
        buf: the mapping holding the word.
        offset: byte offset of a little-endian u32.
        expected: the value last seen.
        timeout: relative seconds (float); None waits without a bound.

    Returns:
        True if the word changed; False if the timeout passed. The word is read
        once more after the last sleep; ``time.sleep`` releases the GIL between looks.
    """
    expected &= 0xFFFFFFFF
    deadline = None if timeout is None else time.monotonic() + (timeout if timeout > 0 else 0.0)
    step = _FIRST_STEP
    while _U32.unpack_from(buf, offset)[0] == expected:
        left = step if deadline is None else min(step, deadline - time.monotonic())
        if left <= 0:
            return False
        time.sleep(left)
        step = min(step * 2, _LONGEST_STEP)
    return True


def wake_word(buf: mmap.mmap, offset: int, count: int = 0) -> int:
    """Nothing to do: pollers notice a change at their next look. Returns 0 (none woken)."""
    del buf, offset, count
    return 0


def bump(buf: mmap.mmap, word_offset: int, parked_offset: int, capacity: int) -> None:
    """Publisher side: word += 1 (mod 2**32), inside the region's critical section.

    The parked bytes are not consulted: nobody here sleeps in the kernel.
    """
    del parked_offset, capacity
    word = (_U32.unpack_from(buf, word_offset)[0] + 1) & 0xFFFFFFFF
    buf[word_offset : word_offset + 4] = _U32.pack(word)  # as _region.store


def probe() -> None:
    """Check that this process can use the backend: polling always can."""
