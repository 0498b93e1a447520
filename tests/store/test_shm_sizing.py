"""``shm://`` stores: objects sized to the store, the fleet capacity, what a full fleet says."""

from __future__ import annotations

import pytest

from orbitive import CapacityMismatch, Fleet
from orbitive.lock import LockKey, LockTable
from orbitive.store import ErrorKind, InvalidStoreUrl, StoreError, open_store
from orbitive.store._shm import SHM_CAPACITY_DEFAULT, STORE_LAYOUT, footprint

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
