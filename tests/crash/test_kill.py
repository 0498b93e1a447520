"""Processes killed with SIGKILL: while holding a lease, and inside the critical section."""

from __future__ import annotations

import os
import signal
import time

import pytest

from orbitive import Fleet, FleetError
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable, Occupied

from .._children import KEY, Server, serve, start_server, stop_in_critical_section
from .._processes import Processes

SURVIVOR = LockOwner(b"survivor")


def test_holder_killed_while_holding_is_succeeded_after_ttl_with_a_larger_token(
    processes: Processes, shared_table: LockTable, fleet_name: str
) -> None:
    holder = start_server(processes, fleet_name, 4)
    held = holder.table("try_acquire", KEY, LockOwner(b"holder"), 1.0)
    assert isinstance(held, Acquired)
    assert holder.child.kill() == -signal.SIGKILL
    assert not shared_table.fleet.is_alive(holder.node)
    # The lease outlives its process until the TTL passes (expiry needs no event).
    assert shared_table.try_acquire(KEY, SURVIVOR, 30.0) == Occupied(held.lease)
    time.sleep(max(0.0, held.lease.expires_at - time.monotonic()) + 0.01)
    taken = shared_table.try_acquire(KEY, SURVIVOR, 30.0)
    assert isinstance(taken, Acquired)
    assert taken.lease.fencing_token > held.lease.fencing_token
    assert shared_table.current(KEY) == taken.lease


def test_process_killed_between_tombstone_and_commit_blocks_nobody_and_leaves_key_absent(
    processes: Processes, shared_table: LockTable, fleet_name: str
) -> None:
    victim = processes.start(stop_in_critical_section, fleet_name, 4, "acquire")
    assert victim.recv() == "stopped"
    assert victim.kill() == -signal.SIGKILL

    # Another process is not blocked, and sees the key absent.
    other = start_server(processes, fleet_name, 4)
    assert other.table("current", KEY) is None
    taken = other.table("try_acquire", KEY, SURVIVOR, 30.0)
    assert isinstance(taken, Acquired), "the key was left half-written"
    assert other.stop() == 0

    # So does this one; the entry is the survivor's, whole, and the only one.
    assert shared_table.current(KEY) == taken.lease
    assert shared_table.leases() == [taken.lease]
    statistics = shared_table.statistics()
    assert statistics.occupied_count == 1


def test_process_killed_after_raising_the_probe_bound_leaves_the_key_absent(
    processes: Processes, shared_table: LockTable, fleet_name: str
) -> None:
    mask = shared_table.layout.capacity - 1
    neighbour = next(
        key
        for key in (LockKey("tests.children", f"n-{n}") for n in range(100_000))
        if key.digest & mask == KEY.digest & mask
    )  # holds KEY's home slot, so KEY lands one slot further and raises max_probe
    held = shared_table.try_acquire(neighbour, SURVIVOR, 60.0)
    assert isinstance(held, Acquired)
    assert shared_table.statistics().max_probe == 0
    victim = processes.start(stop_in_critical_section, fleet_name, 4, "raise-bound")
    assert victim.recv() == "stopped"
    assert victim.kill() == -signal.SIGKILL

    # The bound stays raised; the entry was never written, so the key is absent.
    assert shared_table.statistics().max_probe == 1
    assert shared_table.current(KEY) is None
    taken = shared_table.try_acquire(KEY, SURVIVOR, 30.0)
    assert isinstance(taken, Acquired)
    assert taken.lease.slot == (KEY.digest + 1) & mask
    assert set(shared_table.leases()) == {held.lease, taken.lease}
    assert shared_table.statistics().max_probe == 1


def test_a_process_stopped_in_the_critical_section_holds_others_until_killed(
    processes: Processes, fleet_name: str
) -> None:
    victim = processes.start(stop_in_critical_section, fleet_name, 4, "acquire")
    assert victim.recv() == "stopped"
    waiter = Server(processes.start(serve, fleet_name, 4, None, None))  # attaching never waits
    waiter.child.send(("table", "current", (KEY,)))
    with pytest.raises(TimeoutError):
        waiter.child.recv(timeout=0.3)  # the lookup waits on the section the victim holds
    os.kill(victim.pid, signal.SIGKILL)
    assert waiter.child.recv() == ("ok", None)  # the kernel handed the section on; KEY absent
    assert waiter.stop() == 0


def test_killed_process_frees_its_node_at_once(processes: Processes, fleet_name: str) -> None:
    member = start_server(processes, fleet_name, 4, node=2)
    with Fleet.join(fleet_name, 4, node=0) as fleet:
        assert fleet.is_alive(2)
        with pytest.raises(FleetError, match="held by a live process"):
            Fleet.join(fleet_name, 4, node=2)
        assert member.child.kill() == -signal.SIGKILL
        assert not fleet.is_alive(2)
        with Fleet.join(fleet_name, 4, node=2) as successor:
            assert successor.incarnation != member.incarnation
