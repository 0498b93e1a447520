"""Shared-memory regions: one mapped object per (fleet, kind, user id).

Facts this module relies on:

* On Linux ``shm_open(name)`` is ``open("/dev/shm/" + name)`` on a tmpfs; we open the
  path ourselves so that ``O_NOFOLLOW`` and ``O_EXCL`` apply and no
  ``multiprocessing.resource_tracker`` is involved. (The tracker unlinks segments
  when the process that *attached* exits, the trap this module exists to avoid:
  a process that only attaches never unlinks.)
* ``link(2)`` of a new name fails with ``EEXIST`` when the name exists. A new
  object is therefore created under a temporary name, sized, fully initialised
  (header and section block) and only then linked to its real name: a peer never
  attaches to a half-written header, and no lock file is needed to create one.
  A creator killed before the link leaves only its temporary name, which no peer
  opens (``orbit clear`` removes it).
* Each object carries its own critical section in its section block (see
  ``_section``), so every process that maps the object is excluded, whatever
  its environment.

Invariant: every mutation of a region's bytes by a table happens between
``acquire()`` and ``release()``: the process mutex (threads) and then the
object's section (processes).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import re
import secrets
import stat
import struct
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

from . import _fork
from ._access import check_shm_dir, euid, open_checked
from ._errors import AccessDenied, FleetError, LayoutMismatch, OrbitError, ShmFull
from ._robust import SECTION_BYTES
from ._section import (
    Section,
    attach_section,
    block_offset,
    chosen_mechanism,
    create_section,
    object_bytes,
    private_section,
    recoveries,
)

SHM_DIR: Final = Path("/dev/shm")
#: Marks the temporary name of an object being created (``orbit clear`` removes leftovers).
CREATING: Final = ".creating-"
#: Seconds ``close`` waits for another thread's critical section before it closes
#: anyway (a step takes microseconds; a longer wait is a section stuck in ``flock``).
CLOSE_WAIT: Final = 1.0
#: What a robust mutex's lock or unlock returns when its bytes are not a mutex any
#: peer could have left: a foreign type word, a futex word naming this very thread
#: (or, on unlock, no longer naming it), a mutex a holder left unrepaired (``_robust.h``).
_CORRUPT_MUTEX: Final = frozenset({errno.EINVAL, errno.EDEADLK, errno.ENOTRECOVERABLE, errno.EPERM})
Init = Callable[[mmap.mmap], None]
Validate = Callable[[mmap.mmap], None]
_log = logging.getLogger("orbitive.fleet")


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


def _path(name: str) -> Path:
    return SHM_DIR / name


def open_object(name: str, *, create: bool) -> int:
    """Open an SHM object read/write (``create``: create-exclusive), checked as ours.

    Raises:
        AccessDenied: a symlink, another owner (even with mode 0600), a wider mode,
            or ``/dev/shm`` itself is not a directory only its owner can plant in.
        FleetError: this system has no ``/dev/shm``.
    """
    check_shm_dir(SHM_DIR)
    return open_checked(_path(name), create=create, exclusive=create)


def open_or_create(name: str, size: int, init: Callable[[int], None]) -> tuple[int, bool]:
    """Open the object ``name``, or create it: sized and initialised before it has its name.

    Args:
        name: the object's name in ``/dev/shm``.
        size: bytes of a new object.
        init: writes a new object's contents through its descriptor.

    Returns:
        ``(descriptor, created)``; the caller owns the descriptor.

    Raises:
        AccessDenied: as for :func:`open_object`, or something already has the new
            object's random temporary name. FleetError: no space for it.
    """
    while True:
        with contextlib.suppress(FileNotFoundError):
            return open_object(name, create=False), False
        temporary = f"{name}{CREATING}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            fd = open_object(temporary, create=True)
        except FileExistsError:
            raise AccessDenied(
                f"shm object {temporary!r} exists: its random name was planted; refusing it"
            ) from None
        try:
            _allocate(fd, name, size)
            init(fd)
            os.link(_path(temporary), _path(name))
        except (FileExistsError, FileNotFoundError):
            # Another creator won: attach to its object. Or an ``orbit clear``
            # took the temporary name for a dead creator's: create anew.
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        finally:
            unlink_object(temporary)
        return fd, True


def _allocate(fd: int, name: str, size: int) -> None:
    """Size a new object, reserving its pages.

    A sparse tmpfs object that later finds ``/dev/shm`` full kills the writer
    with SIGBUS; ``posix_fallocate`` refuses up front instead.

    Raises:
        ShmFull: not enough space for the object.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise
        raise no_space([name], size, error.strerror or "") from error


