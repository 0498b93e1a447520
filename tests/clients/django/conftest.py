"""Django-engine fixtures: a database of each test's own on the session's server."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest

from ..._servers import TempPostgres


@pytest.fixture
def database(postgres_server: TempPostgres) -> Iterator[str]:
    """A database of this test's own, dropped (its sessions ended) afterwards."""
    name = f"orbit_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
