"""The pool's availability steps: fleet-wide idle and waiter counts for a client pool.

A client pool (:mod:`orbitive.clients`) keeps its idle clients as registered
resources with a free unit. These steps give it what the plain lease steps
cannot: decisions that depend on the whole key at one moment. Each runs in one
critical section (the region's process mutex and ``flock``), like every other
table step, so two processes never both see room under a bound.

* ``idle`` is the number of free units (capacity - reserved - active) of the
  key's live members. It is counted inside the step, never stored, so it can
  never disagree with the resources it counts (the table's rule for reserved,
  live and creating).
* ``waiters`` are per-node u32 counters in the key slot (layout version 2): how
  many of that node's callers wait because the key is at ``max_live``. A
  node's counters are zeroed when its death is reported or a new life binds
  the node, so a killed waiter never leaves a count behind.
* ``since`` and ``seen`` (layout version 3) queue the waiting nodes: per node,
  the ``CLOCK_MONOTONIC`` ms (mod 2**32) its waiting began and a waiter of it
  last tried to claim. A node waiting with a ``seen`` under
  :data:`SEEN_WITHIN_MS` old has its place in the queue; one that stopped
  trying (stopped with SIGSTOP, a stuck thread) loses it until it tries again.

Rules (the reference design's availability extension):

* :func:`give_back` keeps a finished client idle only while the fleet-wide
  idle count is below ``max_idle``, and retires it instead when another
  process waits at ``max_live`` and this one has no waiter of its own that
  would take it (or holds more than its share, or more than a waiting node
  holds): an idle client never strands a waiter.
* :func:`retire_idle` lets an owner take an idle client out, to retire it, for another
  process's waiter, or for ``idle_timeout`` (only above the ``min_idle``
  floor) and ``max_lifetime``.
* :func:`claim_warm` claims creation only for this node's share of the
  ``min_idle`` deficit: ``idle + creating`` stays at most ``min_idle``.
* :func:`claim_in_turn` claims creation under ``max_live`` only while no
  other node with its place in the queue has waited longer (oldest first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from .._core._errors import BusyError, CreationBudgetError, DrainingError, NotOwnerError, StaleError
from .._core._region import store
from ._layout import (
    LIVE,
    PENDING,
    PENDING_WORDS,
    RES_ACTIVE,
    RES_FENCES,
    RES_HOT,
    RESOURCE_SIZE,
    U32,
)
from ._table import Table
from ._values import U32_MAX, Key, ResourceId

#: Why an owner may retire an idle client (:func:`retire_idle`).
FOR_WAITER: Final = 0  # another process waits at max_live
FOR_IDLE_TIMEOUT: Final = 1  # idle too long: only above the min_idle floor
FOR_LIFETIME: Final = 2  # too old: always
FOR_OWN_WAITER: Final = 3  # a waiter of this node cannot use it (another kind of client): always
FOR_CAP: Final = 4  # the key holds more than a cap from outside (a budget's units): above it

#: A waiting node whose waiters have not tried to claim for this long loses its
#: place in the queue (3 x the client pool's longest sleep, ``WAIT_SLICE_S``).
SEEN_WITHIN_MS: Final = 3000
#: Ages of 2**31 ms or more (a time "in the future") are damage: no place.
_AGE_LIMIT: Final = 1 << 31


def now_ms() -> int:
    """``CLOCK_MONOTONIC`` in ms, mod 2**32: the clock of the waiting times."""
    return (time.monotonic_ns() // 1_000_000) & U32_MAX


def _age(now: int, then: int) -> int | None:
    """Wrap-safe ms from ``then`` to ``now``; None for damage (2**31 ms or more)."""
    age = (now - then) & U32_MAX
    return age if age < _AGE_LIMIT else None


@dataclass(frozen=True, slots=True)
class Census:
    """One key at one moment, counted inside a critical section."""

    live: int
    idle: int
    creating: int
    waiters: tuple[int, ...]  # per node
    live_by_node: dict[int, int]

    def others_waiting(self, node: int) -> int:
        """Waiters of every node but ``node``."""
        return sum(self.waiters) - self.waiters[node]

    def poorer_waiting(self, node: int) -> bool:
        """Whether another node waits that holds fewer live clients than ``node``."""
        mine = self.live_by_node.get(node, 0)
        return any(
            waiting and other != node and self.live_by_node.get(other, 0) < mine
            for other, waiting in enumerate(self.waiters)
        )

    def fair_share(self, max_live: int) -> int:
        """Clients one demanding node may keep while others wait (at least one)."""
        demanding = {n for n, w in enumerate(self.waiters) if w} | set(self.live_by_node)
        return max(1, max_live // max(1, len(demanding)))


def census(table: Table, index: int) -> Census:
    """Count key ``index``'s live, idle, creating and waiting units. In a section."""
    buf = table.buf
    members = table.members(index)
    live = idle = 0
    by_node: dict[int, int] = {}
    lane, base = table.lane_capacity, table.res_base
    while members:
        low = members & -members
        members ^= low
        global_index = low.bit_length() - 1
        offset = base + global_index * RESOURCE_SIZE
        if buf[offset] != LIVE:
            continue
        hot = RES_HOT.unpack_from(buf, offset)
        reserved = PENDING - PENDING_WORDS.unpack_from(buf, offset + RES_FENCES).count(0)
        live += 1
        idle += max(0, hot[6] - reserved - hot[8])
        node = global_index // lane
        by_node[node] = by_node.get(node, 0) + 1
    at = table.key_offset(index)
    claims = table.claims_struct.unpack_from(buf, at + table.key_claims)
    waiters = table.claims_struct.unpack_from(buf, at + table.key_waiters)
    return Census(live, idle, sum(claims), waiters, by_node)


