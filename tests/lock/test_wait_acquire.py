"""wait_acquire: waiters woken by the release itself, oldest first, whatever happens to them."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from orbitive import Fleet
from orbitive._core._errors import InvalidTtl
from orbitive._core._region import SHM_DIR
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable, Occupied, _key_wait
from orbitive.lock._key_wait import WAIT_CAP_S, queue_probe
from orbitive.lock._ring import ANY_KEY, key_tag

from .._children import wait_for_key
from .._processes import Child, Processes, sleeps_in_futex_on

CAPACITY = 6
HOLDER = LockOwner(b"holder")
#: A waiter woken by the release answers well within this; one that was not
#: would wait out its sleep (WAIT_CAP_S) first.
WOKEN_BOUND = WAIT_CAP_S / 2


def key(label: str) -> LockKey:
    return LockKey("tests.children", label)


@pytest.fixture
def holder(fleet_name: str) -> Iterator[LockTable]:
    """The test process's table on a shared fleet the children join."""
    with Fleet.join(fleet_name, CAPACITY) as fleet:
        table = LockTable(fleet)
        yield table
        table.close()
        table.unlink()


def slot(table: LockTable, node: int) -> int:
    """The waiting slot of ``node`` (0: no thread of it waits)."""
    at = table._ring.geometry.waiting_offset + 4 * node
    value: int = struct.unpack_from("<I", table._ring.buf, at)[0]
    return value


def start_waiter(processes: Processes, table: LockTable, label: str) -> tuple[Child, int]:
    """A child waiting for ``label``, once its waiting slot is set (and it had time to sleep)."""
    child = processes.start(wait_for_key, table.fleet.name, CAPACITY, label)
    return child, wait_parked(table, child)


def park(table: LockTable, child: Child) -> Child:
    """Let a started :func:`wait_for_key` child wait, and return it once it sleeps."""
    wait_parked(table, child)
    return child


def wait_parked(table: LockTable, child: Child) -> int:
    """Tell a started child to wait; its node, once it sleeps on the key word."""
    said, node = child.recv()
    assert said == "waiting" and isinstance(node, int)
    child.send("go")
    path = SHM_DIR / table._ring.region.name
    deadline = time.monotonic() + 10.0
    while slot(table, node) == 0 or not sleeps_in_futex_on(child.pid, path):
        assert time.monotonic() < deadline, "the child never waited"
        time.sleep(0.002)
    return node  # asleep on the key word, in the kernel's queue behind any earlier waiter


def granted_at(child: Child) -> float:
    said, *at = child.recv()
    assert said == "granted", said
    stamp: float = at[0]
    return stamp


def hold(table: LockTable, label: str) -> Acquired:
    result = table.try_acquire(key(label), HOLDER, 60.0)
    assert isinstance(result, Acquired)
    return result


def test_free_is_taken_at_once_and_held_is_occupied_after_the_timeout(holder: LockTable) -> None:
    got = holder.wait_acquire(key("k"), b"first", 5.0, 10.0)
    assert isinstance(got, Acquired)
    start = time.monotonic()
    other = holder.wait_acquire(key("k"), b"second", 5.0, 0.2)
    assert isinstance(other, Occupied)
    assert other.lease == got.lease
    assert 0.15 < time.monotonic() - start < 0.2 + WAIT_CAP_S
    assert isinstance(holder.wait_acquire(key("k"), b"second", 5.0, 0), Occupied)
    assert slot(holder, holder.fleet.node) == 0  # nothing left marked
    with pytest.raises(InvalidTtl, match="timeout"):
        holder.wait_acquire(key("k"), b"second", 5.0, -1.0)
    assert holder.release_waking(got.lease) == 0  # nobody waits
    assert holder.release_waking(got.lease) == -1  # not live any more


def test_a_release_wakes_the_waiter_of_another_process_at_once(
    processes: Processes, holder: LockTable
) -> None:
    held = hold(holder, "k")
    child, node = start_waiter(processes, holder, "k")
    assert slot(holder, node) == key_tag(key("k").digest)
    released = time.monotonic()
    assert holder.release_waking(held.lease) == 1
    assert granted_at(child) - released < WOKEN_BOUND
    child.send("release")
    assert child.recv() == ("released", 0)
    assert slot(holder, node) == 0


