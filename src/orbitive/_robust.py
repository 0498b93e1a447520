"""The robust process-shared mutex of a region's section block, through ctypes.

The Python twin of ``_robust.c`` (same names, same order): used where the C
module is not built, and by the differential and recovery tests. Both lock the
same ``pthread_mutex_t`` in shared memory, so peers with and without the C
module exclude each other.

Facts this module relies on:

* ``ctypes.CDLL`` releases the GIL for the duration of a foreign call, so a
  thread waiting in ``pthread_mutex_lock`` for another process never blocks
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
import platform
from collections.abc import Callable
from typing import Final

#: Section block offsets, mirrored in ``_robust.h``.
SECTION_RECOVERIES_AT: Final = 16
SECTION_MUTEX_AT: Final = 64
SECTION_BYTES: Final = 4096
_MUTEXATTR_BYTES: Final = 64  # glibc's pthread_mutexattr_t is 4 bytes; room to spare
_GLIBC_MUTEX_BYTES: Final = {"x86_64": 40, "aarch64": 48, "i686": 24, "armv7l": 24}
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
        for name in ("lock", "trylock", "unlock", "consistent", "init", "attr_setrobust"):
            getattr(libc, f"pthread_mutex{'' if name.startswith('attr') else '_'}{name}")
    except (OSError, AttributeError):
        return None
    return libc


_libc: Final = _load_libc()


def robust_error(rc: int) -> OSError:
    return OSError(rc, f"the section mutex failed: {errno.errorcode.get(rc, rc)}")


class RobustMutex:
    """The robust process-shared mutex in one section block (a writable mapping)."""

    def __init__(self, block: mmap.mmap) -> None:
        if _libc is None:
            raise OSError(errno.ENOSYS, "robust mutexes need glibc's pthread functions")
        if len(block) < SECTION_BYTES:
            raise ValueError("a section block is smaller than its layout")
        self._block = block
        # An export of the mapping: it stays mapped while a thread waits on it.
        self._mutex = (ctypes.c_char * MUTEX_BYTES).from_buffer(block, SECTION_MUTEX_AT)

    def create(self) -> None:
        """Initialise a new mutex (process-shared, robust)."""
        assert _libc is not None
        attr = ctypes.create_string_buffer(_MUTEXATTR_BYTES)
        rc = _libc.pthread_mutexattr_init(attr)
        if rc == 0:
            rc = _libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED)
            if rc == 0:
                rc = _libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST)
            if rc == 0:
                rc = _libc.pthread_mutex_init(self._mutex, attr)
            _libc.pthread_mutexattr_destroy(attr)
        if rc != 0:
            raise robust_error(rc)

    def acquire(self) -> None:
        """Lock, waiting without the GIL; repairs an ``EOWNERDEAD`` mutex."""
        assert _libc is not None
        rc = _libc.pthread_mutex_trylock(self._mutex)
        if rc == errno.EBUSY:
            rc = _libc.pthread_mutex_lock(self._mutex)
        if rc == errno.EOWNERDEAD:
            if recovery_hook is not None:
                recovery_hook()
            rc = _libc.pthread_mutex_consistent(self._mutex)
            if rc == 0:
                at = SECTION_RECOVERIES_AT
                recoveries = int.from_bytes(self._block[at : at + 8], "little") + 1
                self._block[at : at + 8] = (recoveries % (1 << 64)).to_bytes(8, "little")
        if rc != 0:
            raise robust_error(rc)

    def release(self) -> None:
        """Unlock."""
        assert _libc is not None
        rc = _libc.pthread_mutex_unlock(self._mutex)
        if rc != 0:
            raise robust_error(rc)