def shm_free() -> int:
    """Bytes ``/dev/shm`` has free for this user now (``statvfs``: ``f_bavail * f_frsize``)."""
    found = os.statvfs(SHM_DIR)
    return found.f_bavail * found.f_frsize


#: What a :class:`ShmFull` message says to do.
SHM_ADVICE: Final = (
    "make the fleet's objects smaller (a fleet capacity near the processes you run, "
    "Fleet.join(name, capacity=N) or shm://FLEET?capacity=N; a lock table's ring, "
    "LockLayout(ring_capacity=N)), remove fleets nobody uses ('orbit list', then "
    "'orbit clear FLEET --all --yes'), or give /dev/shm more room: Docker "
    "--shm-size=256m (Compose: shm_size), Kubernetes an emptyDir volume with "
    "medium: Memory mounted at /dev/shm"
)


def no_space(names: Sequence[str], size: int, cause: str = "") -> ShmFull:
    """The error for new objects ``names`` of ``size`` bytes in all that ``/dev/shm``
    has no room for."""
    what = " and ".join(repr(name) for name in names)
    because = f" ({cause})" if cause else ""
    return ShmFull(
        f"shm object{'s' if len(names) > 1 else ''} {what}: no space for {size:,} bytes "
        f"in {SHM_DIR}, {shm_free():,} bytes free{because}; {SHM_ADVICE}"
    )


def check_space(names_and_sizes: Collection[tuple[str, int]]) -> None:
    """Refuse, before any is created, objects that ``/dev/shm`` has no room for together.

    ``names_and_sizes``: (object name, bytes of the new object); names that exist
    already are attached, not created, and need no room. The check is advisory
    (another process may take the room after it); ``posix_fallocate`` is the last word.

    Raises:
        ShmFull: the new objects together need more than ``/dev/shm`` has free.
    """
    new = [(name, size) for name, size in names_and_sizes if not _path(name).exists()]
    needed = sum(size for _, size in new)
    if new and needed > shm_free():
        raise no_space([name for name, _ in new], needed)


def client_socket_name(fleet: str, kind: int, node: int, tag: str, *, loans: bool = False) -> str:
    """The name in ``/dev/shm`` of the Unix socket a client pool's owner on ``node``
    serves remote requests on (``tag``: hex digits of the pool's key), or, ``loans``,
    lends its server connections to other processes' transactions on."""
    role = "txn" if loans else "clients"
    return f"orbit-{fleet}-{kind}-{role}-{node}-{tag}-{euid()}.sock"


def router_folder_name(fleet: str, kind: int, node: int) -> str:
    """The name in ``/dev/shm`` of the folder (0700) that holds the listening sockets
    (``.s.PGSQL.{port}``) of the transaction mode's routers of ``node``."""
    return f"orbit-{fleet}-{kind}-pg-{node}-{euid()}"


#: What a router's folder may hold: its listening sockets, named as libpq looks for them.
_ROUTER_SOCKET: Final = re.compile(r"\.s\.PGSQL\.\d{1,5}")


def unlink_object(name: str) -> bool:
    """Remove an SHM object name (or client socket, or router folder) of ours; True if
    it existed.

    Mappings stay valid. A name that is another user's, or neither a regular
    file nor a socket, is left as it is: the sticky ``/dev/shm`` lets only its
    owner remove it, and root must not remove what another user planted. A router's
    folder (:func:`router_folder_name`, a directory, never a symlink) goes with the
    sockets in it, only when each is a socket of ours named as a router names one.

    Raises:
        AccessDenied: the name, or something in a router's folder, is not ours to
            remove (the message names it).
    """
    path = _path(name)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        return _remove_router_folder(path, info)
    _check_removable(path, info, stat.S_ISREG(info.st_mode) or stat.S_ISSOCK(info.st_mode))
    return _unlink(path)


