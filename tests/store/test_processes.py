"""Real processes against each engine: a 16-way race per round, and random churn."""

from __future__ import annotations

import pytest

from orbitive.store import open_store

from .._processes import Processes
from ._workers import CTX, PATIENCE_S, STRESS_NAMES, Shared, race_worker, stress_worker

RACERS = 16
ROUNDS = 200
CHURNERS = 8
OPS = 1000


@pytest.mark.slow
def test_sixteen_processes_racing_get_exactly_one_lock_per_round(store_url: str) -> None:
    open_store(store_url).close()  # create the schema/file once, outside the race
    barrier = CTX.Barrier(RACERS)
    wins = CTX.Array("i", ROUNDS)
    with Processes("fork") as procs:
        racers = [
            procs.start(race_worker, store_url, i, ROUNDS, barrier, wins) for i in range(RACERS)
        ]
        assert [racer.recv(PATIENCE_S) for racer in racers] == ["done"] * RACERS
    assert wins[:] == [1] * ROUNDS


@pytest.mark.slow
def test_random_churn_keeps_one_holder_and_valid_renewals(store_url: str) -> None:
    open_store(store_url).close()
    shared = Shared.create(STRESS_NAMES)
    with Processes("fork") as procs:
        churners = [procs.start(stress_worker, store_url, i, OPS, shared) for i in range(CHURNERS)]
        assert [churner.recv(PATIENCE_S) for churner in churners] == ["done"] * CHURNERS
    assert shared.violations.value == 0
    assert all(writes > 0 for writes in shared.writes[:])  # every name was really contended
