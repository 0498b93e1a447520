"""The key side of the pool table: memory, critical section, identity, keys, claims, waiting marks.

:class:`KeyTable` holds what every step needs (the mapping, its offsets, the
region's critical section, this process's owner identity) and the steps on key
slots: install and lookup, the version word, creation claims and the marks of
waiters. :class:`~orbitive.pool._table.Table` adds the resource steps.

Python cannot compare-and-swap shared memory, so every step that reads and
writes the table runs inside ``with table:`` (:meth:`KeyTable.leave` on the way
out): the region's process mutex (threads) and its section (processes). One step
is atomic for every process of the fleet.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final

from .._core import _fork
from .._core._errors import (
    CreationBudgetError,
    KeyFullError,
    LayoutMismatch,
    MalformedError,
    OrbitError,
)
from .._core._readiness import Channel, bump
from .._core._region import Region, store
from ._layout import (
    BELL_PARKED,
    EPOCH_OFFSET,
    KEY_CHANGES,
    KEY_HEAD,
    KEY_LIMITS,
    KEY_LOHI,
    KEY_PARKED,
    KEY_WAITS,
    LABEL_MAX,
    U32,
    U64,
    U64_PAIR,
    WAIT_BOUNDS_US,
    Layout,
)
from ._values import Key

M64: Final = (1 << 64) - 1
_GOLDEN: Final = 0x9E3779B97F4A7C15


class KeyTable:
    """One process's view of one pool table: offsets, identity, critical section, keys.

    One instance per mapped region per process, shared by every ``Pool`` handle
    on it. ``node``/``incarnation`` are the bound owner identity (-1/0 until a
    Pool binds it, and again in a forked child).
    """

    def __init__(self, region: Region, layout: Layout) -> None:
        self.region = region
        self.buf = region.buf
        self.layout = layout
        self.kind = layout.kind
        self.fleet_capacity = layout.fleet_capacity
        self.key_capacity = layout.key_capacity
        self.lane_capacity = layout.lane_capacity
        self.res_base = layout.resources
        self.key_base = layout.keys
        self.key_stride = layout.key_stride
        self.key_interest = layout.key_interest
        self.key_claims = layout.key_claims
        self.key_waiters = layout.key_waiters
        self.key_wait_since = layout.key_wait_since
        self.key_wait_seen = layout.key_wait_seen
        self.key_members = layout.key_members
        self.key_waits = layout.key_waits
        self.key_limits = layout.key_limits
        self.key_label = layout.key_label
        self.key_opened = layout.key_opened
        self.member_bytes = layout.member_bytes
        self.member_mask = layout.member_mask
        self.bell = layout.bell
        #: The bell: readiness of this table for every process that armed interest.
        self.channel = Channel(
            region, layout.bell, layout.bell + BELL_PARKED, layout.fleet_capacity
        )
        self.zero_nodes = bytes(layout.fleet_capacity)
        self.claims_struct = struct.Struct(f"<{layout.fleet_capacity}I")
        self._key_shift = 64 - (layout.key_capacity.bit_length() - 1)
        self.node = -1
        self.incarnation = 0
        self.keys: dict[Key, int] = {}
        self.parked: dict[int, int] = {}
        self._parked_mutex = threading.Lock()  # the counts and this node's parked bytes
        self.deferred: list[Callable[[], None]] = []
        self.hint = 0
        self.extras: dict[str, object] = {}  # waiting machinery, per process
        #: Enter the critical section (process mutex + section); bound once for speed.
        self.enter: Callable[[], None] = region.acquire
        self._release: Callable[[], None] = region.release
        _fork.register(self)

    # -- critical section --------------------------------------------------------

    @property
    def __enter__(self) -> Callable[[], None]:
        """``with table:`` enters the critical section with the region's own ``acquire``,
        handed over bound: no frame of ours runs between it and the block, so a signal
        handler's exception once the section is held surfaces inside one or the other,
        and either lets go (see ``Region``)."""
        return self.enter

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        """Leave the critical section entered by ``with table:`` (:meth:`leave`)."""
        self.leave()

    def leave(self) -> None:
        """Leave the critical section, then run steps finalisers deferred meanwhile."""
        self._release()
        if self.deferred:
            self._run_deferred()

    def run_soon(self, step: Callable[[], None]) -> None:
        """Run ``step`` now, or after the current critical section if this thread is in one.

        Finalisers call this: a step while this thread already holds the process
        mutex would be a re-entry (refused).
        """
        if self.region.holds():
            self.deferred.append(step)
        else:
            with contextlib.suppress(OrbitError, OSError, ValueError):
                step()

    def _run_deferred(self) -> None:
        while self.deferred:
            step = self.deferred.pop()
            with contextlib.suppress(OrbitError, OSError, ValueError):
                step()

    def _after_fork_in_child(self) -> None:
        self.node = -1
        self.incarnation = 0
        self.parked = {}
        self._parked_mutex = threading.Lock()
        self.deferred = []
        self.extras = {}

    # -- addressing -----------------------------------------------------------------

    def key_offset(self, index: int) -> int:
        """Offset of key slot ``index``."""
        return self.key_base + index * self.key_stride

    def epoch(self) -> int:
        """The table epoch in the header."""
        value: int = U64.unpack_from(self.buf, EPOCH_OFFSET)[0]
        return value

    def checked_epoch(self) -> int:
        """The table epoch, for an id to carry.

        Raises:
            LayoutMismatch: the header's epoch is 0 (damage; ``reset_all`` mends it).
        """
        epoch = self.epoch()
        if not epoch:
            raise LayoutMismatch(
                f"pool table (kind {self.kind}) has epoch 0, which no id can carry; "
                "reset_all starts a new epoch",
                kind=self.kind,
            )
        return epoch

    # -- keys ---------------------------------------------------------------------

    def find_key(self, key: Key, install: bool) -> int:
        """Index of ``key``'s slot; -1 when absent and not ``install``. In a section.

        Raises:
            KeyFullError: ``install`` and every slot holds another key.
            LayoutMismatch: a key slot has an impossible state byte.
        """
        index = self.keys.get(key)
        lo, hi = key.value & M64, key.value >> 64
        if index is not None:
            state, klo, khi, _ = KEY_HEAD.unpack_from(self.buf, self.key_offset(index))
            if state == 1 and klo == lo and khi == hi:
                return index
        index = self._probe(lo, hi, install)
        if index >= 0:
            self.keys[key] = index
        return index

    def index(self, key: Key) -> int:
        """Index of ``key``'s slot, installing it, in a critical section of its own.

        Raises:
            As :meth:`find_key` with ``install``.
        """
        with self:
            return self.find_key(key, True)

    def _probe(self, lo: int, hi: int, install: bool) -> int:
        mask = self.key_capacity - 1
        rotated = (hi << 32 | hi >> 32) & M64
        index = (((lo ^ rotated) * _GOLDEN) & M64) >> self._key_shift & mask
        for _ in range(self.key_capacity):
            offset = self.key_offset(index)
            state, klo, khi, _ = KEY_HEAD.unpack_from(self.buf, offset)
            if state == 0:
                if not install:
                    return -1
                store(self.buf, offset + KEY_LOHI, U64_PAIR, lo, hi)
                self.buf[offset] = 1  # commit
                return index
            if state != 1:
                raise LayoutMismatch(f"pool key slot {index} has state {state}", kind=self.kind)
            if klo == lo and khi == hi:
                return index
            index = (index + 1) & mask
        if install:
            raise KeyFullError(
                f"pool key table full ({self.key_capacity} keys this epoch)", kind=self.kind
            )
        return -1

    def installed_keys(self) -> list[int]:
        """Indexes of installed key slots."""
        stride, base = self.key_stride, self.key_base
        return [i for i in range(self.key_capacity) if self.buf[base + i * stride] == 1]

    def changes(self, index: int) -> int:
        """The key's version word (a single aligned read; no section needed)."""
        value: int = U32.unpack_from(self.buf, self.key_offset(index) + KEY_CHANGES)[0]
        return value

    def key_changed(self, index: int) -> None:
        """Bump the key's version, wake its waiters, ring interested nodes. In a section."""
        buf, capacity = self.buf, self.fleet_capacity
        offset = self.key_base + index * self.key_stride  # key_offset, on every completion
        bump(buf, offset + KEY_CHANGES, offset + KEY_PARKED, capacity)
        interest = offset + self.key_interest
        if buf[interest : interest + capacity] != self.zero_nodes:
            buf[interest : interest + capacity] = self.zero_nodes
            self.channel.bump()

    def members(self, index: int) -> int:
        """The key's member bitmap; bits past the last resource slot (damage) are dropped."""
        at = self.key_offset(index) + self.key_members
        bits = int.from_bytes(self.buf[at : at + self.member_bytes], "little")
        return bits & self.member_mask

    def budget(self, index: int) -> tuple[int, int]:
        """(live, creating) of a key: its member bits and the sum of its claims."""
        claims = self.claims_struct.unpack_from(self.buf, self.key_offset(index) + self.key_claims)
        return self.members(index).bit_count(), sum(claims)

    def _set_member(self, index: int, global_index: int, present: bool) -> None:
        at = self.key_offset(index) + self.key_members + (global_index >> 3)
        bit = 1 << (global_index & 7)
        self.buf[at] = self.buf[at] | bit if present else self.buf[at] & ~bit & 0xFF

    # -- label and wait counters ------------------------------------------------------

    def describe(self, key: Key, label: bytes, limits: tuple[int, int, int] | None) -> None:
        """Write ``key``'s label (1..127 bytes of UTF-8; empty: keep the one it has) and
        its ``(max_live, min_idle, max_idle)``, if given. Installs the key.

        Raises:
            KeyFullError: no room to install the key.
        """
        with self:
            offset = self.key_offset(self.find_key(key, True))
            if limits is not None:
                store(self.buf, offset + self.key_limits, KEY_LIMITS, *limits)
            if label:
                at = offset + self.key_label
                # A process killed in between leaves no label, never a torn one.
                self.buf[at] = 0
                self.buf[at + 1 : at + 1 + len(label)] = label
                self.buf[at] = len(label)  # commit: the length last

    def mark_opened(self, key: Key, opened: bool, still: Callable[[], bool] | None = None) -> None:
        """Mark (or unmark) a client pool of this node open on ``key``, so that an
        observer lists the key while the process lives, whatever it holds; only if
        ``still()`` holds, asked inside the section. Installs the key; nothing for an
        unbound table.

        Raises:
            KeyFullError: no room to install the key.
        """
        if self.node < 0:
            return
        with self:
            if still is None or still():
                offset = self.key_offset(self.find_key(key, True))
                self.buf[offset + self.key_opened + self.node] = 1 if opened else 0

    def count_wait(self, index: int, wait_us: int, timed_out: bool) -> None:
        """Count one finished wait at ``max_live`` on key ``index``: a timeout, or a
        checkout served after ``wait_us`` microseconds. In a section."""
        at = self.key_offset(index) + self.key_waits
        counts = list(KEY_WAITS.unpack_from(self.buf, at))
        if timed_out:
            counts[0] += 1
        else:
            counts[1] += 1
            counts[2] += wait_us
            bucket = next((i for i, bound in enumerate(WAIT_BOUNDS_US) if wait_us <= bound), -1)
            if bucket >= 0:
                counts[3 + bucket] += 1
        store(self.buf, at, KEY_WAITS, *(count & M64 for count in counts))

    # -- identity -------------------------------------------------------------------

    def bind(self, node: int, incarnation: int, fleet_life: int) -> None:
        """Adopt (node, incarnation) as this process's owner identity and stamp the doorbell.

        The doorbell records ``incarnation`` (the pool's life, the fleet's by
        default) and beside it ``fleet_life``, the fleet incarnation of this
        process, which the membership object shows while this process holds the
        node (``pool/_deaths.py`` compares the two).

        A previous life of the node (its doorbell shows another incarnation) is
        over: this process holds the node now. Its creation claims are returned
        and its waiting marks cleared; its resources wait for ``node_dead``.

        Raises:
            MalformedError: this process already bound another identity.
        """
        if self.node >= 0:
            if (self.node, self.incarnation) != (node, incarnation):
                raise MalformedError(
                    f"this process already uses pool kind {self.kind} as node {self.node} "
                    f"incarnation {self.incarnation}, not {node}/{incarnation}",
                    node=node,
                    kind=self.kind,
                )
            return
        with self:
            doorbell = self.layout.doorbells + 8 * node
            previous = U64.unpack_from(self.buf, doorbell)[0]
            if previous != incarnation:
                for index in self._forget_node(node, claims=previous != 0):
                    self.key_changed(index)
                store(self.buf, doorbell, U64, incarnation)
            store(self.buf, self.layout.bell_lives + 8 * node, U64, fleet_life)
        self.node, self.incarnation = node, incarnation

    def _forget_node(self, node: int, *, claims: bool) -> list[int]:
        """Zero a node's claims (when ``claims``), waiting marks, waiter counts and times,
        and its opened marks.

        Returns the keys whose claims fell or whose waiters' queue lost the node
        (the others may claim now).
        """
        changed = []
        for index in self.installed_keys():
            offset = self.key_offset(index)
            self.buf[offset + KEY_PARKED + node] = 0
            self.buf[offset + self.key_interest + node] = 0
            self.buf[offset + self.key_opened + node] = 0
            queued = U32.unpack_from(self.buf, offset + self.key_waiters + 4 * node)[0]
            for field in (self.key_waiters, self.key_wait_since, self.key_wait_seen):
                store(self.buf, offset + field + 4 * node, U32, 0)
            at = offset + self.key_claims + 4 * node
            claimed = claims and U32.unpack_from(self.buf, at)[0]
            if claimed:
                store(self.buf, at, U32, 0)
            if claimed or queued:
                changed.append(index)
        self.buf[self.bell + BELL_PARKED + node] = 0
        return changed

    def doorbell(self, node: int) -> int:
        """The incarnation recorded for ``node`` (0: none)."""
        value: int = U64.unpack_from(self.buf, self.layout.doorbells + 8 * node)[0]
        return value

    def bell_life(self, node: int) -> int:
        """The fleet incarnation of the process whose pool rang ``node``'s doorbell (0: none)."""
        value: int = U64.unpack_from(self.buf, self.layout.bell_lives + 8 * node)[0]
        return value

    # -- creation claims --------------------------------------------------------------

    def claim(self, key: Key, max_live: int) -> tuple[int, int]:
        """Count one creation in progress for this node; returns (key index, epoch).

        Raises:
            KeyFullError, CreationBudgetError.
        """
        with self:
            index = self.find_key(key, True)
            return index, self.claim_at(index, key, max_live)

    def claim_at(self, index: int, key: Key, max_live: int) -> int:
        """:meth:`claim` on installed key slot ``index``, in a section; returns the epoch.

        Raises:
            CreationBudgetError: live + creating already reached ``max_live``.
        """
        live, creating = self.budget(index)
        if live + creating >= max_live:
            raise CreationBudgetError(
                f"key {key}: {live} live + {creating} creating reached max_live {max_live}",
                key=key,
            )
        at = self.key_offset(index) + self.key_claims + 4 * self.node
        store(self.buf, at, U32, U32.unpack_from(self.buf, at)[0] + 1)
        return self.epoch()

    def unclaim(self, key: Key, index: int, node: int, epoch: int) -> None:
        """Return one claim of ``node`` on ``key`` if that key, slot and epoch still hold."""
        with self:
            offset = self.key_offset(index)
            state, lo, hi, _ = KEY_HEAD.unpack_from(self.buf, offset)
            at = offset + self.key_claims + 4 * node
            claims = U32.unpack_from(self.buf, at)[0]
            same = state == 1 and lo == key.value & M64 and hi == key.value >> 64
            if same and claims and self.epoch() == epoch:
                store(self.buf, at, U32, claims - 1)
                self.key_changed(index)

    # -- waiting marks ------------------------------------------------------------------

    def park(self, index: int, since: int) -> int:
        """Mark this node as waiting on a key unless it changed; returns its version.

        Inside the section, so that a change either sees the mark and wakes, or
        came first and the version read here shows it (``_readiness_futex.bump``).
        """
        with self:
            current = self.changes(index)
            if current == since:
                with self._parked_mutex:
                    self.parked[index] = self.parked.get(index, 0) + 1
                    self.buf[self.key_offset(index) + KEY_PARKED + self.node] = 1
        return current

    def unpark(self, index: int) -> int:
        """Undo one :meth:`park` of this process; returns the key's version.

        Outside the section, right after the wake (on the waiter's path): clearing
        the mark late costs a change only a spurious wake, and the version is one
        aligned u32 read.
        """
        with self._parked_mutex:
            count = self.parked.get(index, 0) - 1
            if count > 0:
                self.parked[index] = count
            else:
                self.parked.pop(index, None)
                self.buf[self.key_offset(index) + KEY_PARKED + self.node] = 0
        return self.changes(index)

    def arm(self, indexes: list[int]) -> list[int]:
        """Ask for a bell when any of these keys changes (one-shot); their versions."""
        with self:
            versions = []
            for index in indexes:
                self.buf[self.key_offset(index) + self.key_interest + self.node] = 1
                versions.append(self.changes(index))
        return versions


def label_at(buf: mmap.mmap, at: int) -> bytes:
    """The label stored at ``at`` (empty: none); a damaged length reads as at most 127."""
    return buf[at + 1 : at + 1 + min(buf[at], LABEL_MAX)]
