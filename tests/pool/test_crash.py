"""kill -9 at any instant, inside a critical section or not, leaves a usable table."""

from __future__ import annotations

import random
import time

from orbitive.pool import Key, Pool

from ._agent import Context
from ._churn import CLAIM_KEY, KEY, churn
from .conftest import CAPACITY


def test_member_killed_anywhere_leaves_a_consistent_table_that_never_over_admits(
    shm_pool: Pool, fleet_name: str, context: Context
) -> None:
    mine = shm_pool.register(Key(13), 2)
    rng = random.Random(7)
    for _ in range(10):
        running = context.Event()
        child = context.Process(target=churn, args=(fleet_name, CAPACITY, mine, running))
        child.start()
        assert running.wait(60.0)
        time.sleep(rng.uniform(0.005, 0.05))
        child.kill()
        child.join(10.0)
        dead = shm_pool.reap_dead()  # the flock is free again: this would hang otherwise
        assert len(dead) == 1
        [candidate] = shm_pool.candidates(Key(13))
        assert candidate.reserved + candidate.active <= candidate.capacity
        assert candidate.reserved <= 1  # the child held at most one reservation
        shm_pool.reconcile(mine, 0, grace=0.0)  # the owner ages out what never arrived
        assert shm_pool.candidates(Key(13))[0].free == 2
        assert shm_pool.budget(CLAIM_KEY) == (0, 0)  # its claims came back
        assert shm_pool.candidates(KEY) == []  # its resources are closed
        with shm_pool.accept(shm_pool.reserve(mine)):  # and the table still works
            pass
    statistics = shm_pool.statistics()
    assert all(r.owner_node == shm_pool.node for r in statistics.resources)
