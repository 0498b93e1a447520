"""A host cut off from its budget's coordinator never lets the hosts exceed the total.

Three hosts share a budget of 6 on the durable PostgreSQL server; host ``c``
reaches the coordinator through a fault-injecting proxy (its connections to
the database go straight to it, so the server counts what ``c`` really holds).
The proxy drops replies, then black-holes the link for two TTLs, then resets
every connection for one: ``c``'s renewals fail, it stops creating and closes
its connections before its units can lapse, the others take the units that
lapsed, and ``pg_stat_activity``, sampled every 5 ms, never shows more than 6.
Once the link returns, ``c`` is served again. And a host that holds a free unit
serves a checkout without asking the coordinator: a black hole does not slow it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from orbitive import Fleet
from orbitive.clients import Budget, PoolOptions
from orbitive.clients.psycopg import ConnectionPool

from .._servers import TempPostgres
from ..store._faultproxy import FaultProxy
from ._budget_hosts import TTL, Host, wait_for
from ._sampling import ServerConnections


def test_a_host_cut_off_from_the_coordinator_keeps_the_total_and_recovers(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres
) -> None:
    server = durable_postgres_server
    db, tag, name = server.url, f"budget-{secrets.token_hex(4)}", f"db-{secrets.token_hex(3)}"
    with FaultProxy(server.port) as proxy:
        faulty = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
        started = []
        for host_name, coordinator in (("a", db), ("b", db), ("c", faulty)):
            shared = {"url": coordinator, "name": name, "total": 6, "ttl": TTL}
            options = {"max_live": 4}
            started.append(
                hosts(host_name, db=db, budget=shared, options=options, tag=tag, timeout=60.0)
            )
        a, b, c = started
        for host in started:
            host.wait_ready()
        with ServerConnections(db, tag) as witness:
            for host in started:
                host.mode("busy")
            wait_for(lambda: c.census().get("budget_units", 0) >= 1, 20.0)
            time.sleep(1.0)
            for round_ in range(1, 4):  # replies lost after the server did the work
                proxy.lose_next_reply()
                wait_for(lambda: proxy.fired >= round_, 10.0)  # noqa: B023 - polled at once
                time.sleep(0.3)
            assert witness.highest <= 6
            proxy.black_hole()  # silence: no reply, no reset
            wait_for(lambda: c.census().get("live", 1) == 0, 2 * TTL)  # c sheds in time
            wait_for(lambda: units(a) + units(b) == 6, 3 * TTL)  # its units lapsed: taken
            time.sleep(TTL)
            proxy.heal()
            proxy.cut()  # every connection reset
            time.sleep(TTL)
            assert c.census().get("budget_units", 0) == 0 or c.census().get("budget_cap") == 0
            served = c.successes()
            proxy.heal()
            wait_for(lambda: c.successes() > served + 10, 20.0)  # c is served again
            wait_for(lambda: c.census().get("budget_units", 0) >= 1, 10.0)
        for host in started:
            host.mode("idle")
    assert witness.highest <= 6, f"{witness.highest} connections of a budget of 6"
    assert a.errors() == {} and b.errors() == {}
    assert set(c.errors()) <= {"OperationalError"}  # a request severed under its caller


def units(host: Host) -> int:
    """The units the host holds, by its freshest report."""
    return int(host.census().get("budget_units", 0))


def test_a_checkout_on_a_host_holding_a_free_unit_makes_no_round_trip(
    fleet: Fleet, durable_postgres_server: TempPostgres
) -> None:
    """With the coordinator black-holed, checkouts under the units already held are served
    at once: none of them waits on the coordinator."""
    server = durable_postgres_server
    with FaultProxy(server.port) as proxy:
        coordinator = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
        budget = Budget(coordinator, name=f"db-{secrets.token_hex(3)}", total=4, ttl=TTL * 4)
        options = PoolOptions(max_live=2)
        with ConnectionPool(server.url, fleet=fleet, options=options, budget=budget) as pool:
            with pool.connection() as first, pool.connection() as second:  # two units held
                first.execute("SELECT 1")
                second.execute("SELECT 1")
            proxy.black_hole()
            slowest = 0.0
            for _ in range(200):
                started = time.monotonic()
                with pool.connection() as conn:
                    conn.execute("SELECT 1")
                slowest = max(slowest, time.monotonic() - started)
            assert pool.statistics().budget_units == 2
            proxy.heal()
    assert slowest < 0.5, f"a checkout took {slowest:.3f} s"  # a coordinator call waits ttl / 4
