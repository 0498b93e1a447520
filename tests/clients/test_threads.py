"""Many threads of one process on one client pool while its upkeep thread retires idle
clients (idle_timeout, max_lifetime, handoff to another process's waiter) and another
process's requests reserve its idle clients (remote mode).

Invariants: no client is handed to two callers at once or after it was closed,
none is lost (every client created is closed by the end), the statistics add up
at rest, and nothing escapes from the upkeep thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions

from .._processes import Processes
from ._fakes import FakeClient, close, echo
from ._workers import counted_waiter, fake_borrower
from .conftest import CAPACITY

SECONDS = 1.5
#: Rounds of SECONDS at most (a loaded machine may serve the borrower late).
ROUNDS_MOST = 10
THREADS = 6


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


class Ledger:
    """Which clients are handed out now, and what went wrong."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.out: set[int] = set()
        self.problems: list[str] = []
        self.checkouts = 0

    def handed(self, client: FakeClient) -> None:
        with self.lock:
            if client.serial in self.out:
                self.problems.append(f"client {client.serial} handed to two callers")
            if client.closed:
                self.problems.append(f"client {client.serial} handed out closed")
            self.out.add(client.serial)
            self.checkouts += 1

    def back(self, client: FakeClient) -> None:
        with self.lock:
            self.out.discard(client.serial)


def churn(pool: ClientPool[FakeClient], ledger: Ledger, until: float, index: int) -> None:
    turn = 0
    try:
        while time.monotonic() < until:
            client = pool.getconn(timeout=10.0)
            ledger.handed(client)
            if turn % 3 == 0:
                time.sleep(0.001)  # long enough for the upkeep to look at the others
            ledger.back(client)
            if (turn + index) % 17 == 0:
                pool.discard(client)
            else:
                pool.putconn(client)
            turn += 1
    except Exception as error:
        with ledger.lock:
            ledger.problems.append(repr(error))


def test_threads_upkeep_handoffs_and_borrowers_never_share_or_lose_a_client(
    spawned: Processes, fleet: Fleet
) -> None:
    hooked: list[object] = []
    previous, threading.excepthook = threading.excepthook, hooked.append
    waiter = spawned.start(counted_waiter, fleet.name, CAPACITY)  # handoffs to another process
    borrower = spawned.start(fake_borrower, fleet.name, CAPACITY, 3)
    try:
        assert waiter.recv(60) == "waiting" and borrower.recv(60) == "ready"
        options = PoolOptions(
            max_live=3, idle_timeout=0.02, max_lifetime=0.2, handoff_after=0.1, handoff_uses=3,
            acquire_timeout=20,
        )  # fmt: skip
        pool = ClientPool(fleet, "fake", create=FakeClient, close=close, handler=echo,
                          options=options)  # fmt: skip
        ledger = Ledger()
        for _ in range(ROUNDS_MOST):  # until the borrower has run on our clients
            until = time.monotonic() + SECONDS
            threads = [
                threading.Thread(target=churn, args=(pool, ledger, until, n))
                for n in range(THREADS)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60.0)
            borrower.send("count")
            if borrower.recv(60):
                break
        borrower.send("stop")
        served, errors, borrowed = borrower.recv(60)
        waiter.send("stop")
        assert ledger.problems == [] and errors == []
        assert ledger.checkouts > THREADS and served > 0
        assert borrowed > 0  # some requests reserved this process's idle clients
        local = pool.statistics()
        assert (local.local_in_use, local.local_waiting) == (0, 0)
        assert local.local_idle == FakeClient.open_now <= options.max_live
        assert local.created_count - local.closed_count == FakeClient.open_now
        pool.close()
        assert FakeClient.open_now == 0 and pool._upkeep.failures == 0 and hooked == []
    finally:
        threading.excepthook = previous
