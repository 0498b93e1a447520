"""A frozen snapshot of a pool table, for ``Pool.statistics()`` and ``orbit pool``.

:func:`collect` reads a mapping only (no Table, no identity), so the CLI can use
it on an attach-only, read-only mapping; :func:`inspect` is that attach.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, replace
from typing import Final, final

from .._core._access import open_checked
from .._core._errors import LayoutMismatch
from .._core._region import SHM_DIR, map_section, object_name
from ._keys import label_at
from ._layout import (
    DRAINING,
    EPOCH_OFFSET,
    HEADER,
    HEADER_SIZE,
    KEY_HEAD,
    KEY_LIMITS,
    KEY_PARKED,
    KEY_WAITS,
    LIVE,
    PENDING,
    PENDING_WORDS,
    RES_FENCES,
    RES_HOT,
    RESOURCE_SIZE,
    U64,
    WAIT_BOUNDS_US,
    Layout,
)
from ._values import Key, ResourceId

#: The wait-time buckets' upper bounds in seconds (``KeyStatistics.wait_buckets``).
WAIT_BOUNDS_S: Final = tuple(bound / 1e6 for bound in WAIT_BOUNDS_US)

_STATES = {1: "live", 2: "draining"}


@final
@dataclass(frozen=True, slots=True)
class KeyStatistics:
    """One installed key: its budget, version, claims, idle units, waiters and label.

    Two words for two things, the same everywhere (``orbit pool``, metrics,
    ``ClientPool.statistics()``):

    * ``waiting``: callers (checkouts) waiting for a client at ``max_live``,
      fleet-wide; ``waiters`` the same per node (nodes with any).
    * ``parked_nodes``: nodes with a thread asleep on the key's version word
      (``Pool.wait_capacity``: a waiting caller, or a client pool's upkeep
      thread watching the key), whatever it waits for.

    ``idle`` is the free units (capacity - reserved - active) of the key's live
    resources. ``label`` names the key for people (the database's
    ``user@host:port/dbname``, or a name the application gave), empty when
    nobody labelled it; ``max_live``, ``min_idle`` and ``max_idle`` are the
    limits of the client pool opened last on the key (0 when none was).
    Since the table's epoch began: ``timeouts_count`` checkouts gave up at
    ``max_live``; ``waits_count`` waited there and then got a client, after
    ``waited_s`` seconds in all, ``wait_buckets`` of them (per bound of
    :data:`WAIT_BOUNDS_S`) within that bound and above the one before.
    ``opened``: the nodes whose process has a client pool of the key open.
    """

    index: int
    key: Key
    live: int
    creating: int
    version: int
    claims: tuple[tuple[int, int], ...]  # (node, claims held) for nodes holding any
    parked_nodes: int
    idle: int = 0
    waiting: int = 0
    waiters: tuple[tuple[int, int], ...] = ()
    label: str = ""
    max_live: int = 0
    min_idle: int = 0
    max_idle: int = 0
    timeouts_count: int = 0
    waits_count: int = 0
    waited_s: float = 0.0
    wait_buckets: tuple[int, ...] = (0,) * len(WAIT_BOUNDS_US)
    opened: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """The label, or the key's digest in hex when it has none."""
        return self.label or str(self.key)


@final
@dataclass(frozen=True, slots=True)
class ResourceStatistics:
    """One live or draining resource."""

    id: ResourceId
    key: Key
    owner_node: int
    owner_incarnation: int
    state: str
    capacity: int
    reserved: int
    active: int
    fence: int
    last_reserve_at: float


@final
@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """The whole table at one moment.

    Counters carry ``_count``; ``waiting_count`` is the callers waiting at
    ``max_live`` over every key and ``parked_nodes_count`` the keys' parked
    nodes summed (see :class:`KeyStatistics`). ``members`` lists (node,
    incarnation) doorbells and ``bell_lives`` (node, fleet incarnation) of the
    processes that rang them (the life a node's holder must still have for the
    doorbell's life to go on).
    """

    fleet: str
    kind: int
    epoch: int
    fleet_capacity: int
    key_capacity: int
    lane_capacity: int
    keys_count: int
    live_count: int
    draining_count: int
    reserved_count: int
    active_count: int
    creating_count: int
    waiting_count: int
    parked_nodes_count: int
    members: tuple[tuple[int, int], ...]
    bell_lives: tuple[tuple[int, int], ...]
    keys: tuple[KeyStatistics, ...]
    resources: tuple[ResourceStatistics, ...]


