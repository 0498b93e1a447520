"""Waiting for a key's release: one word per bucket of keys, oldest waiter woken first.

The ring's lane heads hold one u32 **key word** each; a key belongs to bucket
``digest % lane_count``. A release of a key adds one to its bucket's word and
wakes, with one ``FUTEX_WAKE(word, 1)``, the thread that has slept on the word
longest (the kernel's queue order, see ``_core._readiness_futex``): a hand-over
costs one wake-up, woken by the release itself, and the waiters of one key are
served oldest first. The release does so only while some node's **waiting**
slot holds the key's tag (``_ring.key_tag``; or any key, when the node's threads
wait for several), and tells its caller how many nodes wait for the key
(``LockTable.release_waking``). The kernel keeps the queue itself, so a waiter
killed in its sleep simply leaves it; its node's slot stays until the node's
next process opens the table (or a polite waiter finds the node dead).

Why no release is missed. A waiter (1) marks its node's slot, (2) reads the
word, (3) attempts (``try_acquire``: the key's stripes), (4) sleeps while the
word still holds what it read. A release runs under those stripes too: if it
came before the attempt, the attempt finds the key free; if after, it finds the
slot (written before the waiter took the stripes) and changes the word after
the waiter read it, so the sleep returns at once or is woken.

A wake can land on a waiter of another key of the same bucket, or on one that
is leaving. Such a waiter passes it on (one more ``FUTEX_WAKE(word, 1)``): when,
between two refused attempts, the word moved (a release in the bucket) and its
key's holder stayed the same (so that release was not of its key); or when it
leaves without the key after the word moved. A pass-on that finds nobody to
wake costs a syscall; a wake lost with a waiter killed after its wake costs the
others their timeout (at most :data:`WAIT_CAP_S`). Order is kept among waiters
that wait less than that: a sleep that runs out re-queues at the back.

Queueing. A caller that has just released the key, or that finds threads refused
it, waits behind them before its first attempt (:meth:`KeyWaiter.queue`, at most
:data:`QUEUE_S`), so a woken waiter is not overtaken. One whose release woke a
waiter waits for that waiter's own release (the word moving past what its
release left), watching the word briefly before it sleeps; any other waits only
behind slots holding the key's tag, since a queueing caller's slot shows
``ANY_KEY`` and two queueing callers must not wait for each other.

Timeline of three processes on one key::

    A holds; B parks (t=1), C parks (t=2)    queue: B, C
    A releases -> word + 1, wakes B          B attempts: granted
    A asks again with queue=True             A parks behind C (no barging)
    B releases -> wakes C, C is granted; C releases -> wakes A
"""

from __future__ import annotations

import collections
import mmap
import struct
import threading
import time
from collections.abc import Callable
from typing import Final

from .._core import _fork
from .._core._fleet import Fleet
from .._core._readiness import wait_word, wake_word
from .._core._region import store
from ._ring import ANY_KEY, Ring, key_tag

#: Longest single sleep of a waiter, in seconds: bounds what a wake lost with a waiter
#: killed between its wake and its attempt costs the others (a sleep also ends at
#: the holder's expiry). A waiter that sleeps it out goes to the back of the queue.
WAIT_CAP_S: Final = 2.0
#: Longest a caller waits behind the key's waiters before its first attempt
#: (:meth:`KeyWaiter.queue`), in seconds: long enough for a woken waiter to run on a
#: busy host, short enough to bound what a waiter killed after its wake costs.
QUEUE_S: Final = 0.05
#: How long a caller whose release woke a waiter watches the key word before it
#: sleeps, in seconds: about one hand-over between two running processes. Measured
#: (docs/benchmarks.md, issue 25): 20 us kept the turns going round (about 99%
#: hand-overs) without each costing a sleep and a wake-up; 0 halved the throughput
#: at 2 and 4 processes, 100 us took CPU from the woken process at 8.
HANDED_SPIN_S: Final = 20e-6
_HANDED_SPIN_NS: Final = round(HANDED_SPIN_S * 1e9)
_U32: Final = struct.Struct("<I")


