"""Closing a client pool while clients are out: every client is closed when it comes back,
and its share of the fleet-wide ``max_live`` comes back with it.

Another pool of the same key and fleet (as another worker would) sees the budget.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive import Fleet, FleetError
from orbitive.clients import ClientPool, PoolClosed, PoolOptions
from orbitive.clients._client_pool import UPKEEP_INTERVAL_S

from .._processes import Processes
from ._fakes import FakeClient, close
from ._workers import fake_request
from .conftest import CAPACITY


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


def test_a_second_close_racing_the_first_returns_once_the_queued_closes_are_done(
    fleet: Fleet,
) -> None:
    let_go = threading.Event()

    def slow_close(client: FakeClient) -> None:
        assert let_go.wait(10.0)
        time.sleep(0.3)
        client.close()

    options = PoolOptions(max_live=1, max_idle=0)  # every return closes its client
    pool = ClientPool(fleet, "fake", create=FakeClient, close=slow_close, options=options)
    client = pool.getconn()
    pool.putconn(client)  # its close is queued, blocked
    first = threading.Thread(target=pool.close)
    first.start()
    time.sleep(0.2)  # the first close() waits for the queued close
    let_go.set()
    pool.close()
    assert client.closed and live_clients(fleet) == 0
    first.join(10.0)


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


def wait_for_a_client(pool: ClientPool[FakeClient], outcomes: list[object]) -> None:
    try:
        outcomes.append(pool.getconn(timeout=20.0))
    except Exception as error:  # the test looks at what came out
        outcomes.append(error)


def test_callers_waiting_at_close_get_pool_closed_and_are_counted_out(fleet: Fleet) -> None:
    with _pool(fleet, 1) as hog:
        held = hog.getconn()  # the key is at max_live: the pool's callers wait
        pool = _pool(fleet, 1)
        outcomes: list[object] = []
        threads = [
            threading.Thread(target=wait_for_a_client, args=(pool, outcomes)) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10.0
        while hog.statistics().waiting < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hog.statistics().waiting == 3
        pool.close()
        for thread in threads:
            thread.join(30.0)
        assert [type(outcome) for outcome in outcomes] == [PoolClosed] * 3
        assert hog.statistics().waiting == 0  # no waiter left counted for other processes
        hog.putconn(held)


def test_close_leaves_a_client_serving_another_processs_request_until_it_is_done(
    spawned: Processes, fleet: Fleet
) -> None:
    inside, release = threading.Event(), threading.Event()

    def held_echo(client: FakeClient, payload: bytes) -> bytes:
        inside.set()
        release.wait(30.0)
        return b"closed under the handler" if client.closed else payload

    pool = ClientPool(
        fleet, "fake", create=FakeClient, close=close, handler=held_echo,
        options=PoolOptions(max_live=1),
    )  # fmt: skip
    pool.putconn(pool.getconn())  # the only client of the key, idle here
    borrower = spawned.start(fake_request, fleet.name, CAPACITY, b"ping")
    assert inside.wait(60.0)  # the borrower's request runs on our idle client
    pool.close()
    release.set()
    assert borrower.recv(60) == b"ping"
    deadline = time.monotonic() + 10.0
    while FakeClient.open_now:  # closed once its request is done
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert live_clients(fleet) == 0


_EXITS_WITH_A_CLOSE_QUEUED = """
import sys, time
from pathlib import Path
from orbitive import Fleet, FleetError
from orbitive.clients import ClientPool, PoolOptions

def slow_close(client):
    time.sleep(0.5)
    Path(sys.argv[1]).write_text("closed")

fleet = Fleet.join(sys.argv[2], 4)
pool = ClientPool(fleet, "fake", create=object, close=slow_close,
                  options=PoolOptions(max_live=1, max_idle=0))
pool.putconn(pool.getconn())  # its close is queued for a closing thread
# the interpreter exits here, without pool.close()
"""


def test_the_closes_queued_at_interpreter_exit_are_done_before_it_ends(
    fleet_name: str, tmp_path: Path
) -> None:
    """The closing threads are daemons: the exit waits for their queued closes (at most
    EXIT_WAIT_S), so the server sees its sessions end, not drop."""
    marker = tmp_path / "closed"
    done = subprocess.run(
        [sys.executable, "-c", _EXITS_WITH_A_CLOSE_QUEUED, str(marker), fleet_name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "closed"


def test_a_fleet_closed_under_an_open_pool_stops_its_upkeep_reading_and_is_named(
    fleet_name: str,
) -> None:
    """The fleet unmaps its regions at ``close()``; a pool left open on it then reports no
    error from its upkeep thread (which reaps dead nodes every UPKEEP_INTERVAL_S) and its
    calls raise FleetError naming the closed fleet, never read an unmapped table."""
    seen: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, seen.append
    fleet = Fleet.join(fleet_name, CAPACITY)
    pool = _pool(fleet, 1)
    try:
        pool.putconn(pool.getconn())
        fleet.close()
        time.sleep(3 * UPKEEP_INTERVAL_S)  # a round due to reap the dead, at least
        with pytest.raises(FleetError, match="is closed"):
            pool.getconn(timeout=0.1)
    finally:
        threading.excepthook = previous
        pool.close()
    assert [str(args.exc_value) for args in seen] == []