def _keys(buf: mmap.mmap, layout: Layout) -> list[KeyStatistics]:
    claims_struct = struct.Struct(f"<{layout.fleet_capacity}I")
    mask = layout.member_mask  # bits past the slots are damage
    rows = []
    for index in range(layout.key_capacity):
        offset = layout.key_offset(index)
        state, lo, hi, changes = KEY_HEAD.unpack_from(buf, offset)
        if state != 1:
            continue
        claims = claims_struct.unpack_from(buf, offset + layout.key_claims)
        waiters = claims_struct.unpack_from(buf, offset + layout.key_waiters)
        timeouts, waits, wait_us, *buckets = KEY_WAITS.unpack_from(buf, offset + layout.key_waits)
        max_live, min_idle, max_idle = KEY_LIMITS.unpack_from(buf, offset + layout.key_limits)
        members = offset + layout.key_members
        bits = int.from_bytes(buf[members : members + layout.member_bytes], "little")
        live = (bits & mask).bit_count()
        parked = buf[offset + KEY_PARKED : offset + KEY_PARKED + layout.fleet_capacity]
        opened = buf[
            offset + layout.key_opened : offset + layout.key_opened + layout.fleet_capacity
        ]
        rows.append(
            KeyStatistics(
                index,
                Key(hi << 64 | lo),
                live,
                sum(claims),
                changes,
                tuple((node, count) for node, count in enumerate(claims) if count),
                len(parked) - parked.count(0),
                waiting=sum(waiters),
                waiters=tuple((node, count) for node, count in enumerate(waiters) if count),
                label=label_at(buf, offset + layout.key_label).decode(errors="replace"),
                max_live=max_live,
                min_idle=min_idle,
                max_idle=max_idle,
                timeouts_count=timeouts,
                waits_count=waits,
                waited_s=wait_us / 1e6,
                wait_buckets=tuple(buckets),
                opened=tuple(node for node, mark in enumerate(opened) if mark),
            )
        )
    return rows


def _with_idle(
    keys: list[KeyStatistics], resources: list[ResourceStatistics]
) -> list[KeyStatistics]:
    """Each key with its idle units: the free units of its live resources."""
    idle: dict[Key, int] = {}
    for res in resources:
        if res.state == "live":
            free = max(0, res.capacity - res.reserved - res.active)
            idle[res.key] = idle.get(res.key, 0) + free
    return [replace(key, idle=idle.get(key.key, 0)) for key in keys]


def _resources(buf: mmap.mmap, layout: Layout) -> list[ResourceStatistics]:
    states = buf[layout.resources : layout.size : RESOURCE_SIZE]
    rows = []
    for global_index, state in enumerate(states):
        if not LIVE <= state <= DRAINING:
            continue
        node, slot = divmod(global_index, layout.lane_capacity)
        offset = layout.resources + global_index * RESOURCE_SIZE
        hot = RES_HOT.unpack_from(buf, offset)
        if hot[1] != node or not 1 <= hot[2] <= 0xFFFFFF or not hot[11]:
            continue  # not a consistent slot; skip rather than guess
        free = PENDING_WORDS.unpack_from(buf, offset + RES_FENCES).count(0)
        rows.append(
            ResourceStatistics(
                ResourceId(layout.kind, node, slot, hot[2], hot[11]),
                Key(hot[5] << 64 | hot[4]),
                node,
                hot[3],
                _STATES[state],
                hot[6],
                PENDING - free,
                hot[8],
                hot[9],
                hot[10] / 1000.0,
            )
        )
    return rows


def collect(buf: mmap.mmap, layout: Layout, fleet: str) -> PoolStatistics:
    """Read the statistics of the table in ``buf`` (call under its critical section)."""
    resources = _resources(buf, layout)
    keys = _with_idle(_keys(buf, layout), resources)
    members, bell_lives = [], []
    for node in range(layout.fleet_capacity):
        life = U64.unpack_from(buf, layout.doorbells + 8 * node)[0]
        if life:
            members.append((node, life))
            bell_lives.append((node, U64.unpack_from(buf, layout.bell_lives + 8 * node)[0]))
    return PoolStatistics(
        fleet=fleet,
        kind=layout.kind,
        epoch=U64.unpack_from(buf, EPOCH_OFFSET)[0],
        fleet_capacity=layout.fleet_capacity,
        key_capacity=layout.key_capacity,
        lane_capacity=layout.lane_capacity,
        keys_count=len(keys),
        live_count=sum(1 for r in resources if r.state == "live"),
        draining_count=sum(1 for r in resources if r.state == "draining"),
        reserved_count=sum(r.reserved for r in resources),
        active_count=sum(r.active for r in resources),
        creating_count=sum(k.creating for k in keys),
        waiting_count=sum(k.waiting for k in keys),
        parked_nodes_count=sum(k.parked_nodes for k in keys),
        members=tuple(members),
        bell_lives=tuple(bell_lives),
        keys=tuple(keys),
        resources=tuple(resources),
    )


def inspect(fleet: str, kind: int) -> PoolStatistics | None:
    """Attach read-only to an existing pool table and snapshot it; None if absent.

    Never creates, locks exclusively, resets or unlinks anything. The geometry
    comes from the header, which is validated in full first.

    Raises:
        LayoutMismatch: the object is not a valid pool table.
        AccessDenied: the object is not exclusively ours.
    """
    try:
        fd = open_checked(SHM_DIR / object_name(fleet, kind), create=False)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            raise LayoutMismatch(f"pool table {object_name(fleet, kind)!r} has {size} bytes")
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as buf:
            fields = HEADER.unpack_from(buf, 0)
            layout = Layout(kind, fields[7], fields[3], fields[4])
            if layout.size > size:
                raise LayoutMismatch(f"pool table {object_name(fleet, kind)!r} is truncated")
            layout.validate(buf)
            _, section = map_section(fd, layout.size, repr(object_name(fleet, kind)))
            section.acquire()
            try:
                return collect(buf, layout, fleet)
            finally:
                section.release()
                section.close()
    finally:
        os.close(fd)
