"""A damaged table: steps refuse by name, or skip what they cannot judge; none writes half.

The damage is written through the pool's own mapping, as a stray write by any
process of the fleet would land.
"""

from __future__ import annotations

import pytest

from orbitive import Fleet
from orbitive.pool import Key, LocalReuse, Pool
from orbitive.pool._layout import RES_BODY_AT

RES_INCARNATION = 8  # the owner's incarnation in a resource slot

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
