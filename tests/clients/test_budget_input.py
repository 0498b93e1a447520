"""A budget refuses bad input with named errors, and a refused pool leaves nothing held.

The values themselves (``Budget(...)``), then the pool's start-up: a ``min_idle``
above ``total``, a total other hosts do not share (another host is another fleet
here: each fleet is a board of its own), a coordinator that cannot be reached,
and one that may forget what it grants.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orbitive import Fleet
from orbitive.clients import (
    Budget,
    BudgetMismatch,
    BudgetUnavailable,
    InvalidBudget,
    PoolOptions,
    UnsafeCoordinator,
)
from orbitive.clients._coordinator import Coordinator
from orbitive.clients.psycopg import ConnectionPool
from orbitive.store._network import split_timeout

from .._fleets import new_fleet_name, remove_fleet_files
from .._servers import TempPostgres, TempRedis
from .conftest import CAPACITY

#: A port nothing listens on (the discard port, closed on a test machine).
UNREACHABLE_PG = "postgresql://postgres@127.0.0.1:9/postgres?timeout=1"
UNREACHABLE_REDIS = "redis://127.0.0.1:9/0?timeout=1"


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ({"url": "sqlite:///tmp/x.db"}, "url"),
        ({"url": "shm://fleet"}, "url"),
        ({"url": 5}, "url"),
        ({"url": "postgresql://db/app?timeout=5", "ttl": 10.0}, "url"),
        ({"url": "postgresql://db/app?timeout=-1"}, "url"),
        ({"url": "postgresql://db/app?timeout=0"}, "url"),
        ({"url": "postgresql://db/app?timeout=0.01"}, "url"),
        ({"url": "redis://db/0?timeout=0.049"}, "url"),
        ({"url": "postgresql://db/app?timeout=nan"}, "url"),
        ({"url": "postgresql://db/app?timeout=1&timeout=2"}, "url"),
        ({"name": ""}, "name"),
        ({"name": "a\nb"}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": 7}, "name"),
        ({"total": 0}, "total"),
        ({"total": 4097}, "total"),
        ({"total": True}, "total"),
        ({"total": 2.0}, "total"),
        ({"ttl": 0.5}, "ttl"),
        ({"ttl": math.nan}, "ttl"),
        ({"ttl": "10"}, "ttl"),
        ({"handover_within": 0.01}, "handover_within"),
        ({"handover_within": 20.0, "ttl": 10.0}, "handover_within"),
    ],
)
def test_a_budget_value_breaking_its_rule_is_refused_by_name(
    arguments: dict[str, Any], key: str
) -> None:
    given = {"url": "postgresql://db/app", "name": "main-db", "total": 4, **arguments}
    with pytest.raises(InvalidBudget) as raised:
        Budget(**given)
    assert raised.value.key == key


@pytest.mark.parametrize("timeout", ["0.05", "0.3", "2.5"])
@pytest.mark.parametrize("scheme", ["postgresql", "redis"])
def test_a_timeout_the_budget_accepts_is_one_its_coordinator_store_accepts(
    scheme: str, timeout: str
) -> None:
    budget = Budget(f"{scheme}://db/0?timeout={timeout}", name="main-db", total=4, ttl=10.0)
    assert split_timeout(budget.store_url()) == (f"{scheme}://db/0", float(timeout))
    assert budget.call_timeout == float(timeout)


def test_a_timeout_below_the_store_bound_names_the_range() -> None:
    with pytest.raises(InvalidBudget, match=r"timeout=0.01 must be seconds in 0.05..1 \(ttl / 4\)"):
        Budget("redis://db/0?timeout=0.01", name="main-db", total=4, ttl=4.0)


def test_the_repr_hides_the_password() -> None:
    budget = Budget("postgresql://app:s3cret@db/app", name="main-db", total=4)
    assert "s3cret" not in repr(budget)
    assert "***" in repr(budget)


@pytest.fixture
def fleets() -> Iterator[list[Fleet]]:
    """Two fleets of their own: two hosts, as far as a budget can tell (their SHM objects
    removed afterwards)."""
    joined = [Fleet.join(new_fleet_name(), CAPACITY) for _ in range(2)]
    try:
        yield joined
    finally:
        for fleet in joined:
            fleet.close()
            remove_fleet_files(fleet.name)


def pool(fleet: Fleet, db: str, budget: Budget, **options: Any) -> ConnectionPool:
    return ConnectionPool(db, fleet=fleet, options=PoolOptions(max_live=4, **options),
                          budget=budget)  # fmt: skip


def test_a_total_below_the_pools_min_idle_is_refused(
    fleets: list[Fleet], durable_postgres_server: TempPostgres
) -> None:
    db = durable_postgres_server.url
    budget = Budget(db, name=f"db-{secrets.token_hex(3)}", total=2)
    with pytest.raises(InvalidBudget, match="min_idle") as raised:
        pool(fleets[0], db, budget, min_idle=3)
    assert raised.value.key == "total"
    coordinator = Coordinator(budget)
    try:
        assert coordinator.survey().units == []  # nothing taken
    finally:
        coordinator.close()


def test_a_second_total_for_one_budget_name_is_refused(
    fleets: list[Fleet], durable_postgres_server: TempPostgres
) -> None:
    db, name = durable_postgres_server.url, f"db-{secrets.token_hex(3)}"
    first = pool(fleets[0], db, Budget(db, name=name, total=4), min_idle=1)
    try:
        with first.connection() as conn:  # the first host holds a unit and posts
            conn.execute("SELECT 1")
        coordinator = Coordinator(Budget(db, name=name, total=4))
        try:
            deadline = time.monotonic() + 10.0
            while not coordinator.posts() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert coordinator.posts()
        finally:
            coordinator.close()
        with pytest.raises(BudgetMismatch) as raised:
            pool(fleets[1], db, Budget(db, name=name, total=5))
        assert (raised.value.total, raised.value.found) == (5, 4)
        with first.connection() as conn:  # the first host goes on unharmed
            conn.execute("SELECT 1")
    finally:
        first.close()


def test_a_second_total_on_one_host_is_refused(
    fleets: list[Fleet], durable_postgres_server: TempPostgres
) -> None:
    db, name = durable_postgres_server.url, f"db-{secrets.token_hex(3)}"
    first = pool(fleets[0], db, Budget(db, name=name, total=4))
    try:
        with pytest.raises(BudgetMismatch):
            pool(fleets[0], db, Budget(db, name=name, total=6))
    finally:
        first.close()


@pytest.mark.parametrize("url", [UNREACHABLE_PG, UNREACHABLE_REDIS])
def test_an_unreachable_coordinator_at_start_up_is_refused(
    fleets: list[Fleet], durable_postgres_server: TempPostgres, url: str
) -> None:
    db = durable_postgres_server.url
    started = time.monotonic()
    with pytest.raises(BudgetUnavailable) as raised:
        pool(fleets[0], db, Budget(url, name=f"db-{secrets.token_hex(3)}", total=4))
    assert time.monotonic() - started < 10.0
    assert raised.value.__cause__ is not None


def test_a_coordinator_that_may_forget_its_grants_is_refused(
    fleets: list[Fleet],
    durable_postgres_server: TempPostgres,
    postgres_server: TempPostgres,
    redis_server: TempRedis,
) -> None:
    db = durable_postgres_server.url
    for coordinator in (postgres_server.url, redis_server.url):  # fsync off; no AOF
        budget = Budget(coordinator, name=f"db-{secrets.token_hex(3)}", total=4)
        with pytest.raises(UnsafeCoordinator):
            pool(fleets[0], db, budget)