def _check_removable(path: Path, info: os.stat_result, made_by_us: bool) -> None:
    """Raise AccessDenied unless ``path`` (its ``lstat`` ``info``) is ours and of a
    type orbitive makes there (``made_by_us``)."""
    if info.st_uid != euid():
        raise AccessDenied(f"not removing {str(path)!r}: owned by uid {info.st_uid}, not {euid()}")
    if not made_by_us:
        raise AccessDenied(f"not removing {str(path)!r}: not a file or socket orbitive makes")


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except PermissionError as error:
        raise AccessDenied(f"not removing {str(path)!r}: {error.strerror}") from None
    return True


def _remove_router_folder(path: Path, info: os.stat_result) -> bool:
    """Remove a router's folder of ours with the listening sockets a killed router left."""
    _check_removable(path, info, stat.S_IMODE(info.st_mode) == 0o700)
    with os.scandir(path) as entries:
        for entry in entries:
            inner = entry.stat(follow_symlinks=False)
            socket = stat.S_ISSOCK(inner.st_mode) and _ROUTER_SOCKET.fullmatch(entry.name)
            _check_removable(Path(entry.path), inner, bool(socket))
            _unlink(Path(entry.path))
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return False
    except OSError as error:  # a router of a live process bound a socket meanwhile
        raise AccessDenied(f"not removing {str(path)!r}: {error.strerror}") from None
    return True


def fleet_entries(fleet: str, kinds: Collection[int], *, members: bool) -> list[str]:
    """The names in ``/dev/shm`` of fleet ``fleet`` (exactly: not those of ``fleet-2``)
    under this user's pattern, whoever owns them, for ``orbit clear``.

    They are the fleet's objects of ``kinds``, its membership object when
    ``members``, the client sockets, readiness sockets and router folders of ``kinds``
    (a killed watcher's or router's stays until its node binds it again) and the
    temporary names of creations whose creator is gone; the membership object comes
    last.
    """
    wanted = {str(kind) for kind in kinds}
    found, membership = [], []
    for name, match in _fleet_names(fleet):
        if CREATING in name:
            if not creator_alive(name):
                found.append(name)
        elif match["members"]:
            membership += [name] if members else []
        elif (match["kind"] or match["socket"] or match["watch"] or match["router"]) in wanted:
            found.append(name)
    return sorted(found) + membership


def _fleet_names(fleet: str) -> Iterator[tuple[str, re.Match[str]]]:
    """Every name in ``/dev/shm`` that this user's objects, temporary names, client
    sockets, readiness sockets and router folders of fleet ``fleet`` take
    (:func:`object_name`, ``_fleet.members_name``, :func:`client_socket_name`,
    ``_channel.Channel.path``, :func:`router_folder_name`), with its match: ``kind``,
    ``members``, ``socket``, ``watch`` or ``router``."""
    uid, escaped = euid(), re.escape(fleet)
    pattern = re.compile(
        rf"orbit-{escaped}-(?:(?P<kind>\d{{1,3}})|(?P<members>members))-{uid}"
        rf"(?:{re.escape(CREATING)}\d+-[0-9a-f]+)?"
        rf"|orbit-{escaped}-(?P<socket>\d{{1,3}})-(?:clients|txn)-\d+-[0-9a-f]+-{uid}\.sock"
        rf"|orbit-{escaped}-(?P<watch>\d{{1,3}})-{uid}\.w\d+\.n\d+\.b\d+"
        rf"|orbit-{escaped}-(?P<router>\d{{1,3}})-pg-\d+-{uid}"
    )
    for entry in os.scandir(SHM_DIR):
        match = pattern.fullmatch(entry.name)
        if match is not None:
            yield entry.name, match


