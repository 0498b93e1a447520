"""Client-pool fixtures: a fleet per test, the session's PostgreSQL server, a tag per test.

Connections are tagged with an ``application_name`` unique to the test, so
``pg_stat_activity`` counts exactly the connections the test's pools opened.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from orbitive import Fleet

from .._processes import Processes
from .._servers import TempPostgres

#: Nodes of a test fleet: up to 8 workers, the test process and a few spares.
CAPACITY = 16


@pytest.fixture
def fleet(fleet_name: str) -> Iterator[Fleet]:
    """The test process's member of this test's SHM fleet."""
    with Fleet.join(fleet_name, CAPACITY) as joined:
        yield joined


@pytest.fixture
def pg_url(postgres_server: TempPostgres) -> str:
    """The session server's URL."""
    return postgres_server.url


@pytest.fixture
def tag() -> str:
    """An application_name unique to this test."""
    return f"orbit-test-{secrets.token_hex(4)}"


@pytest.fixture
def spawned(fleet_name: str) -> Iterator[Processes]:
    """Children started with spawn (no inherited psycopg state); all reaped afterwards."""
    del fleet_name  # every child is dead before the fleet's files are removed
    with Processes("spawn") as started:
        yield started
