"""A pool's label and key take what the connection takes from libpq's environment.

A conninfo that leaves out the host, port, database or role connects where
``PGHOST``, ``PGPORT``, ``PGDATABASE`` and ``PGUSER`` say; the label (``orbit
pool``, the metrics) shows that target, not ``localhost``, and pools of one host
whose environments lead to other servers hold other keys (other ``max_live``).
"""

from __future__ import annotations

import pytest

from orbitive import Fleet
from orbitive.clients._database import database_key, target_label
from orbitive.clients._psycopg_connections import connection_key, conninfo_label
from orbitive.clients.psycopg import ConnectionPool

ENVIRONMENT = {"PGHOST": "db.example", "PGPORT": "6543", "PGUSER": "app", "PGDATABASE": "main"}


@pytest.fixture
def libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("libpq_environment")
def test_the_label_shows_the_target_the_environment_names() -> None:
    assert conninfo_label("", {}) == "app@db.example:6543/main"
    assert conninfo_label("host=other dbname=shop", {}) == "app@other:6543/shop"
    assert target_label({}) == "app@db.example:6543/main"
    assert target_label({"host": "other", "port": 5432}) == "app@other:5432/main"


def test_the_label_shows_localhost_without_a_host_anywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (*ENVIRONMENT, "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    assert conninfo_label("dbname=main", {}) == "localhost/main"
    assert target_label({"database": "main"}) == "localhost/main"


@pytest.mark.usefixtures("libpq_environment")
def test_a_pools_name_is_the_environments_target(fleet_name: str) -> None:
    fleet = Fleet.join(fleet_name, 4)
    try:
        pool = ConnectionPool("", fleet=fleet, open=False)
        assert pool.name == "app@db.example:6543/main"
    finally:
        fleet.close()


def test_the_key_follows_the_environments_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGHOST", "one.example")
    first, explicit = connection_key("", {}), connection_key("host=db", {})
    first_sqlalchemy = database_key()
    monkeypatch.setenv("PGHOST", "two.example")
    assert connection_key("", {}) != first  # another server: another budget
    assert connection_key("host=db", {}) == explicit  # the conninfo's host wins
    assert database_key() != first_sqlalchemy
