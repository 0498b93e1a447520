"""The lock table shared by real processes (fork and spawn)."""

from __future__ import annotations

import json

import pytest

from orbitive import Fleet
from orbitive.lock import Acquired, LockLease, LockOwner, LockTable, Occupied

from .._children import (
    KEY,
    OTHER_KEY,
    RACE_KEYS,
    RACE_ROUNDS,
    fork_child_exits_normally,
    race,
    race_keys,
    race_many,
    start_server,
)
from .._fleets import shm_path
from .._processes import Processes, run_interpreter

RACERS = 16


def test_sixteen_processes_released_by_a_barrier_get_exactly_one_acquired(
    processes: Processes, fleet_name: str
) -> None:
    capacity = RACERS + 1
    with Fleet.join(fleet_name, capacity) as fleet:
        table = LockTable(fleet)
        barrier = processes.context.Barrier(RACERS)
        racers = [
            processes.start(race, fleet_name, capacity, barrier, f"racer-{n}".encode())
            for n in range(RACERS)
        ]
        answers: list[tuple[str, LockLease]] = [racer.recv() for racer in racers]
        winners = [lease for outcome, lease in answers if outcome == "acquired"]
        assert len(winners) == 1, answers
        winner = winners[0]
        assert all(lease == winner for _, lease in answers), "every loser saw the winner"
        assert table.current(KEY) == winner
        assert table.leases() == [winner]
        assert len({racer.pid for racer in racers}) == RACERS
        for racer in racers:
            racer.send("done")
            assert racer.wait() == 0
        table.close()


@pytest.mark.parametrize("tables", ["inherited", "own"])
def test_forked_children_and_parent_racing_on_many_keys_get_each_key_once(
    fleet_name: str, tables: str
) -> None:
    with Processes("fork") as processes, Fleet.join(fleet_name, 8) as fleet:
        table = LockTable(fleet)
        barrier = processes.context.Barrier(4)
        inherited = table if tables == "inherited" else None
        children = [
            processes.start(race_many, inherited, fleet_name, barrier, f"child-{n}".encode())
            for n in range(3)
        ]
        mine = race_keys(table, barrier, b"parent")
        won = [label for child in children for label in child.recv()] + mine
        assert len(won) == len(set(won)) == RACE_KEYS * RACE_ROUNDS, "a key won twice (or never)"
        assert table.leases() == []
        for event in table.poll().events:  # children publish with nodes of their own
            assert (event.node == fleet.node) == (event.owner == LockOwner(b"parent"))
        table.close()
        table.unlink()


def test_a_lease_held_in_another_process_is_occupied_here_and_tokens_keep_rising(
    processes: Processes, shared_table: LockTable, fleet_name: str
) -> None:
    other = start_server(processes, fleet_name, 4)
    assert other.node != shared_table.fleet.node
    theirs = other.table("try_acquire", KEY, LockOwner(b"them"), 30.0)
    assert isinstance(theirs, Acquired)
    assert theirs.lease.node == other.node
    assert shared_table.try_acquire(KEY, LockOwner(b"us"), 30.0) == Occupied(theirs.lease)
    assert not shared_table.release_owned(KEY, LockOwner(b"us"))
    assert other.table("release", theirs.lease) is True
    ours = shared_table.try_acquire(KEY, LockOwner(b"us"), 30.0)
    assert isinstance(ours, Acquired)
    assert ours.lease.fencing_token > theirs.lease.fencing_token
    assert other.table("current", KEY) == ours.lease
    assert other.table("renew", theirs.lease, 30.0) is None
    assert other.stop() == 0


def test_a_process_that_only_attached_exits_and_object_and_leases_remain(
    processes: Processes, shared_table: LockTable, fleet_name: str
) -> None:
    held = shared_table.try_acquire(KEY, LockOwner(b"creator"), 60.0)
    assert isinstance(held, Acquired)
    attacher = start_server(processes, fleet_name, 4)
    assert attacher.table("current", KEY) == held.lease
    assert attacher.stop() == 0
    layout = shared_table.layout
    assert shm_path(fleet_name, layout.state_kind).exists()
    assert shm_path(fleet_name, layout.event_kind).exists()
    assert shared_table.current(KEY) == held.lease
    with Fleet.join(fleet_name, 4) as fleet:
        assert LockTable(fleet).current(KEY) == held.lease


def test_leases_of_a_process_that_created_the_table_and_exited_remain(
    processes: Processes, fleet_name: str
) -> None:
    creator = start_server(processes, fleet_name, 4)
    held = creator.table("try_acquire", KEY, LockOwner(b"creator"), 60.0)
    assert isinstance(held, Acquired)
    assert creator.stop() == 0
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        assert table.current(KEY) == held.lease
        assert isinstance(table.try_acquire(KEY, LockOwner(b"late"), 1.0), Occupied)
        table.close()


@pytest.mark.parametrize("child_closes", ["close", "leave"])
def test_forked_child_exiting_normally_releases_nothing_its_parent_holds(
    fleet_name: str, child_closes: str
) -> None:
    report = json.loads(run_interpreter(fork_child_exits_normally, fleet_name, child_closes))
    assert report["child_status"] == 0
    assert report["intact"], report
    assert report["node_alive"], "the child's exit unlocked the parent's node"
    assert report["other_held"], "the child's own lease vanished at its exit"
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        held = table.current(KEY)
        assert held is not None and held.owner == LockOwner(b"parent")
        assert table.current(OTHER_KEY) is not None
        table.close()
