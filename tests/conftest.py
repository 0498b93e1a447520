"""Fixtures shared by every test directory: fleet names, fleets, tables and child processes.

Every fleet a test makes gets a fresh name, and every SHM object and lock file
of that name is unlinked afterwards, whether the test passed or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive.lock import LockTable

from ._fleets import new_fleet_name, remove_fleet_files
from ._processes import START_METHODS, Processes

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
