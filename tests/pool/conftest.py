"""Fixtures: unique fleets (SHM and local), both start methods, member processes reaped."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive._fleet import membership_path, node_path
from orbitive._region import lock_path, object_name, unlink_object
from orbitive.pool import Pool

from ._agent import Agent, Context

CAPACITY = 10
_counter = iter(range(1_000_000))


def unique_fleet_name() -> str:
    """A fleet name no other test (or run) uses."""
    return f"tp{os.getpid()}-{next(_counter)}"


def remove_fleet_files(name: str, capacity: int = CAPACITY) -> None:
    """Unlink every pool object and lock file a test may have left for fleet ``name``."""
    for kind in range(256):
        if unlink_object(object_name(name, kind)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path(name, kind))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(membership_path(name))
    for node in range(capacity):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(node_path(name, node))


@pytest.fixture
def fleet_name() -> Iterator[str]:
    """A unique SHM fleet name whose objects are removed afterwards."""
    name = unique_fleet_name()
    yield name
    remove_fleet_files(name)


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
def agents(context: Context, fleet_name: str) -> Iterator[Callable[[], Agent]]:
    """A factory of member processes of ``fleet_name``; all reaped afterwards."""
    started: list[Agent] = []

    def start() -> Agent:
        agent = Agent(context, fleet_name, CAPACITY)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
