"""Engine fixtures: every store test runs on SQLite, PostgreSQL and SHM (ids as named).

The PostgreSQL engine runs against a real server started for the session (see
``_postgres.py``); each test gets its own schema through the URL's
``search_path``, dropped afterwards. Each SHM test gets its own fleet, whose
objects and lock files are removed afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from orbitive.store import Store, open_store

from .._fleets import new_fleet_name, remove_fleet_files
from ._postgres import PostgresUnavailable, TempPostgres

ENGINES = ("sqlite", "postgres", "shm")
#: Fleet capacity of test SHM stores: one node per process that opens one.
SHM_CAPACITY = 24


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[TempPostgres]:
    """A PostgreSQL server for the whole session (skips with the reason if none)."""
    try:
        server = TempPostgres.start()
    except PostgresUnavailable as error:
        print(f"\nPostgreSQL tests skipped: {error}")
        pytest.skip(f"PostgreSQL unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: TempPostgres) -> Iterator[str]:
    """A store URL on a fresh schema of the session server."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{postgres_server.url}?options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def shm_url() -> Iterator[str]:
    """A store URL on a fresh fleet, removed afterwards."""
    name = new_fleet_name()
    yield f"shm://{name}?capacity={SHM_CAPACITY}"
    remove_fleet_files(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A store URL on a fresh SQLite file."""
    return f"sqlite://{tmp_path}/locks.db"


@pytest.fixture(params=ENGINES)
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh store URL on each engine."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open store on each engine, closed afterwards."""
    with open_store(store_url) as opened:
        yield opened


@pytest.fixture
def other(store_url: str) -> Iterator[Store]:
    """A second, independent store object on the same URL (another client)."""
    with open_store(store_url) as opened:
        yield opened
