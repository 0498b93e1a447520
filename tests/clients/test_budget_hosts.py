"""One budget across hosts: each host a process group with its own shared memory.

Every host is ``tests/clients/_budget_host.py`` in a mount namespace of its own
with a private ``/dev/shm`` (as root; else a fleet name of its own), with four
worker processes whose psycopg pools name one budget. The coordinator is the
PostgreSQL server being capped (or Redis), and ``pg_stat_activity``, sampled
every 5 ms, is the witness: it never shows more of the budget's connections
than ``total``.

Each test runs several hosts of five processes and holds them to bounds in seconds:
they are marked slow, so they run in the whole suite on the default interpreter and
not beside two other interpreters' suites (``scripts/test-pythons``) on a loaded
machine. Waits for a state to settle are patient; the bounds are asserted apart.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from .._servers import DURABLE_POSTGRES, ServerUnavailable, TempPostgres, TempRedis
from ._budget_hosts import HANDOVER, ISOLATED, NETNS, TTL, Host, Link, wait_for
from ._sampling import ServerConnections

pytestmark = pytest.mark.slow

#: How long a test waits for a state to settle (not a bound: those are asserted apart).
SETTLE_S = 20.0


@pytest.fixture(params=["postgres", "redis"])
def coordinator(request: pytest.FixtureRequest, durable_postgres_server: TempPostgres) -> str:
    """The coordinator's URL: the capped PostgreSQL itself, or a Redis server."""
    if request.param == "postgres":
        return durable_postgres_server.url
    server: TempRedis = request.getfixturevalue("durable_redis_server")
    return server.url


def budget(url: str, total: int) -> dict[str, Any]:
    return {"url": url, "name": f"db-{secrets.token_hex(3)}", "total": total, "ttl": TTL,
            "handover_within": HANDOVER}  # fmt: skip


def test_hosts_are_separate() -> None:
    """The simulation is what it claims: hosts cannot meet through /dev/shm."""
    if not ISOLATED:
        pytest.skip("no mount namespaces here: each host has its own fleet name instead")
    assert ISOLATED


def test_three_hosts_of_four_workers_never_hold_more_than_the_total(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres, coordinator: str
) -> None:
    db, tag = durable_postgres_server.url, f"budget-{secrets.token_hex(4)}"
    shared = budget(coordinator, total=6)
    started = [
        hosts(name, db=db, budget=shared, options={"max_live": 4}, tag=tag) for name in "abc"
    ]
    for host in started:
        host.wait_ready()
    with ServerConnections(db, tag) as witness:
        for host in started:
            host.mode("busy")
        time.sleep(6.0)
        for host in started:
            host.mode("idle")
        time.sleep(0.2)
    assert witness.samples > 100
    assert witness.highest <= 6, f"{witness.highest} connections of a budget of 6"
    assert witness.highest >= 5  # the budget was used, not starved
    for host in started:
        assert host.errors() == {}, f"host {host.name}: {host.errors()}"
        assert host.successes() > 0, f"host {host.name} was never served"


def hold_every_unit_idle(host: Host) -> None:
    """Make ``host`` hold every unit of a total of 4 in four idle connections.

    Busy until it holds every unit and four live connections: while its cap was below
    4 its workers took turns, and the one without a connection when it turns idle
    makes none. A renewal that comes late (a loaded machine, a slow coordinator) makes
    the host retire the idle connections it hands back, as it must while its units may
    lapse; then the set-up starts over.

    Raises:
        AssertionError: the host did not get there within SETTLE_S (its census said).
    """
    deadline = time.monotonic() + SETTLE_S
    while True:
        host.mode("busy")
        wait_for(
            lambda: (census := host.census()).get("budget_units") == 4 and census.get("live") == 4,
            SETTLE_S,
        )
        host.mode("idle")  # its workers stop, holding four idle connections
        with contextlib.suppress(AssertionError):
            wait_for(lambda: host.census().get("idle") == 4, 5.0)
            return
        assert time.monotonic() < deadline, f"host {host.name}: {host.census()}"


