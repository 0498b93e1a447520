"""Single-process rules of LockTable (seed 000), on a joined and on a local fleet."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from orbitive import Fleet, InvalidArgumentType
from orbitive.lock import (
    Acquired,
    EntryTooLarge,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockTable,
    Occupied,
)

from ..conftest import MakeFleet

KEY = LockKey("tests.table", "queue:1")
OTHER = LockKey("tests.table", "queue:2")
ALICE = LockOwner(b"alice")
BOB = LockOwner(b"bob")


def acquire(table: LockTable, key: LockKey, owner: LockOwner, ttl: float = 30.0) -> LockLease:
    result = table.try_acquire(key, owner, ttl)
    assert isinstance(result, Acquired), result
    return result.lease


def revision(table: LockTable) -> int:
    return table.statistics().last_state_revision


# -- acquire --------------------------------------------------------------------------------


def test_acquire_returns_lease_with_key_owner_and_deadline(table: LockTable) -> None:
    before = time.monotonic()
    lease = acquire(table, KEY, ALICE, ttl=5.0)
    after = time.monotonic()
    assert (lease.key, lease.owner) == (KEY, ALICE)
    assert lease.fencing_token == 1
    assert lease.node == table.fleet.node
    assert before - 0.002 <= lease.acquired_at <= after + 0.002
    assert lease.expires_at == pytest.approx(lease.acquired_at + 5.0, abs=0.002)
    assert 4.0 < lease.remaining() <= 5.0
    assert table.current(KEY) == lease


def test_acquire_of_held_key_is_occupied_with_the_holders_lease(table: LockTable) -> None:
    held = acquire(table, KEY, ALICE)
    result = table.try_acquire(KEY, BOB, 30.0)
    assert result == Occupied(held)
    assert table.current(KEY) == held


def test_acquire_with_the_same_owner_bytes_is_occupied_too(table: LockTable) -> None:
    held = acquire(table, KEY, ALICE)
    assert table.try_acquire(KEY, LockOwner(b"alice"), 30.0) == Occupied(held)
    assert table.try_acquire(KEY, b"alice", 30.0) == Occupied(held)


def test_only_the_key_decides_contention(table: LockTable) -> None:
    first = acquire(table, KEY, ALICE)
    second = acquire(table, OTHER, ALICE)
    third = acquire(table, LockKey("tests.other-namespace", "queue:1"), ALICE)
    assert len({first.lock_id, second.lock_id, third.lock_id}) == 3


def test_every_acquire_gets_a_strictly_larger_fencing_token(table: LockTable) -> None:
    tokens = []
    for round_ in range(20):
        lease = acquire(table, KEY if round_ % 2 else OTHER, LockOwner(f"owner-{round_}"))
        tokens.append(lease.fencing_token)
        assert table.release(lease)
    assert tokens == sorted(set(tokens))
    assert tokens[0] == 1


def test_str_and_bytes_owners_are_wrapped(table: LockTable) -> None:
    by_text = table.try_acquire(KEY, "text-owner", 30.0)
    by_bytes = table.try_acquire(OTHER, b"byte-owner", 30.0)
    assert isinstance(by_text, Acquired) and isinstance(by_bytes, Acquired)
    assert by_text.lease.owner == LockOwner(b"text-owner")
    assert by_bytes.lease.owner == LockOwner(b"byte-owner")
    assert table.release_owned(KEY, "text-owner")
    assert table.renew_owned(OTHER, b"byte-owner", 1.0) is not None


def test_sub_millisecond_ttl_is_rounded_up_to_one_millisecond(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE, ttl=1e-6)
    assert lease.expires_at - lease.acquired_at == pytest.approx(0.001)


# -- renew ----------------------------------------------------------------------------------


def renewed_within(call: Callable[[], LockLease | None], ttl: float) -> LockLease:
    """Run a renew; check its deadline is ``ttl`` after a moment inside the call."""
    before = time.monotonic()
    renewed = call()
    after = time.monotonic()
    assert renewed is not None
    # The table keeps whole milliseconds: allow one either side.
    assert before + ttl - 0.001 <= renewed.expires_at <= after + ttl + 0.001
    return renewed


def test_renew_sets_a_new_full_window_from_now_and_keeps_the_token(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE, ttl=10.0)
    time.sleep(0.05)
    # Not additive: about now + 1 s, far below the 10 s still left on the old window.
    renewed = renewed_within(lambda: table.renew(lease, 1.0), 1.0)
    assert (renewed.lock_id, renewed.fencing_token) == (lease.lock_id, lease.fencing_token)
    assert renewed.acquired_at == lease.acquired_at
    assert renewed.state_revision == lease.state_revision + 1
    longer = renewed_within(lambda: table.renew(renewed, 20.0), 20.0)
    assert table.current(KEY) == longer


def test_renew_owned_renews_the_tenure_with_exactly_that_owner(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE, ttl=10.0)
    assert table.renew_owned(KEY, BOB, 5.0) is None
    assert table.renew_owned(KEY, b"alic", 5.0) is None
    renewed = renewed_within(lambda: table.renew_owned(KEY, ALICE, 5.0), 5.0)
    assert renewed.lock_id == lease.lock_id


def test_renew_of_an_old_lease_object_of_the_same_tenure_still_renews(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE)
    assert table.renew(lease, 30.0) is not None
    assert table.renew(lease, 30.0) is not None  # same lock id: same tenure


def test_renew_of_a_released_tenure_returns_none(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE)
    assert table.release(lease)
    assert table.renew(lease, 30.0) is None
    assert table.current(KEY) is None


# -- release --------------------------------------------------------------------------------


def test_release_ends_the_tenure_once(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE)
    assert table.release(lease)
    assert not table.release(lease)
    assert table.current(KEY) is None
    assert acquire(table, KEY, BOB).fencing_token > lease.fencing_token


def test_release_owned_needs_exactly_the_stored_owner(table: LockTable) -> None:
    acquire(table, KEY, ALICE)
    assert not table.release_owned(KEY, BOB)
    assert not table.release_owned(KEY, b"alice-and-more")
    assert not table.release_owned(OTHER, ALICE)
    assert table.current(KEY) is not None
    assert table.release_owned(KEY, ALICE)
    assert not table.release_owned(KEY, ALICE)
    assert table.current(KEY) is None


def test_force_release_removes_a_live_entry_without_owner(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE)
    assert table.force_release(KEY)
    assert not table.force_release(KEY)
    assert table.current(KEY) is None
    assert table.renew(lease, 30.0) is None
    assert not table.release(lease)
    assert acquire(table, KEY, BOB).fencing_token > lease.fencing_token


def test_force_release_of_an_expired_entry_returns_false(table: LockTable) -> None:
    acquire(table, KEY, ALICE, ttl=0.01)
    time.sleep(0.03)
    assert not table.force_release(KEY)


def test_force_release_of_a_live_entry_is_logged_once(
    table: LockTable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    acquire(table, KEY, ALICE)
    assert table.force_release(KEY)
    assert not table.force_release(KEY)  # nothing live: nothing to say
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "orbitive.lock",
            logging.WARNING,
            f"lock table of fleet {table.fleet.name!r} (kind 228): key 'tests.table/queue:1' "
            "force-released; its holder has lost it",
        )
    ]


# -- state_revision ------------------------------------------------------------------------


def test_state_revision_increments_on_acquire_renew_and_release(table: LockTable) -> None:
    start = revision(table)
    lease = acquire(table, KEY, ALICE)
    assert lease.state_revision == revision(table) == start + 1
    renewed = table.renew(lease, 30.0)
    assert renewed is not None
    assert renewed.state_revision == revision(table) == start + 2
    assert table.renew_owned(KEY, ALICE, 30.0) is not None
    assert revision(table) == start + 3
    assert table.release(lease)
    assert revision(table) == start + 4
    acquire(table, KEY, ALICE)
    assert table.release_owned(KEY, ALICE)
    assert revision(table) == start + 6
    acquire(table, KEY, ALICE)
    assert table.force_release(KEY)
    assert revision(table) == start + 8


def test_state_revision_is_unchanged_by_lookups_and_refused_operations(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE)
    start = revision(table)
    table.current(KEY)
    table.restore(KEY, ALICE)
    table.leases()
    table.poll()
    assert isinstance(table.try_acquire(KEY, BOB, 30.0), Occupied)
    assert not table.release_owned(KEY, BOB)
    assert table.renew_owned(KEY, BOB, 30.0) is None
    assert not table.force_release(OTHER)
    assert table.release(lease)
    assert revision(table) == start + 1
    assert not table.release(lease)
    assert table.renew(lease, 1.0) is None
    assert revision(table) == start + 1


# -- replace: a key taken for another owner, unless other keys are held (store semaphores) ---

SLOTS = tuple(LockKey("tests.table", f"slot:{index}") for index in range(3))
#: More keys than an eighth of the default table's 256 slots: looked for in one pass.
MANY = tuple(LockKey("tests.table", f"slot:{index}") for index in range(40))


@pytest.mark.parametrize("unless", [SLOTS, MANY], ids=["probed", "one-pass"])
def test_replace_takes_the_key_for_another_owner_when_no_key_of_unless_is_held(
    table: LockTable, unless: tuple[LockKey, ...]
) -> None:
    old = acquire(table, KEY, ALICE)
    acquire(table, unless[-1], BOB, ttl=0.01)  # expired: not held
    acquire(table, OTHER, BOB)  # held, but not one of unless
    time.sleep(0.03)
    table.poll()
    start = revision(table)
    result = table._replace(old, BOB, 5.0, unless)
    assert isinstance(result, Acquired)
    new = result.lease
    assert (new.key, new.owner) == (KEY, BOB) and new.fencing_token > old.fencing_token
    assert 4.0 < new.remaining() <= 5.0
    assert table.current(KEY) == new and revision(table) == start + 2
    transitions = [(event.transition, event.lock_id) for event in table.poll().events]
    assert transitions == [("released", old.lock_id), ("acquired", new.lock_id)]
    assert not table.release(old) and table.renew(old, 1.0) is None


@pytest.mark.parametrize("unless", [SLOTS, MANY], ids=["probed", "one-pass"])
def test_replace_changes_nothing_while_a_key_of_unless_is_held(
    table: LockTable, unless: tuple[LockKey, ...]
) -> None:
    old = acquire(table, KEY, ALICE)
    holder = acquire(table, unless[-1], BOB)
    start = revision(table)
    assert table._replace(old, BOB, 30.0, unless) == Occupied(holder)
    assert table.current(KEY) == old and revision(table) == start


def test_replace_of_a_tenure_that_is_not_live_changes_nothing(table: LockTable) -> None:
    old = acquire(table, KEY, ALICE)
    assert table.release(old)
    assert table._replace(old, BOB, 30.0, ()) is None
    successor = acquire(table, KEY, ALICE)
    start = revision(table)
    assert table._replace(old, BOB, 30.0, ()) is None  # the same owner, another tenure
    assert table.current(KEY) == successor and revision(table) == start


# -- lookups --------------------------------------------------------------------------------


def test_current_restore_and_leases_show_exactly_the_live_entries(table: LockTable) -> None:
    first = acquire(table, KEY, ALICE)
    second = acquire(table, OTHER, BOB)
    acquire(table, LockKey("tests.table", "short"), BOB, ttl=0.01)
    time.sleep(0.03)
    assert table.current(KEY) == first
    assert table.restore(KEY, ALICE) == first
    assert table.restore(KEY, b"alice") == first
    assert table.restore(KEY, BOB) is None
    assert table.restore(LockKey("tests.table", "absent"), ALICE) is None
    assert sorted(table.leases(), key=lambda lease: lease.fencing_token) == [first, second]


def test_expired_entry_reads_as_absent_and_is_reclaimed_on_acquire(table: LockTable) -> None:
    lease = acquire(table, KEY, ALICE, ttl=0.02)
    time.sleep(0.04)
    assert table.current(KEY) is None
    assert table.restore(KEY, ALICE) is None
    assert table.leases() == []
    successor = acquire(table, KEY, BOB)
    assert successor.fencing_token > lease.fencing_token
    assert table.statistics().occupied_count == 1


# -- entry size ------------------------------------------------------------------------------


def test_entry_of_exactly_payload_max_bytes_fits(table: LockTable) -> None:
    key = LockKey("n" * 100, "l" * 500)
    owner = LockOwner(b"o" * (960 - 600))
    lease = acquire(table, key, owner)
    assert table.current(key) == lease
    assert any(event.key == key for event in table.poll().events)


def test_entry_one_byte_over_payload_max_is_entry_too_large_everywhere(table: LockTable) -> None:
    key = LockKey("n" * 100, "l" * 500)
    owner = LockOwner(b"o" * (961 - 600))
    start = revision(table)
    with pytest.raises(EntryTooLarge) as caught:
        table.try_acquire(key, owner, 30.0)
    assert caught.value.key == key
    assert isinstance(caught.value, ValueError)
    for call in (
        lambda: table.renew_owned(key, owner, 30.0),
        lambda: table.release_owned(key, owner),
        lambda: table.restore(key, owner),
    ):
        with pytest.raises(EntryTooLarge):
            call()
    assert revision(table) == start
    assert table.leases() == []


def test_payload_max_of_a_custom_layout_bounds_the_entry(make_fleet: MakeFleet) -> None:
    layout = LockLayout(state_kind=90, event_kind=91, payload_max=16, frame_bytes=64)
    table = LockTable(make_fleet(), layout)
    try:
        acquire(table, LockKey("ns", "label"), LockOwner(b"o" * 9))  # 2 + 5 + 9 = 16
        with pytest.raises(EntryTooLarge):
            table.try_acquire(LockKey("ns", "label2"), LockOwner(b"o" * 9), 30.0)
    finally:
        table.close()
        table.unlink()


# -- argument types --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, "queue:1", ("ns", "label"), b"ns/label"])
def test_a_key_that_is_not_a_lock_key_is_a_type_error(table: LockTable, bad: Any) -> None:
    for call in (
        lambda: table.try_acquire(bad, ALICE, 30.0),
        lambda: table.current(bad),
        lambda: table.force_release(bad),
        lambda: table.release_owned(bad, ALICE),
    ):
        with pytest.raises(InvalidArgumentType):
            call()


@pytest.mark.parametrize("bad", [None, 42, ("key", "owner"), {"lock_id": 1}])
def test_a_lease_that_is_not_a_lock_lease_is_a_type_error(table: LockTable, bad: Any) -> None:
    with pytest.raises(InvalidArgumentType):
        table.renew(bad, 30.0)
    with pytest.raises(InvalidArgumentType):
        table.release(bad)


def test_a_forged_lease_with_a_wrong_lock_id_touches_nothing(table: LockTable) -> None:
    held = acquire(table, KEY, ALICE)
    forged = held._replace(lock_id=held.lock_id + 1)
    assert table.renew(forged, 30.0) is None
    assert not table.release(forged)
    wrong_slot = held._replace(slot=(held.slot + 1) % 256)
    assert table.renew(wrong_slot, 30.0) is not None  # the hint is only a hint
    out_of_range = held._replace(slot=10**9)
    assert table.release(out_of_range)
    assert table.current(KEY) is None


def test_tables_on_a_local_fleet_share_memory_only_through_the_same_fleet(fleet_name: str) -> None:
    fleet = Fleet.local(fleet_name, 2)
    one, two = LockTable(fleet), LockTable(fleet)
    elsewhere = LockTable(Fleet.local(fleet_name, 2))
    lease = acquire(one, KEY, ALICE)
    assert two.current(KEY) == lease
    assert elsewhere.current(KEY) is None
