"""The psycopg adapter under everyday faults, on a real PostgreSQL server.

A role whose ``CONNECTION LIMIT`` equals ``max_live`` is the witness that the
server never counts more sessions than the budget: a connect past the limit is
refused by the server itself.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from .._processes import Processes
from ._psycopg_workers import BUSY_DESCRIPTORS, async_checkout, busy_reconnects
from ._workers import psycopg_holder
from .conftest import CAPACITY


@pytest.fixture
def limited_role(pg_url: str) -> Iterator[str]:
    """A URL of a fresh role limited to one connection (dropped afterwards)."""
    role = f"orbit_limited_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role))
        )
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


def test_sync_and_async_pools_of_one_conninfo_share_one_budget(
    spawned: Processes, fleet_name: str, pg_url: str, tag: str
) -> None:
    """A fleet of gunicorn (sync) and uvicorn (async) workers on one database: one cap."""
    holder = spawned.start(psycopg_holder, fleet_name, CAPACITY, pg_url, tag, 2, 2)
    assert holder.recv(60) == 2  # the sync pool holds the whole budget
    checkout = spawned.start(async_checkout, fleet_name, CAPACITY, pg_url, tag, 2)
    assert checkout.recv(60) == (0, ["PoolTimeout", "PoolTimeout"])
    assert holder.kill() == -signal.SIGKILL
    checkout = spawned.start(async_checkout, fleet_name, CAPACITY, pg_url, tag, 2)
    assert checkout.recv(60) == (2, [])  # the dead sync worker's budget is the async pool's
