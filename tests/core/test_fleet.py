"""Fleet membership: node claims by flock, incarnations, liveness, names, fork and exec."""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from orbitive import CapacityMismatch, Fleet
from orbitive._core._errors import FleetError, InvalidCapacity, InvalidName, NodeOutsideFleet
from orbitive._core._fleet import CAPACITY_DEFAULT, members_name
from orbitive._core._region import SHM_DIR
from orbitive.lock import Acquired, LockKey, LockTable

from .._children import report_node, sleep_forever, start_server, try_twice_in_child
from .._fleets import remove_fleet_files
from .._processes import Processes, exec_program

KEY = LockKey("tests.fleet", "fork")

# -- claims -----------------------------------------------------------------------------------


def test_join_claims_the_lowest_free_node(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 4, node=0) as zero, Fleet.join(fleet_name, 4, node=2):
        with Fleet.join(fleet_name, 4) as first_free:
            assert first_free.node == 1
            with Fleet.join(fleet_name, 4) as next_free:
                assert next_free.node == 3
                with pytest.raises(FleetError, match="all 4 nodes") as caught:
                    Fleet.join(fleet_name, 4)
                assert caught.value.fleet == fleet_name
        zero.close()
        with Fleet.join(fleet_name, 4) as again:
            assert again.node == 0


def test_a_second_live_process_cannot_claim_a_held_node(
    processes: Processes, fleet_name: str
) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        assert fleet.node == 0
        refused = start_server(processes, fleet_name, 4, node=0)
        assert isinstance(refused.refused, FleetError)
        assert refused.refused.node == 0
        other = start_server(processes, fleet_name, 4)
        assert other.refused is None
        assert other.node == 1
        assert fleet.is_alive(1)
        assert other.fleet("is_alive", 0) is True
        assert other.stop() == 0
        assert not fleet.is_alive(1)


def test_a_closed_fleet_gives_its_node_back_at_once(fleet_name: str) -> None:
    fleet = Fleet.join(fleet_name, 2, node=1)
    with Fleet.join(fleet_name, 2, node=0) as observer:
        assert observer.is_alive(1)
        fleet.close()
        fleet.close()  # idempotent
        assert not observer.is_alive(1)
    with pytest.raises(FleetError, match="closed"):
        fleet.node  # noqa: B018 - the property raises


def test_join_without_a_capacity_takes_the_fleets_own_or_the_default(fleet_name: str) -> None:
    with Fleet.join(fleet_name) as new:
        assert new.capacity == CAPACITY_DEFAULT == 64  # as shm://FLEET
    remove_fleet_files(fleet_name)
    with Fleet.join(fleet_name, 3), Fleet.join(fleet_name) as joined:
        assert joined.capacity == 3  # the capacity the fleet was created with


def test_another_capacity_is_a_capacity_mismatch(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 3), pytest.raises(CapacityMismatch) as caught:
        Fleet.join(fleet_name, 4)
    assert isinstance(caught.value, InvalidCapacity) and "has capacity 3" in str(caught.value)


def test_explicit_node_is_claimed_and_reported(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 8, node=5) as fleet:
        assert (fleet.name, fleet.capacity, fleet.node) == (fleet_name, 8, 5)
        assert fleet.is_alive(5)
        assert not fleet.is_alive(4)
        assert repr(fleet) == f"<Fleet {fleet_name!r} shm capacity=8 node=5>"


def test_incarnation_differs_for_every_life_of_a_node(
    processes: Processes, fleet_name: str
) -> None:
    seen = []
    for _ in range(3):
        with Fleet.join(fleet_name, 2, node=0) as fleet:
            seen.append(fleet.incarnation)
    for _ in range(2):
        member = start_server(processes, fleet_name, 2, node=0)
        seen.append(member.incarnation)
        assert member.stop() == 0
    assert seen == sorted(set(seen)), "incarnations repeat or go backwards"


def test_incarnation_of_names_the_holders_life_and_none_for_a_free_node(
    processes: Processes, fleet_name: str
) -> None:
    with Fleet.join(fleet_name, 3) as fleet:
        assert fleet.incarnation_of(fleet.node) == fleet.incarnation
        assert fleet.incarnation_of(1) is None
        lives = []
        for _ in range(2):  # two lives of node 1, one after the other
            member = start_server(processes, fleet_name, 3, node=1)
            assert fleet.incarnation_of(1) == member.incarnation
            with Fleet.observe(fleet_name, 3) as observer:
                assert observer.incarnation_of(1) == member.incarnation
            lives.append(member.incarnation)
            assert member.stop() == 0
            assert fleet.incarnation_of(1) is None
        assert lives[0] < lives[1]


def test_is_alive_is_false_for_a_node_never_claimed(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        assert not fleet.is_alive(3)
    with Fleet.observe(fleet_name, 4) as observer:
        assert not observer.is_alive(3)


def test_local_fleet_claims_nothing_and_reports_only_its_own_node(fleet_name: str) -> None:
    local = Fleet.local(fleet_name, 4, node=2)
    assert (local.node, local.capacity) == (2, 4)
    assert local.is_alive(2) and not local.is_alive(1)
    assert Fleet.local(fleet_name, 4).incarnation != local.incarnation
    with Fleet.join(fleet_name, 4, node=2) as joined:  # no flock was taken
        assert joined.node == 2


def test_fleet_cannot_be_pickled(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 1) as fleet, pytest.raises(TypeError, match=r"Fleet\.join"):
        pickle.dumps(fleet)


# -- argument checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "x" * 33, "a/b", "a b", "näme", "a\0b", ".", "..", "a:b", None, 7, b"bytes"],
    ids=repr,
)
def test_bad_fleet_name_raises_invalid_name(name: Any) -> None:
    for make in (Fleet.join, Fleet.local):
        with pytest.raises(InvalidName) as caught:
            make(name, 2)
        assert isinstance(caught.value, ValueError)


