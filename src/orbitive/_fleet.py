"""Fleet membership: a name, a capacity, this process's node and incarnation.

A node claimed by :meth:`Fleet.join` is held by ``flock(LOCK_EX)`` on a per-node
lock file for the life of the process. The kernel drops it the moment the
process dies, however it dies, so "cannot take the node lock" means exactly
"a live process holds that node". The descriptor is close-on-exec (an exec'd
program never inherits it) and a forked child closes its inherited copy without
unlocking (see ``_fork``), then claims a node of its own on first use.

Members also hold ``flock(LOCK_SH)`` on the fleet membership file; ``orbit clear``
takes it ``LOCK_EX | LOCK_NB`` and so refuses while any member is alive.

``incarnation`` is unique per (node, process life): the previous value is kept in
the node's lock file and the new one is ``max(previous + 1, time.time_ns())``,
written while the node lock is held.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import struct
import time
from pathlib import Path
from typing import Final

from . import _fork
from ._access import euid, lock_dir, open_checked
from ._errors import FleetError, InvalidCapacity, InvalidName, NodeOutsideFleet
from ._region import Init, Region, Validate

_NAME_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,32}")
#: Largest fleet capacity (node ids are 16-bit in every layout).
CAPACITY_MAX: Final = 4096
_U64: Final = struct.Struct("<Q")
_local_incarnations = itertools.count(1)


def check_fleet_name(name: object) -> str:
    """Return ``name`` if it is 1..32 characters of ``[A-Za-z0-9._-]``.

    Raises:
        InvalidName: any other value (including non-strings).
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in {".", ".."}:
        raise InvalidName(f"fleet name must be 1..32 characters of [A-Za-z0-9._-], got {name!r}")
    return name


def _check_capacity(capacity: object) -> int:
    if type(capacity) is not int or not 1 <= capacity <= CAPACITY_MAX:
        raise InvalidCapacity(
            f"fleet capacity must be an int in 1..{CAPACITY_MAX}, got {capacity!r}"
        )
    return capacity


def _agree_capacity(fd: int, name: str, capacity: int) -> None:
    """Record the fleet's capacity in its membership file, or check it against the record.

    The first member writes it; every later one must ask for the same. A POSIX
    record lock (``lockf``, separate from the members' ``flock``) serialises the
    read-and-write; ``orbit clear --all`` removes the file and so the record.

    Raises:
        InvalidCapacity: the fleet already has another capacity.
    """
    fcntl.lockf(fd, fcntl.LOCK_EX)
    try:
        raw = os.pread(fd, 8, 0)
        recorded = _U64.unpack(raw)[0] if len(raw) == 8 else 0
        if recorded == 0:
            os.pwrite(fd, _U64.pack(capacity), 0)
        elif recorded != capacity:
            raise InvalidCapacity(
                f"fleet {name!r} has capacity {recorded}; joining with {capacity} would "
                "give its members different lane counts",
                fleet=name,
            )
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN)


def _check_node(node: object, capacity: int) -> int:
    if type(node) is not int or not 0 <= node < capacity:
        raise NodeOutsideFleet(f"node must be an int in 0..{capacity - 1}, got {node!r}", node=None)
    return node


def membership_path(name: str) -> Path:
    """The fleet membership file: LOCK_SH by members, LOCK_EX by ``orbit clear``."""
    return lock_dir() / f"orbit-{name}-{euid()}.fleet"


def node_path(name: str, node: int) -> Path:
    """The per-node lock file whose exclusive flock is the node claim."""
    return lock_dir() / f"orbit-{name}-{euid()}.node{node}.lock"


def _try_lock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


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
        self._node_fd = -1
        self._member_fd = -1
        self._regions: dict[int, Region] = {}
        self._closed = False
        self._fork_generation = _fork.generation

    # -- construction ----------------------------------------------------------------

    @classmethod
    def join(cls, name: str, capacity: int, node: int | None = None) -> Fleet:
        """Join the SHM fleet ``name``, claiming ``node`` or the lowest free node.

        Args:
            name: 1..32 characters of ``[A-Za-z0-9._-]``.
            capacity: number of nodes (writer lanes), 1..4096; all members agree.
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
        fleet = cls(check_fleet_name(name), _check_capacity(capacity), shared=True)
        if node is not None:
            _check_node(node, fleet.capacity)
            fleet._explicit_node = True
        try:
            fleet._member_fd = open_checked(membership_path(name), create=True)
            fcntl.flock(fleet._member_fd, fcntl.LOCK_SH)
            _agree_capacity(fleet._member_fd, name, fleet.capacity)
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

    def _claim(self, node: int | None) -> None:
        candidates = [node] if node is not None else range(self.capacity)
        for candidate in candidates:
            fd = open_checked(node_path(self.name, candidate), create=True)
            if _try_lock(fd, fcntl.LOCK_EX):
                self._node_fd = fd
                self._node = candidate
                self._incarnation = self._next_incarnation(fd)
                return
            os.close(fd)
        if node is not None:
            raise FleetError(
                f"fleet {self.name!r} node {node} is held by a live process",
                fleet=self.name,
                node=node,
            )
        raise FleetError(
            f"fleet {self.name!r}: all {self.capacity} nodes are held by live processes",
            fleet=self.name,
        )

    @staticmethod
    def _next_incarnation(fd: int) -> int:
        raw = os.pread(fd, 8, 0)
        previous = _U64.unpack(raw)[0] if len(raw) == 8 else 0
        value = max(previous + 1, time.time_ns())
        os.pwrite(fd, _U64.pack(value), 0)
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
        _check_node(node, self.capacity)
        if self._closed:
            raise FleetError(f"fleet {self.name!r} is closed", fleet=self.name)
        if not self.shared:
            return node == self._node
        try:
            fd = open_checked(node_path(self.name, node), create=False)
        except FileNotFoundError:
            return False
        try:
            if _try_lock(fd, fcntl.LOCK_EX):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False
            return True
        finally:
            os.close(fd)

    # -- regions -------------------------------------------------------------------------

    def region(self, kind: int, size: int, init: Init, validate: Validate) -> Region:
        """The fleet's region for ``kind``, created or attached once per Fleet object.

        After an ``unlink()`` the next call attaches (or creates) the object that
        now has the name, as a new process would.
        """
        region = self._regions.get(kind)
        if region is None or region.unlinked:
            if self._closed:
                raise FleetError(f"fleet {self.name!r} is closed", fleet=self.name)
            if self.shared:
                region = Region.open_shared(self.name, kind, size, init, validate)
            else:
                region = Region.open_private(self.name, kind, size, init)
            self._regions[kind] = region
        else:
            validate(region.buf)
        return region

    # -- lifecycle ------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # Close inherited copies: the parent's locks stay the parent's.
        for fd in (self._node_fd, self._member_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._node_fd = self._member_fd = -1

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
            self._member_fd = open_checked(membership_path(self.name), create=True)
            fcntl.flock(self._member_fd, fcntl.LOCK_SH)
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
        for fd in (self._node_fd, self._member_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._node_fd = self._member_fd = -1

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
