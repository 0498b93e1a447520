"""Fleet membership: a name, a capacity, this process's node and incarnation.

Membership is anchored in one SHM object per fleet, ``orbit-{name}-members-{uid}``
(docs/format.md, "Membership object"), so that every process that maps the
fleet's objects agrees on it, whatever its environment:

* its header records the fleet's capacity, written before the object gets its
  name (see ``_region.open_or_create``), so every joiner checks the same value;
* a node is claimed by a Linux open-file-description lock (``F_OFD_SETLK``) on
  byte ``node`` of that object, held for the life of the process. The kernel
  drops it the moment the process dies, however it dies, so "cannot take the
  node lock" means exactly "a live process holds that node". The descriptor is
  close-on-exec and a forked child closes its inherited copy without unlocking
  (see ``_fork``), then claims a node of its own on first use;
* members also hold ``flock(LOCK_SH)`` on it; ``orbit clear`` takes it
  ``LOCK_EX | LOCK_NB`` and so refuses while any member is alive.

``incarnation`` is unique per (node, process life): the previous value is kept
in the node's word of the membership object and the new one is
``max(previous + 1, time.time_ns())``, written while the node lock is held.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import struct
import time
from collections.abc import Collection, Iterator
from typing import Final, NamedTuple

from . import _fork
from ._access import euid
from ._errors import (
    CapacityMismatch,
    FleetError,
    InvalidCapacity,
    InvalidName,
    LayoutMismatch,
    NodeOutsideFleet,
    ShmFull,
    shown,
)
from ._region import (
    SHM_DIR,
    Init,
    Region,
    Validate,
    check_space,
    object_name,
    open_object,
    open_or_create,
    unlink_object,
)
from ._section import object_bytes

_NAME_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,32}")
#: Largest fleet capacity (node ids are 16-bit in every layout).
CAPACITY_MAX: Final = 4096
#: The capacity of a fleet joined with none given, when it does not exist yet (as ``shm://``).
CAPACITY_DEFAULT: Final = 64
_U64: Final = struct.Struct("<Q")
#: Membership object header: magic, version, reserved, capacity; incarnations from 64.
MEMBERS: Final = struct.Struct("<IHHI")
MEMBERS_MAGIC: Final = 0x424D524F  # "ORMB"
MEMBERS_VERSION: Final = 1
INCARNATIONS_AT: Final = 64
#: The capacity of the placeholder ``orbit clear`` holds while a fleet has no members object.
CLEARING: Final = 0
#: ``struct flock`` of 64-bit Linux: type, whence, start, length, pid (0 for OFD locks).
_FLOCK: Final = struct.Struct("=hh4xqqi4x")
_OFD_SETLK: Final = getattr(fcntl, "F_OFD_SETLK", 37)
_OFD_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", 36)
_local_incarnations = itertools.count(1)


def check_fleet_name(name: object) -> str:
    """Return ``name`` if it is 1..32 characters of ``[A-Za-z0-9._-]``.

    Raises:
        InvalidName: any other value (including non-strings).
    """
    if type(name) is not str or not _NAME_RE.fullmatch(name) or name in {".", ".."}:
        raise InvalidName(
            f"fleet name must be 1..32 characters of [A-Za-z0-9._-], got {shown(name)}"
        )
    return name


def _check_capacity(capacity: object) -> int:
    if type(capacity) is not int or not 1 <= capacity <= CAPACITY_MAX:
        raise InvalidCapacity(
            f"fleet capacity must be an int in 1..{CAPACITY_MAX}, got {shown(capacity)}"
        )
    return capacity


def members_name(name: str) -> str:
    """The fleet's membership object name (no leading slash)."""
    return f"orbit-{name}-members-{euid()}"


def _members_bytes(capacity: int) -> int:
    return INCARNATIONS_AT + 8 * capacity


