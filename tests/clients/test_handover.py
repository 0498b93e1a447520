"""Handing a client over: the process that closed its client for another process's waiter
lets that waiter create first, instead of claiming the freed capacity back at once.

Another process counts a waiter on the key (as a checkout parked at ``max_live``
does). With ``handoff_uses=1`` every return then closes the client for it, and the
next checkout of the returning process waits one change of the key (at most
``HANDOFF_GRACE_S``) before it claims. Without a waiter elsewhere nothing waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions
from orbitive.clients._ledger import Ledger
from orbitive.clients._options import HANDOFF_GRACE_S

from .._processes import Processes
from ._fakes import FakeClient, close, retired
from ._workers import counted_waiter, fake_contender
from .conftest import CAPACITY


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def _pool(fleet: Fleet, **options: object) -> ClientPool[FakeClient]:
    return ClientPool(
        fleet, "fake", create=FakeClient, close=close,
        options=PoolOptions(max_live=1, handoff_uses=1, **options),  # type: ignore[arg-type]
    )  # fmt: skip


def checkout_after_return(pool: ClientPool[FakeClient], mode: str) -> float:
    """Return the held client, check one out again; seconds the second checkout took."""
    client = pool.getconn()
    pool.putconn(client)
    started = time.monotonic()
    if mode == "sync":
        again = pool.getconn(timeout=5.0)
        elapsed = time.monotonic() - started
        pool.putconn(again)
        return elapsed

    async def run() -> float:
        again = await pool.getconn_async(timeout=5.0)
        elapsed = time.monotonic() - started
        await pool.putconn_async(again)
        return elapsed

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_after_a_handover_the_next_checkout_waits_before_it_claims(
    spawned: Processes, fleet: Fleet, mode: str
) -> None:
    waiter = spawned.start(counted_waiter, fleet.name, CAPACITY)
    assert waiter.recv(60) == "waiting"
    with _pool(fleet) as pool:
        elapsed = checkout_after_return(pool, mode)
        assert pool.counters.retired >= 1  # the return closed the client for the waiter
        assert elapsed >= 0.8 * HANDOFF_GRACE_S  # and the next checkout let it go first
        assert pool.counters.created == 2  # then created: the waiter never claimed
    waiter.send("stop")


def test_a_client_serves_its_process_for_its_turn_then_goes_to_the_waiter(
    spawned: Processes, fleet: Fleet
) -> None:
    waiter = spawned.start(counted_waiter, fleet.name, CAPACITY)
    assert waiter.recv(60) == "waiting"
    turn = 0.5
    options = PoolOptions(max_live=1, handoff_after=turn, acquire_timeout=10.0)
    with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
        first = pool.getconn()
        pool.putconn(first)
        while time.monotonic() - pool._family.idle[0].created_at < 0.8 * turn:  # within its turn
            with pool.client() as client:
                assert client is first  # kept, though another process waits
        assert pool.counters.retired == 0
        with pool.client() as client:
            assert client is first
            time.sleep(turn)  # in use (an idle one would go within HANDOFF_GRACE_S)
        assert first.closed and pool.counters.retired == 1  # its turn was over: handed over
    waiter.send("stop")


def test_without_a_waiter_elsewhere_a_return_that_closes_never_delays_the_next_checkout(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No checkout is polite: each claims at once (waiting only for the close before it
    to give the unit back, never ``HANDOFF_GRACE_S`` for a waiter that does not exist)."""
    answers: list[bool] = []
    polite = Ledger.polite

    def noted(ledger: Ledger[FakeClient]) -> bool:
        answers.append(polite(ledger))
        return answers[-1]

    monkeypatch.setattr(Ledger, "polite", noted)
    with _pool(fleet, max_idle=0) as pool:  # every return closes its client
        for _ in range(20):
            with pool.client():
                pass
        assert retired(pool, 20)
    assert len(answers) == 20 and not any(answers)


def test_three_processes_of_two_threads_at_max_live_two_all_get_turns(
    spawned: Processes, fleet: Fleet
) -> None:
    """More demanding processes than max_live: each keeps its client for a waiter of its own
    only while no process waiting holds fewer, so a client changes hands every
    ``handoff_uses`` checkouts instead of circling between two of them."""
    contenders = [spawned.start(fake_contender, fleet.name, CAPACITY, 2, 3.0) for _ in range(3)]
    for contender in contenders:
        assert contender.recv(60) == "ready"
    for contender in contenders:
        contender.send("go")
    results = [contender.recv(60) for contender in contenders]
    assert [errors for _, errors in results] == [[], [], []]  # nobody timed out
    served = sorted(done for done, _ in results)
    assert served[0] >= served[-1] / 10, served  # before: [32, 2242, 2249] in 12 s
