"""Pool fixtures: fleets (SHM and local) of capacity 10, pools, member processes reaped.

``fleet_name`` (unique, files removed afterwards) comes from ``tests/conftest.py``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive.pool import Pool

from ._agent import Agent, Context

CAPACITY = 10


@pytest.fixture(params=["join", "local"])
def fleet(request: pytest.FixtureRequest, fleet_name: str) -> Iterator[Fleet]:
    """A joined SHM fleet, then a process-local one (the same code paths)."""
    if request.param == "join":
        made = Fleet.join(fleet_name, CAPACITY)
    else:
        made = Fleet.local(fleet_name, CAPACITY)
    yield made
    made.close()


@pytest.fixture
def pool(fleet: Fleet) -> Iterator[Pool]:
    """A Pool on the ``fleet`` fixture."""
    with Pool(fleet) as made:
        yield made


@pytest.fixture
def shm_fleet(fleet_name: str) -> Iterator[Fleet]:
    """A joined SHM fleet only (for tests with other processes)."""
    with Fleet.join(fleet_name, CAPACITY) as made:
        yield made


@pytest.fixture
def shm_pool(shm_fleet: Fleet) -> Iterator[Pool]:
    """A Pool on ``shm_fleet``."""
    with Pool(shm_fleet) as made:
        yield made


@pytest.fixture(params=["fork", "spawn"])
def context(request: pytest.FixtureRequest) -> Context:
    """Member processes started by fork, then by spawn."""
    made: Context = multiprocessing.get_context(request.param)
    return made


@pytest.fixture
def agents(context: Context, fleet_name: str) -> Iterator[Callable[..., Agent]]:
    """A factory of member processes of ``fleet_name``; all reaped afterwards.

    Keyword arguments go to the member's ``Pool`` (kind, key_capacity, lane_capacity).
    """
    started: list[Agent] = []

    def start(**options: int) -> Agent:
        agent = Agent(context, fleet_name, CAPACITY, **options)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
