"""LockTable lifecycle: reset_transport, observers, close, repr and pickling."""

from __future__ import annotations

import pickle
import time

import pytest

from orbitive import Fleet, FleetError
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

from ..conftest import MakeFleet

KEY = LockKey("tests.lifecycle", "job")
OWNER = LockOwner(b"owner")


def test_reset_transport_clears_state_counters_and_ring(table: LockTable) -> None:
    for n in range(5):
        assert isinstance(
            table.try_acquire(LockKey("tests.lifecycle", f"{n}"), OWNER, 30.0), Acquired
        )
    table.reset_transport()
    statistics = table.statistics()
    assert table.leases() == []
    assert (statistics.last_fencing_token, statistics.last_state_revision) == (0, 0)
    assert statistics.tombstone_count == statistics.occupied_count == 0
    assert set(statistics.ring_heads) == {0}
    assert table.poll().events == ()
    result = table.try_acquire(KEY, OWNER, 30.0)
    assert isinstance(result, Acquired)
    assert result.lease.fencing_token == 1
    assert [event.transition for event in table.poll().events] == ["acquired"]


def test_statistics_count_live_expired_and_tombstoned_slots(table: LockTable) -> None:
    held = table.try_acquire(KEY, OWNER, 30.0)
    table.try_acquire(LockKey("tests.lifecycle", "short"), OWNER, 0.001)
    assert isinstance(held, Acquired)
    time.sleep(0.01)
    statistics = table.statistics()
    assert (statistics.capacity, statistics.occupied_count) == (256, 1)
    assert statistics.expired_count + statistics.tombstone_count == 1
    assert statistics.last_fencing_token == 2


def test_an_observer_reads_the_table_but_cannot_change_it(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as member:
        writer = LockTable(member)
        held = writer.try_acquire(KEY, OWNER, 30.0)
        assert isinstance(held, Acquired)
        observer_fleet = Fleet.observe(fleet_name, 2)
        observer = LockTable.replay_retained(observer_fleet)
        assert observer_fleet.node == -1
        assert observer.leases() == [held.lease]
        assert observer.current(KEY) == held.lease
        assert [event.transition for event in observer.poll().events] == ["acquired"]
        for change in (
            lambda: observer.try_acquire(LockKey("tests.lifecycle", "other"), OWNER, 1.0),
            lambda: observer.renew(held.lease, 1.0),
            lambda: observer.release(held.lease),
            lambda: observer.force_release(KEY),
        ):
            with pytest.raises(FleetError):
                change()
        assert writer.current(KEY) == held.lease
        observer.close()
        observer_fleet.close()
        writer.close()
        writer.unlink()


def test_close_is_idempotent_and_repr_never_raises(table: LockTable) -> None:
    assert repr(table).startswith(f"<LockTable fleet={table.fleet.name!r} node=")
    table.fileno()
    table.close()
    table.close()
    assert "closed" in repr(table)
    assert repr(LockTable.__new__(LockTable)) == "<LockTable (not initialised)>"


def test_a_table_cannot_be_pickled(table: LockTable) -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(table)


def test_a_closed_fleet_refuses_new_tables(fleet_name: str) -> None:
    fleet = Fleet.join(fleet_name, 2)
    fleet.close()
    with pytest.raises(FleetError, match="closed"):
        LockTable(fleet)


def test_a_table_whose_fleet_closed_raises_fleet_error(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    table = LockTable(fleet)
    held = table.try_acquire(KEY, OWNER, 30.0)
    assert isinstance(held, Acquired)
    fleet.close()
    for call in (
        lambda: table.try_acquire(KEY, OWNER, 1.0),
        lambda: table.current(KEY),
        table.leases,
        table.statistics,
        lambda: table.renew(held.lease, 1.0),
        lambda: table.release(held.lease),
        lambda: table.release_owned(KEY, OWNER),
    ):
        with pytest.raises(FleetError, match="closed"):
            call()
    table.unlink()
