"""A renew or release of an expired or replaced tenure never touches the successor."""

from __future__ import annotations

import time

import pytest

from orbitive import InvalidArgumentType
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

KEY = LockKey("tests.stale", "job")


@pytest.mark.parametrize("owners", ["distinct-owners", "same-owner-bytes"])
def test_renew_and_release_after_ttl_return_none_and_false_and_successor_untouched(
    table: LockTable, owners: str
) -> None:
    owner_a = LockOwner(b"worker")
    owner_b = LockOwner(b"worker" if owners == "same-owner-bytes" else b"other")
    first = table.try_acquire(KEY, owner_a, ttl=0.2)
    assert isinstance(first, Acquired)
    time.sleep(0.3)
    second = table.try_acquire(KEY, owner_b, ttl=30.0)
    assert isinstance(second, Acquired)
    successor = second.lease
    assert successor.fencing_token > first.lease.fencing_token

    assert table.renew(first.lease, 30.0) is None
    assert table.release(first.lease) is False

    assert table.current(KEY) == successor
    assert table.statistics().last_state_revision == successor.state_revision
    assert table.renew(successor, 30.0) is not None


def test_renew_after_ttl_returns_none_even_when_nobody_took_the_key(table: LockTable) -> None:
    first = table.try_acquire(KEY, LockOwner(b"worker"), ttl=0.02)
    assert isinstance(first, Acquired)
    time.sleep(0.05)
    assert table.renew(first.lease, 30.0) is None
    assert table.renew_owned(KEY, LockOwner(b"worker"), 30.0) is None
    assert table.release(first.lease) is False
    assert table.release_owned(KEY, LockOwner(b"worker")) is False
    assert table.current(KEY) is None


def test_release_of_a_force_released_tenure_spares_the_same_owner_successor(
    table: LockTable,
) -> None:
    owner = LockOwner(b"worker")
    first = table.try_acquire(KEY, owner, ttl=30.0)
    assert isinstance(first, Acquired)
    assert table.force_release(KEY)
    second = table.try_acquire(KEY, owner, ttl=30.0)
    assert isinstance(second, Acquired)
    assert table.release(first.lease) is False
    assert table.renew(first.lease, 1.0) is None
    assert table.current(KEY) == second.lease


def test_a_lease_with_other_owner_bytes_neither_renews_nor_releases(table: LockTable) -> None:
    held = table.try_acquire(KEY, LockOwner(b"alice"), 30.0)
    assert isinstance(held, Acquired)
    forged = held.lease._replace(owner=LockOwner(b"mallory"))  # e.g. from an Occupied result
    assert table.renew(forged, 30.0) is None
    assert table.release(forged) is False
    assert table.release(held.lease) is True


def test_a_lease_too_large_for_this_table_is_no_tenure_of_it(table: LockTable) -> None:
    held = table.try_acquire(KEY, LockOwner(b"alice"), 30.0)
    assert isinstance(held, Acquired)
    huge = held.lease._replace(owner=LockOwner(b"x" * (table.layout.payload_max + 1)))
    assert table.renew(huge, 30.0) is None
    assert table.release(huge) is False
    assert table.current(KEY) == held.lease


@pytest.mark.parametrize(
    "change",
    [{"owner": b"alice"}, {"key": "tests.stale/job"}, {"lock_id": 1.0}, {"lock_id": True}],
)
def test_a_lease_with_fields_of_other_types_is_refused_by_name(
    table: LockTable, change: dict[str, object]
) -> None:
    held = table.try_acquire(KEY, LockOwner(b"alice"), 30.0)
    assert isinstance(held, Acquired)
    odd = held.lease._replace(**change)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType):
        table.release(odd)
    with pytest.raises(InvalidArgumentType):
        table.renew(odd, 30.0)
    assert table.release(held.lease) is True
