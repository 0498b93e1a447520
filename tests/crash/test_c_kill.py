"""Processes killed at random moments inside the C operations (no hook stops them there).

A child loops try_acquire, renew and release through ``_fastpath.c``; the test
kills it with SIGKILL after a random pause, many times. A kill that lands
inside the section leaves the robust mutex owner-dead: the next locker (here,
the test's own calls) must get it, repair it and find the table consistent:
the key absent or held by the churner, never half-written.
"""

from __future__ import annotations

import random
import time

from orbitive import Fleet
from orbitive._core._section import recoveries
from orbitive.lock import Acquired, LockOwner, LockTable

from .._capabilities import require_c_steps
from .._children import KEY
from .._processes import Channel, Processes

CHURNER = LockOwner(b"churner")
MOST_KILLS = 600
ENOUGH_RECOVERIES = 3


def churn(channel: Channel, fleet_name: str) -> None:
    table = LockTable(Fleet.join(fleet_name, 4))
    require_c_steps(table._steps, "orbitive.lock._fastpath")
    channel.send("running")
    while True:
        result = table.try_acquire(KEY, CHURNER, 30.0)
        if isinstance(result, Acquired):
            table.renew(result.lease, 30.0)
            table.release(result.lease)


def test_kills_inside_the_c_operations_are_repaired_and_leave_the_table_consistent(
    fleet_name: str,
) -> None:
    with Processes("fork") as processes:  # hundreds of children: fork only
        kills = churn_and_kill(processes, fleet_name)
    assert kills >= 1


def churn_and_kill(processes: Processes, fleet_name: str) -> int:
    """Kill churners until some kills landed in a section; the number of kills."""
    table = LockTable(Fleet.join(fleet_name, 4))
    rng = random.Random(20261201)
    kills = 0
    while kills < MOST_KILLS and recoveries(table._state.block) < ENOUGH_RECOVERIES:
        child = processes.start(churn, fleet_name)
        assert child.recv() == "running"
        time.sleep(rng.uniform(0.0, 0.005))
        child.kill()
        kills += 1
        lease = table.current(KEY)  # would wait for ever on a wedged section
        assert lease is None or lease.owner == CHURNER
        statistics = table.statistics()
        assert statistics.occupied_count + statistics.expired_count <= 1
        if lease is not None:
            assert table.force_release(KEY)
        taken = table.try_acquire(KEY, LockOwner(b"tester"), 30.0)
        assert isinstance(taken, Acquired)
        assert table.release(taken.lease)
    assert recoveries(table._state.block) >= 1, f"no kill of {kills} landed in a section"
    table.unlink()
    return kills
