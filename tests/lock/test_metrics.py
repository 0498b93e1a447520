"""The lock tables' metrics: live leases, acquisitions, conflicts and recoveries, per table."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable, Occupied
from orbitive.metrics import FleetCollector
from orbitive.store import open_store


def _samples(fleet: str) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet))
    text = generate_latest(registry).decode()
    return {
        (sample.name, sample.labels.get("table", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("fleet") == fleet
    }


def test_the_lock_tables_counters_are_exported_per_table(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 4) as fleet, open_store(f"shm://{fleet_name}") as store:
        table = LockTable(fleet)
        key, owner = LockKey("tests.metrics", "a"), LockOwner(b"one")
        assert isinstance(table.try_acquire(key, owner, 30.0), Acquired)
        assert isinstance(table.try_acquire(LockKey("tests.metrics", "b"), owner, 30.0), Acquired)
        assert isinstance(table.try_acquire(key, LockOwner(b"two"), 30.0), Occupied)
        lock = store.try_lock("jobs/nightly", "worker-1", 30.0)
        assert lock is not None and store.try_lock("jobs/nightly", "worker-2", 30.0) is None
        samples = _samples(fleet_name)
        lock.release()
        table.close()
    assert samples[("orbitive_lock_leases", "locks")] == 2
    assert samples[("orbitive_lock_acquisitions_total", "locks")] == 2
    assert samples[("orbitive_lock_conflicts_total", "locks")] == 1
    assert samples[("orbitive_lock_recoveries_total", "locks")] == 0
    assert samples[("orbitive_lock_leases", "store")] == 1
    assert samples[("orbitive_lock_conflicts_total", "store")] == 1
    assert not any(name.startswith("db_client") for name, _ in samples)  # no pool table


def test_a_fleet_with_no_tables_exports_no_series(fleet_name: str) -> None:
    assert _samples(fleet_name) == {}
    names = {family.name for family in FleetCollector(fleet_name).describe()}
    assert {"db_client_connection_count", "orbitive_lock_conflicts"} <= names