def test_waiters_of_a_key_are_served_oldest_first(processes: Processes, holder: LockTable) -> None:
    # The order holds among waiters that sleep less than WAIT_CAP_S; parking them one
    # by one on a loaded host can take longer, and a sleep run out re-queues at the
    # back: the children sleep up to 60 s at a time.
    held = hold(holder, "k")
    started = [
        processes.start(wait_for_key, holder.fleet.name, CAPACITY, "k", 0.0, 60.0) for _ in range(3)
    ]
    waiters = [park(holder, child) for child in started]
    assert holder.release_waking(held.lease) == 3
    order = []
    for _ in waiters:
        ready = [c for c in waiters if c not in order and c.channel._conn.poll(WOKEN_BOUND)]
        assert len(ready) == 1, "exactly one waiter holds the key at a time"
        granted_at(ready[0])
        order.append(ready[0])
        ready[0].send("release")
        assert ready[0].recv()[0] == "released"
    assert order == waiters


def test_a_waiter_killed_in_its_sleep_does_not_hold_up_the_next(
    processes: Processes, holder: LockTable
) -> None:
    held = hold(holder, "k")
    doomed, _ = start_waiter(processes, holder, "k")
    survivor, _ = start_waiter(processes, holder, "k")
    assert doomed.kill() == -signal.SIGKILL
    released = time.monotonic()
    assert holder.release_waking(held.lease) >= 1
    assert granted_at(survivor) - released < WOKEN_BOUND


def _same_bucket_labels() -> tuple[str, str]:
    first = key("a").digest % CAPACITY
    other = next(f"b{n}" for n in range(1000) if key(f"b{n}").digest % CAPACITY == first)
    return "a", other


def test_a_wake_for_another_key_of_the_bucket_is_passed_on(
    processes: Processes, holder: LockTable
) -> None:
    first, second = _same_bucket_labels()
    hold(holder, first)
    held = hold(holder, second)
    older, _ = start_waiter(processes, holder, first)  # woken first by any release
    younger, _ = start_waiter(processes, holder, second)
    released = time.monotonic()
    assert holder.release_waking(held.lease) == 1  # one node waits for that very key
    assert granted_at(younger) - released < WOKEN_BOUND
    assert not older.channel._conn.poll(0.1)  # its key is still held


def test_queue_takes_its_turn_behind_the_waiters(processes: Processes, holder: LockTable) -> None:
    held = hold(holder, "k")
    child, _ = start_waiter(processes, holder, "k")
    assert holder.release_waking(held.lease) == 1
    mine: list[float] = []

    def ask_again() -> None:  # at once, as a loop around the lock would
        got = holder.wait_acquire(key("k"), HOLDER, 60.0, 10.0, queue=True)
        assert isinstance(got, Acquired)
        mine.append(time.monotonic())

    again = threading.Thread(target=ask_again)
    again.start()
    child_got = granted_at(child)
    time.sleep(0.1)
    assert not mine  # it waits behind the child
    child.send("release")
    assert child.recv() == ("released", 1)  # the test process was waiting then
    again.join(10.0)
    assert mine and mine[0] > child_got