def listed_objects() -> list[tuple[str, int, int]]:
    """(fleet, kind, bytes) of every orbit SHM object of this user, sorted.

    Entries that are not our regular files, and objects still being created, are skipped.
    """
    return sorted(
        (fleet, int(kind), size) for fleet, kind, size in _our_objects() if kind.isdigit()
    )


def listed_memberships() -> list[tuple[str, int]]:
    """(fleet, bytes) of every membership object of this user, sorted by fleet."""
    return sorted((fleet, size) for fleet, kind, size in _our_objects() if kind == "members")


def _our_objects() -> Iterator[tuple[str, str, int]]:
    """(fleet, kind or ``members``, bytes) of every regular file of ours named
    ``orbit-{fleet}-{kind}-{uid}``: no socket, no temporary name, nobody else's."""
    suffix = f"-{euid()}"
    for entry in os.scandir(SHM_DIR):
        if not entry.name.startswith("orbit-") or not entry.name.endswith(suffix):
            continue
        fleet, _, kind = entry.name[len("orbit-") : -len(suffix)].rpartition("-")
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if fleet and stat.S_ISREG(st.st_mode) and st.st_uid == euid():
                yield fleet, kind, st.st_size


def leftover_creations(fleet: str) -> list[str]:
    """Temporary names of fleet ``fleet``'s objects (exactly that fleet's), sorted: each
    is a creation under way, or one whose creator died before linking it."""
    return sorted(name for name, _ in _fleet_names(fleet) if CREATING in name)


