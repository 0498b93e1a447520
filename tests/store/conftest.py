"""Engine fixtures: every store test runs on SQLite, PostgreSQL, SHM and Redis (ids as named).

The PostgreSQL engine runs against the session's server (``tests/conftest.py``);
each test gets its own schema through the URL's ``search_path``, dropped
afterwards. The Redis engine likewise runs against the session's redis-server;
each test gets its own key prefix, whose keys are deleted afterwards. Without the
server binary these tests skip, except under ``CI=true``, where they fail. Each
SHM test gets its own fleet, whose objects and lock files are removed afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orbitive.store import Store, open_store

from .._fleets import new_fleet_name, remove_fleet_files
from .._servers import TempPostgres, TempRedis

ENGINES = ("sqlite", "postgres", "shm", "redis")
#: Fleet capacity of test SHM stores: one node per process that opens one.
SHM_CAPACITY = 24


@pytest.fixture
def postgres_url(postgres_server: TempPostgres) -> Iterator[str]:
    """A store URL on a fresh schema of the session server."""
    with postgres_server.schema_url("t_") as url:
        yield url


@pytest.fixture
def redis_url(redis_server: TempRedis) -> Iterator[str]:
    """A store URL on a fresh key prefix of the session server, its keys deleted afterwards."""
    prefix = f"t{secrets.token_hex(6)}:"
    yield f"{redis_server.url}?prefix={prefix}"
    with redis.Redis(host="127.0.0.1", port=redis_server.port) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


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
