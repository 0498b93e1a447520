"""Fixtures shared by every test directory: fleet names, fleets, tables, child processes,
and the session's PostgreSQL and Redis servers.

Every fleet a test makes gets a fresh name, and every SHM object and lock file
of that name is unlinked afterwards, whether the test passed or not. The servers
(``_servers.py``) start once per session, at the first test that asks; without a
server binary their tests skip, except under ``CI=true``, where they fail.

Under pytest-xdist each worker is a session of its own: its own servers (on free
ports, in temporary directories of their own), its own ``tmp_path`` root, and fleet
names drawn at random, so no two workers share a fleet, a database or a directory.
Collection marks the timing-sensitive tests ``serial`` and the unit tests ``quick``
(see pyproject.toml's markers; scripts/test runs the ``serial`` ones in a pass of their
own, one at a time).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import pytest

from orbitive import Fleet
from orbitive.lock import LockTable

from ._fleets import new_fleet_name, remove_fleet_files
from ._processes import START_METHODS, Processes
from ._servers import DURABLE_POSTGRES, ServerUnavailable, TempPostgres, TempRedis, TempServer

_Server = TypeVar("_Server", bound=TempServer)

#: Modules whose tests time a hand-over, a wake-up, fairness or a kill -9 and its lease's
#: lapse: they run one at a time, in scripts/test's second pass (marker ``serial``).
SERIAL_MODULES: Final = frozenset(
    {"test_handover", "test_kill", "test_crash", "test_fairness", "test_wake", "test_waiting"}
)
SERIAL_DIRECTORIES: Final = frozenset({"crash"})
#: Directories of whole-program tests (packaging, docs pages, benchmarks, scripts): never quick.
SLOW_DIRECTORIES: Final = frozenset({"packaging", "docs", "bench", "scripts"})
#: Fixtures that start a server or a child process: a test using one is not quick.
PROCESS_FIXTURES: Final = frozenset(
    {"postgres_server", "redis_server", "durable_postgres_server", "durable_redis_server",
     "processes", "spawned", "prober_process", "hosts"}
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the timing-sensitive tests ``serial`` and the unit tests ``quick``."""
    for item in items:
        folder = item.path.parent.name
        if item.path.stem in SERIAL_MODULES or folder in SERIAL_DIRECTORIES:
            item.add_marker(pytest.mark.serial)
        fixtures = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        on_server = any(
            type(value) is str and value in ("postgres", "redis") for value in params.values()
        )
        if not (
            item.get_closest_marker("slow")
            or item.get_closest_marker("serial")
            or folder in SLOW_DIRECTORIES
            or fixtures & PROCESS_FIXTURES
            or on_server
        ):
            item.add_marker(pytest.mark.quick)


MakeFleet = Callable[..., Fleet]


@pytest.fixture
def fleet_name() -> Iterator[str]:
    """A fleet name of this test only; its objects and lock files are removed afterwards."""
    name = new_fleet_name()
    yield name
    remove_fleet_files(name)


@pytest.fixture(params=["join", "local"])
def make_fleet(request: pytest.FixtureRequest, fleet_name: str) -> Iterator[MakeFleet]:
    """Builds fleets named ``fleet_name`` with Fleet.join or Fleet.local; closes them after."""
    fleets: list[Fleet] = []

    def make(capacity: int = 4) -> Fleet:
        if request.param == "join":
            fleet = Fleet.join(fleet_name, capacity)
        else:
            fleet = Fleet.local(fleet_name, capacity)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


@pytest.fixture
def table(make_fleet: MakeFleet) -> Iterator[LockTable]:
    """A lock table (default layout) on a joined or a local fleet."""
    opened = LockTable(make_fleet())
    yield opened
    opened.close()
    opened.unlink()


@pytest.fixture
def shared_fleet(fleet_name: str) -> Iterator[Fleet]:
    """This test's SHM fleet (capacity 4), joined by the test process."""
    with Fleet.join(fleet_name, 4) as fleet:
        yield fleet


@pytest.fixture
def shared_table(shared_fleet: Fleet) -> Iterator[LockTable]:
    """The lock table of :func:`shared_fleet`; children open it by name."""
    opened = LockTable(shared_fleet)
    yield opened
    opened.close()
    opened.unlink()


@pytest.fixture(params=START_METHODS)
def processes(request: pytest.FixtureRequest, fleet_name: str) -> Iterator[Processes]:
    """Starts children with the fork or the spawn method; all are reaped afterwards.

    It depends on ``fleet_name`` so that every child is dead before the fleet's
    files are removed: a child still running could create them again.
    """
    del fleet_name
    with Processes(request.param) as started:
        yield started


def _session_server(start: Callable[[], _Server]) -> Iterator[_Server]:
    """A server for the session, stopped at its end; one that will not start (no binary,
    say) skips its tests, but fails them under ``CI=true``."""
    try:
        server = start()
    except ServerUnavailable as error:
        if os.environ.get("CI"):
            pytest.fail(f"server unavailable under CI: {error}")
        pytest.skip(f"server unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[TempPostgres]:
    """The session's PostgreSQL server (one cluster for every test that needs one)."""
    yield from _session_server(TempPostgres.start)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[TempRedis]:
    """The session's redis-server."""
    yield from _session_server(TempRedis.start)


@pytest.fixture(scope="session")
def durable_postgres_server() -> Iterator[TempPostgres]:
    """A PostgreSQL server with ``fsync`` and ``synchronous_commit`` on: a budget refuses a
    coordinator that may forget what it grants."""
    yield from _session_server(lambda: TempPostgres.start(*DURABLE_POSTGRES))


@pytest.fixture(scope="session")
def durable_redis_server() -> Iterator[TempRedis]:
    """A redis-server with an append-only file, as a budget's coordinator must be."""
    yield from _session_server(lambda: TempRedis.start(appendonly=True))
