"""The SQLAlchemy integration: create_engine(poolclass=FleetPool) keeps the host-wide cap."""

from __future__ import annotations

import pytest
import sqlalchemy

from orbitive import Fleet
from orbitive.clients import PoolOptions, PoolTimeout
from orbitive.clients.sqlalchemy import FleetPool

from .._processes import Processes
from ._sampling import ServerConnections
from ._workers import sqlalchemy_requests
from .conftest import CAPACITY


def test_four_processes_on_one_engine_url_never_exceed_a_cap_of_three(
    spawned: Processes, fleet_name: str, pg_url: str, tag: str
) -> None:
    children = [
        spawned.start(sqlalchemy_requests, fleet_name, CAPACITY, pg_url, tag, 3, 100)
        for _ in range(4)
    ]
    for child in children:
        assert child.recv(60) == "ready"
    with ServerConnections(pg_url, tag) as server:
        for child in children:
            child.send("go")
        results = [child.recv(120) for child in children]
    for child in children:
        assert child.wait(60) == 0
    assert [ok for ok, _, _ in results] == [100] * 4
    assert all(errors == [] for _, errors, _ in results)
    assert all(status.startswith("FleetPool max_live 3") for _, _, status in results)
    assert server.samples > 10
    assert 1 <= server.highest <= 3, server.highest


def test_an_engine_reuses_its_connection_and_recreates_on_dispose(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    engine = sqlalchemy.create_engine(
        pg_url.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"application_name": tag},
        poolclass=FleetPool,
        fleet=fleet,
        fleet_key=pg_url,
        fleet_options=PoolOptions(max_live=1),
    )
    with ServerConnections(pg_url, tag) as server:
        for _ in range(5):
            with engine.connect() as conn:
                assert conn.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
        assert server.count() == 1
        first = engine.pool
        assert isinstance(first, FleetPool)
        assert first.clients.statistics().created_count == 1
        # The key is labelled by its fleet_key, a URL here, shown without a password.
        assert first.clients.label == pg_url.split("?", maxsplit=1)[0]
        (row,) = [k for k in first.clients.pool.statistics().keys if k.key == first.clients.key]
        assert row.label == first.clients.label and row.max_live == 1
        engine.dispose()
        assert engine.pool is not first
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
        assert server.wait_at_most(0, timeout=5.0) == 0


def test_a_failed_connect_and_a_timeout_raise_sqlalchemys_own_errors(
    fleet: Fleet, pg_url: str, tag: str
) -> None:
    """Existing handlers keep working: a refused connect is the engine's
    OperationalError, no connection within the timeout its TimeoutError."""
    refused = sqlalchemy.create_engine(
        "postgresql+psycopg://nobody@127.0.0.1:1/none",
        poolclass=FleetPool, fleet=fleet, fleet_key="refused",
        fleet_options=PoolOptions(max_live=1),
    )  # fmt: skip
    with pytest.raises(sqlalchemy.exc.OperationalError):
        refused.connect()
    assert refused.pool.status().startswith("FleetPool max_live 1: 0 live")  # claim returned
    engine = sqlalchemy.create_engine(
        pg_url.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"application_name": tag},
        poolclass=FleetPool, fleet=fleet, fleet_key=pg_url,
        fleet_options=PoolOptions(max_live=1, acquire_timeout=0.2),
    )  # fmt: skip
    with engine.connect(), pytest.raises(sqlalchemy.exc.TimeoutError) as raised:
        engine.connect()
    assert isinstance(raised.value.__cause__, PoolTimeout)
    refused.dispose()
    engine.dispose()