class _Slots:
    """This process's waiting threads per (mapping, node), by key tag; it writes the node's slot.

    Only this process writes its node's slot (each live process holds its own node).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tags: dict[tuple[int, int], collections.Counter[int]] = {}

    def hold(self, buf: mmap.mmap, at: int, tag: int) -> None:
        with self._lock:
            tags = self._tags.setdefault((id(buf), at), collections.Counter())
            tags[tag] += 1
            self._write(buf, at, tags)

    def release(self, buf: mmap.mmap, at: int, tag: int) -> None:
        with self._lock:
            tags = self._tags[(id(buf), at)]
            self._drop(tags, tag)
            if not tags:
                del self._tags[(id(buf), at)]
            self._write(buf, at, tags)

    def swap(self, buf: mmap.mmap, at: int, old: int, new: int) -> None:
        """One thread's mark changes from ``old`` to ``new`` in one write: never unmarked."""
        with self._lock:
            tags = self._tags[(id(buf), at)]
            tags[new] += 1
            self._drop(tags, old)
            self._write(buf, at, tags)

    @staticmethod
    def _drop(tags: collections.Counter[int], tag: int) -> None:
        tags[tag] -= 1
        if tags[tag] <= 0:
            del tags[tag]

    def reset(self, buf: mmap.mmap, at: int) -> None:
        """Zero a slot a previous process of this node left, unless our own threads wait."""
        with self._lock:
            if (id(buf), at) not in self._tags:
                store(buf, at, _U32, 0)

    @staticmethod
    def _write(buf: mmap.mmap, at: int, tags: collections.Counter[int]) -> None:
        value = 0 if not tags else next(iter(tags)) if len(tags) == 1 else ANY_KEY
        store(buf, at, _U32, value)

    def _after_fork_in_child(self) -> None:
        # The parent's waiting threads do not exist here, and the slots are its nodes'.
        self._lock = threading.Lock()
        self._tags = {}


SLOTS: Final = _Slots()
_fork.register(SLOTS)


