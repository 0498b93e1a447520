"""The robust process-shared mutexes of a region's section block, through ctypes.

The Python twin of ``_robust.c`` (same names, same order): used where the C
module is not built, and by the differential and recovery tests. Both lock the
same ``pthread_mutex_t`` values in shared memory, so peers with and without the
C module exclude each other. A block holds one mutex per stripe, each in its own
cache line (a lock table's state has several stripes, every other region one);
:meth:`RobustMutex.acquire` locks them all, in ascending order.

Facts this module relies on:

* ``ctypes.CDLL`` releases the GIL for the duration of a foreign call, so a
  thread waiting in ``pthread_mutex_clocklock`` for another process never blocks
  this process's other threads.
* A robust mutex whose holder died locks with ``EOWNERDEAD``; unless the new
  holder calls ``pthread_mutex_consistent`` before unlocking, the mutex becomes
  ``ENOTRECOVERABLE`` for everyone. Every path here repairs first.
* ``pthread_mutex_t`` is 40 bytes on x86-64 glibc and 48 on aarch64; musl's
  layout differs, which is why the section block records the C library.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import threading
import time
from collections.abc import Callable
from typing import Final

#: Section block offsets, mirrored in ``_robust.h`` (``_robust_c.LAYOUT``, compared by a test).
SECTION_RECOVERIES_AT: Final = 16
SECTION_MUTEX_AT: Final = 64
SECTION_STRIPE_BYTES: Final = 64
SECTION_STRIPES_MAX: Final = 63
SECTION_BYTES: Final = 4096
_MUTEXATTR_BYTES: Final = 64  # glibc's pthread_mutexattr_t is 4 bytes; room to spare
_GLIBC_MUTEX_BYTES: Final = {"x86_64": 40, "aarch64": 48, "i686": 24, "armv7l": 24}
#: Where glibc keeps the mutex's type word (``__data.__kind``): after four ints on
#: 64-bit targets, after three on 32-bit ones.
_GLIBC_KIND_AT: Final = {"x86_64": 16, "aarch64": 16, "i686": 12, "armv7l": 12}
#: Where a mutex's robust list link (``__data.__list.__next``) is: past the type word,
#: the spin count and ``__list.__prev`` on 64-bit targets, past five ints on 32-bit ones
#: (``_robust_c.MUTEX_LIST_AT``, compared by a test).
_GLIBC_LIST_AT: Final = {"x86_64": 32, "aarch64": 32, "i686": 20, "armv7l": 20}
#: The ``get_robust_list`` system call's number.
_GET_ROBUST_LIST: Final = {"x86_64": 274, "aarch64": 100, "i686": 312, "armv7l": 339}
#: At most this many entries of a thread's robust list are read (``ROBUST_LIST_MAX``).
_ROBUST_LIST_MAX: Final = 2048
#: The futex word's owner bits and owner-died bit (linux/futex.h).
_TID_MASK: Final = 0x3FFFFFFF
_OWNER_DIED: Final = 0x40000000
_PTHREAD_PROCESS_SHARED: Final = 1
_PTHREAD_MUTEX_ROBUST: Final = 1

#: Test-only hook, called between ``EOWNERDEAD`` and ``pthread_mutex_consistent``.
recovery_hook: Callable[[], None] | None = None


def _glibc_mutex_bytes() -> int:
    """``sizeof(pthread_mutex_t)`` of this process's glibc, or 0 when unknown."""
    if platform.libc_ver()[0] != "glibc":
        return 0
    return _GLIBC_MUTEX_BYTES.get(platform.machine(), 0)


MUTEX_BYTES: Final = _glibc_mutex_bytes()
GLIBC: Final = int(MUTEX_BYTES > 0)


def _load_libc() -> ctypes.CDLL | None:
    if not MUTEX_BYTES:
        return None
    try:
        libc = ctypes.CDLL(None)
        for name in ("clocklock", "trylock", "unlock", "consistent", "init", "attr_setrobust"):
            getattr(libc, f"pthread_mutex{'' if name.startswith('attr') else '_'}{name}")
    except (OSError, AttributeError):
        return None
    return libc


_libc: Final = _load_libc()


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


#: A waiter wakes at least this often to look at the mutex again (``robust_wait`` in C).
_SLICE_NS: Final = 50_000_000


