"""The critical section of a shared region, anchored in the region's own object.

Every SHM object ends with a *section block* (one page, see docs/format.md): a
magic, the mechanism every peer must use, the C library's mutex size, the
number of stripes, a count of recoveries, and (for the robust mutex) one
``pthread_mutex_t`` per stripe.
Because the lock lives in the object, any two processes that map the object
exclude each other, whatever their environment (``XDG_RUNTIME_DIR``,
``TMPDIR``, working folder): there is no lock file to disagree about.

Two mechanisms, both released by the kernel when their holder dies (lease contract,
"Crash-safe"), measured side by side in ``bench/section_bench.py``:

* :data:`ROBUST_MUTEX` (the default): a ``PTHREAD_PROCESS_SHARED`` +
  ``PTHREAD_MUTEX_ROBUST`` mutex in the block. Uncontended it costs no system
  call; a dead holder's mutex locks with ``EOWNERDEAD`` and is repaired (each
  table step is crash-safe by its write order, so marking it consistent is the
  whole repair). Through the C module or, without it, ctypes on glibc.
* :data:`FLOCK`: ``flock`` on the object's own descriptor (two system calls a
  section); for C libraries whose mutex layout is unknown. ``ORBIT_SECTION=flock``
  chooses it when an object is created.

The mechanism is recorded when the object is created; a peer that cannot use
the recorded one refuses with :class:`LayoutMismatch` instead of silently not
excluding.

Stripes. A lock table's state object has several robust mutexes, each guarding
a contiguous run of slots, so that steps on keys far apart run at once in
different processes (``lock/_fastpath.c`` locks only the stripes a key's probe
covers). Everything else, and every Python step, enters the whole section:
every stripe, in ascending order. A flock section has one stripe.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import struct
import threading
from collections.abc import Callable
from typing import Final, Protocol

from . import _robust
from ._errors import LayoutMismatch
from ._robust import SECTION_BYTES, SECTION_MUTEX_AT, SECTION_STRIPES_MAX

try:
    from . import _robust_c
except ImportError:  # not built (no C compiler): ctypes on glibc, or flock
    _robust_c = None  # type: ignore[assignment, unused-ignore]

#: Section block: magic, version, mechanism, C library, mutex bytes, stripes (then
#: at 16 the u64 recovery count and from 64 the stripe mutexes, see ``_robust``).
BLOCK: Final = struct.Struct("<IHBBIH")
BLOCK_MAGIC: Final = 0x4353524F  # "ORSC"
BLOCK_VERSION: Final = 2
ROBUST_MUTEX: Final = 1
FLOCK: Final = 2
MECHANISMS: Final = {"mutex": ROBUST_MUTEX, "flock": FLOCK}
_PAGE: Final = mmap.ALLOCATIONGRANULARITY
#: Bytes from SECTION_MUTEX_AT that hold the stripe mutexes: all zero in an object
#: created for flock, never all zero once a mutex is made there.
_MUTEX_AREA: Final = SECTION_BYTES - SECTION_MUTEX_AT


def block_offset(size: int) -> int:
    """Where the section block of an object whose layout needs ``size`` bytes starts."""
    return -(-size // _PAGE) * _PAGE


def object_bytes(size: int) -> int:
    """The whole object: the layout, padding to a page, the section block."""
    return block_offset(size) + SECTION_BYTES


class Mutex(Protocol):
    """Either twin of the robust mutex (``_robust_c.RobustMutex``, ``_robust.RobustMutex``)."""

    def create(self) -> None: ...
    def acquire(self) -> int: ...
    def release(self) -> None: ...
    def release_mine(self) -> int: ...


def _mutex_type() -> Callable[[mmap.mmap, int], Mutex] | None:
    """The robust mutex implementation this process can use, C first."""
    if _robust_c is not None and _robust_c.GLIBC:
        return _robust_c.RobustMutex
    return _robust.RobustMutex if _robust.GLIBC else None


def _mutex_bytes() -> int:
    return int(_robust_c.MUTEX_BYTES) if _robust_c is not None else _robust.MUTEX_BYTES


def chosen_mechanism() -> int:
    """The mechanism a new object records: ``ORBIT_SECTION`` if set, else the mutex if usable.

    Raises:
        LayoutMismatch: ``ORBIT_SECTION`` names no mechanism, or one this process cannot use.
    """
    wanted = os.environ.get("ORBIT_SECTION", "")
    if wanted and wanted not in MECHANISMS:
        raise LayoutMismatch(f"ORBIT_SECTION must be one of {sorted(MECHANISMS)}, got {wanted!r}")
    usable = _mutex_type() is not None
    if wanted == "mutex" and not usable:
        raise LayoutMismatch("ORBIT_SECTION=mutex: this process has no glibc robust mutex")
    return MECHANISMS[wanted] if wanted else (ROBUST_MUTEX if usable else FLOCK)


class Section(Protocol):
    """One region's cross-process lock (threads are excluded by the region's own mutex)."""

    mechanism: int
    stripes: int

    def acquire(self) -> int: ...  # how many stripe mutexes it repaired (a holder died)
    def release(self) -> None: ...
    def release_mine(self) -> None: ...
    def after_fork_in_child(self) -> None: ...
    def close(self) -> None: ...


class MutexSection:
    """The robust stripe mutexes in the block; nothing to close.

    A shared block's mutex is owned by a thread, not an open file, so a forked
    child simply locks it (waiting for a parent's thread if it must). A private
    block (``Fleet.local``) is the child's own copy, made anew after a fork: a
    copy locked by a parent's thread would never be unlocked in the child.
    """

    mechanism = ROBUST_MUTEX

    def __init__(
        self, block: mmap.mmap, stripes: int, *, create: bool, private: bool = False
    ) -> None:
        mutex_type = _mutex_type()
        assert mutex_type is not None
        self.stripes = stripes
        self.mutex: Mutex = mutex_type(block, stripes)
        self.private = private
        if create:
            self.mutex.create()
        self.acquire = self.mutex.acquire
        self.release = self.mutex.release

    def release_mine(self) -> None:
        """Unlock what this thread holds of the section (an acquire cut short)."""
        self.mutex.release_mine()

    def after_fork_in_child(self) -> None:
        if self.private:
            self.mutex.create()

    def close(self) -> None:
        """The block stays mapped while any thread may still wait on the mutex."""


class FlockSection:
    """``flock`` on the object's own descriptor (kept open for the region's life).

    The lock belongs to the open file description, which the region's mappings share
    (``mmap`` keeps a duplicate of the descriptor): closing the descriptor would not
    unlock it. So a :meth:`close` while a thread waits in :meth:`acquire` leaves the
    descriptor open until that thread, once it has the lock, lets it go again.
    """

    mechanism = FLOCK
    stripes = 1

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)
        os.set_inheritable(self.fd, False)
        #: Guards ``fd`` against a close racing an acquire (a few instructions each).
        self._guard = threading.Lock()
        self._waiting = 0
        self._closing = False

    def acquire(self) -> int:
        """Lock (waiting for another process's hold); returns 0 (the kernel lets a dead
        holder's lock go: nothing to repair).

        Raises:
            OSError: ``EBADF`` once closed, or ``flock``'s own.
        """
        with self._guard:
            if self._closing:
                raise OSError(errno.EBADF, "the section is closed")
            fd = self.fd
            self._waiting += 1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            with self._guard:
                self._waiting -= 1
        return 0

    def release(self) -> None:
        """Unlock; after a :meth:`close` that a waiter deferred, close the descriptor too."""
        with self._guard:
            if self.fd >= 0:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
                finally:
                    if self._closing and not self._waiting:
                        self._close_fd()

    def release_mine(self) -> None:
        """Unlock after an acquire cut short: the region's process mutex keeps this
        process's other threads out meanwhile, so any hold of the lock is this thread's."""
        with contextlib.suppress(OSError):
            self.release()

    def after_fork_in_child(self) -> None:
        """Open the same object anew: a flock through the inherited description is the parent's."""
        self._guard = threading.Lock()  # a parent's thread may have held it at the fork
        self._waiting = 0
        if self.fd < 0:
            return
        old, self.fd = self.fd, -1
        with contextlib.suppress(OSError):
            self.fd = os.open(f"/proc/self/fd/{old}", os.O_RDWR | os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            os.close(old)  # closing our copy never unlocks the parent's

    def close(self) -> None:
        """Close the descriptor, or, while a thread waits to lock, leave that to its release."""
        with self._guard:
            self._closing = True
            if not self._waiting:
                self._close_fd()

    def _close_fd(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _write_block(block: mmap.mmap, mechanism: int, stripes: int) -> None:
    block[: BLOCK.size] = BLOCK.pack(
        BLOCK_MAGIC, BLOCK_VERSION, mechanism, _robust.GLIBC, _mutex_bytes(), stripes
    )


def _check_stripes(stripes: int) -> None:
    if not 1 <= stripes <= SECTION_STRIPES_MAX:
        raise ValueError(f"stripes must be 1..{SECTION_STRIPES_MAX}, got {stripes}")


def create_section(block: mmap.mmap, fd: int, mechanism: int, stripes: int = 1) -> Section:
    """Write a new object's section block and return its section.

    ``stripes`` robust mutexes are made for the robust mechanism; flock has one stripe.
    """
    _check_stripes(stripes)
    if mechanism == ROBUST_MUTEX:
        _write_block(block, mechanism, stripes)
        return MutexSection(block, stripes, create=True)
    _write_block(block, mechanism, 1)
    return FlockSection(fd)


def private_section(block: mmap.mmap, stripes: int = 1) -> Section | None:
    """The section of process-private memory: robust mutexes where they can be locked.

    Without them the region's process mutex alone guards it (no other process maps it).
    """
    _check_stripes(stripes)
    if _mutex_type() is None:
        return None
    _write_block(block, ROBUST_MUTEX, stripes)
    return MutexSection(block, stripes, create=True, private=True)


def attach_section(block: mmap.mmap, fd: int, what: str, stripes: int = 1) -> Section:
    """Validate an existing object's section block and return its section.

    ``stripes`` is the count the caller's layout makes robust sections with.

    Raises:
        LayoutMismatch: bad magic or version, an unknown mechanism, flock recorded
            over an initialised mutex (its peers may lock the mutex), a robust
            mutex of another C library or size than this process's (or none usable
            here), or another stripe count than the layout's.
    """
    magic, version, mechanism, glibc, mutex_bytes, found = BLOCK.unpack(block[: BLOCK.size])
    if magic != BLOCK_MAGIC or version != BLOCK_VERSION:
        raise LayoutMismatch(f"{what}: no section block (magic {magic:#x}, version {version})")
    if mechanism == FLOCK:
        if any(block[SECTION_MUTEX_AT : SECTION_MUTEX_AT + _MUTEX_AREA]):
            raise LayoutMismatch(
                f"{what}: its section records flock but holds a mutex (a changed mechanism "
                "byte: its peers may be locking the mutex)"
            )
        if found != 1:
            raise LayoutMismatch(f"{what}: its flock section records {found} stripes, not 1")
        return FlockSection(fd)
    if mechanism != ROBUST_MUTEX:
        raise LayoutMismatch(f"{what}: unknown section mechanism {mechanism}")
    if _mutex_type() is None or not glibc or mutex_bytes != _mutex_bytes():
        raise LayoutMismatch(
            f"{what}: its section is a robust mutex of {mutex_bytes} bytes "
            f"({'glibc' if glibc else 'another C library'}), which this process cannot lock; "
            "every peer of a fleet must use the same C library"
        )
    if found != stripes:
        raise LayoutMismatch(
            f"{what}: its section has {found} stripes, where this layout makes {stripes}"
        )
    return MutexSection(block, stripes, create=False)


def recoveries(block: mmap.mmap) -> int:
    """How many times a peer found a stripe mutex's holder dead and repaired it."""
    at = _robust.SECTION_RECOVERIES_AT
    return int.from_bytes(block[at : at + 8], "little")
