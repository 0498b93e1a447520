"""A full table refuses a new key with StateFull and never evicts a live one."""

from __future__ import annotations

import time

import pytest

from orbitive.lock import Acquired, LockKey, LockLease, LockOwner, LockTable, StateFull

OWNER = LockOwner(b"filler")


def fill(table: LockTable, short_ttl: float) -> tuple[list[LockLease], LockLease]:
    """255 keys for a minute and one for ``short_ttl`` seconds."""
    held = []
    for index in range(255):
        result = table.try_acquire(LockKey("tests.full", f"key-{index}"), OWNER, 60.0)
        assert isinstance(result, Acquired), index
        held.append(result.lease)
    short = table.try_acquire(LockKey("tests.full", "short"), OWNER, short_ttl)
    assert isinstance(short, Acquired)
    return held, short.lease


def test_257th_key_gives_state_full_and_nothing_is_evicted(table: LockTable) -> None:
    held, short = fill(table, short_ttl=5.0)
    newcomer = LockKey("tests.full", "newcomer")
    before = table.statistics()
    with pytest.raises(StateFull) as caught:
        table.try_acquire(newcomer, OWNER, 60.0)
    assert caught.value.key == newcomer
    assert caught.value.fleet == table.fleet.name
    assert "256" in str(caught.value)
    assert table.statistics() == before
    assert set(table.leases()) == {*held, short}
    assert table.current(newcomer) is None
    # A held key still answers Occupied, a full table or not.
    assert not isinstance(table.try_acquire(held[100].key, OWNER, 1.0), Acquired)


def test_after_one_key_expires_a_new_key_fits(table: LockTable) -> None:
    held, short = fill(table, short_ttl=0.5)
    with pytest.raises(StateFull):
        table.try_acquire(LockKey("tests.full", "newcomer"), OWNER, 60.0)
    time.sleep(max(0.0, short.expires_at - time.monotonic()) + 0.02)
    result = table.try_acquire(LockKey("tests.full", "newcomer"), OWNER, 60.0)
    assert isinstance(result, Acquired)
    assert all(table.current(lease.key) == lease for lease in held)
    with pytest.raises(StateFull):
        table.try_acquire(LockKey("tests.full", "one-more"), OWNER, 60.0)


def test_after_a_release_a_new_key_fits(table: LockTable) -> None:
    held, _ = fill(table, short_ttl=60.0)
    assert table.release(held[17])
    result = table.try_acquire(LockKey("tests.full", "newcomer"), OWNER, 60.0)
    assert isinstance(result, Acquired)
    assert len(table.leases()) == 256