def _read_capacity(fd: int, name: str) -> int:
    """The capacity a membership object records.

    Raises:
        LayoutMismatch: the object is not a membership object of this version.
    """
    raw = os.pread(fd, MEMBERS.size, 0)
    magic, version, _, capacity = MEMBERS.unpack(raw.ljust(MEMBERS.size, b"\0"))
    if magic == MEMBERS_MAGIC and version == MEMBERS_VERSION and capacity == CLEARING:
        raise LayoutMismatch(
            f"fleet {name!r}: {members_name(name)!r} is the placeholder of an 'orbit clear' "
            f"(running now, or interrupted: then run 'orbit clear {name} --all --yes' again)"
        )
    if magic != MEMBERS_MAGIC or version != MEMBERS_VERSION or not 1 <= capacity <= CAPACITY_MAX:
        raise LayoutMismatch(f"fleet {name!r}: {members_name(name)!r} is no membership object")
    if os.fstat(fd).st_size < _members_bytes(capacity):
        raise LayoutMismatch(f"fleet {name!r}: {members_name(name)!r} is truncated")
    return int(capacity)


def recorded_capacity(name: str) -> int | None:
    """The capacity fleet ``name`` was created with, or None when it has no members object.

    Raises:
        AccessDenied: the membership object is not ours alone.
        LayoutMismatch: it is not a membership object of this version.
    """
    try:
        fd = open_object(members_name(name), create=False)
    except FileNotFoundError:
        return None
    try:
        return _read_capacity(fd, name)
    finally:
        os.close(fd)


class Membership(NamedTuple):
    """What a fleet's membership object says now (``orbit list``)."""

    #: The capacity the fleet was created with.
    capacity: int
    #: The nodes live processes hold, ascending.
    held: tuple[int, ...]


def membership(name: str) -> Membership | None:
    """The capacity of fleet ``name`` and the nodes live processes hold, read without
    joining; None when it has no membership object.

    Raises:
        AccessDenied: the membership object is not ours alone.
        LayoutMismatch: it is not a membership object of this version, or the
            placeholder of an ``orbit clear`` (the message says what to run).
    """
    try:
        fd = open_object(members_name(name), create=False)
    except FileNotFoundError:
        return None
    try:
        capacity = _read_capacity(fd, name)
        return Membership(capacity, tuple(node for node in range(capacity) if _ofd_held(fd, node)))
    finally:
        os.close(fd)


def capacity_advice(name: str) -> str:
    """What to do when fleet ``name`` is full or has another capacity (for messages)."""
    return (
        "every process that joins holds one node for its life (each open shm:// store, "
        "each Fleet.join, a preloaded gunicorn master too); close what does not need "
        f"one, or to change the capacity stop every member, run 'orbit clear {name} "
        "--all --yes' (this ends every lease and restarts fencing tokens at 1) and "
        "join again with the new capacity (capacity=N, or ?capacity=N in an shm:// URL)"
    )


def _open_members(name: str, capacity: int) -> tuple[int, bool]:
    """Open (or create, recording ``capacity``) the membership object; (fd, created).

    Raises:
        AccessDenied, FleetError: as for ``_region.open_or_create``.
    """

    def init(fd: int) -> None:
        os.pwrite(fd, MEMBERS.pack(MEMBERS_MAGIC, MEMBERS_VERSION, 0, capacity), 0)

    return open_or_create(members_name(name), _members_bytes(capacity), init)


def _check_recorded(fd: int, name: str, capacity: int) -> None:
    """Refuse a membership object that records another capacity (or none).

    Raises:
        CapacityMismatch: the fleet already has another capacity.
        LayoutMismatch: it is no membership object, or a clear's placeholder.
    """
    recorded = _read_capacity(fd, name)
    if recorded != capacity:
        raise CapacityMismatch(
            f"fleet {name!r} has capacity {recorded}; joining with {capacity} would give "
            f"its members different lane counts: join with capacity={recorded}; "
            f"{capacity_advice(name)}",
            fleet=name,
        )


