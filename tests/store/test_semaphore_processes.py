"""Counting leases across real processes on every engine (issue 23, "Counting leases").

A barrier race for ``limit`` slots gives exactly ``limit`` winners per round; 8
processes spending 8 x 1,000 random operations, some SIGKILLed at random instants
and replaced, never let an independent observer see more than ``limit`` live
holders or a new holder whose token does not grow.
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from orbitive.store import open_store

from .._processes import Processes
from ._semaphore_workers import (
    CHURN_LIMIT,
    CHURN_NAMES,
    CHURN_TTLS,
    Budget,
    churn,
    observe,
    race_slots,
)
from ._workers import CTX, PATIENCE_S

RACERS = 8
ROUNDS = 60
RACE_LIMIT = 3
CHURNERS = 8
OPS_EACH = 1000
#: A churner is killed after every so many operations (a random number in this range).
KILL_EVERY = (400, 800)
KILLS_MIN = 8
#: The call timeout of the network engines here, in seconds: a store open or an
#: operation of 13 busy processes on 2 cores may stall past the default 5 s, and
#: what these tests check does not depend on how fast a call returns.
CALL_TIMEOUT_S = 60.0


@pytest.fixture
def patient_url(store_url: str) -> str:
    """``store_url`` with a call timeout of :data:`CALL_TIMEOUT_S` (PostgreSQL, Redis)."""
    if not store_url.startswith(("postgresql:", "redis:")):
        return store_url
    joiner = "&" if "?" in store_url else "?"
    return f"{store_url}{joiner}timeout={CALL_TIMEOUT_S:g}"


@pytest.mark.slow
def test_a_barrier_race_for_limit_slots_has_exactly_limit_winners_per_round(
    patient_url: str,
) -> None:
    open_store(patient_url).close()  # create the schema/file once, outside the race
    barrier = CTX.Barrier(RACERS)
    wins = CTX.Array("i", ROUNDS)
    with Processes("fork") as procs:
        racers = [
            procs.start(race_slots, patient_url, i, ROUNDS, RACE_LIMIT, barrier, wins)
            for i in range(RACERS)
        ]
        assert [racer.recv(PATIENCE_S) for racer in racers] == ["done"] * RACERS
    assert wins[:] == [RACE_LIMIT] * ROUNDS


@pytest.mark.slow
def test_random_operations_with_sigkills_never_exceed_the_limit_or_reuse_a_token(
    patient_url: str,
) -> None:
    open_store(patient_url).close()
    rng = random.Random(23)
    next_kill = rng.randint(*KILL_EVERY)
    budget = Budget.create(CHURNERS, OPS_EACH, allowed=next_kill)
    kills = 0
    with Processes("fork") as procs:
        observer = procs.start(observe, patient_url, budget)
        assert observer.recv(PATIENCE_S) == "ready"
        churners = [procs.start(churn, patient_url, seat, 0, budget) for seat in range(CHURNERS)]
        assert [churner.recv(PATIENCE_S) for churner in churners] == ["ready"] * CHURNERS
        started = time.monotonic()
        while not budget.spent() and time.monotonic() - started < PATIENCE_S:
            time.sleep(rng.uniform(0.002, 0.02))
            seats = [seat for seat in range(CHURNERS) if budget.done[seat] < OPS_EACH - 50]
            if not seats:
                budget.allowed.value = CHURNERS * OPS_EACH  # the rest runs without kills
                continue
            if budget.total < next_kill:
                continue
            seat = rng.choice(seats)
            assert churners[seat].kill() == -signal.SIGKILL
            kills += 1
            churners[seat] = procs.start(churn, patient_url, seat, kills, budget)
            assert churners[seat].recv(PATIENCE_S) == "ready"
            next_kill += rng.randint(*KILL_EVERY)
            budget.allowed.value = next_kill
        assert [churner.recv(PATIENCE_S) for churner in churners] == ["done"] * CHURNERS
        budget.stop.value = 1
        broken, snapshots, most, highest = observer.recv(PATIENCE_S)
    assert budget.total == CHURNERS * OPS_EACH
    assert kills >= KILLS_MIN
    assert broken == []
    assert snapshots > 100 and most == CHURN_LIMIT  # the observer saw the semaphores full
    time.sleep(max(CHURN_TTLS) + 0.1)  # every lease a killed churner held has lapsed
    with open_store(patient_url) as store:
        for name in CHURN_NAMES:
            sem = store.semaphore(name, CHURN_LIMIT)
            leases = [sem.try_acquire("survivor", 30.0) for _ in range(CHURN_LIMIT)]
            assert all(lease is not None for lease in leases), f"{name} has a stuck slot"
            assert min(lease.fencing_token for lease in leases if lease) > highest