def queue(table: Table, index: int, now: int) -> tuple[int | None, ...]:
    """Per node of key ``index``: ms it has waited if it has its place, else None. In a section.

    A node has its place while its waiters counter is non-zero, its ``seen``
    is under :data:`SEEN_WITHIN_MS` old and both times read as valid ages.
    """
    at = table.key_offset(index)
    unpack, buf = table.claims_struct.unpack_from, table.buf
    waiters = unpack(buf, at + table.key_waiters)
    since = unpack(buf, at + table.key_wait_since)
    seen = unpack(buf, at + table.key_wait_seen)
    waited: list[int | None] = []
    for count, began, tried in zip(waiters, since, seen, strict=True):
        age, fresh = _age(now, began), _age(now, tried)
        placed = count and age is not None and fresh is not None and fresh < SEEN_WITHIN_MS
        waited.append(age if placed else None)
    return tuple(waited)


def _behind(waited: tuple[int | None, ...], node: int) -> bool:
    """Whether another node with its place has waited longer than ``node``.

    A node without its place (not waiting) counts as the newest.
    """
    mine = waited[node]
    floor = -1 if mine is None else mine
    return any(age is not None and age > floor for other, age in enumerate(waited) if other != node)


def _owned_live(table: Table, rid: ResourceId, offset: int) -> tuple[int, ...]:
    """The slot's hot fields if it is ``rid``, ours and LIVE; else the refusal."""
    hot = table._owned(rid, offset)
    if hot[0] != LIVE:
        raise DrainingError(f"resource {rid} is draining", node=rid.node, key=rid)
    return hot


def _free(table: Table, offset: int, hot: tuple[int, ...]) -> int:
    reserved = PENDING - PENDING_WORDS.unpack_from(table.buf, offset + RES_FENCES).count(0)
    return int(hot[6]) - reserved - int(hot[8])


def take(table: Table, rid: ResourceId) -> None:
    """Owner checks out its own idle client: one free unit becomes active.

    The reference of the C ``Operations.take`` (``_availability.h``: ``take``).

    Raises:
        MalformedError, StaleError, NotOwnerError, DrainingError.
        BusyError: no free unit (a borrower reserved it).
    """
    offset = table.locate(rid)
    with table:
        hot = _owned_live(table, rid, offset)
        if _free(table, offset, hot) <= 0:
            raise BusyError(f"resource {rid} has no free unit", node=rid.node, key=rid)
        store(table.buf, offset + RES_ACTIVE, U32, hot[8] + 1)


