"""``shm://`` stores: objects sized to the store, the fleet capacity, what a full fleet says."""

from __future__ import annotations

import pytest

from orbitive import CapacityMismatch, Fleet
from orbitive.lock import LockKey, LockTable
from orbitive.store import (
    ErrorKind,
    InvalidSemaphoreLimit,
    InvalidStoreUrl,
    LockTimeout,
    StoreError,
    open_store,
)
from orbitive.store._shm import SHM_CAPACITY_DEFAULT, SHM_LIMIT_MAX, STORE_LAYOUT, footprint

from .._fleets import fleet_files


def shm_bytes(fleet: str) -> dict[int, int]:
    """Size of each table object of ``fleet`` in /dev/shm, by kind (not the membership object)."""
    return {
        int(kind): path.stat().st_size
        for path in fleet_files(fleet)
        if (kind := path.name.split("-")[2]).isdigit()
    }


def test_a_default_store_takes_under_one_megabyte_of_dev_shm(fleet_name: str) -> None:
    with open_store(f"shm://{fleet_name}") as store:
        assert store.try_lock("jobs/nightly", "w" * 255, 5.0) is not None  # longest owner fits
        sizes = shm_bytes(fleet_name)
    assert set(sizes) == {STORE_LAYOUT.state_kind, STORE_LAYOUT.event_kind}
    assert sum(sizes.values()) == footprint(SHM_CAPACITY_DEFAULT) < 1_000_000


def test_the_longest_name_and_owner_fit_the_store_table(fleet_name: str) -> None:
    with open_store(f"shm://{fleet_name}?capacity=2") as store:
        lock = store.try_lock("n" * 255, "o" * 255, 5.0)
        assert lock is not None and lock.release()


def test_without_capacity_the_store_joins_the_fleet_it_finds(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 3), open_store(f"shm://{fleet_name}") as store:
        assert store.try_lock("job", "worker", 5.0) is not None
        assert sum(shm_bytes(fleet_name).values()) == footprint(3)


def test_an_application_lock_table_and_the_store_share_a_fleet(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 4) as fleet, open_store(f"shm://{fleet_name}") as store:
        table = LockTable(fleet)  # the default layout, kinds 228/229: no LayoutMismatch
        assert store.try_lock("job", "worker", 5.0) is not None
        assert table.current(LockKey("orbitive.store", "job")) is None  # tables are apart
        table.close()


def test_another_capacity_is_a_mismatch_that_quotes_the_url_and_says_what_to_do(
    fleet_name: str,
) -> None:
    with Fleet.join(fleet_name, 2), pytest.raises(CapacityMismatch) as caught:
        open_store(f"shm://{fleet_name}?capacity=8")  # a valid URL: not InvalidStoreUrl
    assert not isinstance(caught.value, InvalidStoreUrl)
    message = str(caught.value)
    assert f"shm://{fleet_name}?capacity=8" in message and "has capacity 2" in message
    assert f"orbit clear {fleet_name} --all --yes" in message and "?capacity=N" in message


def test_a_full_fleet_is_unavailable_and_the_message_says_what_to_do(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 1), pytest.raises(StoreError) as caught:
        open_store(f"shm://{fleet_name}")
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    message = str(caught.value)
    assert "all 1 nodes are held" in message
    assert "gunicorn master" in message and f"orbit clear {fleet_name} --all --yes" in message


def test_a_semaphore_limit_past_half_the_table_is_refused_when_it_is_made(fleet_name: str) -> None:
    with open_store(f"shm://{fleet_name}?capacity=2") as store:
        for limit in (SHM_LIMIT_MAX + 1, STORE_LAYOUT.capacity, 4096):
            with pytest.raises(InvalidSemaphoreLimit) as caught:
                store.semaphore("wide", limit)
            assert caught.value.kind is ErrorKind.INVALID_INPUT
            message = str(caught.value)
            assert f"1..{SHM_LIMIT_MAX} on an shm:// store" in message
            assert f"{STORE_LAYOUT.capacity} names" in message and f"got {limit}" in message
        assert store.semaphores() == []


def test_a_full_semaphore_of_the_largest_limit_answers_busy_and_leaves_room(
    fleet_name: str,
) -> None:
    with open_store(f"shm://{fleet_name}?capacity=2") as store:
        sem = store.semaphore("wide", SHM_LIMIT_MAX)
        leases = [sem.try_acquire(f"w{n}", 30.0) for n in range(SHM_LIMIT_MAX)]
        assert sorted(lease.slot for lease in leases if lease is not None) == list(
            range(SHM_LIMIT_MAX)
        )
        assert sem.try_acquire("late", 30.0) is None  # busy, not "lock table full"
        with pytest.raises(LockTimeout):
            sem.acquire("late", 30.0, timeout=0.05, auto_renew=False)
        # The other half of the table: every other name of the store still fits.
        room = STORE_LAYOUT.capacity - (SHM_LIMIT_MAX + 1)
        locks = [store.try_lock(f"job-{n}", "other", 30.0) for n in range(room)]
        assert all(lock is not None for lock in locks)
        assert len(store.locks()) == room
        with pytest.raises(StoreError, match="lock table full") as caught:  # the 256-name rule
            store.try_lock("one-too-many", "other", 30.0)
        assert caught.value.kind is ErrorKind.DATABASE
        assert sem.try_acquire("late", 30.0) is None  # still busy
        assert leases[0] is not None and leases[0].release()
        again = sem.try_acquire("late", 30.0)
        assert again is not None and again.slot == 0
