"""What a survivor's log records say after a member was SIGKILLed inside a critical
section while it owned a pool resource, and inside the pool's own section (issue 24,
item 2).

The victim stops inside the lock table's section (a Python step holds every stripe)
and is killed there. The survivor's next step repairs what it locks of the section,
on its C steps (the stripes its probe covers) or on the Python steps (every stripe),
and its death watch closes the victim's resource: two WARNING records, one each on
``orbitive.fleet`` and ``orbitive.pool``, and nothing else. A member killed inside
the pool table's section is repaired, and logged, by the survivor's next C pool
operation.
"""

from __future__ import annotations

import logging
import signal

import pytest

from orbitive._core._region import object_name
from orbitive._core._section import recoveries
from orbitive.lock import Acquired, LockOwner, LockTable, _steps
from orbitive.pool import Key, Pool, ResourceId

from .._capabilities import require_c_steps
from .._children import KEY, stop_in_a_section_owning_a_resource, stop_in_the_pools_section
from .._processes import Processes


@pytest.mark.parametrize("survivor", ["C steps", "Python steps"])
def test_the_survivors_records_say_what_the_kill_left_and_what_was_repaired(
    processes: Processes,
    shared_table: LockTable,
    fleet_name: str,
    survivor: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    stripes = shared_table.layout.stripes
    with Pool(shared_table.fleet) as pool:
        victim = processes.start(stop_in_a_section_owning_a_resource, fleet_name, 4)
        node, incarnation = victim.recv()
        assert victim.kill() == -signal.SIGKILL
        assert caplog.records == []  # nothing is known yet
        if survivor == "C steps":
            require_c_steps(shared_table._steps, "orbitive.lock._fastpath")
            repaired = 1  # the stripe of the key's probe; the others wait for their lockers
        else:
            monkeypatch.setattr(_steps, "crash_hook", lambda point: None)  # the Python steps
            repaired = stripes  # a Python step holds every stripe
        taken = shared_table.try_acquire(KEY, LockOwner(b"survivor"), 30.0)
        assert isinstance(taken, Acquired)
        assert pool.reap_dead() == [(node, incarnation)]
    assert recoveries(shared_table._state.block) == repaired
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "orbitive.fleet",
            logging.WARNING,
            f"shm object {object_name(fleet_name, 228)!r}: a process died inside its "
            f"critical section; this process repaired {repaired} stripe mutex(es) "
            f"(EOWNERDEAD), {repaired} repair(s) of this object in all",
        ),
        (
            "orbitive.pool",
            logging.WARNING,
            f"pool of fleet {fleet_name!r} (kind 247): the process on node {node} "
            f"(incarnation {incarnation}) is gone; closed the 1 resource(s) it left "
            "(its share of max_live is free)",
        ),
    ]


def test_a_member_killed_inside_the_pools_section_is_repaired_and_logged_by_a_c_step(
    processes: Processes,
    shared_table: LockTable,
    fleet_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    with Pool(shared_table.fleet) as pool:
        require_c_steps(pool._operations, "orbitive.pool._fastpath")
        rid = pool.register(Key(0x5EED), 1)
        assert isinstance(rid, ResourceId)
        victim = processes.start(stop_in_the_pools_section, fleet_name, 4)
        assert victim.recv() == "inside"
        assert victim.kill() == -signal.SIGKILL
        assert caplog.records == []
        lease = pool.reserve(rid)  # the C operation: it repairs the section, then logs
        assert lease.id == rid
        assert recoveries(pool._table.region.block) == 1
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "orbitive.fleet",
            logging.WARNING,
            f"shm object {pool._table.region.name!r}: a process died inside its critical "
            "section; this process repaired 1 stripe mutex(es) (EOWNERDEAD), 1 repair(s) of "
            "this object in all",
        )
    ]