def creator_alive(name: str) -> bool:
    """Whether the process that made the temporary name ``name`` still lives."""
    pid = name.rpartition(CREATING)[2].partition("-")[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, and another user's
    return True


def object_size(name: str) -> int | None:
    """Size in bytes of an existing object we own, or None when absent."""
    try:
        fd = open_object(name, create=False)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_prefix(name: str, size: int) -> bytes:
    """The first ``size`` bytes of an existing object we own (zero-padded if shorter)."""
    fd = open_object(name, create=False)
    try:
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    return data.ljust(size, b"\0")


def map_section(fd: int, size: int, what: str, stripes: int = 1) -> tuple[mmap.mmap, Section]:
    """Map the section block of an existing object whose layout is ``size`` bytes.

    ``stripes``: the count of stripe mutexes the layout makes (see ``_section``).

    Raises:
        LayoutMismatch: the object is not exactly that layout plus its block, or the
            block is not one this process can use.
    """
    actual = os.fstat(fd).st_size
    if actual != object_bytes(size):
        raise LayoutMismatch(
            f"{what} has {actual} bytes; its layout and section block need {object_bytes(size)}"
        )
    block = mmap.mmap(fd, SECTION_BYTES, mmap.MAP_SHARED, offset=block_offset(size))
    try:
        return block, attach_section(block, fd, what, stripes)
    except BaseException:
        block.close()
        raise


class Region:
    """One mapped SHM object (or private anonymous memory) with its critical section.

    Build with :meth:`open_shared` or :meth:`open_private`. ``buf`` is the mapping;
    ``with region:`` (or ``acquire``/``release``) brackets every mutation.

    Steps enter with ``with region:``, whose ``__enter__`` is :meth:`acquire` itself:
    then no Python signal handler can run between ``acquire`` returning and the block
    (the interpreter runs none between ``__enter__`` returning and the block's first
    instruction), so an exception a handler raises once the section is held surfaces
    either inside ``acquire`` (which lets go) or inside the block (whose exit lets
    go). After a plain call ``region.acquire()``, CPython 3.10 runs pending handlers
    at the call itself, in the caller, with the section already held: the caller
    sees the exception as if ``acquire`` had raised and never releases.
    """

    fleet: str
    kind: int
    name: str
    size: int
    buf: mmap.mmap
    #: The section block's own mapping (shared regions only).
    block: mmap.mmap
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
        self.section: Section | None = None
        #: An RLock for the owner it knows (:meth:`holds`), never taken twice by one
        #: thread (:meth:`acquire` refuses a re-entry).
        self._mutex = threading.RLock()
        #: ``inside`` is True in a thread from just before it takes the mutex to just
        #: after it lets go: a close() that finds it set runs inside that section.
        self._thread = threading.local()
        self._closed = False
        self._close_hooks: list[Callable[[], None]] = []
        #: Stripe mutexes the thread inside repaired, reported once it has let go.
        self._repaired = 0

    # -- construction ------------------------------------------------------------

    @classmethod
    def open_shared(
        cls, fleet: str, kind: int, size: int, init: Init, validate: Validate, stripes: int = 1
    ) -> Region:
        """Create or attach ``orbit-{fleet}-{kind}-{uid}``.

        A new object is initialised (``init``, then its section block) before it
        gets its name, so every peer sees a whole header.

        Args:
            fleet: validated fleet name.
            kind: SHM kind number, 0..255.
            size: bytes the layout needs (the object adds its section block).
            init: writes the header into a new, zeroed mapping.
            validate: raises :class:`LayoutMismatch` when an existing mapping's
                header differs from the expected layout.
            stripes: robust mutexes in the section block (``_section``), 1..63.

        Raises:
            AccessDenied: foreign owner, wider mode or symlink (object untouched).
            LayoutMismatch: the existing object has another size, header or section.
            ShmFull: no space in ``/dev/shm`` for a new object (a :class:`FleetError`).
        """
        region = cls(fleet, kind, size, shared=True)
        mechanism = chosen_mechanism()

        def create(fd: int) -> None:
            region.buf = region._map_layout(fd)
            init(region.buf)
            region.block = region._map_block(fd)
            region.section = create_section(region.block, fd, mechanism, stripes)

        try:
            fd, region.created = open_or_create(region.name, object_bytes(size), create)
            try:
                if not region.created:
                    region.block, region.section = map_section(fd, size, repr(region.name), stripes)
                    region.buf = region._map_layout(fd)
                    validate(region.buf)
            finally:
                os.close(fd)
        except BaseException:
            region.close()
            raise
        _fork.register(region)
        return region

    @classmethod
    def open_private(cls, fleet: str, kind: int, size: int, init: Init, stripes: int = 1) -> Region:
        """Process-private anonymous memory with the same interface (``Fleet.local``)."""
        region = cls(fleet, kind, size, shared=False)
        # MAP_PRIVATE: a forked child gets a copy, not memory shared without a section.
        region.buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        region.created = True
        init(region.buf)
        region.block = mmap.mmap(-1, SECTION_BYTES, flags=mmap.MAP_PRIVATE)
        region.section = private_section(region.block, stripes)
        _fork.register(region)
        return region

    def _map_layout(self, fd: int) -> mmap.mmap:
        return mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def _map_block(self, fd: int) -> mmap.mmap:
        return mmap.mmap(fd, SECTION_BYTES, mmap.MAP_SHARED, offset=block_offset(self.size))

    # -- critical section ----------------------------------------------------------

    def acquire(self) -> None:
        """Enter the critical section: process mutex, then the object's section.

        An exception raised once the process mutex or the section is locked but
        before this returns (a signal handler's, ``KeyboardInterrupt``) unlocks them
        again as it propagates.

        Raises:
            FleetError: the region is closed (its mapping is gone), its ``flock``
                failed, or this thread is inside the section already (a signal
                handler calling the table inside one of its steps).
            LayoutMismatch: the section's robust mutex is corrupt (see docs/format.md).
        """
        if self.holds():
            raise FleetError(
                f"shm object {self.name!r}: entered again by the thread inside it (a signal "
                "handler calling the table inside one of its steps); waiting would never end"
            )
        try:
            self._thread.inside = True
            self._mutex.acquire()
            if self._closed:
                raise FleetError(f"shm object {self.name!r} is closed")
            if self.section is not None:
                try:
                    repaired = self.section.acquire()
                except OSError as error:
                    raise self._section_error(error) from error
                if self._closed:  # closed while this thread waited for the section
                    self.section.release()
                    self.report_repaired(repaired)
                    raise FleetError(f"shm object {self.name!r} is closed")
                if repaired:
                    self._repaired = repaired
        except BaseException as error:
            if self.section is not None and not isinstance(error, OrbitError):
                # Not a failure to lock but an exception raised once the lock was taken
                # (a signal handler's, KeyboardInterrupt): the section would stay held by
                # a live thread, and every process of the fleet would wait for ever.
                self.section.release_mine()
            if self.holds():  # not when the exception came before the mutex was taken
                self._mutex.release()
            self._thread.inside = False
            if self._closed and not isinstance(error, FleetError):
                raise FleetError(f"shm object {self.name!r} is closed") from None
            raise

    __enter__ = acquire

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        """Leave the critical section entered by ``with region:`` (raises as :meth:`release`)."""
        self.release()

    def _section_error(self, error: OSError) -> FleetError | LayoutMismatch:
        """The named error of a section that failed to lock: a corrupt mutex, or another failure."""
        if error.errno == errno.EDEADLK:
            return LayoutMismatch(
                f"shm object {self.name!r}: its section mutex names this very thread as its "
                "holder: forged bytes, or a re-entry (a signal handler calling the table "
                "inside one of its steps); waiting would never end"
            )
        if error.errno in _CORRUPT_MUTEX:
            return LayoutMismatch(
                f"shm object {self.name!r}: its section mutex is corrupt ({error.strerror}); "
                "stop every member and remove the object (orbit clear)"
            )
        return FleetError(f"shm object {self.name!r}: {error}")

    def release(self) -> None:
        """Leave the critical section entered by :meth:`acquire`.

        After a forced :meth:`close` of a flock section the descriptor is gone, and
        so is its lock.

        Raises:
            LayoutMismatch: the mutex's futex word no longer names this thread
                (bytes forged while it held the section).
        """
        repaired = self._repaired
        try:
            if self.section is not None:
                self.section.release()
        except OSError as error:
            raise self._section_error(error) from error
        finally:  # inline: an exception at a call's start would leave the mutex held
            if repaired:
                self._repaired = 0
            self._mutex.release()
            self._thread.inside = False
            if repaired:
                self.report_repaired(repaired)

    def report_repaired(self, count: int) -> None:
        """Log that this process repaired ``count`` stripe mutexes of the section, whose
        holder died inside it (``EOWNERDEAD``); called once the section is let go (the
        C steps call it too). Nothing for 0."""
        if count and self.section is not None:
            _log.warning(
                "shm object %r: a process died inside its critical section; this process "
                "repaired %d stripe mutex(es) (EOWNERDEAD), %d repair(s) of this object in all",
                self.name,
                count,
                recoveries(self.block),
            )

    def holds(self) -> bool:
        """Whether this thread holds the process mutex (it is inside a step)."""
        return bool(self._mutex._is_owned())  # type: ignore[attr-defined]

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the region closes, before its mapping goes (the C operations)."""
        self._close_hooks.append(hook)

    # -- lifecycle -----------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.RLock()
        self._thread = threading.local()
        if self.section is not None and not self._closed:
            self.section.after_fork_in_child()

    def close(self) -> None:
        """Unmap the layout and close descriptors; never unlinks. Idempotent.

        Waits for a critical section another thread is in (up to
        :data:`CLOSE_WAIT` seconds), so that step finishes under its locks; later
        :meth:`acquire` calls raise :class:`FleetError`. Called from inside this
        thread's own section (a signal handler), it closes at once, and the
        interrupted step ends with the mapping's ``ValueError``. The section block
        stays mapped while its section object lives (a thread may wait on it).
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
        for hook in self._close_hooks:
            hook()
        if self.section is not None:
            self.section.close()
        buf = getattr(self, "buf", None)
        if buf is not None:
            with contextlib.suppress(BufferError, ValueError):
                buf.close()

    def unlink(self) -> None:
        """Remove the object's name; existing mappings stay valid."""
        self.unlinked = True
        if self.shared:
            unlink_object(self.name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("shared" if self.shared else "private")
        return f"<Region {self.name!r} {self.size} bytes {state}>"
