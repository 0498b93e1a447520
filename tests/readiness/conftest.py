"""Fixtures: both readiness backends, both start methods, a real SHM fleet, reaped children."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.context import ForkContext, SpawnContext
from multiprocessing.process import BaseProcess

import pytest

from orbitive import Fleet
from orbitive._core._fleet import members_name
from orbitive._core._readiness import BACKENDS, Backend
from orbitive._core._region import Region, unlink_object

from ._shared import CAPACITY, open_region, unique_fleet_name


def _runs(name: str) -> bool:
    try:
        BACKENDS[name].probe()
    except OSError:
        return False
    return True


@pytest.fixture(params=["futex", "pipe"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend module in turn; futex is skipped where its probe fails."""
    name: str = request.param
    if not _runs(name):
        pytest.skip(f"readiness backend {name!r} cannot run here")
    return BACKENDS[name]


Context = ForkContext | SpawnContext


@pytest.fixture(params=["fork", "spawn"])
def context(request: pytest.FixtureRequest) -> Context:
    """Publisher processes started by fork, then by spawn."""
    if request.param == "fork":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


@dataclass
class Shm:
    """A joined SHM fleet (this process holds one node) and its test region."""

    name: str
    fleet: Fleet
    region: Region


@pytest.fixture
def shm() -> Iterator[Shm]:
    name = unique_fleet_name()
    fleet = Fleet.join(name, CAPACITY)
    region = open_region(fleet)
    try:
        yield Shm(name, fleet, region)
    finally:
        region.unlink()
        fleet.close()
        unlink_object(members_name(name))


Start = Callable[..., BaseProcess]


@pytest.fixture
def children(context: Context) -> Iterator[Start]:
    """Start child processes in ``context``; whatever happens, none outlives the test."""
    started: list[BaseProcess] = []

    def start(target: Callable[..., object], *args: object) -> BaseProcess:
        process = context.Process(target=target, args=args, daemon=True)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()
