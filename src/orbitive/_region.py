"""Shared-memory regions: one mapped object per (fleet, kind, user id).

Facts this module relies on:

* On Linux ``shm_open(name)`` is ``open("/dev/shm/" + name)`` on a tmpfs; we open the
  path ourselves so that ``O_NOFOLLOW`` and ``O_EXCL`` apply and no
  ``multiprocessing.resource_tracker`` is involved. (The tracker unlinks segments
  when the process that *attached* exits, the trap this module exists to avoid:
  a process that only attaches never unlinks.) Elsewhere CPython's
  ``_posixshmem.shm_open`` is used.
* ``flock`` locks belong to an open file description and the kernel drops them
  when the last descriptor of it closes, however the process died. A forked
  child shares its parent's descriptions, so every region reopens its lock file
  in the child (see ``_fork``) instead of flocking an inherited descriptor.
* A new tmpfs object reads as zeros after ``ftruncate``. Creation and header
  initialisation happen while the kind's lock file is held exclusively, so a
  peer never attaches to a half-initialised header; any failure after creating
  the object unlinks it again. A creator killed between ``open`` and the header
  write leaves an empty or all-zero object; the next opener, holding the same
  flock, knows nobody else is initialising it and initialises it.

Invariant: every mutation of a region's bytes by the lock table happens between
``acquire()`` and ``release()``: the process mutex (threads) and then the
``flock`` (processes).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from . import _fork
from ._access import check_fd, euid, lock_dir, open_checked
from ._errors import AccessDenied, FleetError, LayoutMismatch

SHM_DIR: Final = Path("/dev/shm")
_USE_SHM_DIR: Final = SHM_DIR.is_dir()

#: Leading bytes that are never all zero in an initialised object (every layout
#: starts with a non-zero magic); all zero under the flock means the creator died.
HEADER_PROBE: Final = 16
#: Seconds ``close`` waits for another thread's critical section before it closes
#: anyway (a step takes microseconds; a longer wait is a section stuck in ``flock``).
CLOSE_WAIT: Final = 1.0
Init = Callable[[mmap.mmap], None]
Validate = Callable[[mmap.mmap], None]


def store(buf: mmap.mmap, offset: int, layout: struct.Struct, *values: object) -> None:
    """Write ``values`` packed by ``layout`` at ``offset`` of a mapping, in one copy.

    Every store into shared memory goes through here (or a slice assignment like
    it), never ``layout.pack_into``: CPython's ``pack_into`` zeroes its whole
    target before it writes the fields, so a process killed between the two
    leaves zeros behind (a fence counter back at 0, a slot state read as EMPTY,
    a ring head hiding its frames), and a lock-free reader can see them.
    """
    buf[offset : offset + layout.size] = layout.pack(*values)


def object_name(fleet: str, kind: int) -> str:
    """The SHM object name (no leading slash) of one (fleet, kind, user id)."""
    return f"orbit-{fleet}-{kind}-{euid()}"


def lock_path(fleet: str, kind: int) -> Path:
    """The companion lock file whose ``flock`` serialises that object."""
    return lock_dir() / f"{object_name(fleet, kind)}.lock"


def _open_object(name: str, *, create: bool) -> int:
    """Open an SHM object read/write; ``create`` means create-exclusive."""
    if _USE_SHM_DIR:
        return open_checked(SHM_DIR / name, create=create, exclusive=create)
    import _posixshmem  # type: ignore[import-not-found]  # noqa: PLC0415 - no /dev/shm here

    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd: int = _posixshmem.shm_open("/" + name, flags, mode=0o600)
    try:
        check_fd(fd, f"shm object {name!r}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink_object(name: str) -> bool:
    """Remove an SHM object name; True if it existed. Mappings stay valid."""
    try:
        if _USE_SHM_DIR:
            os.unlink(SHM_DIR / name)
        else:
            import _posixshmem  # noqa: PLC0415 - only where /dev/shm is missing

            _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def listed_objects() -> list[tuple[str, int, int]]:
    """(fleet, kind, bytes) of every orbit SHM object of this user, sorted.

    Lists ``/dev/shm``; where there is none, objects cannot be listed and the
    result is empty. Entries that are not our regular files are skipped.
    """
    if not _USE_SHM_DIR:
        return []
    suffix = f"-{euid()}"
    found = []
    for entry in os.scandir(SHM_DIR):
        if not entry.name.startswith("orbit-") or not entry.name.endswith(suffix):
            continue
        fleet, _, kind = entry.name[len("orbit-") : -len(suffix)].rpartition("-")
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if fleet and kind.isdigit() and stat.S_ISREG(st.st_mode) and st.st_uid == euid():
                found.append((fleet, int(kind), st.st_size))
    return sorted(found)


def object_size(name: str) -> int | None:
    """Size in bytes of an existing object we own, or None when absent."""
    try:
        fd = _open_object(name, create=False)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_prefix(name: str, size: int) -> bytes:
    """The first ``size`` bytes of an existing object we own (zero-padded if shorter)."""
    fd = _open_object(name, create=False)
    try:
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    return data.ljust(size, b"\0")


class Region:
    """One mapped SHM object (or private anonymous memory) with its critical section.

    Build with :meth:`open_shared` or :meth:`open_private`. ``buf`` is the mapping;
    ``acquire``/``release`` bracket every mutation.
    """

    fleet: str
    kind: int
    name: str
    size: int
    buf: mmap.mmap
    created: bool

    def __init__(self, fleet: str, kind: int, size: int, *, shared: bool) -> None:
        # Defaults first, so close() is safe on a half-built region.
        self.fleet = fleet
        self.kind = kind
        self.name = object_name(fleet, kind)
        self.size = size
        self.created = False
        self.unlinked = False
        self.shared = shared
        self._lock_fd = -1
        self._mutex = threading.Lock()
        #: ``inside`` is True in a thread from just before it takes the mutex to just
        #: after it lets go: a close() that finds it set runs inside that section.
        self._thread = threading.local()
        self._closed = False

    # -- construction ------------------------------------------------------------

    @classmethod
    def open_shared(
        cls, fleet: str, kind: int, size: int, init: Init, validate: Validate
    ) -> Region:
        """Create or attach ``orbit-{fleet}-{kind}-{uid}``, under the kind's flock.

        Args:
            fleet: validated fleet name.
            kind: SHM kind number, 0..255.
            size: bytes the layout needs.
            init: writes the header into a new, zeroed mapping.
            validate: raises :class:`LayoutMismatch` when an existing mapping's
                header differs from the expected layout.

        Raises:
            AccessDenied: foreign owner, wider mode or symlink (object untouched).
            LayoutMismatch: the existing object is too small or its header differs.
        """
        region = cls(fleet, kind, size, shared=True)
        try:
            region._lock_fd = open_checked(lock_path(fleet, kind), create=True)
            fcntl.flock(region._lock_fd, fcntl.LOCK_EX)
            try:
                region._map(init, validate)
            finally:
                fcntl.flock(region._lock_fd, fcntl.LOCK_UN)
        except BaseException:
            region.close()
            raise
        _fork.register(region)
        return region

    @classmethod
    def open_private(cls, fleet: str, kind: int, size: int, init: Init) -> Region:
        """Process-private anonymous memory with the same interface (``Fleet.local``)."""
        region = cls(fleet, kind, size, shared=False)
        # MAP_PRIVATE: a forked child gets a copy, not memory shared without a flock.
        region.buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        region.created = True
        init(region.buf)
        return region

    def _map(self, init: Init, validate: Validate) -> None:
        try:
            fd = _open_object(self.name, create=True)
            self.created = True
        except FileExistsError:
            fd = _open_object(self.name, create=False)
        try:
            actual = os.fstat(fd).st_size
            if self.created or actual == 0:  # actual == 0: a creator died before sizing it
                self._allocate(fd)
                actual = self.size
                self.created = True
            if actual < self.size:
                raise LayoutMismatch(
                    f"shm object {self.name!r} has {actual} bytes; the layout needs {self.size}",
                    fleet=self.fleet,
                    kind=self.kind,
                )
            self.buf = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if not self.created and not any(self.buf[:HEADER_PROBE]):
                self.created = True  # a creator died before writing the header
            if self.created:
                init(self.buf)
            else:
                validate(self.buf)
        except BaseException:
            if self.created:
                unlink_object(self.name)
            raise
        finally:
            os.close(fd)

    def _allocate(self, fd: int) -> None:
        """Size the new object, reserving its pages where the system can.

        A sparse tmpfs object that later finds ``/dev/shm`` full kills the
        writer with SIGBUS; ``posix_fallocate`` refuses up front instead.

        Raises:
            FleetError: not enough space for the object.
        """
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, self.size)
            else:
                os.ftruncate(fd, self.size)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                raise
            raise FleetError(
                f"shm object {self.name!r}: no space for {self.size:,} bytes ({error.strerror})",
                fleet=self.fleet,
            ) from error

    # -- critical section ----------------------------------------------------------

    def acquire(self) -> None:
        """Enter the critical section: process mutex, then the kind's ``flock``.

        Raises:
            FleetError: the region is closed (its mapping is gone).
        """
        self._thread.inside = True
        self._mutex.acquire()
        try:
            if self._closed:
                raise FleetError(f"shm object {self.name!r} is closed")
            if self.shared:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                if self._closed:  # closed while this thread waited for the flock
                    raise FleetError(f"shm object {self.name!r} is closed")
        except BaseException as error:
            self._leave()
            if self._closed and not isinstance(error, FleetError):
                raise FleetError(f"shm object {self.name!r} is closed") from None
            raise

    def release(self) -> None:
        """Leave the critical section entered by :meth:`acquire`.

        After a forced :meth:`close` the descriptor is gone, and so is its lock.
        """
        try:
            if self.shared and self._lock_fd >= 0:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._leave()

    def _leave(self) -> None:
        self._mutex.release()
        self._thread.inside = False

    # -- lifecycle -----------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.Lock()
        self._thread = threading.local()
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing our copy never unlocks the parent's
            self._lock_fd = -1
            if not self._closed:
                with contextlib.suppress(OSError, AccessDenied):
                    self._lock_fd = open_checked(lock_path(self.fleet, self.kind), create=True)

    def close(self) -> None:
        """Unmap and close descriptors; never unlinks. Idempotent.

        Waits for a critical section another thread is in (up to
        :data:`CLOSE_WAIT` seconds), so that step finishes under its locks; later
        :meth:`acquire` calls raise :class:`FleetError`. Called from inside this
        thread's own section (a signal handler), it closes at once, and the
        interrupted step ends with the mapping's ``ValueError``.
        """
        if self._closed:
            return
        self._closed = True
        inside = getattr(self._thread, "inside", False)
        waited = not inside and self._mutex.acquire(timeout=CLOSE_WAIT)
        try:
            self._close_now()
        finally:
            if waited:
                self._mutex.release()

    def _close_now(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1
        buf = getattr(self, "buf", None)
        if buf is not None:
            with contextlib.suppress(BufferError, ValueError):
                buf.close()

    def unlink(self) -> None:
        """Remove the object's name and its lock file; existing mappings stay valid."""
        self.unlinked = True
        if self.shared:
            unlink_object(self.name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path(self.fleet, self.kind))

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("shared" if self.shared else "private")
        return f"<Region {self.name!r} {self.size} bytes {state}>"
