"""The client pool's log records (issue 24, item 2): clients retired for their lifetime
or idleness (INFO), creates that fail and work again (one WARNING per run of failures,
one INFO when they work again), and a worker SIGKILLed holding clients, as the
survivors' records tell it (``orbitive.pool``). Fake clients, a real fleet, a real
worker process.
"""

from __future__ import annotations

import logging
import re
import signal
import time

import pytest

from orbitive import Fleet
from orbitive.clients import ClientCreateError, ClientPool, PoolOptions

from .._processes import Processes
from ._fakes import FakeClient, close, retired
from ._workers import fake_holder
from .conftest import CAPACITY

Records = list[tuple[str, int, str]]


def messages(caplog: pytest.LogCaptureFixture) -> Records:
    return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]


def until(caplog: pytest.LogCaptureFixture, count: int, timeout: float = 10.0) -> Records:
    """The records once there are ``count`` of them (the upkeep thread writes some)."""
    deadline = time.monotonic() + timeout
    while len(caplog.records) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return messages(caplog)


def where(pool: ClientPool[FakeClient], fleet: Fleet) -> str:
    return f"client pool of fleet {fleet.name!r} ({pool.name})"


def test_a_client_past_max_lifetime_is_logged_as_it_is_retired(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    options = PoolOptions(max_live=2, max_lifetime=0.3)
    with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
        client = pool.getconn()
        time.sleep(0.35)
        pool.putconn(client)  # past its lifetime: closed, not kept
        assert retired(pool, 1)
    ((name, level, message),) = messages(caplog)
    assert (name, level) == ("orbitive.clients", logging.INFO)
    pattern = r": retiring a client 0\.\d s old, past max_lifetime \(0\.3 s\)"
    pattern = re.escape(where(pool, fleet)) + pattern
    assert re.fullmatch(pattern, message), message


def test_idle_clients_past_idle_timeout_are_logged_by_the_upkeep(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    options = PoolOptions(max_live=3, idle_timeout=0.2)
    with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
        clients = [pool.getconn() for _ in range(2)]
        for client in clients:
            pool.putconn(client)
        records = until(caplog, 1)
        assert retired(pool, 2)
    assert records == [
        (
            "orbitive.clients",
            logging.INFO,
            f"{where(pool, fleet)}: retiring 2 idle client(s) idle longer than idle_timeout "
            "(0.2 s)",
        )
    ]


class Flaky:
    """A ``create`` that raises ConnectionRefusedError while ``down`` is set."""

    def __init__(self) -> None:
        self.down = True

    def __call__(self) -> FakeClient:
        if self.down:
            raise ConnectionRefusedError("the server refused")
        return FakeClient()


def test_a_run_of_failed_creates_is_one_warning_and_its_end_one_info(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    create = Flaky()
    with ClientPool(fleet, "fake", create=create, close=close) as pool:
        for _ in range(3):
            with pytest.raises(ClientCreateError):
                pool.getconn()
        create.down = False
        pool.putconn(pool.getconn())
        pool.putconn(pool.getconn())  # the idle one: nothing to say
        assert pool.statistics().create_errors_count == 3
    warning, info = messages(caplog)
    assert warning == (
        "orbitive.clients",
        logging.WARNING,
        f"{where(pool, fleet)}: create() for a checkout failed: "
        "ConnectionRefusedError('the server refused'); its claim on max_live is returned "
        "(later failures are counted, not logged, until a create succeeds)",
    )
    assert info[:2] == ("orbitive.clients", logging.INFO)
    pattern = r": create\(\) works again, after 3 failure\(s\) over \d+\.\d s"
    pattern = re.escape(where(pool, fleet)) + pattern
    assert re.fullmatch(pattern, info[2]), info[2]


def test_the_min_idle_refill_logs_its_failures_once_and_its_recovery(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    create = Flaky()
    options = PoolOptions(max_live=2, min_idle=1)
    with ClientPool(fleet, "fake", create=create, close=close, options=options) as pool:
        deadline = time.monotonic() + 10.0
        while pool.statistics().create_errors_count < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the upkeep tries every round, in vain
        create.down = False
        records = until(caplog, 2)
    assert [(name, level) for name, level, _ in records] == [
        ("orbitive.clients", logging.WARNING),
        ("orbitive.clients", logging.INFO),
    ]
    assert "create() to refill min_idle failed: ConnectionRefusedError(" in records[0][2]
    assert re.search(r"create\(\) works again, after \d+ failure\(s\)", records[1][2])


def test_a_worker_killed_holding_clients_is_told_by_the_survivors_records(
    spawned: Processes, fleet: Fleet, fleet_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    holder = spawned.start(fake_holder, fleet_name, CAPACITY, 2, 1)  # 2 in use, 1 idle
    assert holder.recv(60) == 2
    node = fleet.node + 1  # the lowest free node after the test process's
    assert fleet.is_alive(node)
    assert holder.kill() == -signal.SIGKILL
    with ClientPool(fleet, "fake", create=FakeClient, close=close) as survivor:
        records = until(caplog, 1)  # its upkeep's death watch
        assert survivor.statistics().live == 0  # the dead worker's three are closed
    ((name, level, message),) = records
    assert (name, level) == ("orbitive.pool", logging.WARNING)
    pattern = (
        rf"pool of fleet '{fleet_name}' \(kind 247\): the process on node {node} "
        r"\(incarnation \d+\) is gone; closed the 3 resource\(s\) it left "
        r"\(its share of max_live is free\)"
    )
    assert re.fullmatch(pattern, message), message
