"""The psycopg adapter under everyday faults, on a real PostgreSQL server.

A role whose ``CONNECTION LIMIT`` equals ``max_live`` is the witness that the
server never counts more sessions than the budget: a connect past the limit is
refused by the server itself.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from .._processes import Processes
from ._psycopg_workers import BUSY_DESCRIPTORS, busy_reconnects
from .conftest import CAPACITY


@pytest.fixture
def limited_role(pg_url: str) -> Iterator[str]:
    """A URL of a fresh role limited to one connection (dropped afterwards)."""
    role = f"orbit_limited_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
    yield pg_url.replace("postgres@", f"{role}@", 1)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_process_with_many_descriptors_waits_for_the_backend_before_the_budget_returns(
    spawned: Processes, fleet_name: str, limited_role: str, tag: str
) -> None:
    """Its sockets are numbered 1024 and up: the wait for the server must still work."""
    worker = spawned.start(busy_reconnects, fleet_name, CAPACITY, limited_role, tag, 200)
    refused, close_errors, lowest = worker.recv(120)
    assert lowest >= BUSY_DESCRIPTORS
    assert (refused, close_errors) == (0, 0)