class KeyWaiter:
    """One thread's place in the wait queue of a key's bucket.

    Use: :meth:`enter` once (then :meth:`queue`, to wait behind the others), before
    every attempt :meth:`look`, after every refused attempt :meth:`wait`, and
    :meth:`leave` in a ``finally`` (saying whether the key was granted).
    """

    __slots__ = (
        "_buf",
        "_digest",
        "_entered",
        "_fleet",
        "_holder",
        "_node",
        "_previous",
        "_ring",
        "_seen",
        "_slot",
        "_tag",
        "_word",
    )

    def __init__(self, ring: Ring, digest: int, fleet: Fleet, node: int) -> None:
        geometry = ring.geometry
        self._ring, self._digest, self._fleet, self._node = ring, digest, fleet, node
        self._buf = ring.buf
        self._tag = key_tag(digest)
        self._word = geometry.key_word(digest)
        self._slot = geometry.waiting_offset + 4 * node
        self._seen = self._previous = 0
        self._holder: int | None = None
        self._entered = False

    def enter(self) -> None:
        """Mark this node's waiting slot with the key's tag, so its releases wake."""
        SLOTS.hold(self._buf, self._slot, self._tag)
        self._entered = True

    def look(self) -> None:
        """Read the key word: before every attempt."""
        self._previous, self._seen = self._seen, self._read()

    def wait(self, holder_id: int | None, timeout: float | None) -> bool:
        """Sleep until a release in the key's bucket, or ``timeout`` seconds.

        Args:
            holder_id: the lock id of the holder the refused attempt saw (None
                before a first attempt: nothing to compare).
            timeout: seconds (float), at most :data:`WAIT_CAP_S` is slept.

        Returns:
            False when the sleep ran to its end; True when the word moved (maybe).
        """
        if holder_id is not None and holder_id == self._holder and self._seen != self._previous:
            wake_word(self._buf, self._word, 1)  # that release was another key's: pass it on
        self._holder = holder_id
        bound = WAIT_CAP_S if timeout is None else min(max(timeout, 0.0), WAIT_CAP_S)
        return wait_word(self._buf, self._word, self._seen, bound)

    def others_wait(self) -> bool:
        """Whether another node's slot says its threads wait for the key alone: they were
        refused it (a node queueing, or waiting for several keys, shows ``ANY_KEY``)."""
        return bool(waiting_nodes(self._ring, self._digest, self._node, alone=True))

    def queue(self, timeout: float | None, handed: int | None = None) -> None:
        """Before a first attempt, after :meth:`enter`: wait behind the key's waiters for
        its next release, at most :data:`QUEUE_S` or ``timeout`` seconds.

        Meanwhile the node's slot shows ``ANY_KEY``: a release still wakes this thread,
        but other callers queueing do not wait behind it, so two of them never wait
        for each other while the key is free. The word is read before the slots: a
        release after that read ends the wait at once. A wait that runs out found the
        waiters' slots stale, or their holder slow: the slots of dead nodes are zeroed
        (their processes were killed waiting).

        Args:
            timeout: seconds (float), or None.
            handed: for a caller whose own release woke a waiter, the key word that
                release left (``LockTable._release_handing``). It waits while the word still holds
                that (the woken waiter has not released yet) behind any waiter, queued
                ones too, since its release woke one of them; it watches the word for
                :data:`HANDED_SPIN_S` before it sleeps. Without it, it waits only behind
                the threads that were refused the key.
        """
        SLOTS.swap(self._buf, self._slot, self._tag, ANY_KEY)
        try:
            self.look()
            if handed is None:
                behind = self.others_wait()
            else:
                behind = (
                    self._seen == handed
                    and bool(waiting_nodes(self._ring, self._digest, self._node))
                    and not self._moves_within(_HANDED_SPIN_NS)
                )
            if behind and not self.wait(
                None, QUEUE_S if timeout is None else min(QUEUE_S, timeout)
            ):
                for node in waiting_nodes(self._ring, self._digest, self._node):
                    if not self._fleet.is_alive(node):
                        forget(self._ring, node)
        finally:
            SLOTS.swap(self._buf, self._slot, ANY_KEY, self._tag)

    def leave(self, granted: bool) -> None:
        """Stop waiting; a waiter leaving without the key passes on a wake it may have had."""
        if not self._entered:
            return
        self._entered = False
        SLOTS.release(self._buf, self._slot, self._tag)
        if not granted and self._read() != self._seen:
            wake_word(self._buf, self._word, 1)

    def _moves_within(self, ns: int) -> bool:
        """Watch the key word on the CPU for up to ``ns`` nanoseconds: whether it moved
        from what :meth:`look` saw."""
        read, seen, now = self._read, self._seen, time.perf_counter_ns
        end = now() + ns
        while read() == seen:
            if now() >= end:
                return False
        return True

    def _read(self) -> int:
        value: int = _U32.unpack_from(self._buf, self._word)[0]
        return value


def waiting_nodes(ring: Ring, digest: int, node: int, *, alone: bool = False) -> list[int]:
    """The nodes other than ``node`` whose slot says they wait for the key of ``digest``:
    it holds the key's tag, or ``ANY_KEY`` unless ``alone``."""
    geometry = ring.geometry
    tag = key_tag(digest)
    marks = (tag,) if alone else (tag, ANY_KEY)
    slots = struct.unpack_from(f"<{geometry.lane_count}I", ring.buf, geometry.waiting_offset)
    return [n for n, v in enumerate(slots) if n != node and v in marks]


def queue_probe(ring: Ring, digest: int) -> Callable[[], bool]:
    """A check, made once per key: whether a thread of some node (this one included)
    waits for the key of ``digest`` alone, i.e. a waiting slot holds exactly its tag
    (a node waiting for several keys at once, ``ANY_KEY``, does not count). Each call
    is one search of the slots in C."""
    geometry = ring.geometry
    start = geometry.waiting_offset
    end = start + 4 * geometry.lane_count
    tag = _U32.pack(key_tag(digest))
    find = ring.buf.find

    def queued() -> bool:
        at = find(tag, start, end)
        while at >= 0 and (at - start) % 4:  # found across two slots: look on
            at = find(tag, at + 1, end)
        return at >= 0

    return queued


def forget(ring: Ring, node: int) -> None:
    """Zero ``node``'s waiting slot (a dead process's), unless this process waits there."""
    SLOTS.reset(ring.buf, ring.geometry.waiting_offset + 4 * node)