def test_an_idle_host_hands_its_units_to_a_waiting_host_within_the_bound(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres, coordinator: str
) -> None:
    db, tag = durable_postgres_server.url, f"budget-{secrets.token_hex(4)}"
    shared = budget(coordinator, total=4)
    a = hosts("a", db=db, budget=shared, options={"max_live": 4}, tag=tag)
    b = hosts("b", db=db, budget=shared, options={"max_live": 4}, tag=tag)
    a.wait_ready()
    b.wait_ready()
    with ServerConnections(db, tag) as witness:
        hold_every_unit_idle(a)
        started = time.monotonic()
        b.mode("busy")
        served = wait_for(lambda: b.first_success_at() is not None, 10.0)
        assert (b.first_success_at() or served) - started <= HANDOVER
        drained = wait_for(lambda: a.census().get("idle") == 0, SETTLE_S)
        assert drained - started <= HANDOVER + 1.0
        wait_for(lambda: b.census().get("budget_units") == 4, SETTLE_S)  # demand decides
    assert witness.highest <= 4
    assert b.errors() == {}


def test_the_units_of_a_killed_host_are_taken_by_the_others_within_ttl(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres
) -> None:
    db, tag = durable_postgres_server.url, f"budget-{secrets.token_hex(4)}"
    shared = budget(db, total=4)
    a = hosts("a", db=db, budget=shared, options={"max_live": 4}, tag=tag)
    b = hosts("b", db=db, budget=shared, options={"max_live": 4}, tag=tag)
    a.wait_ready()
    b.wait_ready()
    with ServerConnections(db, tag) as witness:
        a.mode("busy")
        b.mode("busy")
        wait_for(lambda: a.census().get("budget_units", 0) >= 1, SETTLE_S)
        wait_for(lambda: b.census().get("budget_units", 0) >= 1, SETTLE_S)
        time.sleep(1.0)
        held = a.census()["budget_units"]
        assert held >= 1
        killed = time.monotonic()
        a.kill()  # every process of host a, SIGKILL
        recovered = wait_for(lambda: b.census().get("budget_units") == 4, TTL + 5.0)
        assert recovered - killed <= TTL + 1.0, f"{recovered - killed:.2f} s"
        wait_for(lambda: b.census().get("live") == 4, SETTLE_S)
    assert witness.highest <= 4
    assert b.errors() == {}


@pytest.fixture
def links() -> Iterator[list[Link]]:
    """Three network namespaces, each joined to this one by a veth pair."""
    if not NETNS:
        pytest.skip("needs root and iproute2 for network namespaces")
    made = [Link(f"orbit-budget-{index}-{secrets.token_hex(2)}", 100 + index) for index in range(3)]
    try:
        for link in made:
            link.up()
        yield made
    finally:
        for link in made:
            link.down()


@pytest.fixture
def routed_postgres(links: list[Link]) -> Iterator[TempPostgres]:
    """A durable server listening on loopback and on the outside end of every link, and
    trusting the links' addresses."""
    addresses = ",".join(["127.0.0.1", *(link.outside for link in links)])
    try:
        server = TempPostgres.start(*DURABLE_POSTGRES, f"listen_addresses={addresses}")
    except ServerUnavailable as error:
        pytest.skip(f"server unavailable: {error}")
    try:
        hba = server.root / "data" / "pg_hba.conf"
        hba.write_text(hba.read_text() + "host all all 10.77.0.0/16 trust\n")
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        server.stop()


def test_hosts_in_network_namespaces_of_their_own_keep_the_total(
    hosts: Callable[..., Host], links: list[Link], routed_postgres: TempPostgres
) -> None:
    server = routed_postgres
    tag, name = f"budget-{secrets.token_hex(4)}", f"db-{secrets.token_hex(3)}"
    started = []
    for host_name, link in zip("abc", links, strict=True):
        url = f"postgresql://postgres@{link.outside}:{server.port}/postgres"
        shared = {"url": url, "name": name, "total": 6, "ttl": TTL}
        options = {"max_live": 4}
        started.append(hosts(host_name, db=url, budget=shared, options=options, tag=tag, link=link))
    for host in started:
        host.wait_ready()
    with ServerConnections(server.url, tag) as witness:
        for host in started:
            host.mode("busy")
        time.sleep(5.0)
        with psycopg.connect(server.url) as conn:
            rows = conn.execute(
                "SELECT DISTINCT host(client_addr) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (tag,),
            ).fetchall()
        for host in started:
            host.mode("idle")
    assert {row[0] for row in rows} == {link.inside for link in links}  # over the veth pairs
    assert witness.highest <= 6
    for host in started:
        assert host.errors() == {}, f"host {host.name}: {host.errors()}"
        assert host.successes() > 0
