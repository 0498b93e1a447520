"""Fixtures of the rate-limit storage tests: a fresh fleet's ``shm://`` URL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import orbitive.limits  # noqa: F401 - registers shm:// and async+shm://
from orbitive.limits import _shm_storage

from .._fleets import new_fleet_name, remove_fleet_files


@pytest.fixture
def fleet() -> Iterator[str]:
    """A fleet name of this test only; this process's tables are closed and the fleet's
    objects removed afterwards."""
    name = new_fleet_name()
    yield name
    _shm_storage.close_tables()
    remove_fleet_files(name)


@pytest.fixture
def url(fleet: str) -> str:
    """A small table's URL: 64 counters, 8 moving windows of 16 timestamps."""
    return f"shm://{fleet}?capacity=64&windows=8&window=16"
