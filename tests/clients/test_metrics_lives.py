"""A scrape lists the pools live processes use, each as what it is.

Three child processes each open a client pool (fake clients, one held) and a
resource pool key of a plain ``Pool`` (one resource of 3 units); one exits
cleanly, one is SIGKILLed, one lives on. The scrape shows the live one's client
pool as a database connection pool and its resource pool in the resource pool
families, by their labels; the exited and killed ones' keys, still in the table,
show only as the dead resources and connections their owners left. A client pool
is listed from its opening to its closing, whatever it holds.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions
from orbitive.metrics import FleetCollector

from .._processes import Processes
from ._fakes import FakeClient, close
from ._workers import two_pools_holder
from .conftest import CAPACITY

#: Each sample's value by (name, sorted labels).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(fleet_name: str) -> Samples:
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet_name))
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def named(samples: Samples, prefix: str, label: str) -> dict[str, float]:
    """The samples whose name starts with ``prefix``, by name and the value of ``label``
    (``name{label_value}``; the state too, when there is one)."""
    found = {}
    for (name, labels), value in samples.items():
        values = dict(labels)
        if name.startswith(prefix) and label in values:
            state = values.get("db_client_connection_state") or values.get("state")
            found[f"{name}{{{values[label]}{',' + state if state else ''}}}"] = value
    return found


def test_a_scrape_lists_live_processes_pools_each_as_what_it_is(
    spawned: Processes, fleet_name: str
) -> None:
    children = {
        name: spawned.start(two_pools_holder, fleet_name, CAPACITY, name)
        for name in ("live", "exited", "killed")
    }
    for child in children.values():
        assert child.recv(60) == "ready"
    children["exited"].send("exit")
    assert children["exited"].wait(60) == 0
    children["killed"].kill()
    samples = scrape(fleet_name)
    assert named(samples, "db_client_connection_", "db_client_connection_pool_name") == {
        "db_client_connection_count{db-live,idle}": 0.0,
        "db_client_connection_count{db-live,used}": 1.0,
        "db_client_connection_max{db-live}": 2.0,
        "db_client_connection_idle_max{db-live}": 2.0,
        "db_client_connection_idle_min{db-live}": 0.0,
        "db_client_connection_pending_requests{db-live}": 0.0,
        "db_client_connection_timeouts_total{db-live}": 0.0,
        **{
            f"db_client_connection_wait_time_seconds_{suffix}{{db-live}}": 0.0
            for suffix in ("bucket", "count", "sum")  # every bucket 0: one entry
        },
    }
    # What the dead owners left shows as dead until the live child's upkeep reports them.
    pools = named(samples, "orbitive_pool_", "db_client_connection_pool_name")
    assert pools.pop("orbitive_pool_creating{db-live}") == 0.0
    assert pools.items() <= {"orbitive_pool_dead_connections{db-killed}": 1.0}.items()
    resources = named(samples, "orbitive_resource_pool_", "pool")
    dead = {f"orbitive_resource_pool_dead_resources{{jobs-{n}}}" for n in ("exited", "killed")}
    assert {name: value for name, value in resources.items() if name not in dead} == {
        "orbitive_resource_pool_resources{jobs-live}": 1.0,
        "orbitive_resource_pool_units{jobs-live,idle}": 3.0,
        "orbitive_resource_pool_units{jobs-live,used}": 0.0,
        "orbitive_resource_pool_creating{jobs-live}": 0.0,
    }
    assert all(resources[name] == 1.0 for name in dead & resources.keys())
    children["live"].send("exit")
    assert children["live"].wait(60) == 0


def test_a_client_pool_is_listed_while_open_whatever_it_holds(
    fleet: Fleet, fleet_name: str
) -> None:
    """Before its first checkout and once its only client is retired the pool holds no
    client: it is listed all the same, with counts of 0 (a series that vanished between
    scrapes would break a dashboard's graph); once closed, it is not."""
    pool: ClientPool[FakeClient] = ClientPool(
        fleet, "db-empty", create=FakeClient, close=close,
        options=PoolOptions(max_live=2, max_idle=0), label="db-empty",
    )  # fmt: skip
    counts = "db_client_connection_count"
    try:
        assert named(scrape(fleet_name), counts, "db_client_connection_pool_name") == {
            "db_client_connection_count{db-empty,idle}": 0.0,
            "db_client_connection_count{db-empty,used}": 0.0,
        }
        pool.putconn(pool.getconn())  # max_idle 0: retired on its return
        deadline = time.monotonic() + 30.0
        while pool.statistics().live:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert named(scrape(fleet_name), counts, "db_client_connection_pool_name") == {
            "db_client_connection_count{db-empty,idle}": 0.0,
            "db_client_connection_count{db-empty,used}": 0.0,
        }
    finally:
        pool.close()
    assert (
        named(scrape(fleet_name), "db_client_connection_", "db_client_connection_pool_name") == {}
    )
