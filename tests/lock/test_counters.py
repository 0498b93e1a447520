"""The lock table's fleet-wide counters: acquisitions, conflicts and section recoveries."""

from __future__ import annotations

import signal

import pytest

from orbitive import Fleet
from orbitive._core._section import FlockSection
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable, Occupied

from .._children import KEY, start_server, stop_in_critical_section
from .._processes import Processes

OWNER = LockOwner(b"counted")


@pytest.mark.parametrize("steps", ["c", "python"])
def test_each_occupied_answer_counts_one_conflict(table: LockTable, steps: str) -> None:
    if steps == "python":
        table._bind(None)  # the Python reference steps
    for n in range(3):
        assert isinstance(
            table.try_acquire(LockKey("tests.counters", f"{n}"), OWNER, 30.0), Acquired
        )
    for _ in range(4):
        assert isinstance(table.try_acquire(LockKey("tests.counters", "0"), OWNER, 30.0), Occupied)
    statistics = table.statistics()
    assert (statistics.last_fencing_token, statistics.conflicts_count) == (3, 4)
    table.reset_transport()
    assert table.statistics().conflicts_count == 0


def test_conflicts_in_other_processes_count_in_the_same_table(
    processes: Processes, fleet_name: str
) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        assert isinstance(table.try_acquire(KEY, OWNER, 30.0), Acquired)
        other = start_server(processes, fleet_name, 4)
        for _ in range(5):
            assert isinstance(other.table("try_acquire", KEY, LockOwner(b"other"), 30.0), Occupied)
        assert other.table("statistics").conflicts_count == 5
        assert other.stop() == 0
        assert table.statistics().conflicts_count == 5
        observer = LockTable(Fleet.observe(fleet_name, 4))
        assert isinstance(observer.try_acquire(KEY, OWNER, 1.0), Occupied)  # refused, uncounted
        assert table.statistics().conflicts_count == 5
        table.close()


def test_a_holder_of_the_section_killed_inside_it_counts_a_recovery_per_stripe(
    processes: Processes, fleet_name: str
) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        before = table.statistics().recoveries_count
        victim = processes.start(stop_in_critical_section, fleet_name, 4, "acquire")
        assert victim.recv() == "stopped"
        assert victim.kill() == -signal.SIGKILL
        after = table.statistics().recoveries_count
        if isinstance(table._state.section, FlockSection):
            assert after == before == 0  # the kernel frees a flock: nothing to repair
        else:  # a Python step holds every stripe: each stripe's mutex is repaired once
            assert after == before + table._state.section.stripes  # type: ignore[union-attr]
        table.close()
