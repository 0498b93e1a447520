"""A damaged table: steps refuse by name, or skip what they cannot judge; none writes half.

The damage is written through the pool's own mapping, as a stray write by any
process of the fleet would land.
"""

from __future__ import annotations

from orbitive import Fleet
from orbitive.pool import Key, LocalReuse, Pool

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
