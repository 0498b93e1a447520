"""A renew or release of an expired or replaced tenure never touches the successor."""

from __future__ import annotations

import time

import pytest

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