def _wait(mutex: ctypes.Array[ctypes.c_char]) -> int:
    """Lock a mutex another thread holds, waiting in slices; glibc's return code.

    A wake can be lost (the kernel hands a dead holder's mutex on with one wake,
    and the woken waiter may be killed too before it takes the mutex): a waiter
    that only slept until woken would then sleep for ever while the mutex is free.
    Before each slice the mutex is checked as on entry: a futex word naming this
    thread is ``EDEADLK``; while the type word is foreign and the mutex held, the
    holder puts it back before it unlocks, so the waiter sleeps a slice without
    handing glibc the bytes; foreign and unheld (or its holder dead), ``EINVAL``.
    """
    assert _libc is not None
    while True:
        if _names_me(mutex):
            return errno.EDEADLK
        if mutex.raw[_KIND_AT : _KIND_AT + 4] != _KIND:
            word = int.from_bytes(mutex.raw[:4], "little")
            if not word & _TID_MASK or word & _OWNER_DIED:
                return errno.EINVAL
            time.sleep(_SLICE_NS / 1e9)
            continue
        until = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + _SLICE_NS
        deadline = _Timespec(until // 1_000_000_000, until % 1_000_000_000)
        rc: int = _libc.pthread_mutex_clocklock(mutex, time.CLOCK_MONOTONIC, ctypes.byref(deadline))
        if rc != errno.ETIMEDOUT:
            return rc


def _names_me(mutex: ctypes.Array[ctypes.c_char]) -> bool:
    """Whether the futex word names this very thread as a live holder (``robust_names_me``)."""
    word = int.from_bytes(mutex.raw[:4], "little")
    return word & _TID_MASK == threading.get_native_id() and not word & _OWNER_DIED


def _linked_here(mutex: ctypes.Array[ctypes.c_char]) -> bool | None:
    """Whether this thread holds ``mutex`` through this very address; None when unknown
    (``robust_linked_here``, which says why a futex word naming this thread is not enough).

    Reads this thread's robust list from the head the kernel has for it: glibc links a
    held robust mutex through the address it was locked at (the low bit a flag).
    """
    call = _GET_ROBUST_LIST.get(platform.machine())
    if _libc is None or call is None:
        return None
    head, size = ctypes.c_void_p(), ctypes.c_size_t()
    if _libc.syscall(ctypes.c_long(call), ctypes.c_long(0), ctypes.byref(head), ctypes.byref(size)):
        return None
    if not head.value:
        return None
    end, here = head.value, ctypes.addressof(mutex) + _LIST_AT
    entry = ctypes.c_void_p.from_address(end).value or 0
    for _ in range(_ROBUST_LIST_MAX):
        entry &= ~1
        if entry == end:
            return False
        if entry == here:
            return True
        entry = ctypes.c_void_p.from_address(entry).value or 0
    return None


def _held_here(mutex: ctypes.Array[ctypes.c_char]) -> bool:
    """Whether the futex word names a live thread of this process (``robust_held_here``)."""
    word = int.from_bytes(mutex.raw[:4], "little")
    tid = word & _TID_MASK
    return bool(tid) and not word & _OWNER_DIED and os.path.exists(f"/proc/self/task/{tid}")


#: Stripe mutexes whose block another thread of this process held when their
#: RobustMutex went: kept (with their mapping) for the life of the process.
_kept: list[list[ctypes.Array[ctypes.c_char]]] = []


def robust_error(rc: int) -> OSError:
    return OSError(rc, os.strerror(rc))


def _attributes() -> ctypes.Array[ctypes.c_char]:
    """Process-shared, robust mutex attributes (the caller destroys them).

    Raises:
        OSError: glibc refused one of them.
    """
    assert _libc is not None
    attr = ctypes.create_string_buffer(_MUTEXATTR_BYTES)
    rc = _libc.pthread_mutexattr_init(attr)
    if rc == 0:
        rc = _libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED)
        if rc == 0:
            rc = _libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST)
        if rc != 0:
            _libc.pthread_mutexattr_destroy(attr)
    if rc != 0:
        raise robust_error(rc)
    return attr


def _init(mutex: ctypes.Array[ctypes.c_char]) -> None:
    """Initialise ``mutex`` as a process-shared, robust mutex."""
    assert _libc is not None
    attr = _attributes()
    rc = _libc.pthread_mutex_init(mutex, attr)
    _libc.pthread_mutexattr_destroy(attr)
    if rc != 0:
        raise robust_error(rc)


def _robust_kind() -> bytes:
    """The type word glibc writes for our attributes (see ``robust_kind`` in ``_robust.h``)."""
    if _libc is None:
        return b""
    probe = ctypes.create_string_buffer(MUTEX_BYTES)
    _init(probe)
    return probe.raw[_KIND_AT : _KIND_AT + 4]


_KIND_AT: Final = _GLIBC_KIND_AT.get(platform.machine(), 0)
_LIST_AT: Final = _GLIBC_LIST_AT.get(platform.machine(), 0)
_KIND: Final = _robust_kind()


