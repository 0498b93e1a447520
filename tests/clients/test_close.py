"""Closing a client pool while clients are out: every client is closed when it comes back,
and its share of the fleet-wide ``max_live`` comes back with it.

Another pool of the same key and fleet (as another worker would) sees the budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolClosed, PoolOptions

from ._fakes import FakeClient, close


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def _pool(fleet: Fleet, max_live: int) -> ClientPool[FakeClient]:
    return ClientPool(
        fleet, "fake", create=FakeClient, close=close, options=PoolOptions(max_live=max_live)
    )


def live_clients(fleet: Fleet) -> int:
    """The key's live clients fleet-wide, as a fresh pool of the key counts them."""
    with _pool(fleet, 1) as other:
        return other.statistics().live


def test_a_client_returned_after_close_gives_its_budget_back(fleet: Fleet) -> None:
    pool = _pool(fleet, 1)
    out = pool.getconn()
    pool.close()
    pool.putconn(out)
    assert out.closed and FakeClient.open_now == 0
    assert live_clients(fleet) == 0
    with _pool(fleet, 1) as other:
        other.putconn(other.getconn(timeout=2.0))  # the one unit of max_live is free


def churn_until_closed(pool: ClientPool[FakeClient], errors: list[BaseException]) -> None:
    """Check out and hand back until the pool refuses; anything but PoolClosed is kept."""
    try:
        while True:
            pool.putconn(pool.getconn(timeout=5.0))
    except PoolClosed:
        return
    except BaseException as error:
        errors.append(error)


@pytest.mark.parametrize("round_", range(15))
def test_returns_racing_close_close_every_client_and_return_the_budget(
    fleet: Fleet, round_: int
) -> None:
    pool = _pool(fleet, 4)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=churn_until_closed, args=(pool, errors)) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.002 * round_)
    pool.close()
    for thread in threads:
        thread.join(30.0)
    assert errors == []
    assert FakeClient.open_now == 0  # none left idle after close, none dropped unclosed
    assert live_clients(fleet) == 0