def test_longest_and_odd_but_valid_names_are_accepted() -> None:
    for name in ("x" * 32, "a.b_c-D9", "...", "-"):
        assert Fleet.local(name, 1).name == name


@pytest.mark.parametrize("capacity", [0, -1, 4097, 2.0, True, None, "4"], ids=repr)
def test_bad_capacity_raises_invalid_capacity(fleet_name: str, capacity: Any) -> None:
    # None is join's default (the fleet's own capacity, else 64); a local fleet needs one.
    for make in (Fleet.local,) if capacity is None else (Fleet.join, Fleet.local):
        with pytest.raises(InvalidCapacity) as caught:
            make(fleet_name, capacity)
        assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("node", [-1, 4, 100, 1.0, True, "0"], ids=repr)
def test_bad_node_raises_node_outside_fleet(fleet_name: str, node: Any) -> None:
    with pytest.raises(NodeOutsideFleet):
        Fleet.join(fleet_name, 4, node=node)
    with pytest.raises(NodeOutsideFleet):
        Fleet.local(fleet_name, 4, node=node)
    with Fleet.join(fleet_name, 4) as fleet, pytest.raises(NodeOutsideFleet):
        fleet.is_alive(node)


# -- fork and exec ----------------------------------------------------------------------------


def test_forked_child_gets_another_node_and_does_not_inherit_the_node_lock(
    fleet_name: str,
) -> None:
    with Processes("fork") as processes, Fleet.join(fleet_name, 4) as fleet:
        parent_node = fleet.node
        child = processes.start(report_node, fleet)
        kind, child_node = child.recv()
        assert kind == "node"
        assert child_node != parent_node
        assert fleet.is_alive(child_node)
        fleet.close()
        # The child is alive and had a copy of the parent's node descriptor.
        with Fleet.join(fleet_name, 4, node=parent_node) as successor:
            assert successor.node == parent_node
        child.send("exit")
        assert child.wait() == 0


def test_forked_child_of_an_explicit_node_member_gets_fleet_error(fleet_name: str) -> None:
    with Processes("fork") as processes, Fleet.join(fleet_name, 4, node=1) as fleet:
        child = processes.start(report_node, fleet)
        kind, error = child.recv()
        assert kind == "raised"
        assert isinstance(error, FleetError)
        assert error.node == 1
        assert fleet.is_alive(1) and fleet.node == 1
        child.send("exit")
        assert child.wait() == 0


def test_forked_child_of_a_full_fleet_keeps_failing_and_never_uses_the_parents_node(
    fleet_name: str,
) -> None:
    with Processes("fork") as processes, Fleet.join(fleet_name, 1) as fleet:
        table = LockTable(fleet)
        child = processes.start(try_twice_in_child, fleet, table)
        assert child.recv() == ["FleetError"] * 4
        assert child.wait() == 0
        assert table.poll().events == (), "the child wrote into the parent's lane"
        assert table.leases() == []
        table.close()
        table.unlink()


def test_an_execd_program_does_not_inherit_the_node_lock(fleet_name: str) -> None:
    fleet = Fleet.join(fleet_name, 2)
    node = fleet.node
    lock_file = SHM_DIR / members_name(fleet_name)
    program = [sys.executable, "-c", "import time; time.sleep(60)"]
    with exec_program(program, close_fds=False) as child:
        fds = Path(f"/proc/{child.pid}/fd")
        if fds.is_dir():
            targets = {os.readlink(fd) for fd in fds.iterdir() if fd.is_symlink()}
            assert str(lock_file) not in targets
        fleet.close()
        with Fleet.join(fleet_name, 2, node=node) as successor:
            assert successor.node == node
        assert child.poll() is None, "the program should still be running"


def test_fleet_dies_with_its_process_even_when_stopped_processes_linger(
    processes: Processes, fleet_name: str
) -> None:
    member = start_server(processes, fleet_name, 2)
    os.kill(member.child.pid, signal.SIGSTOP)
    with Fleet.join(fleet_name, 2) as fleet:
        assert fleet.node == 1 and fleet.is_alive(0)  # stopped is not dead
    member.child.kill()
    with Fleet.join(fleet_name, 2) as fleet:
        assert fleet.node == 0


def test_a_blocked_child_is_killed_and_reaped_by_the_helper() -> None:
    with Processes("spawn") as processes:
        child = processes.start(sleep_forever)
        assert child.recv() == "sleeping"
    assert child.process.exitcode == -signal.SIGKILL


def test_joining_with_another_capacity_than_the_fleet_has_is_refused(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as first:
        with pytest.raises(InvalidCapacity) as caught:
            Fleet.join(fleet_name, 8)
        assert "capacity 2" in str(caught.value)
        with Fleet.join(fleet_name, 2) as second:
            assert second.node != first.node


def test_is_alive_on_a_closed_fleet_raises_fleet_error(fleet_name: str) -> None:
    fleet = Fleet.join(fleet_name, 2)
    fleet.close()
    with pytest.raises(FleetError):
        fleet.is_alive(0)


def test_a_forked_child_of_a_local_fleet_writes_its_own_copy(fleet_name: str) -> None:
    with Fleet.local(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        pid = os.fork()
        if pid == 0:  # the child: its acquisition must stay its own
            os._exit(0 if isinstance(table.try_acquire(KEY, b"child", 60.0), Acquired) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert table.current(KEY) is None
