"""Word waits on Linux: a thread sleeps on a shared u32 word with ``futex``.

Facts about futex
-----------------

* **Process-shared wake-ups.** Without ``FUTEX_PRIVATE_FLAG`` the kernel keys a
  futex by the page it lives in (inode and offset for a ``/dev/shm`` mapping, the
  anonymous page for a ``MAP_SHARED`` anonymous mapping inherited by ``fork``),
  not by the virtual address. A ``FUTEX_WAKE`` in one process therefore reaches a
  ``FUTEX_WAIT`` in another even when the object is mapped at different
  addresses. Nothing but the word is shared: no descriptor crosses processes.
  With the PRIVATE flag the same calls would silently never wake a peer.
* **The compare is atomic with the sleep.** ``FUTEX_WAIT(word, expected)`` reads
  the word under the kernel's hash-bucket lock and sleeps only if it still equals
  ``expected``; otherwise it fails with ``EAGAIN``. A waker that stores a new
  value *before* calling ``FUTEX_WAKE`` can therefore never be missed by a waiter
  whose compare happens later (the kernel's barriers pair the waker's store with
  the waiter's read; see the comment block at the top of ``kernel/futex/waitwake.c``).
* **Oldest first.** ``FUTEX_WAKE(word, n)`` wakes at most ``n`` sleepers of the
  word, in the order they went to sleep (the hash bucket's queue is ordered by
  priority, then arrival, and every normal task has the same priority), and
  returns how many it woke. A sleeper that dies or times out leaves the queue.
* **Spurious wake-ups.** ``FUTEX_WAIT`` returns 0 on any wake on the word
  (including one meant for another value), ``EAGAIN`` when the word already
  differed and ``EINTR`` when a signal arrived. All three mean "maybe changed":
  :func:`wait_word` returns True and the caller re-reads the word. Only
  ``ETIMEDOUT`` means False. The timeout is relative and measured on
  ``CLOCK_MONOTONIC``.
* **A wake costs a syscall even when nobody sleeps** (about 1.6 to 2.4 us through
  ctypes here). So each node has a *parked* byte next to the word, set only
  while a thread of that node may sleep on it; :func:`bump` skips the syscall
  when every byte is zero. Why that cannot lose a wake is explained at :func:`bump`.
* **ctypes releases the GIL** around every foreign call made through a ``CDLL``
  (not ``PyDLL``), so a thread parked in ``FUTEX_WAIT`` does not stall Python.
  ``c_uint32.from_buffer`` exports the mapping's buffer for as long as the ctypes
  object lives; ``mmap.close()`` refuses (``BufferError``) while an export
  exists, so a parked thread keeps its word mapped. We drop the export right
  after each call.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import os
import platform
import struct
import sys
import threading
from typing import Final

from . import _fork

NAME: Final = "futex"

_FUTEX_WAIT: Final = 0
_FUTEX_WAKE: Final = 1  # no FUTEX_PRIVATE_FLAG (128): waiters in other processes must wake
_WAKE_ALL: Final = 2**31 - 1
_U32: Final = struct.Struct("<I")
#: Longest timeout one futex wait takes, in seconds (about 272 years); longer is this.
LONGEST_S: Final = 1 << 33
#: SYS_futex by machine, for 64-bit Linux processes only (i386 and arm32 differ).
_SYS_FUTEX_BY_MACHINE: Final = {"x86_64": 202, "aarch64": 98}


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def _sys_futex_number() -> int | None:
    if sys.platform != "linux" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    return _SYS_FUTEX_BY_MACHINE.get(platform.machine())


_SYS_FUTEX: Final = _sys_futex_number()
_syscall = getattr(ctypes.CDLL(None, use_errno=True), "syscall", None)
if _syscall is not None:  # syscall(SYS_futex, uaddr, op, val, timeout, uaddr2, val3)
    _syscall.restype = ctypes.c_long
    _long, _ptr = ctypes.c_long, ctypes.c_void_p
    _syscall.argtypes = (_long, _ptr, _long, _long, _ptr, _ptr, _long)


def _timespec(timeout: float | None) -> _Timespec | None:
    """The relative timespec of ``timeout`` seconds; longer than :data:`LONGEST_S` is that."""
    if timeout is None or (math.isinf(timeout) and timeout > 0):
        return None
    if not timeout > 0:  # negative, zero or NaN: a non-blocking look
        return _Timespec(0, 0)
    if timeout >= LONGEST_S:  # tv_sec is a C long: a larger int would wrap, or be EINVAL
        return _Timespec(LONGEST_S, 0)
    seconds = math.floor(timeout)
    return _Timespec(seconds, min(int((timeout - seconds) * 1e9), 999_999_999))


def _futex(buf: mmap.mmap, offset: int, op: int, value: int, ts: _Timespec | None) -> int:
    """One futex call on the u32 at ``offset``; 0 on success, else the errno."""
    word = ctypes.c_uint32.from_buffer(buf, offset)
    try:
        result: int = _syscall(  # type: ignore[misc]  # None only when probe() failed
            _SYS_FUTEX,
            ctypes.byref(word),
            op,
            value,
            None if ts is None else ctypes.byref(ts),
            None,
            0,
        )
    finally:
        del word  # release the export so mmap.close() can proceed
    return 0 if result >= 0 else ctypes.get_errno()


def wait_word(buf: mmap.mmap, offset: int, expected: int, timeout: float | None) -> bool:
    """Park the calling thread while the u32 at ``offset`` equals ``expected``.

    Args:
        buf: a writable mapping (shared, or anonymous and shared by fork).
        offset: byte offset of a 4-byte aligned little-endian u32.
        expected: the value last seen; the thread sleeps only while it is current.
        timeout: relative seconds (float); None waits without a bound, and
            more than :data:`LONGEST_S` waits that long.

    Returns:
        True if the word may have changed (wake, EAGAIN, EINTR; spurious wake-ups
        allowed, the caller re-reads); False if the timeout passed.

    Raises:
        OSError: the kernel refused the call (EFAULT, EINVAL: misaligned offset).
    """
    code = _futex(buf, offset, _FUTEX_WAIT, expected & 0xFFFFFFFF, _timespec(timeout))
    if code in (0, errno.EAGAIN, errno.EINTR):
        return True
    if code == errno.ETIMEDOUT:
        return False
    raise OSError(code, f"futex wait on offset {offset}: {os.strerror(code)}")


def wake_word(buf: mmap.mmap, offset: int, count: int = _WAKE_ALL) -> int:
    """Wake up to ``count`` threads in any process parked on the u32 at ``offset``.

    The longest-parked first (see the module's facts); every one by default.

    Returns:
        How many threads it woke.

    Raises:
        OSError: the kernel refused the call.
    """
    word = ctypes.c_uint32.from_buffer(buf, offset)
    try:
        woken: int = _syscall(  # type: ignore[misc]  # None only when probe() failed
            _SYS_FUTEX, ctypes.byref(word), _FUTEX_WAKE, count, None, None, 0
        )
    finally:
        del word  # release the export so mmap.close() can proceed
    if woken < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"futex wake on offset {offset}: {os.strerror(code)}")
    return woken


def bump(buf: mmap.mmap, word_offset: int, parked_offset: int, capacity: int) -> None:
    """Publisher side: word += 1 (mod 2**32), then wake only if a node is parked.

    Call it inside the region's critical section (process mutex + ``flock``),
    which also makes the read-modify-write of the word safe between publishers.

    Why a wake cannot be lost. A waiter parks in three steps: (1) inside the same
    critical section it sets its node's parked byte and reads the word; (2)
    outside it, ``FUTEX_WAIT(word, seen)``; (3) it clears the byte after waking.
    Mutual exclusion orders step (1) against this function. If this bump came
    first, step (1) reads the new word and the wait returns at once. If step (1)
    came first, this bump sees the byte and calls ``FUTEX_WAKE``; that wake either
    finds the waiter asleep, or precedes its ``FUTEX_WAIT``, whose in-kernel
    compare then sees the new word (fact two in the module essay) and returns at
    once. Clearing the byte late only costs a spurious wake. Nothing here relies
    on CPU memory ordering beyond what the lock gives, which matters: a plain
    store followed by a plain load of another address may be reordered even on
    x86-64.

    Args:
        buf: the mapping holding the word and the parked bytes.
        word_offset: byte offset of the u32 generation word (4-byte aligned).
        parked_offset: byte offset of ``capacity`` parked bytes, one per node.
        capacity: the fleet capacity.
    """
    word = (_U32.unpack_from(buf, word_offset)[0] + 1) & 0xFFFFFFFF
    buf[word_offset : word_offset + 4] = _U32.pack(word)  # as _region.store
    if buf[parked_offset : parked_offset + capacity].count(0) != capacity:
        wake_word(buf, word_offset)


class ParkedBytes:
    """Process-local counts of this process's threads parked on each parked byte.

    Two threads of one process waiting on one word share its node's byte; it is
    cleared only when neither waits. Only this process writes its node's byte
    (each live process holds its own node).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, int], int] = {}

    def hold(self, buf: mmap.mmap, index: int) -> None:
        with self._lock:
            count = self._counts.get((id(buf), index), 0)
            if count == 0:
                buf[index] = 1
            self._counts[(id(buf), index)] = count + 1

    def release(self, buf: mmap.mmap, index: int) -> None:
        with self._lock:
            count = self._counts.pop((id(buf), index)) - 1
            if count:
                self._counts[(id(buf), index)] = count
            else:
                buf[index] = 0

    def _after_fork_in_child(self) -> None:
        # The parent's waiting threads do not exist here, and the bytes belong to its nodes.
        self._lock = threading.Lock()
        self._counts = {}


#: The parked bytes this process has set; a waiter holds its node's byte while it may sleep.
PARKED: Final = ParkedBytes()
_fork.register(PARKED)


def probe() -> None:
    """Check that this process can use the backend.

    Raises:
        OSError: the reason it cannot (not 64-bit Linux, no ``syscall``, or the
            kernel rejected a futex call).
    """
    if _SYS_FUTEX is None:
        raise OSError(f"no SYS_futex number for {sys.platform} {platform.machine()} (64-bit)")
    if _syscall is None:
        raise OSError("libc has no syscall()")
    buf = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        wake_word(buf, 0)
        if not wait_word(buf, 0, 1, 0.0) or wait_word(buf, 0, 0, 0.0):
            raise OSError("FUTEX_WAIT does not compare the word")
    finally:
        buf.close()
