"""A killed worker's clients and creation claims come back without a supervisor."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions, PoolTimeout
from orbitive.clients._retiring import MOST_THREADS

from .._children import lock_table_member
from .._processes import Processes
from ._fakes import FakeClient, close
from ._workers import fake_churner, fake_holder, hung_closer, stuck_creator
from .conftest import CAPACITY


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def _pool(fleet: Fleet, max_live: int) -> ClientPool[FakeClient]:
    options = PoolOptions(max_live=max_live, acquire_timeout=10.0)
    return ClientPool(fleet, "fake", create=FakeClient, close=close, options=options)


def test_a_worker_killed_inside_create_returns_its_claim_within_a_second(
    spawned: Processes, fleet: Fleet
) -> None:
    stuck = spawned.start(stuck_creator, fleet.name, CAPACITY)
    assert stuck.recv(60) == "creating"
    with _pool(fleet, 1) as pool:
        assert pool.statistics().creating == 1
        with pytest.raises(PoolTimeout):
            pool.getconn(timeout=0.3)  # the claim holds the only unit of budget
        assert stuck.kill() == -signal.SIGKILL
        killed = time.monotonic()
        with pool.client(timeout=5.0):
            assert time.monotonic() - killed < 1.0
        assert pool.statistics().creating == 0


def test_a_killed_owners_idle_and_busy_clients_are_reported_dead_then_closed(
    spawned: Processes, fleet: Fleet
) -> None:
    holder = spawned.start(fake_holder, fleet.name, CAPACITY, 2, 1)
    assert holder.recv(60) == 2
    with _pool(fleet, 4) as pool:
        assert pool.statistics().live == 3
        assert holder.kill() == -signal.SIGKILL
        deadline = time.monotonic() + 5.0
        while (stats := pool.statistics()).live + stats.dead_owners_count:
            assert time.monotonic() < deadline, stats
            time.sleep(0.02)
        held = [pool.getconn() for _ in range(4)]  # the whole budget is back
        for client in held:
            pool.putconn(client)


def test_a_worker_killed_with_closes_queued_gives_their_budget_back(
    spawned: Processes, fleet: Fleet
) -> None:
    """Eight closes hang in the worker's closing threads and four more wait behind them;
    the death watch here returns all twelve units once it is killed."""
    closer = spawned.start(hung_closer, fleet.name, CAPACITY, 12)
    assert closer.recv(60) == MOST_THREADS  # no more threads for the queued closes
    with _pool(fleet, 12) as pool:
        assert pool.statistics().live == 12
        assert closer.kill() == -signal.SIGKILL
        held = [pool.getconn(timeout=5.0) for _ in range(12)]  # the whole budget is back
        assert pool.statistics().live == 12
        for client in held:
            pool.putconn(client)


@pytest.mark.parametrize("round_", range(6))
def test_a_worker_killed_mid_checkout_gives_the_whole_budget_back_within_a_second(
    spawned: Processes, fleet: Fleet, round_: int
) -> None:
    """Killed at any point of its take, give-back, create or close (the C steps included)."""
    churner = spawned.start(fake_churner, fleet.name, CAPACITY, 2)
    assert churner.recv(60) == "churning"
    with _pool(fleet, 2) as pool:
        pool.putconn(pool.getconn())  # contends with it: handoffs both ways
        time.sleep(0.013 * round_)
        assert churner.kill() == -signal.SIGKILL
        killed = time.monotonic()
        held = [pool.getconn(timeout=5.0) for _ in range(2)]
        assert time.monotonic() - killed < 1.0
        stats = pool.statistics()
        assert (stats.live, stats.waiting, stats.creating) == (2, 0, 0)
        for client in held:
            pool.putconn(client)


def test_a_waiter_killed_mid_checkout_is_counted_out_within_a_second(
    spawned: Processes, fleet: Fleet
) -> None:
    """Else every return here would be closed for a waiter that no longer exists."""
    options = PoolOptions(max_live=1, handoff_uses=1, acquire_timeout=10.0)
    with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
        held = pool.getconn()  # the only unit: the churner's four callers all wait
        churner = spawned.start(fake_churner, fleet.name, CAPACITY, 1)
        assert churner.recv(60) == "churning"
        deadline = time.monotonic() + 10.0
        while pool.statistics().waiting < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert churner.kill() == -signal.SIGKILL
        killed = time.monotonic()
        while pool.statistics().waiting:
            assert time.monotonic() - killed < 1.0
            time.sleep(0.01)
        pool.putconn(held)
        assert pool.counters.retired == 0  # kept idle: nobody waits for it any more
        assert pool.getconn() is held
        pool.putconn(held)


def test_a_killed_workers_budget_returns_when_a_process_without_a_pool_takes_its_node(
    spawned: Processes, fleet: Fleet
) -> None:
    """As ``orbit run --store shm://...`` joining right after the kill: it takes the
    freed node and opens no pool, so no doorbell ever shows its life."""
    holder = spawned.start(fake_holder, fleet.name, CAPACITY, 2, 0)
    assert holder.recv(60) == 2
    assert holder.kill() == -signal.SIGKILL
    member = spawned.start(lock_table_member, fleet.name, CAPACITY)
    member.recv(60)  # holds the dead worker's node (the lowest free one)
    with _pool(fleet, 2) as pool:
        held = [pool.getconn(timeout=5.0) for _ in range(2)]  # the whole budget is back
        stats = pool.statistics()
        assert (stats.live, stats.dead_owners_count, stats.creating) == (2, 0, 0)
        for client in held:
            pool.putconn(client)
