"""A budget's total holds while a process is paused, and while its coordinator forgets.

* **A paused steward** (SIGSTOP of the one worker whose thread renews its host's
  units): the host's other workers take its place once its stewardship lease
  runs out and renew the units in time, so the paused worker's open sessions stay
  covered while a second host asks for every unit. Before, the units lapsed after
  ``ttl``, the second host was granted them, and the server held one session per
  paused-worker session over the total for the whole pause.
* **A coordinator that forgets** (the units' rows deleted while two hosts grow):
  the hosts are granted the slots again, and the overshoot ends at their next
  renewal, within ``ttl / 4``. Before, the PostgreSQL engine matched a renewal's
  rows to grants by slot alone, and a host that held a slot twice (its forgotten
  tenure and its new one) counted both for good.

``pg_stat_activity``, sampled every 5 ms, is the witness.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from .._servers import TempPostgres, TempRedis
from ._budget_hosts import HANDOVER, TTL, Host, wait_for
from ._sampling import ServerConnections

pytestmark = pytest.mark.slow

SETTLE_S = 20.0


@pytest.fixture(params=["postgres", "redis"])
def coordinator(request: pytest.FixtureRequest, durable_postgres_server: TempPostgres) -> str:
    """The coordinator's URL: the capped PostgreSQL itself, or a Redis server."""
    if request.param == "postgres":
        return durable_postgres_server.url
    server: TempRedis = request.getfixturevalue("durable_redis_server")
    return server.url


def budget(url: str, total: int, handover: float = HANDOVER) -> dict[str, Any]:
    return {"url": url, "name": f"db-{secrets.token_hex(3)}", "total": total, "ttl": TTL,
            "handover_within": handover}  # fmt: skip


def steward_pid(host: Host) -> int:
    """The pid of the host's steward, by its workers' reports."""
    found = [report["pid"] for report in host.stats() if report.get("steward")]
    assert len(found) == 1, f"host {host.name}: stewards {found}"
    return int(found[0])


def test_a_steward_paused_for_three_ttls_is_replaced_and_the_total_holds(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres, coordinator: str
) -> None:
    db, tag = durable_postgres_server.url, f"budget-{secrets.token_hex(4)}"
    shared = budget(coordinator, total=4)
    a = hosts("a", db=db, budget=shared, options={"max_live": 4}, tag=tag)
    b = hosts("b", db=db, budget=shared, options={"max_live": 4}, tag=tag)
    a.wait_ready()
    b.wait_ready()
    with ServerConnections(db, tag) as witness:
        a.mode("busy")
        wait_for(lambda: a.census().get("budget_units") == 4, SETTLE_S)
        wait_for(lambda: any(report.get("steward") for report in a.stats()), SETTLE_S)
        paused = steward_pid(a)
        b.mode("busy")  # b asks for every unit
        os.kill(paused, signal.SIGSTOP)
        try:
            served = a.successes()
            time.sleep(3 * TTL)
            healthy = a.successes() - served
        finally:
            os.kill(paused, signal.SIGCONT)
        time.sleep(1.0)
        a.mode("idle")
        b.mode("idle")
    assert witness.samples > 100
    assert witness.highest <= 4, f"{witness.highest} sessions of a budget of 4"
    assert healthy > 0  # the paused host's other workers served within what it held
    assert b.successes() > 0
    assert b.errors() == {}, b.errors()


def test_a_coordinator_that_forgets_its_units_costs_at_most_a_quarter_ttl(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres
) -> None:
    db, tag = durable_postgres_server.url, f"budget-{secrets.token_hex(4)}"
    shared = budget(db, total=2, handover=0.2)  # each host tries for a unit every 50 ms
    a = hosts("a", db=db, budget=shared, options={"max_live": 4}, tag=tag, timeout=60.0)
    b = hosts("b", db=db, budget=shared, options={"max_live": 4}, tag=tag, timeout=60.0)
    a.wait_ready()
    b.wait_ready()
    with ServerConnections(db, tag) as witness:
        a.mode("busy")
        b.mode("busy")  # each holds one unit and asks for more
        wait_for(lambda: a.census().get("budget_units") == 1, SETTLE_S)
        wait_for(lambda: b.census().get("budget_units") == 1, SETTLE_S)
        time.sleep(1.0)
        assert witness.highest <= 2
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("DELETE FROM orbitive_semaphores WHERE name = %s",
                         ("orbitive.budget/" + shared["name"],))  # fmt: skip
            forgot = time.monotonic()
        time.sleep(4 * TTL)
        a.mode("idle")
        b.mode("idle")
    over = [at - forgot for at, count in witness.seen if count > 2]
    last = max(over, default=0.0)
    print(f"over the total for {last:.3f} s after the rows were deleted ({len(over)} samples)")
    assert last <= TTL / 4 + 0.5, f"{len(over)} samples over the total, the last {last:.2f} s on"


def test_a_whole_host_paused_exceeds_the_total_by_its_units_until_it_wakes_then_sheds(
    hosts: Callable[..., Host], durable_postgres_server: TempPostgres
) -> None:
    """What docs/budget.md states under "What is not promised": nothing on a host whose
    every process is stopped can act, so its units lapse and the other host is granted
    them; the overshoot is at most the units it held, and ends as it wakes."""
    db, tag = durable_postgres_server.url, f"budget-{secrets.token_hex(4)}"
    shared = budget(db, total=4)
    a = hosts("a", db=db, budget=shared, options={"max_live": 4}, tag=tag, timeout=60.0)
    b = hosts("b", db=db, budget=shared, options={"max_live": 4}, tag=tag, timeout=60.0)
    a.wait_ready()
    b.wait_ready()
    with ServerConnections(db, tag) as witness:
        a.mode("busy")
        b.mode("busy")
        wait_for(lambda: a.census().get("budget_units", 0) >= 1, SETTLE_S)
        wait_for(lambda: b.census().get("budget_units", 0) >= 1, SETTLE_S)
        time.sleep(1.0)
        held = a.census()["budget_units"]
        os.killpg(a.process.pid, signal.SIGSTOP)
        try:
            time.sleep(3 * TTL)
        finally:
            os.killpg(a.process.pid, signal.SIGCONT)
            woke = time.monotonic()
        time.sleep(2.0)
        a.mode("idle")
        b.mode("idle")
    over = [at - woke for at, count in witness.seen if count > 4]
    last = max(over, default=-1.0)
    print(f"a held {held}; at most {witness.highest} sessions; over the total until {last:.3f} s "
          "after it woke")  # fmt: skip
    assert witness.highest <= 4 + held
    assert last <= 1.0, f"over the total {last:.2f} s after the host woke"
