"""Client-pool fixtures: a fleet per test, the session's PostgreSQL server, a tag per test.

Connections are tagged with an ``application_name`` unique to the test, so
``pg_stat_activity`` counts exactly the connections the test's pools opened.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool
from orbitive.clients._router import Router

from .._processes import REPLY_TIMEOUT, Child, Processes
from .._servers import TempPostgres
from ._budget_hosts import Host
from ._router_pool import PORT, server_pool
from ._workers import budget_prober

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
def router_pool(
    fleet: Fleet, postgres_server: TempPostgres, tag: str
) -> Iterator[ClientPool[psycopg.Connection]]:
    """At most two server connections for transaction mode's router (tagged ``tag``)."""
    with server_pool(fleet, postgres_server.url, tag, 2) as opened:
        yield opened


@pytest.fixture
def router(
    router_pool: ClientPool[psycopg.Connection], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    """Transaction mode's reference router on :func:`router_pool`."""
    started = Router(str(tmp_path_factory.mktemp("router")), PORT, router_pool)
    yield started
    started.close()


@pytest.fixture
def writes(postgres_server: TempPostgres, tag: str) -> Iterator[str]:
    """A table named as the test's tag (``worker``, ``n``, ``kept``: true unless said),
    for transactions to write their rows to; dropped after."""
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE TABLE "{tag}" (worker int, n int, kept bool NOT NULL DEFAULT true)')
        yield tag
        admin.execute(f'DROP TABLE "{tag}"')


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


class Prober:
    """Another process of the test's fleet, asked whether ``max_live`` clients of a key
    can be checked out there at once (:func:`._workers.budget_prober`)."""

    def __init__(self, child: Child, fleet_name: str) -> None:
        self._child = child
        self.fleet_name = fleet_name

    def probe(self, key: object, max_live: int, timeout: float) -> str | None:
        """None if ``max_live`` clients of ``key`` were checked out at once, else why not."""
        self._child.send(("probe", self.fleet_name, key, max_live, timeout))
        answer: str | None = self._child.recv(timeout * max_live + REPLY_TIMEOUT)
        return answer

    def leave(self) -> None:
        self._child.send(("leave", self.fleet_name))
        assert self._child.recv() == "left"


@pytest.fixture(scope="session")
def prober_process() -> Iterator[Child]:
    """One spawned process that probes budgets for every test that asks (see Prober)."""
    with Processes("spawn") as started:
        child = started.start(budget_prober, CAPACITY)
        yield child
        child.send("stop")
        child.wait()


@pytest.fixture
def prober(prober_process: Child, fleet_name: str) -> Iterator[Prober]:
    """The prober process, in this test's fleet until the test ends."""
    probing = Prober(prober_process, fleet_name)
    yield probing
    probing.leave()


@pytest.fixture
def hosts() -> Iterator[Callable[..., Host]]:
    """Start simulated hosts of a budget (:class:`._budget_hosts.Host`); each is stopped at
    the end, or killed if it will not stop."""
    started: list[Host] = []

    def start(name: str, **config: Any) -> Host:
        host = Host(name, **config)
        started.append(host)
        return host

    try:
        yield start
    finally:
        for host in started:
            host.stop()