def test_a_caller_whose_release_woke_a_queued_caller_waits_for_its_turn(
    processes: Processes, holder: LockTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller woken was still queueing (its slot ANY_KEY, never refused): the releaser
    asking again at once with ``queue=True`` waits behind it all the same, for its own
    release (the key word its release left), as the SHM store's lock does."""
    queue_s = 1.0
    monkeypatch.setattr(_key_wait, "QUEUE_S", queue_s)
    held = hold(holder, "k")
    stale = holder._ring.geometry.waiting_offset + 4 * (CAPACITY - 1)  # a node nobody holds
    # A slot saying a thread waits for "k" alone: the child's queued call waits behind it.
    holder._ring.buf[stale : stale + 4] = key_tag(key("k").digest).to_bytes(4, "little")
    child = processes.start(wait_for_key, holder.fleet.name, CAPACITY, "k", queue_s)
    node = wait_parked(holder, child)
    assert slot(holder, node) == ANY_KEY  # queued, not refused
    holder._ring.buf[stale : stale + 4] = bytes(4)  # now only the queued child waits
    os.kill(child.pid, signal.SIGSTOP)  # woken by the release, it cannot run yet
    try:
        assert holder.release_waking(held.lease) == 1
        started = time.monotonic()
        got = holder.wait_acquire(key("k"), HOLDER, 60.0, 10.0, queue=True)
        took = time.monotonic() - started
    finally:
        os.kill(child.pid, signal.SIGCONT)
    assert isinstance(got, Acquired)
    assert took >= 0.9 * queue_s, took  # it queued behind the woken child
    assert holder.release(got.lease)
    granted_at(child)
    child.send("release")
    assert child.recv() == ("released", 0)


def test_a_caller_queued_behind_a_waiter_that_has_come_and_gone_does_not_wait(
    processes: Processes, holder: LockTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter a release woke may hold the key and release it before the caller that
    released reads the key word: that release is the one it waits for."""
    monkeypatch.setattr(_key_wait, "QUEUE_S", 60.0)  # a missed release: a sleep of WAIT_CAP_S
    held = hold(holder, "k")
    child, _ = start_waiter(processes, holder, "k")
    assert holder.release_waking(held.lease) == 1
    mine = holder._key_waiter(key("k"))
    mine.enter()  # as the store's caller does once its release found a waiter
    try:
        granted_at(child)
        child.send("release")
        assert child.recv() == ("released", 1)  # this node was marked: the word moved
        started = time.monotonic()
        mine.queue(None)
        assert time.monotonic() - started < WOKEN_BOUND
    finally:
        mine.leave(False)


def test_callers_queued_at_once_do_not_wait_for_each_other(
    processes: Processes, holder: LockTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued caller shows ANY_KEY, so another one does not wait behind it while the
    key is free; a release still wakes it."""
    monkeypatch.setattr(_key_wait, "QUEUE_S", 60.0)
    mine = holder._key_waiter(key("k"))
    mine.enter()  # this node waits for "k": the child's queued call waits behind it
    try:
        child = processes.start(wait_for_key, holder.fleet.name, CAPACITY, "k", 60.0)
        node = wait_parked(holder, child)
        assert slot(holder, node) == ANY_KEY  # queued, not refused
        started = time.monotonic()
        mine.queue(None)
        assert time.monotonic() - started < WOKEN_BOUND
    finally:
        mine.leave(False)
    got = hold(holder, "k")
    released = time.monotonic()
    assert holder.release_waking(got.lease) == 1
    assert granted_at(child) - released < WOKEN_BOUND


def test_a_dead_nodes_waiting_slot_is_forgotten_by_a_queued_caller(holder: LockTable) -> None:
    dead = CAPACITY - 1  # never claimed: no process holds it
    at = holder._ring.geometry.waiting_offset + 4 * dead
    holder._ring.buf[at : at + 4] = struct.pack("<I", key_tag(key("k").digest))
    held = hold(holder, "k")
    assert holder.release_waking(held.lease) == 1  # the stale slot counts
    mine = holder.wait_acquire(key("k"), HOLDER, 60.0, 10.0, queue=True)
    assert isinstance(mine, Acquired)
    assert slot(holder, dead) == 0  # forgotten after the queued wait found nobody
    assert holder.release_waking(mine.lease) == 0


def test_the_queue_probe_sees_a_slot_holding_exactly_the_keys_tag(holder: LockTable) -> None:
    queued = queue_probe(holder._ring, key("k").digest)
    start = holder._ring.geometry.waiting_offset
    tag = struct.pack("<I", key_tag(key("k").digest))
    assert not queued()
    # The tag's bytes across two slots (the end of node 1's, the start of node 2's): no.
    holder._ring.buf[start + 4 : start + 12] = b"\x00\x00" + tag + b"\x00\x00"
    assert not queued()
    holder._ring.buf[start + 4 : start + 12] = bytes(8)
    holder._ring.buf[start + 8 : start + 12] = struct.pack("<I", ANY_KEY)  # several keys: no
    assert not queued()
    holder._ring.buf[start + 8 : start + 12] = tag
    assert queued()
    holder._ring.buf[start + 8 : start + 12] = bytes(4)
    assert not queued()


class Interrupted(Exception):
    pass


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def test_a_waiter_interrupted_in_its_sleep_unmarks_its_node(holder: LockTable) -> None:
    hold(holder, "k")
    previous = signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        with pytest.raises(Interrupted):
            holder.wait_acquire(key("k"), b"other", 5.0, 10.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert slot(holder, holder.fleet.node) == 0
