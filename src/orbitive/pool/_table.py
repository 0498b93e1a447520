"""The pool table's resource steps: each one a single critical section.

Every step runs between ``enter()`` and ``leave()`` (the region's process mutex
and ``flock``, see :mod:`._keys`), so it is atomic for every process of the
fleet; that is what keeps ``reserve`` from ever over-admitting (pool contract:
"reserves one unit with a single compare-and-swap").

Invariant (crash safety): a process killed inside a step leaves a table the
next process can use. Writes go commit-last and no counter duplicates the
entries it counts (reserved = non-zero pending fences, live = member bits,
creating = sum of claims):

* register: body, then ``state = LIVE``, then the key's member bit;
* close (unregister, node_dead): member bit cleared, then ``state = CLOSED``;
* reserve: the fence counter, then the entry's time, then its fence (commit);
* accept: the pending fence cleared, then ``active + 1``. For a moment the
  unit is counted neither reserved nor active, so an owner killed between the
  two frees a unit of its (now dead) resource: a reserve may take it, though
  nobody serves it, until ``node_dead`` closes the resource.

Values read from shared memory are checked before use: a slot is used only if
its state, node, generation and epoch match the id that names it, and a step
that would push a counter past its field (a fence counter at 2**64 - 1, an
active count at 2**32 - 1: only damaged memory holds those) raises
``LayoutMismatch`` before it writes anything.

The three hot steps, reserve, accept and complete, also exist in C
(``_fastpath.c``, built when a compiler is present): the same checks and the
same writes in the same order. Over them, ``Operations``
(:func:`~._opening.operations_for`) makes ``Pool.reserve``, ``Pool.accept``
and ``Execution.complete`` one C call each on tables whose section is the
robust mutex: section, clock, step, the key's change and the result objects.
The Python steps here are the reference, and they run whenever the C module is
missing or the C call declines.
"""

from __future__ import annotations

from typing import Final

from .._core._clock import wall_ms
from .._core._errors import (
    BusyError,
    DrainingError,
    LaneFullError,
    LayoutMismatch,
    MalformedError,
    NotOwnerError,
    NotReservedError,
    OrbitError,
    StaleError,
    shown,
)
from .._core._readiness import bump
from .._core._region import Region, store
from ._keys import M64, KeyTable
from ._layout import (
    CLOSED,
    DRAINING,
    EMPTY,
    EXHAUSTED,
    GENERATION_MAX,
    KEY_CHANGES,
    KEY_PARKED,
    LIVE,
    PENDING,
    PENDING_WORDS,
    RES_ACTIVE,
    RES_BODY,
    RES_BODY_AT,
    RES_FENCE,
    RES_FENCES,
    RES_HOT,
    RES_KEY_INDEX,
    RES_LEASE,
    RES_OWNER,
    RES_SINCE,
    RESOURCE_SIZE,
    U32,
    U64,
    U64_PAIR,
    Layout,
    new_epoch,
    write_header,
)
from ._values import U64_MAX, Key, ResourceId

try:
    from ._fastpath import Steps
except ImportError:  # not built (no C compiler): the Python steps are used
    Steps = None  # type: ignore[assignment, misc]

_ZERO_PENDING: Final = bytes(2 * 8 * PENDING)

#: Outcomes of the C steps (``_fastpath.c``); all but DONE leave the slot untouched.
_DONE: Final = 0  # REFUSED (-1), not that registration or not ours: ``_refusal``
_BUSY: Final = -2
_NOT_PENDING: Final = -3
_DECLINED: Final = -4  # a counter is at its limit (or no C steps): the Python step decides


