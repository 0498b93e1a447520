"""Transitions: the per-node ring, its loss accounting, and the readiness descriptor."""

from __future__ import annotations

import asyncio
import gc
import os
import selectors
import threading

from orbitive import Fleet
from orbitive.lock import (
    Acquired,
    LockEvent,
    LockKey,
    LockLayout,
    LockOwner,
    LockTable,
)

from .._children import KEY, start_server
from .._processes import Processes
from ..conftest import MakeFleet

OWNER = LockOwner(b"owner")
#: A small ring under its own kinds, so it wraps after eight frames.
SMALL_RING = LockLayout(state_kind=120, event_kind=121, ring_capacity=8)
WAKE_TIMEOUT = 10.0


def acquire(table: LockTable, key: LockKey, ttl: float = 30.0) -> Acquired:
    result = table.try_acquire(key, OWNER, ttl)
    assert isinstance(result, Acquired)
    return result


def test_poll_returns_acquire_renew_release_in_revision_order(table: LockTable) -> None:
    lease = acquire(table, KEY).lease
    renewed = table.renew(lease, 10.0)
    assert renewed is not None
    assert table.release(renewed)
    polled = table.poll()
    assert not polled.lost
    assert [event.transition for event in polled.events] == ["acquired", "renewed", "released"]
    assert [event.state_revision for event in polled.events] == [
        lease.state_revision,
        lease.state_revision + 1,
        lease.state_revision + 2,
    ]
    acquired, renewal, release = polled.events
    assert (acquired.key, acquired.owner, acquired.lock_id) == (KEY, OWNER, lease.lock_id)
    assert acquired.expires_at == lease.expires_at
    assert renewal.expires_at == renewed.expires_at
    assert release.expires_at is None
    assert {event.fencing_token for event in polled.events} == {lease.fencing_token}
    assert {event.node for event in polled.events} == {table.fleet.node}
    assert table.poll().events == ()


def test_a_new_table_subscribes_after_the_current_heads(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    first = LockTable(fleet)
    acquire(first, KEY)
    late = LockTable(fleet)
    assert late.poll().events == ()
    replay = LockTable.replay_retained(fleet)
    assert [event.transition for event in replay.poll().events] == ["acquired"]
    first.force_release(KEY)
    assert [event.transition for event in late.poll().events] == ["released"]
    for table in (first, late, replay):
        table.close()
    first.unlink()


def test_wrapped_ring_reports_loss_and_leaves_current_state_intact(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet()
    table = LockTable(fleet, SMALL_RING)
    try:
        keys = [LockKey("tests.events", f"k{n}") for n in range(6)]
        leases = [acquire(table, key).lease for key in keys]  # 6 frames
        for lease in leases[:3]:
            assert table.release(lease)  # 9
        renewed = [table.renew(lease, 30.0) for lease in leases[3:]]  # 12
        assert all(lease is not None for lease in renewed)
        kept = [table.renew(lease, 30.0) for lease in renewed if lease is not None]  # 15
        polled = table.poll()
        assert polled.overwritten == 15 - 8
        assert polled.lost
        assert len(polled.events) == 8
        revisions = [event.state_revision for event in polled.events]
        assert revisions == list(range(15 - 7, 16))
        for key in keys[:3]:
            assert table.current(key) is None
        assert set(table.leases()) == set(kept)
        replay = LockTable.replay_retained(fleet, SMALL_RING)
        replayed = replay.poll()
        assert (replayed.overwritten, len(replayed.events)) == (7, 8)
        replay.close()
    finally:
        table.close()
        table.unlink()


def wait_readable(descriptor: int) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(descriptor, selectors.EVENT_READ)
        return bool(selector.select(WAKE_TIMEOUT))


def test_every_publish_after_a_drain_makes_the_descriptor_readable_again(
    table: LockTable,
) -> None:
    descriptor = table.fileno()
    table.drain()
    for n in range(3):
        key = LockKey("tests.events", f"again-{n}")
        acquire(table, key)
        assert wait_readable(descriptor), f"publish {n} did not make the descriptor readable"
        assert table.drain() >= 1
        (event,) = table.poll().events
        assert event.key == key


def test_readiness_coalesces_but_poll_returns_every_event(table: LockTable) -> None:
    descriptor = table.fileno()
    for n in range(5):
        acquire(table, LockKey("tests.events", f"c{n}"))
    assert wait_readable(descriptor)
    table.drain()
    assert len(table.poll().events) == 5


def test_childs_acquire_makes_parents_descriptor_readable_and_poll_returns_it(
    processes: Processes, fleet_name: str
) -> None:
    child = start_server(processes, fleet_name, 4)
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        descriptor = table.fileno()
        table.drain()
        assert table.poll().events == ()
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            result = child.table("try_acquire", KEY, OWNER, 30.0)
            assert isinstance(result, Acquired)
            assert selector.select(WAKE_TIMEOUT), "descriptor not readable after the acquire"
        table.drain()
        (event,) = table.poll().events
        assert_event_is(event, result, child.node)
        table.close()
    assert child.stop() == 0


def test_childs_acquire_wakes_an_asyncio_reader(processes: Processes, fleet_name: str) -> None:
    child = start_server(processes, fleet_name, 4)
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)

        async def observe() -> tuple[tuple[LockEvent, ...], Acquired]:
            loop = asyncio.get_running_loop()
            woken: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not woken.done():
                    woken.set_result(None)

            loop.add_reader(table.fileno(), wake)
            try:
                result = await loop.run_in_executor(
                    None, child.table, "try_acquire", KEY, OWNER, 30.0
                )
                await asyncio.wait_for(woken, WAKE_TIMEOUT)
            finally:
                loop.remove_reader(table.fileno())
            table.drain()
            return table.poll().events, result

        events, result = asyncio.run(observe())
        assert len(events) == 1
        assert_event_is(events[0], result, child.node)
        table.close()
    assert child.stop() == 0


def assert_event_is(event: LockEvent, result: Acquired, node: int) -> None:
    lease = result.lease
    assert event.transition == "acquired"
    assert (event.key, event.owner, event.lock_id) == (lease.key, lease.owner, lease.lock_id)
    assert event.state_revision == lease.state_revision
    assert event.node == node


def test_threads_asking_for_the_descriptor_at_once_share_one(table: LockTable) -> None:
    """The descriptor is built once whichever threads ask first: none is left unclosed
    (a ResourceWarning at collection) or holding a readiness bit of the node."""
    before = len(os.listdir("/proc/self/fd"))
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    seen: list[int] = []

    def ask() -> None:
        barrier.wait(10.0)
        seen.append(table.fileno())

    threads = [threading.Thread(target=ask) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
    gc.collect()
    assert len(seen) == threads_n and len(set(seen)) == 1
    assert len(os.listdir("/proc/self/fd")) - before <= 2  # its socket (and a pair's end)
