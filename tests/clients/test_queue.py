"""Waiting processes of one key claim freed capacity oldest first, and a waiter that
stops trying (SIGSTOP) or dies (kill -9) never stalls the others.

The test process holds the only client (``max_live=1``); workers check out in
turn. A worker counts as queued once the key's queue gives its node a place
(it counted itself in and tried to claim), so the order is set by design, not
by how fast each process wakes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive._core._robust import _TID_MASK, SECTION_MUTEX_AT
from orbitive.clients import ClientPool, PoolOptions
from orbitive.pool._availability import key_census, now_ms, queue

from .._processes import Child, Processes
from ._fakes import FakeClient, close
from ._workers import queued_checkout
from .conftest import CAPACITY


@pytest.fixture
def holder(fleet: Fleet) -> Iterator[tuple[ClientPool[FakeClient], FakeClient]]:
    """The test process's pool and its checked-out client: all of ``max_live=1``."""
    options = PoolOptions(max_live=1, acquire_timeout=10.0)
    with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
        yield pool, pool.getconn()


def queued(spawned: Processes, fleet: Fleet, pool: ClientPool[FakeClient]) -> tuple[Child, int]:
    """Start a waiting worker; return it and its node once it has its place in the queue."""
    child = spawned.start(queued_checkout, fleet.name, CAPACITY)
    node: int = child.recv(60)
    deadline = time.monotonic() + 30.0
    while waited(pool, node) is None:
        assert time.monotonic() < deadline, "the worker never queued"
        time.sleep(0.01)
    return child, node


def waited(pool: ClientPool[FakeClient], node: int) -> int | None:
    """The ms ``node`` has waited if it has its place in the key's queue, else None."""
    table = pool.table
    table.enter()
    try:
        return queue(table, table.find_key(pool.key, True), now_ms())[node]
    finally:
        table.leave()


def waiting(pool: ClientPool[FakeClient], node: int) -> int:
    """How many callers of ``node`` are counted as waiting on the pool's key."""
    return key_census(pool.table, pool.key).waiters[node]


def stop_outside_the_section(pool: ClientPool[FakeClient], pid: int) -> None:
    """SIGSTOP ``pid`` at a moment none of its threads holds the pool table's section.

    A process stopped while it holds the section stalls every other one until it
    continues (a robust mutex is recovered from its holder's death, not from a
    stop), so a stop that lands there (a waiter's try, its upkeep's round) is undone
    and tried again.
    """
    block = pool.table.region.block
    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        while not all(thread_stopped(pid, tid) for tid in threads):
            time.sleep(0.001)
        holder = int.from_bytes(block[SECTION_MUTEX_AT : SECTION_MUTEX_AT + 4], "little")
        if holder & _TID_MASK not in threads:
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"process {pid} held the section at every stop")


def thread_stopped(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of ``pid`` is in the stopped state (``T`` in its stat)."""
    with open(f"/proc/{pid}/task/{tid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] in ("T", "t")


def test_the_oldest_waiting_process_gets_the_client_then_the_next(
    spawned: Processes, fleet: Fleet, holder: tuple[ClientPool[FakeClient], FakeClient]
) -> None:
    pool, client = holder
    first, _ = queued(spawned, fleet, pool)
    second, second_node = queued(spawned, fleet, pool)
    pool.discard(client)  # the capacity is free: both wake, only the oldest may claim
    assert first.recv(30) == "got"
    assert waiting(pool, second_node) == 1  # still queued, behind the first
    first.send("release")
    assert second.recv(30) == "got"
    second.send("release")


def test_a_stopped_oldest_waiter_delays_the_others_a_few_seconds_then_loses_its_place(
    spawned: Processes, fleet: Fleet, holder: tuple[ClientPool[FakeClient], FakeClient]
) -> None:
    pool, client = holder
    stopped, _ = queued(spawned, fleet, pool)
    second, _ = queued(spawned, fleet, pool)
    stop_outside_the_section(pool, stopped.pid)
    try:
        started = time.monotonic()
        pool.discard(client)
        assert second.recv(30) == "got"
        waited = time.monotonic() - started
        assert 1.0 <= waited < 8.0, waited  # its place held while fresh (3 s), then went
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    second.send("release")
    assert stopped.recv(30) == "got"  # continued: it tries again and is served
    stopped.send("release")


def test_a_killed_waiter_leaves_the_queue_within_a_second(
    spawned: Processes, fleet: Fleet, holder: tuple[ClientPool[FakeClient], FakeClient]
) -> None:
    pool, client = holder
    killed, killed_node = queued(spawned, fleet, pool)
    second, _ = queued(spawned, fleet, pool)
    assert killed.kill() == -signal.SIGKILL
    gone = time.monotonic()
    while waiting(pool, killed_node):
        assert time.monotonic() - gone < 1.0  # the death watch reported it
        time.sleep(0.01)
    assert waited(pool, killed_node) is None
    started = time.monotonic()
    pool.discard(client)
    assert second.recv(30) == "got"
    assert time.monotonic() - started < 1.0  # no place of the dead one held it back
    second.send("release")
