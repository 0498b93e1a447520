"""The psycopg adapter under everyday faults, on a real PostgreSQL server.

A role whose ``CONNECTION LIMIT`` equals ``max_live`` is the witness that the
server never counts more sessions than the budget: a connect past the limit is
refused by the server itself.
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from orbitive import Fleet
from orbitive.clients import InvalidPoolOptions
from orbitive.clients._psycopg_connections import connection_key
from orbitive.clients.psycopg import AsyncConnectionPool, ConnectionPool

from .._odd import HostileObject
from .._processes import Processes
from ._psycopg_workers import (
    BUSY_DESCRIPTORS,
    async_checkout,
    busy_reconnects,
    key_with_row_factory,
    sleeping_holder,
)
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


#: The statement a worker is killed in (it would run far past the test).
LONG_QUERY = "SELECT pg_sleep(30)"
#: The ``client_connection_check_interval`` the README recommends in its example, in seconds.
CHECK_INTERVAL_S = 1.0
#: What the server may take beyond the interval to end a backend on this noisy VM.
CHECK_SLACK_S = 3.0


@pytest.fixture
def app_role(pg_url: str) -> Iterator[tuple[str, str]]:
    """(role, URL) of a fresh role without settings (dropped afterwards)."""
    role = f"orbit_app_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    yield role, pg_url.replace("postgres@", f"{role}@", 1)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _sessions(admin: psycopg.Connection[Any], role: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def _until_sessions(admin: psycopg.Connection[Any], role: str, at_most: int, within: float) -> int:
    deadline = time.monotonic() + within
    while (count := _sessions(admin, role)) > at_most and time.monotonic() < deadline:
        time.sleep(0.02)
    return count


@pytest.mark.parametrize("check", [True, False], ids=["check-interval", "no-setting"])
def test_a_worker_killed_mid_query_leaves_its_backends_until_the_server_checks_the_client(
    spawned: Processes,
    fleet_name: str,
    pg_url: str,
    app_role: tuple[str, str],
    tag: str,
    check: bool,
) -> None:
    """The killed worker's budget returns at once and a live worker opens max_live anew,
    while the server still runs the killed worker's statements: up to 2x max_live
    sessions. With ``client_connection_check_interval`` (the README's advice) the server
    ends them within the interval; without it they run on to the statement's end."""
    role, url = app_role
    with psycopg.connect(pg_url, autocommit=True) as admin:
        if check:
            admin.execute(
                sql.SQL("ALTER ROLE {} SET client_connection_check_interval = {}").format(
                    sql.Identifier(role), sql.Literal(f"{CHECK_INTERVAL_S:g}s")
                )
            )
        doomed = spawned.start(sleeping_holder, fleet_name, CAPACITY, url, tag, 2, LONG_QUERY)
        assert doomed.recv(60) == "running"
        assert _until_sessions(admin, role, 2, 10.0) == 2
        assert doomed.kill() == -signal.SIGKILL
        killed = time.monotonic()
        successor = spawned.start(psycopg_holder, fleet_name, CAPACITY, url, tag, 2, 2)
        assert successor.recv(60) == 2  # the budget came back: 2 new sessions
        if check:
            assert _until_sessions(admin, role, 2, CHECK_INTERVAL_S + CHECK_SLACK_S + 5.0) == 2
            assert time.monotonic() - killed < CHECK_INTERVAL_S + CHECK_SLACK_S
        else:
            time.sleep(CHECK_INTERVAL_S + 1.0)
            assert _sessions(admin, role) == 4  # the killed worker's statements run on


def test_a_row_factory_does_not_split_the_budget_between_processes(spawned: Processes) -> None:
    """Its repr holds an address, other in every process: it must not be part of the key."""
    url = "postgresql://app@db.example/main"
    theirs = spawned.start(key_with_row_factory, url).recv(60)
    assert theirs == connection_key(url, {"row_factory": dict_row, "application_name": "a"})
    assert theirs == connection_key(url, {"application_name": "a", "autocommit": True})
    assert theirs != connection_key(url, {"application_name": "b"})  # another session setup


@pytest.mark.parametrize(
    ("conninfo", "kwargs"),
    [
        ("\ud800", {}),
        ("host=a\x00", {}),
        (b"host=a", {}),
        ("", {"application_name": "\udcff"}),
        ("", {"application_name": HostileObject()}),
        ("", {"port": object()}),
        ("", {1: "x"}),
        ("", []),
    ],
    ids=[
        "surrogate",
        "nul",
        "bytes",
        "surrogate-parameter",
        "hostile-parameter",
        "object-parameter",
        "int-name",
        "not-a-dict",
    ],
)
def test_odd_conninfo_and_kwargs_are_invalid_pool_options_before_the_table(
    fleet: Fleet, conninfo: Any, kwargs: Any
) -> None:
    for pool_class in (ConnectionPool, AsyncConnectionPool):
        with pytest.raises(InvalidPoolOptions):
            pool_class(conninfo, fleet=fleet, kwargs=kwargs)
