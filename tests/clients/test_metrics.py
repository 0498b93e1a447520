"""A Prometheus scrape from a process outside the fleet shows what ``statistics()`` shows.

Worker processes share one psycopg pool key (``max_live=3``) under load; a
sidecar process that never joins the fleet scrapes with
``prometheus_client.generate_latest`` over :class:`orbitive.metrics.FleetCollector`;
a pool naming a budget across hosts shows the host's share of it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orbitive import Fleet, InvalidName
from orbitive.clients import Budget, PoolOptions
from orbitive.clients._psycopg_connections import conninfo_label
from orbitive.clients.psycopg import ConnectionPool
from orbitive.metrics import FleetCollector
from orbitive.pool import MalformedError

from .._processes import Child, Processes
from .._servers import TempPostgres
from ._workers import metrics_scraper, metrics_worker
from .conftest import CAPACITY

MAX_LIVE = 3


def scrape(sidecar: Child) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One scrape: each sample's value by (name, sorted labels)."""
    sidecar.send("scrape")
    text: str = sidecar.recv()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def pool_value(samples: dict[Any, float], name: str, pool: str, **labels: str) -> float:
    """The sample ``name`` of the pool labelled ``pool`` (and ``labels``)."""
    wanted = {"db_client_connection_pool_name": pool, **labels}
    found = [
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and wanted.items() <= dict(sample_labels).items()
    ]
    assert len(found) == 1, (name, wanted, found)
    return found[0]


def counts(samples: dict[Any, float], pool: str) -> dict[str, float]:
    """What statistics() calls live, idle, in_use and waiting, as the scrape says them."""
    idle = pool_value(
        samples, "db_client_connection_count", pool, db_client_connection_state="idle"
    )
    used = pool_value(
        samples, "db_client_connection_count", pool, db_client_connection_state="used"
    )
    waiting = pool_value(samples, "db_client_connection_pending_requests", pool)
    return {"live": idle + used, "idle": idle, "in_use": used, "waiting": waiting}


def settled(sidecar: Child, pool: str, **expected: float) -> dict[Any, float]:
    """Scrape until the counts are ``expected`` (at most 20 s); that scrape."""
    deadline = time.monotonic() + 20.0
    while True:
        samples = scrape(sidecar)
        now = counts(samples, pool)
        if all(now[name] == value for name, value in expected.items()):
            return samples
        assert time.monotonic() < deadline, (now, expected)
        time.sleep(0.02)


@pytest.fixture
def workers(spawned: Processes, fleet_name: str, pg_url: str, tag: str) -> Iterator[list[Child]]:
    started = [
        spawned.start(metrics_worker, fleet_name, CAPACITY, pg_url, tag, MAX_LIVE) for _ in range(4)
    ]
    yield started
    for worker in started:
        worker.send("close")
        assert worker.recv(60) == "closed"


def test_a_sidecar_scrape_shows_the_counts_statistics_shows_under_load(
    spawned: Processes, fleet_name: str, pg_url: str, workers: list[Child]
) -> None:
    label = conninfo_label(pg_url, {})  # the key's label: user@host:port/dbname
    sidecar = spawned.start(metrics_scraper, fleet_name)
    scrape(sidecar)  # every process is up (spawn imports take a while)
    assert all(_stats(worker)["max_live"] == MAX_LIVE for worker in workers)
    # Under load: four workers x two threads on three connections.
    for worker in workers:
        worker.send(("churn", 2.0))
    # Three scrapes at least, and more while the churn lasts (a loaded machine scrapes
    # slowly: the count is not timed).
    scrapes = 0
    deadline = time.monotonic() + 1.5
    while scrapes < 3 or time.monotonic() < deadline:
        samples = scrape(sidecar)
        now = counts(samples, label)
        assert now["live"] <= MAX_LIVE and min(now.values()) >= 0, now
        assert pool_value(samples, "db_client_connection_max", label) == MAX_LIVE
        scrapes += 1
    assert all(worker.recv(60) > 0 for worker in workers)
    # Held still: three in use by three workers, two callers of the fourth waiting.
    for worker in workers[:3]:
        worker.send("hold")
        assert worker.recv(60) == "held"
    workers[3].send(("wait", 2))
    assert workers[3].recv(60) == "started"
    samples = settled(sidecar, label, live=3, in_use=3, idle=0, waiting=2)
    stats = [_stats(worker) for worker in workers]
    for each in stats:
        assert (each["live"], each["idle"], each["in_use"], each["waiting"]) == (3, 0, 3, 2)
    assert counts(samples, label) == {"live": 3.0, "idle": 0.0, "in_use": 3.0, "waiting": 2.0}
    # Handed over: the waiters got connections, one returned connection stays idle.
    for worker in workers:
        worker.send("release")
        assert worker.recv(60) == "released"
    samples = settled(sidecar, label, waiting=0, in_use=0)
    assert counts(samples, label) == {
        name: float(value)
        for name, value in _stats(workers[0]).items()
        if name in ("live", "idle", "in_use", "waiting")
    }
    waits = pool_value(samples, "db_client_connection_wait_time_seconds_count", label)
    assert waits >= 2  # the two callers that waited at max_live
    assert pool_value(samples, "db_client_connection_wait_time_seconds_sum", label) > 0
    # A checkout that gives up at max_live counts as a timeout, host-wide.
    for worker in workers[:3]:
        worker.send("hold")
        assert worker.recv(60) == "held"
    workers[3].send(("late", 0.2))
    assert workers[3].recv(60) == "PoolTimeout"
    samples = scrape(sidecar)
    assert pool_value(samples, "db_client_connection_timeouts_total", label) == 1
    assert _stats(workers[3])["timeouts_count"] == 1
    for worker in workers[:3]:
        worker.send("release")
        assert worker.recv(60) == "released"
    sidecar.send("stop")


def _stats(worker: Child) -> dict[str, float]:
    worker.send("stats")
    stats: dict[str, float] = worker.recv(60)
    return stats


def test_a_collector_refuses_a_bad_fleet_or_kind() -> None:
    with pytest.raises(InvalidName):
        FleetCollector("no/slash")
    with pytest.raises(MalformedError):
        FleetCollector("web", pool_kind=256)


def test_a_scrape_shows_the_hosts_share_of_a_budget(
    fleet: Fleet, fleet_name: str, durable_postgres_server: TempPostgres
) -> None:
    db = durable_postgres_server.url
    budget = Budget(db, name=f"db-{secrets.token_hex(3)}", total=5, ttl=4.0)
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet_name))
    pool = ConnectionPool(db, fleet=fleet, options=PoolOptions(max_live=3), budget=budget)
    with pool, pool.connection(), pool.connection():
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples
            if sample.name.startswith("orbitive_budget_")
        }
        statistics = pool.statistics()
    assert samples["orbitive_budget_total"] == 5
    assert samples["orbitive_budget_units"] == statistics.budget_units == 2
    assert samples["orbitive_budget_cap"] == statistics.budget_cap == 2
    assert 0.0 < samples["orbitive_budget_lapse_seconds"] <= 4.0