class Table(KeyTable):
    """The resource steps of one pool table (see :class:`KeyTable` for the rest)."""

    def __init__(self, region: Region, layout: Layout) -> None:
        super().__init__(region, layout)
        #: The C steps over this mapping, or None: the Python steps run.
        self._steps = None if Steps is None else Steps(self.buf, self.res_base, layout.size)

    def locate(self, rid: ResourceId) -> int:
        """Offset of the slot ``rid`` names.

        Raises:
            MalformedError: not a ResourceId of this table's kind and geometry.
        """
        if (
            type(rid) is not ResourceId
            or rid.kind != self.kind
            or (rid.node >= self.fleet_capacity or rid.slot >= self.lane_capacity)
        ):
            raise MalformedError(
                f"{rid!r:.100} is not a resource id of this pool (kind {self.kind}, "
                f"{self.fleet_capacity} nodes x {self.lane_capacity} slots)",
                kind=self.kind,
            )
        return self.res_base + (rid.node * self.lane_capacity + rid.slot) * RESOURCE_SIZE

    # -- resource checks --------------------------------------------------------------

    def _refusal(self, rid: ResourceId, hot: tuple[int, ...], *, owner: bool) -> OrbitError:
        """The error for a slot that is not usable as ``rid`` (slow path)."""
        if owner and rid.node != self.node:
            return self._not_owner(rid, hot)
        if (
            hot[2] != rid.generation
            or hot[11] != rid.epoch
            or hot[1] != rid.node
            or not LIVE <= hot[0] <= DRAINING
        ):
            return StaleError(f"resource {rid} is closed or was reused", node=rid.node, key=rid)
        if owner and hot[3] != self.incarnation:
            return self._not_owner(rid, hot)
        return DrainingError(f"resource {rid} is draining", node=rid.node, key=rid)

    def _failure(
        self, outcome: int, rid: ResourceId, offset: int, *, owner: bool, fence: int = 0
    ) -> OrbitError:
        """The error for a C step's REFUSED, BUSY or NOT_PENDING outcome."""
        if outcome == _BUSY:
            return self._busy(rid)
        if outcome == _NOT_PENDING:
            return self._not_reserved(rid, fence)
        return self._refusal(rid, RES_HOT.unpack_from(self.buf, offset), owner=owner)

    def _busy(self, rid: ResourceId) -> BusyError:
        return BusyError(f"resource {rid} has no free unit", node=rid.node, key=rid)

    def _not_reserved(self, rid: ResourceId, fence: int) -> NotReservedError:
        return NotReservedError(
            f"fence {shown(fence)} of resource {rid} is not pending "
            "(accepted already, aged out or cancelled)",
            node=rid.node,
            key=rid,
        )

    def _damaged(self, rid: ResourceId, what: str) -> LayoutMismatch:
        """The error for a slot whose counters cannot be right (nothing is written)."""
        return LayoutMismatch(
            f"resource {rid}'s {what}: the slot is damaged and was left as it is",
            node=rid.node,
            key=rid,
            kind=self.kind,
        )

    def _not_owner(self, rid: ResourceId, hot: tuple[int, ...]) -> NotOwnerError:
        return NotOwnerError(
            f"resource {rid} belongs to node {rid.node} incarnation {hot[3]}, "
            f"not to node {self.node} incarnation {self.incarnation}",
            node=self.node,
            key=rid,
        )

    def _current(self, rid: ResourceId, offset: int) -> tuple[int, ...]:
        hot: tuple[int, ...] = RES_HOT.unpack_from(self.buf, offset)
        if (
            hot[2] != rid.generation
            or hot[11] != rid.epoch
            or hot[1] != rid.node
            or not (LIVE <= hot[0] <= DRAINING)
        ):
            raise self._refusal(rid, hot, owner=False)
        return hot

    def _owned(self, rid: ResourceId, offset: int) -> tuple[int, ...]:
        hot: tuple[int, ...] = RES_HOT.unpack_from(self.buf, offset)
        if (
            hot[2] != rid.generation
            or hot[11] != rid.epoch
            or hot[1] != rid.node
            or not (LIVE <= hot[0] <= DRAINING)
            or hot[3] != self.incarnation
            or rid.node != self.node
        ):
            raise self._refusal(rid, hot, owner=True)
        return hot

    # -- registration -----------------------------------------------------------------

    def register(self, key: Key, capacity: int, active: int) -> ResourceId:
        """Install a LIVE resource in this node's lane; ``active`` units start accepted.

        Raises:
            KeyFullError, LaneFullError.
            LayoutMismatch: the header's epoch is 0 (nothing is written).
        """
        with self:
            epoch = self.checked_epoch()
            index = self.find_key(key, True)
            slot, generation = self._allocate()
            global_index = self.node * self.lane_capacity + slot
            offset = self.res_base + global_index * RESOURCE_SIZE
            self.buf[offset + RES_FENCES : offset + RESOURCE_SIZE] = _ZERO_PENDING
            store(
                self.buf, offset + RES_BODY_AT, RES_BODY, self.node, generation, self.incarnation,
                key.value & M64, key.value >> 64, capacity, index, active, 0, wall_ms(), epoch,
            )  # fmt: skip
            self.buf[offset] = LIVE  # commit the slot, then publish it under the key
            self._set_member(index, global_index, True)
            self.key_changed(index)
        return ResourceId(self.kind, self.node, slot, generation, epoch)

    def _allocate(self) -> tuple[int, int]:
        lane = self.lane_capacity
        base = self.res_base + self.node * lane * RESOURCE_SIZE
        for step in range(lane):
            slot = (self.hint + step) & (lane - 1)
            offset = base + slot * RESOURCE_SIZE
            if self.buf[offset] not in (EMPTY, CLOSED):
                continue
            generation = U32.unpack_from(self.buf, offset + 4)[0]
            if generation >= GENERATION_MAX:
                self.buf[offset] = EXHAUSTED
                continue
            self.hint = (slot + 1) & (lane - 1)
            return slot, generation + 1
        raise LaneFullError(
            f"node {self.node}'s resource lane is full ({lane} slots)", node=self.node
        )

    def close(self, rid: ResourceId) -> None:
        """Owner closes a resource: not a member any more, then CLOSED."""
        offset = self.locate(rid)
        with self:
            hot = self._owned(rid, offset)
            self._close_slot(offset, rid.node * self.lane_capacity + rid.slot, hot[7])

    def _close_slot(self, offset: int, global_index: int, index: int) -> None:
        if index < self.key_capacity:
            self._set_member(index, global_index, False)
            self.buf[offset] = CLOSED
            self.key_changed(index)
        else:
            self.buf[offset] = CLOSED

    def drain(self, rid: ResourceId) -> None:
        """Owner moves LIVE to DRAINING (no wake: nothing became usable)."""
        offset = self.locate(rid)
        with self:
            if self._owned(rid, offset)[0] == LIVE:
                self.buf[offset] = DRAINING

    # -- leases ---------------------------------------------------------------------

    def owner(self, rid: ResourceId) -> tuple[int, int]:
        """(node, incarnation) recorded in ``rid``'s slot (one read, for classification)."""
        node, _, life = RES_OWNER.unpack_from(self.buf, self.locate(rid) + RES_BODY_AT)
        return node, life

    def reserve(self, rid: ResourceId) -> int:
        """Reserve one unit; returns its fence.

        Raises:
            StaleError, DrainingError, BusyError.
            LayoutMismatch: the slot's fence counter is spent (damaged; unchanged).
        """
        offset = self.locate(rid)
        with self:
            steps = self._steps
            fence = (
                _DECLINED
                if steps is None
                else steps.reserve(offset, rid.node, rid.generation, rid.epoch, wall_ms())
            )
            if fence < 0:  # an outcome
                if fence != _DECLINED:
                    raise self._failure(fence, rid, offset, owner=False)
                fence = self._reserve_step(rid, offset)
        return fence

    def _reserve_step(self, rid: ResourceId, offset: int) -> int:
        buf = self.buf
        state, node, generation, _, capacity, _, active, last, epoch = RES_LEASE.unpack_from(
            buf, offset
        )
        if state != LIVE or generation != rid.generation or epoch != rid.epoch or node != rid.node:
            raise self._refusal(rid, RES_HOT.unpack_from(buf, offset), owner=False)
        fences = PENDING_WORDS.unpack_from(buf, offset + RES_FENCES)
        free = fences.count(0)
        if PENDING - free + active >= capacity or not free:
            raise self._busy(rid)
        if last >= U64_MAX:  # the C step declines here
            raise self._damaged(rid, f"fence counter is {last}, the most it can hold")
        entry = fences.index(0) * 8
        fence: int = last + 1
        now = wall_ms()
        store(buf, offset + RES_FENCE, U64_PAIR, fence, now)
        store(buf, offset + RES_SINCE + entry, U64, now)
        store(buf, offset + RES_FENCES + entry, U64, fence)  # commit
        return fence

    def accept(self, rid: ResourceId, fence: int) -> int:
        """Owner turns the pending ``fence`` into an active unit; returns the slot offset.

        Raises:
            StaleError, NotOwnerError, DrainingError, NotReservedError.
            LayoutMismatch: the slot's active count is full (damaged; unchanged).
        """
        offset = self.locate(rid)
        with self:
            steps = self._steps
            outcome = (
                _DECLINED
                if steps is None
                else steps.accept(
                    offset, rid.node, rid.generation, rid.epoch, self.node, self.incarnation, fence
                )
            )
            if outcome != _DONE:
                if outcome != _DECLINED:
                    raise self._failure(outcome, rid, offset, owner=True, fence=fence)
                self._accept_step(rid, offset, fence)
        return offset

    def _accept_step(self, rid: ResourceId, offset: int, fence: int) -> None:
        buf = self.buf
        state, node, generation, life, capacity, _, active, _, epoch = RES_LEASE.unpack_from(
            buf, offset
        )
        if (
            state != LIVE
            or generation != rid.generation
            or epoch != rid.epoch
            or node != self.node
            or life != self.incarnation
            or rid.node != node
        ):
            raise self._refusal(rid, RES_HOT.unpack_from(buf, offset), owner=True)
        try:
            entry = PENDING_WORDS.unpack_from(buf, offset + RES_FENCES).index(fence) * 8
        except ValueError:
            raise self._not_reserved(rid, fence) from None
        if active >= capacity:  # a pending fence means a free unit; the C step declines here
            raise self._damaged(rid, f"active count is {active} of capacity {capacity}")
        store(buf, offset + RES_FENCES + entry, U64, 0)
        store(buf, offset + RES_ACTIVE, U32, active + 1)

    def complete(self, offset: int, generation: int, epoch: int) -> None:
        """Return one active unit of the slot at ``offset`` if it is still that resource."""
        with self:
            steps = self._steps
            if steps is None:
                index = self._complete_step(offset, generation, epoch)
            else:
                index = steps.complete(offset, generation, epoch)
            if 0 <= index < self.key_capacity:
                self.key_changed(index)

    def _complete_step(self, offset: int, generation: int, epoch: int) -> int:
        """Return the unit; the key index stored in the slot, or -1 when nothing changed."""
        buf = self.buf
        state, _, now_generation, _, _, index, active, _, now_epoch = RES_LEASE.unpack_from(
            buf, offset
        )
        if (
            now_generation == generation
            and now_epoch == epoch
            and LIVE <= state <= DRAINING
            and active
        ):
            store(buf, offset + RES_ACTIVE, U32, active - 1)
            return int(index)
        return -1

    def cancel(self, rid: ResourceId, fence: int, holder: tuple[int, int]) -> None:
        """The holder takes its own pending ``fence`` back (before delivery).

        Raises:
            StaleError, NotOwnerError (another holder), NotReservedError.
        """
        offset = self.locate(rid)
        if holder != (self.node, self.incarnation):
            raise NotOwnerError(
                f"only the lease's holder (node {shown(holder[0])} incarnation "
                f"{shown(holder[1])}) may cancel it",
                node=self.node,
                key=rid,
            )
        with self:
            hot = self._current(rid, offset)
            fences = PENDING_WORDS.unpack_from(self.buf, offset + RES_FENCES)
            if fence <= 0 or fence not in fences:
                raise NotReservedError(
                    f"fence {shown(fence)} of resource {rid} is not pending", key=rid
                )
            store(self.buf, offset + RES_FENCES + fences.index(fence) * 8, U64, 0)
            if hot[7] < self.key_capacity:
                self.key_changed(hot[7])

    def reconcile(self, rid: ResourceId, active: int, grace_ms: int) -> int:
        """Owner ages out reservations older than ``grace_ms`` and sets ``active``.

        Returns the number of reservations aged out.

        Raises:
            StaleError, NotOwnerError, MalformedError (``active`` plus the
            reservations still pending would exceed the capacity; nothing changes).
        """
        offset = self.locate(rid)
        buf = self.buf
        with self:
            hot = self._owned(rid, offset)
            fences = PENDING_WORDS.unpack_from(buf, offset + RES_FENCES)
            since = PENDING_WORDS.unpack_from(buf, offset + RES_SINCE)
            now = wall_ms()
            aged = [e for e, fence in enumerate(fences) if fence and now - since[e] > grace_ms]
            pending = PENDING - fences.count(0) - len(aged)
            if active + pending > hot[6]:
                raise MalformedError(
                    f"active {active} and {pending} pending reservations exceed resource "
                    f"{rid}'s capacity {hot[6]} (a shorter grace ages more of them out)",
                    key=rid,
                )
            for entry in aged:
                store(buf, offset + RES_FENCES + entry * 8, U64, 0)
            store(buf, offset + RES_ACTIVE, U32, active)
            if (len(aged) + hot[8] > active) and hot[7] < self.key_capacity:
                self.key_changed(hot[7])
        return len(aged)

    # -- deaths and resets ---------------------------------------------------------------

    def node_dead(self, node: int, incarnation: int) -> int:
        """Close that life's resources; return its claims if its doorbell shows it.

        Returns the number of resources closed.
        """
        with self:
            changed: set[int] = set()
            closed = 0
            base = node * self.lane_capacity
            for slot in range(self.lane_capacity):
                offset = self.res_base + (base + slot) * RESOURCE_SIZE
                if LIVE <= self.buf[offset] <= DRAINING:
                    owner, _, life = RES_OWNER.unpack_from(self.buf, offset + RES_BODY_AT)
                    if owner == node and life == incarnation:
                        index = U32.unpack_from(self.buf, offset + RES_KEY_INDEX)[0]
                        if index < self.key_capacity:
                            self._set_member(index, base + slot, False)
                            changed.add(index)
                        self.buf[offset] = CLOSED
                        closed += 1
            if self.doorbell(node) == incarnation:
                changed.update(self._forget_node(node, claims=True))
                store(self.buf, self.layout.doorbells + 8 * node, U64, 0)
                store(self.buf, self.layout.bell_lives + 8 * node, U64, 0)
            for index in sorted(changed):
                self.key_changed(index)
        return closed

    def reset_all(self) -> int:
        """New epoch; every key and resource emptied, waiters woken. Returns the epoch."""
        with self:
            epoch = new_epoch(self.epoch())
            write_header(self.buf, self.layout, epoch)
            interest = self.key_interest
            for index in range(self.key_capacity):
                offset = self.key_offset(index)
                bump(self.buf, offset + KEY_CHANGES, offset + KEY_PARKED, self.fleet_capacity)
                self.buf[offset : offset + KEY_CHANGES] = bytes(KEY_CHANGES)
                end = offset + self.key_stride
                self.buf[offset + interest : end] = bytes(end - offset - interest)
            end = self.res_base + self.fleet_capacity * self.lane_capacity * RESOURCE_SIZE
            self.buf[self.res_base : end] = bytes(end - self.res_base)
            self.channel.bump()
            self.keys.clear()
        return epoch
