"""A damaged table: steps refuse by name, or skip what they cannot judge; none writes half.

The damage is written through the pool's own mapping, as a stray write by any
process of the fleet would land.
"""

from __future__ import annotations

import pytest

from orbitive import Fleet
from orbitive._core._errors import LayoutMismatch, StaleError
from orbitive.pool import Key, LocalReuse, Pool
from orbitive.pool._availability import (
    FOR_IDLE_TIMEOUT,
    FOR_LIFETIME,
    FOR_WAITER,
    add_waiter,
    retire_idle,
)
from orbitive.pool._layout import (
    EPOCH_MAX,
    EPOCH_OFFSET,
    GENERATION_MAX,
    RES_BODY_AT,
    RES_KEY_INDEX,
)

RES_GENERATION = 4  # the registration's generation in a resource slot
RES_INCARNATION = 8  # the owner's incarnation
RES_EPOCH = 64  # the table epoch at registration

KEY = Key.digest(b"postgres://db/0")


def _poke(pool: Pool, offset: int, data: bytes) -> None:
    pool._table.buf[offset : offset + len(data)] = data


def test_member_bits_past_the_last_slot_are_ignored(fleet: Fleet) -> None:
    with Pool(fleet, key_capacity=4, lane_capacity=4) as pool:  # 40 slots, 64 bits
        rid = pool.register(KEY, 2)
        table = pool._table
        members = table.key_offset(table.keys[KEY]) + table.key_members
        _poke(pool, members + table.member_bytes - 1, b"\x80")
        assert [candidate.id for candidate in pool.candidates(KEY)] == [rid]
        assert pool.budget(KEY) == (1, 0)
        (key,) = pool.statistics().keys
        assert key.live == 1
        plan = pool.acquire(KEY)
        assert isinstance(plan, LocalReuse) and plan.lease.id == rid
        pool.cancel_reservation(plan.lease)


@pytest.mark.parametrize("owner", [1, 10, 0xFFFF])  # another node's, past the fleet, the last
def test_a_slot_owned_outside_its_lane_is_skipped_and_other_deaths_still_reported(
    pool: Pool, owner: int
) -> None:
    """Such a slot cannot be judged; before, reap_dead raised on every scan."""
    damaged, previous = pool.register(KEY, 1), pool.register(KEY, 1)
    table = pool._table
    life = pool.incarnation ^ 0x5A5A  # a previous life of this node: over
    _poke(pool, table.locate(previous) + RES_INCARNATION, life.to_bytes(8, "little"))
    _poke(pool, table.locate(damaged) + RES_BODY_AT, owner.to_bytes(2, "little"))
    assert pool.owners() == [(pool.node, life)]
    assert pool.reap_dead() == [(pool.node, life)]
    assert pool.reap_dead() == []
    assert [candidate.id for candidate in pool.candidates(KEY)] == []


def _set_epoch(pool: Pool, epoch: int) -> None:
    _poke(pool, EPOCH_OFFSET, epoch.to_bytes(8, "little"))


def test_register_refuses_a_table_of_epoch_zero_before_writing(pool: Pool) -> None:
    _set_epoch(pool, 0)
    before = bytes(pool._table.buf)
    with pytest.raises(LayoutMismatch, match="epoch 0"):
        pool.register(KEY, 1)
    with pytest.raises(LayoutMismatch, match="epoch 0"):
        pool.register_active(KEY, 1)
    assert bytes(pool._table.buf) == before  # no orphan slot, member bit or key
    assert pool.reset_all() > 0
    assert pool.candidates(KEY) == [] and pool.register(KEY, 1).epoch == pool.epoch


def test_reset_all_mends_the_largest_epoch(pool: Pool) -> None:
    rid = pool.register(KEY, 1)
    _set_epoch(pool, EPOCH_MAX)
    stale = pool.register(KEY, 1)
    assert (stale.epoch, rid.epoch) == (EPOCH_MAX, rid.epoch)
    epoch = pool.reset_all()
    assert 0 < epoch < EPOCH_MAX and pool.epoch == epoch
    assert pool.reset_all() > epoch  # larger again from there
    for old in (rid, stale):
        with pytest.raises(StaleError):
            pool.reserve(old)
    assert pool.register(KEY, 1).epoch == pool.epoch


@pytest.mark.parametrize(
    ("at", "value"),
    [(RES_GENERATION, 0), (RES_GENERATION, GENERATION_MAX + 1), (RES_EPOCH, 0)],
    ids=["generation-0", "generation-past-24-bits", "epoch-0"],
)
def test_a_slot_no_id_can_name_is_no_candidate(pool: Pool, at: int, value: int) -> None:
    damaged, intact = pool.register(KEY, 1), pool.register(KEY, 1)
    size = 4 if at == RES_GENERATION else 8
    _poke(pool, pool._table.locate(damaged) + at, value.to_bytes(size, "little"))
    assert [candidate.id for candidate in pool.candidates(KEY)] == [intact]
    plan = pool.acquire(KEY)
    assert isinstance(plan, LocalReuse) and plan.lease.id == intact
    pool.cancel_reservation(plan.lease)


def test_a_waiter_count_at_its_largest_stays_there_instead_of_raising(pool: Pool) -> None:
    """Garbage in a waiter counter: counting one more in saturates (before: struct.error)."""
    pool.register(KEY, 1)
    table = pool._table
    at = table.key_offset(table.keys[KEY]) + table.key_waiters + 4 * table.node
    _poke(pool, at, b"\xff" * 4)
    version = add_waiter(table, KEY, 1)
    assert version == pool.version(KEY)
    assert bytes(table.buf[at : at + 4]) == b"\xff" * 4
    add_waiter(table, KEY, -1)
    assert int.from_bytes(table.buf[at : at + 4], "little") == 0xFFFF_FFFE


@pytest.mark.parametrize("reason", [FOR_WAITER, FOR_IDLE_TIMEOUT, FOR_LIFETIME])
def test_an_idle_client_whose_key_index_is_past_the_key_table_is_retired(
    pool: Pool, reason: int
) -> None:
    """Before, the census of that index read past the mapping (struct.error every round)."""
    rid = pool.register(KEY, 1)
    table = pool._table
    _poke(pool, table.locate(rid) + RES_KEY_INDEX, (0xFFFF_FFFF).to_bytes(4, "little"))
    assert retire_idle(table, rid, reason, 4, 0) is True
    (candidate,) = pool.candidates(KEY)  # still a member of its key, now taken to close
    assert candidate.active == 1
    pool.unregister(rid)
    assert pool.candidates(KEY) == []