class RobustMutex:
    """The robust process-shared stripe mutexes of one section block (a writable mapping)."""

    def __init__(self, block: mmap.mmap, stripes: int = 1) -> None:
        if _libc is None:
            raise OSError(errno.ENOSYS, "robust mutexes need glibc's pthread functions")
        if len(block) < SECTION_BYTES:
            raise ValueError("a section block is smaller than its layout")
        if not 1 <= stripes <= SECTION_STRIPES_MAX:
            raise ValueError(f"stripes must be 1..{SECTION_STRIPES_MAX}")
        self._block = block
        # Exports of the mapping: it stays mapped while a thread waits on a mutex.
        self._mutexes = [
            (ctypes.c_char * MUTEX_BYTES).from_buffer(
                block, SECTION_MUTEX_AT + stripe * SECTION_STRIPE_BYTES
            )
            for stripe in range(stripes)
        ]

    def create(self) -> None:
        """Initialise new stripe mutexes (process-shared, robust)."""
        for mutex in self._mutexes:
            _init(mutex)

    def acquire(self) -> int:
        """Lock every stripe in ascending order, waiting without the GIL; repairs ``EOWNERDEAD``.

        On a failure the stripes already locked are unlocked again.

        Returns:
            How many stripe mutexes it repaired (their holder died); the caller
            reports them once it has let the section go.

        Raises:
            OSError: ``EINVAL`` when a mutex's type word is corrupt, ``EDEADLK``
                when its futex word names this very thread, before or while it
                waits (waiting would never end), ``ENOTRECOVERABLE`` as glibc says.
        """
        repaired = 0
        for taken, mutex in enumerate(self._mutexes):
            try:
                repaired += self._lock(mutex)
            except OSError:
                self._unlock_from(taken - 1)
                raise
        return repaired

    def _lock(self, mutex: ctypes.Array[ctypes.c_char]) -> bool:
        """Lock one stripe; True when its holder had died and it was repaired."""
        assert _libc is not None
        if mutex.raw[_KIND_AT : _KIND_AT + 4] != _KIND:
            raise robust_error(errno.EINVAL)
        rc = _libc.pthread_mutex_trylock(mutex)
        if rc == errno.EBUSY:
            rc = _wait(mutex)
        repaired: bool = rc == errno.EOWNERDEAD
        if repaired:
            if recovery_hook is not None:
                recovery_hook()
            rc = _libc.pthread_mutex_consistent(mutex)
            # A plain add (ctypes has no atomics): a repair a C locker of another stripe
            # counts at the same instant may be lost; the count is statistics only.
            if rc == 0:
                at = SECTION_RECOVERIES_AT
                recoveries = int.from_bytes(self._block[at : at + 8], "little") + 1
                self._block[at : at + 8] = (recoveries % (1 << 64)).to_bytes(8, "little")
        if rc != 0:
            raise robust_error(rc)
        return repaired

    def release(self) -> None:
        """Unlock every stripe, in descending order.

        A type word changed while this thread held a mutex is put back first.

        Raises:
            OSError: ``EPERM`` when a futex word no longer names this thread
                (the other stripes are unlocked all the same).
        """
        self._unlock_from(len(self._mutexes) - 1)

    def release_mine(self) -> int:
        """Unlock the stripes whose futex word names this thread as their holder, in
        descending order; returns how many (an :meth:`acquire` cut short by an exception)."""
        released = 0
        for stripe in range(len(self._mutexes) - 1, -1, -1):
            if _names_me(self._mutexes[stripe]):
                self._unlock(stripe)
                released += 1
        return released

    def __del__(self) -> None:
        """Make the block's mapping safe to unmap (``robust_before_unmap`` in C says why).

        The stripes this thread holds through this block are unlocked (one it holds
        through another mapping of the object is left to that mapping's step); while
        another live thread of this process holds one, or the robust list cannot tell,
        the mutexes (and so the mapping) are kept for good.
        """
        mutexes = getattr(self, "_mutexes", [])
        keep = False
        for stripe in range(len(mutexes) - 1, -1, -1):
            if _names_me(mutexes[stripe]):
                linked = _linked_here(mutexes[stripe])
                if linked:
                    self._unlock(stripe)
                elif linked is None:
                    keep = True
            elif _held_here(mutexes[stripe]):
                keep = True
        if keep:
            _kept.append(mutexes)

    def _unlock_from(self, last: int) -> None:
        failed = 0
        for stripe in range(last, -1, -1):
            rc = self._unlock(stripe)
            failed = failed or rc
        if failed:
            raise robust_error(failed)

    def _unlock(self, stripe: int) -> int:
        """``robust_unlock``: a changed type word put back first, then glibc's unlock."""
        assert _libc is not None
        mutex = self._mutexes[stripe]
        if mutex.raw[_KIND_AT : _KIND_AT + 4] != _KIND:
            at = SECTION_MUTEX_AT + stripe * SECTION_STRIPE_BYTES + _KIND_AT
            self._block[at : at + 4] = _KIND
        rc: int = _libc.pthread_mutex_unlock(mutex)
        return rc