def hold_membership(name: str) -> tuple[int, bool]:
    """Hold fleet ``name``'s membership object exclusively: no member lives, none can join.

    A fleet without one gets a placeholder (capacity :data:`CLEARING`), locked
    before it has its name, so a first joiner waits for it instead of joining
    while ``orbit clear`` removes the objects it attaches to.

    Returns:
        ``(descriptor, placeholder)`` for :func:`let_go_membership`.

    Raises:
        FleetError: a live member holds the membership object.
        AccessDenied: the object is not ours alone.
    """

    def init(fd: int) -> None:
        os.pwrite(fd, MEMBERS.pack(MEMBERS_MAGIC, MEMBERS_VERSION, 0, CLEARING), 0)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    fd, placeholder = open_or_create(members_name(name), _members_bytes(CLEARING), init)
    if not placeholder:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FleetError(
                f"fleet {name!r} has a live member; stop every member ('orbit list {name}' "
                "shows the nodes held), then clear it",
                fleet=name,
            ) from None
    return fd, placeholder


def _ofd_lock(fd: int, node: int, kind: int) -> bool:
    """Take (or with F_UNLCK drop) the OFD write lock on byte ``node``; False if held elsewhere."""
    try:
        fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, node, 1, 0))
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _ofd_held(fd: int, node: int) -> bool:
    """Whether another open file description holds byte ``node``'s lock."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, node, 1, 0)
    held: int = _FLOCK.unpack(fcntl.fcntl(fd, _OFD_GETLK, query))[0]
    return held != fcntl.F_UNLCK


def _holder(fd: int, node: int) -> int | None:
    """The incarnation recorded for ``node`` if another open file description holds it."""
    if not _ofd_held(fd, node):
        return None
    raw = os.pread(fd, 8, INCARNATIONS_AT + 8 * node)
    return _U64.unpack(raw)[0] if len(raw) == 8 else 0


def let_go_membership(name: str, fd: int, placeholder: bool) -> None:
    """End :func:`hold_membership`: remove the placeholder if it still has its name, close."""
    try:
        if placeholder and _same_object(fd, members_name(name)):
            unlink_object(members_name(name))
    finally:
        os.close(fd)


def _check_node(node: object, capacity: int) -> int:
    if type(node) is not int or not 0 <= node < capacity:
        raise NodeOutsideFleet(
            f"node must be an int in 0..{capacity - 1}, got {shown(node)}", node=None
        )
    return node


def _same_object(fd: int, name: str) -> bool:
    """Whether ``name`` still names the object open as ``fd`` (``orbit clear`` may have won)."""
    try:
        named = os.stat(SHM_DIR / name, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class Fleet:
    """A set of sibling processes sharing SHM objects under one name.

    Use :meth:`join` (POSIX shared memory, one node per live process) or
    :meth:`local` (process-private memory, same code).
    """

    name: str
    capacity: int
    shared: bool

    def __init__(self, name: str, capacity: int, *, shared: bool) -> None:
        self.name = name
        self.capacity = capacity
        self.shared = shared
        self._node = -1
        self._explicit_node = False
        self._incarnation = 0
        self._member_fd = -1
        self._regions: dict[int, Region] = {}
        self._closed = False
        self._fork_generation = _fork.generation

    # -- construction ----------------------------------------------------------------

    @classmethod
    def join(cls, name: str, capacity: int | None = None, node: int | None = None) -> Fleet:
        """Join the SHM fleet ``name``, claiming ``node`` or the lowest free node.

        Args:
            name: 1..32 characters of ``[A-Za-z0-9._-]``.
            capacity: number of nodes (writer lanes), 1..4096; all members agree.
                None takes the capacity the fleet was created with, or
                :data:`CAPACITY_DEFAULT` (64) for a new fleet, as ``shm://FLEET`` does.
            node: the node id to claim, ``0 <= node < capacity``; None claims the
                lowest node no live process holds.

        Returns:
            A joined :class:`Fleet`; close it (or use ``with``) to give the node back.

        Raises:
            InvalidName: bad fleet name.
            InvalidCapacity: bad capacity, or not the capacity the fleet has.
            NodeOutsideFleet: bad node.
            FleetError: the node (or, with ``node=None``, every node) is held by a
                live process.
            AccessDenied: the lock directory or a lock file is not exclusively ours.

        Example::

            with Fleet.join("web", capacity=8) as fleet:
                print(fleet.node, fleet.incarnation)
        """
        name = check_fleet_name(name)  # before its name is used to look anything up
        if capacity is None:
            capacity = recorded_capacity(name) or CAPACITY_DEFAULT
        fleet = cls(name, _check_capacity(capacity), shared=True)
        if node is not None:
            _check_node(node, fleet.capacity)
            fleet._explicit_node = True
        try:
            fleet._enter()
            fleet._claim(node)
        except BaseException:
            fleet.close()
            raise
        _fork.register(fleet)
        return fleet

    @classmethod
    def local(cls, name: str, capacity: int, node: int = 0) -> Fleet:
        """A process-private fleet: the same tables over anonymous memory.

        Every table built from the same ``Fleet`` object shares its memory; two
        ``local`` calls with the same name are independent fleets.

        Raises:
            InvalidName, InvalidCapacity, NodeOutsideFleet: as for :meth:`join`.
        """
        fleet = cls(check_fleet_name(name), _check_capacity(capacity), shared=False)
        fleet._node = _check_node(node, fleet.capacity)
        fleet._incarnation = next(_local_incarnations)
        return fleet

    @classmethod
    def observe(cls, name: str, capacity: int) -> Fleet:
        """An inspector's view of the SHM fleet ``name``: claims no node, is no member.

        Tables built on it may be read (``leases()``, ``poll()``) but refuse to
        publish; ``node`` is -1. Used by ``orbit locks``.

        Raises:
            InvalidName, InvalidCapacity: as for :meth:`join`.
        """
        return cls(check_fleet_name(name), _check_capacity(capacity), shared=True)

    def _enter(self) -> None:
        """Open the membership object and hold it shared, as a member.

        The recorded capacity is read once held: a clear's placeholder is unlinked
        before the clear lets go, and the joiner then opens the fleet's new object.
        """
        while True:
            fd, _ = _open_members(self.name, self.capacity)
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _same_object(fd, members_name(self.name)):
                self._member_fd = fd
                _check_recorded(fd, self.name, self.capacity)
                return
            os.close(fd)  # cleared while we waited: join the fleet that now has the name

    def _claim(self, node: int | None) -> None:
        fd = self._member_fd
        candidates = [node] if node is not None else range(self.capacity)
        for candidate in candidates:
            if _ofd_lock(fd, candidate, fcntl.F_WRLCK):
                self._node = candidate
                self._incarnation = self._next_incarnation(fd, candidate)
                return
        if node is not None:
            raise FleetError(
                f"fleet {self.name!r} node {node} is held by a live process",
                fleet=self.name,
                node=node,
            )
        raise FleetError(
            f"fleet {self.name!r}: all {self.capacity} nodes are held by live processes; "
            f"{capacity_advice(self.name)}",
            fleet=self.name,
        )

    @staticmethod
    def _next_incarnation(fd: int, node: int) -> int:
        at = INCARNATIONS_AT + 8 * node
        raw = os.pread(fd, 8, at)
        previous = _U64.unpack(raw)[0] if len(raw) == 8 else 0
        value = max(previous + 1, time.time_ns())
        os.pwrite(fd, _U64.pack(value), at)
        return value

    # -- properties --------------------------------------------------------------------

    @property
    def node(self) -> int:
        """This process's node id, ``0 <= node < capacity`` (-1 for :meth:`observe`).

        Raises:
            FleetError: closed, or a forked child of a process that joined with
                an explicit node (that node stays the parent's).
        """
        if self._fork_generation != _fork.generation:
            self._rejoin_in_child()
        if self._closed:
            raise FleetError(f"fleet {self.name!r} is closed", fleet=self.name)
        return self._node

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: the regions are unmapped."""
        return self._closed

    @property
    def incarnation(self) -> int:
        """A value unique to this (node, process life)."""
        self.node  # noqa: B018 - rejoins in a forked child first
        return self._incarnation

    def is_alive(self, node: int) -> bool:
        """Whether a live process holds ``node`` (always True for a local fleet's own node).

        Raises:
            NodeOutsideFleet: node out of range.
            FleetError: the fleet is closed.
        """
        return self.incarnation_of(node) is not None

    def incarnation_of(self, node: int) -> int | None:
        """The incarnation of the live process holding ``node``, or None when none does.

        This is the proof of a new life: incarnations of one node only grow, so
        a life that is not the holder's is over, even while the node is held (by
        a process that opened no pool, say). A new holder records its own in the
        instant after its claim; until then this returns its predecessor's, so a
        life is never judged over too soon.

        Raises:
            NodeOutsideFleet: node out of range.
            FleetError: the fleet is closed.
        """
        _check_node(node, self.capacity)
        if self._closed:
            raise FleetError(f"fleet {self.name!r} is closed", fleet=self.name)
        if not self.shared or node == self._node:
            return self._incarnation if node == self._node else None
        if self._member_fd >= 0:
            return _holder(self._member_fd, node)
        try:  # an observer: look without becoming a member
            fd = open_object(members_name(self.name), create=False)
        except FileNotFoundError:
            return None
        try:
            return _holder(fd, node)
        finally:
            os.close(fd)

    # -- regions -------------------------------------------------------------------------

    def region(
        self, kind: int, size: int, init: Init, validate: Validate, stripes: int = 1
    ) -> Region:
        """The fleet's region for ``kind``, created or attached once per Fleet object.

        ``stripes``: robust mutexes in its section block (a lock table's state has several).

        After an ``unlink()`` the next call attaches (or creates) the object that
        now has the name, as a new process would.
        """
        region = self._regions.get(kind)
        if region is None or region.unlinked:
            if self._closed:
                raise FleetError(f"fleet {self.name!r} is closed", fleet=self.name)
            if self.shared:
                region = Region.open_shared(self.name, kind, size, init, validate, stripes)
            else:
                region = Region.open_private(self.name, kind, size, init, stripes)
            self._regions[kind] = region
        else:
            validate(region.buf)
        return region

    @contextlib.contextmanager
    def creating(self, objects: Collection[tuple[int, int]]) -> Iterator[None]:
        """A block that opens the regions ``objects`` ((kind, bytes of its layout)) together.

        Before the block, ``/dev/shm`` must have room for those of them that do not
        exist yet; when the block raises :class:`ShmFull`, the regions it created
        are closed and unlinked, so no object of the set is left half-made.

        Raises:
            ShmFull: no room for the new objects together (nothing is created).
        """
        if self.shared:
            check_space([(object_name(self.name, k), object_bytes(size)) for k, size in objects])
        before = set(self._regions)
        try:
            yield
        except ShmFull:
            for kind in set(self._regions) - before:
                region = self._regions.pop(kind)
                region.close()
                if region.created:
                    region.unlink()
            raise

    # -- lifecycle ------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # Close inherited copies: the parent's locks stay the parent's.
        if self._member_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._member_fd)
        self._member_fd = -1

    def _rejoin_in_child(self) -> None:
        self._fork_generation = _fork.generation
        if self._closed or not self.shared or self._node < 0:
            return
        if self._explicit_node:
            self._closed = True
            raise FleetError(
                f"fleet {self.name!r} node {self._node} belongs to the parent process; "
                "call Fleet.join again in the child",
                fleet=self.name,
                node=self._node,
            )
        try:
            self._enter()
            self._claim(None)
        except BaseException:
            self.close()  # the inherited node is the parent's: no node is left to use
            raise

    def close(self) -> None:
        """Give the node back and unmap every region; never unlinks. Idempotent."""
        self._closed = True
        for region in self._regions.values():
            region.close()
        self._regions.clear()
        if self._member_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._member_fd)
        self._member_fd = -1

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(
            "a Fleet holds a node lock for this process and cannot be pickled; "
            "call Fleet.join in the other process"
        )

    def __repr__(self) -> str:
        kind = "shm" if self.shared else "local"
        state = "closed" if self._closed else f"node={self._node}"
        return f"<Fleet {self.name!r} {kind} capacity={self.capacity} {state}>"