def give_back(
    table: Table,
    rid: ResourceId,
    max_idle: int,
    max_live: int,
    in_turn: bool = False,
    borrowers: bool = False,
) -> bool:
    """Owner returns an active unit: keep the client idle (True) or retire it (False).

    One step: the unit becomes free only while the fleet-wide idle count is
    below ``max_idle`` and no other process waits at ``max_live`` for capacity
    this client holds. Exceptions: this node's own waiters, within its fair
    share and while no waiting node holds fewer clients, will take it; or
    ``in_turn``, the owner has not used up its turn with this client
    (``PoolOptions.handoff_after``). Otherwise the unit stays
    active: the caller closes the client and only then unregisters it, so the
    budget returns once the client is really gone (a server never sees more
    than ``max_live`` connections). A resource that is no longer ours (reset,
    closed) reads as retired.

    A kept unit wakes the key's waiters only when one of them can take it: a
    waiter of this node, or, with ``borrowers`` (remote mode, where any process
    may reserve it), a waiter of any node. Other processes' plain waiters wait
    for capacity, which only an unregister returns; waking them on every
    return would make each checkout cost every waiter of the fleet a round.

    The reference of the C ``Operations.give_back`` (``_availability.h``:
    ``give_back``, with ``census``, ``keep`` and the census's methods), which
    hands a resource not ours or not LIVE, or a damaged key index, to this
    step. A key index past the key table (damage) reads as retired.
    """
    offset = table.locate(rid)
    with table:
        try:
            hot = table._owned(rid, offset)
        except (StaleError, NotOwnerError):  # closed or reset meanwhile: nothing to keep
            return False
        index = int(hot[7])
        if hot[0] != LIVE or index >= table.key_capacity:
            return False
        waiters = table.claims_struct.unpack_from(
            table.buf, table.key_offset(index) + table.key_waiters
        )
        # Fast path: nobody waits and max_idle cannot be reached (idle < live <= max_live).
        if (any(waiters) or max_idle < max_live) and not _keep(
            census(table, index), table.node, max_idle, max_live, in_turn
        ):
            return False
        store(table.buf, offset + RES_ACTIVE, U32, max(0, hot[8] - 1))
        if waiters[table.node] or (borrowers and any(waiters)):
            table.key_changed(index)
        return True


def _keep(counted: Census, node: int, max_idle: int, max_live: int, in_turn: bool) -> bool:
    at_max = counted.live + counted.creating >= max_live
    if not in_turn and counted.others_waiting(node) and at_max:
        # Kept only for a waiter of ours, who takes it at once, within our fair share,
        # and while no waiter elsewhere holds fewer clients (the share floors at one:
        # with more demanding nodes than max_live, one would wait for ever).
        own = counted.waiters[node]
        mine = counted.live_by_node.get(node, 0)
        return (
            bool(own) and mine <= counted.fair_share(max_live) and not counted.poorer_waiting(node)
        )
    return counted.idle < max_idle


def retire_idle(table: Table, rid: ResourceId, reason: int, max_live: int, min_idle: int) -> bool:
    """Owner takes its idle client ``rid`` for retirement if ``reason`` still holds.

    True: the unit is now active (nobody else can reserve or take it); the
    caller closes the client, then unregisters it.

    ``FOR_WAITER``: another node waits and the key is at ``max_live``, and no
    waiter of this node would take the client. ``FOR_IDLE_TIMEOUT``: the
    fleet-wide idle count is above ``min_idle``. ``FOR_CAP``: the key's live and
    creating clients are more than ``max_live`` (the caller passes a cap from
    outside the table, its budget's units). ``FOR_LIFETIME`` and
    ``FOR_OWN_WAITER`` (a waiter of this node cannot use it): always. A
    drained resource (``Pool.drain``), or one whose key index is past the key
    table (damage): always. A client in use or reserved meanwhile is never
    retired.
    """
    offset = table.locate(rid)
    with table:
        try:
            hot = table._owned(rid, offset)
        except (StaleError, NotOwnerError):  # not ours to retire now
            return False
        if hot[8] or _free(table, offset, hot) < hot[6]:
            return False  # in use or reserved
        index = int(hot[7])
        # Draining (nobody may take it again) or a key index past the key table (damage).
        due = hot[0] != LIVE or index >= table.key_capacity
        if due or _due(census(table, index), table.node, reason, max_live, min_idle):
            store(table.buf, offset + RES_ACTIVE, U32, 1)
            return True
        return False


def _due(counted: Census, node: int, reason: int, max_live: int, min_idle: int) -> bool:
    """Whether :func:`retire_idle`'s ``reason`` holds for a LIVE idle client of ``node``."""
    if reason == FOR_WAITER:
        return (
            counted.others_waiting(node) > 0
            and not counted.waiters[node]
            and counted.live + counted.creating >= max_live
        )
    if reason == FOR_IDLE_TIMEOUT:
        return counted.idle > min_idle
    if reason == FOR_CAP:
        return counted.live + counted.creating > max_live
    return True


def claim_warm(table: Table, key: Key, max_live: int, min_idle: int) -> tuple[int, int]:
    """Claim creation for the ``min_idle`` floor; returns (key index, epoch) as ``claim``.

    Succeeds only while ``idle + creating < min_idle``, ``live + creating <
    max_live`` and nobody waits (a waiter needs the capacity more).

    Raises:
        KeyFullError.
        CreationBudgetError: the floor is met, or the key is at ``max_live``.
    """
    with table:
        index = table.find_key(key, True)
        counted = census(table, index)
        if (
            counted.idle + counted.creating >= min_idle
            or counted.live + counted.creating >= max_live
            or any(counted.waiters)
        ):
            raise CreationBudgetError(
                f"key {key}: {counted.idle} idle + {counted.creating} creating meet "
                f"min_idle {min_idle} (or the key is at max_live {max_live})",
                key=key,
            )
        at = table.key_offset(index) + table.key_claims + 4 * table.node
        store(table.buf, at, U32, U32.unpack_from(table.buf, at)[0] + 1)
        epoch = table.epoch()
    return index, epoch


def claim_in_turn(table: Table, key: Key, max_live: int) -> tuple[int, int]:
    """Claim creation under ``max_live``, oldest waiting node first; returns (index, epoch).

    The client pool's claim (``Table.claim`` for everyone else). A waiting
    node's try refreshes its ``seen`` time first, refused or not; the claim is
    then refused while another node with its place in the queue has waited
    longer than this one (a node not waiting counts as the newest). A waiting
    node that claims goes to the back of the queue (its ``since`` is now), so
    its other waiters do not take every unit in a row.

    Raises:
        KeyFullError.
        CreationBudgetError: live + creating reached ``max_live``, or another
            node waited longer.
    """
    with table:
        index = table.find_key(key, True)
        at = table.key_offset(index)
        now, node = now_ms(), table.node
        waiting = U32.unpack_from(table.buf, at + table.key_waiters + 4 * node)[0]
        if waiting:
            store(table.buf, at + table.key_wait_seen + 4 * node, U32, now)
        if _behind(queue(table, index, now), node):
            raise CreationBudgetError(f"key {key}: another process waited longer", key=key)
        epoch = table.claim_at(index, key, max_live)
        if waiting:
            store(table.buf, at + table.key_wait_since + 4 * node, U32, now)
    return index, epoch


def add_waiter(table: Table, key: Key, delta: int, waited: tuple[int, bool] | None = None) -> int:
    """Count one waiter of this node in or out (+1 / -1); returns the key's version.

    ``waited``, counting one out: ``(microseconds, timed_out)`` of its wait, which
    the key's wait counters add (a timeout, or a wait that got a client); None:
    the wait ended otherwise (the pool closed, the caller was interrupted).

    Counting one in bumps the key, so owners holding idle clients notice. The
    node's first waiter starts its queue time (``since``) with a stale
    ``seen``: the node has its place once a waiter of it tries to claim
    (:func:`claim_in_turn`). The last one out, if its node was at the head of
    the queue, bumps the key so the next node tries. A counter at
    ``2**32 - 1`` (damage) stays there.

    Raises:
        KeyFullError.
    """
    with table:
        index = table.find_key(key, True)
        at = table.key_offset(index)
        counter = at + table.key_waiters + 4 * table.node
        count = U32.unpack_from(table.buf, counter)[0]
        head = delta < 0 and count == 1 and _heads(queue(table, index, now_ms()), table.node)
        store(table.buf, counter, U32, min(max(0, count + delta), U32_MAX))  # damage saturates
        if delta > 0 and not count:
            now = now_ms()
            store(table.buf, at + table.key_wait_since + 4 * table.node, U32, now)
            stale = (now - SEEN_WITHIN_MS) & U32_MAX
            store(table.buf, at + table.key_wait_seen + 4 * table.node, U32, stale)
        if waited is not None:
            table.count_wait(index, *waited)
        if delta > 0 or head:
            table.key_changed(index)
        return table.changes(index)


def _heads(waited: tuple[int | None, ...], node: int) -> bool:
    """Whether ``node`` has its place, another node has one, and none waited longer."""
    others = any(age is not None for other, age in enumerate(waited) if other != node)
    return waited[node] is not None and others and not _behind(waited, node)


def bump(table: Table, key: Key) -> None:
    """Bump ``key``'s version: its waiters look again (a cap from outside the table rose).

    Raises:
        KeyFullError.
    """
    table.enter()
    try:
        table.key_changed(table.find_key(key, True))
    finally:
        table.leave()


def key_census(table: Table, key: Key) -> Census:
    """:func:`census` of ``key`` in its own section (installs the key).

    Raises:
        KeyFullError.
    """
    with table:
        return census(table, table.find_key(key, True))
