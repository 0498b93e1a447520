"""The probe bound (header ``max_probe``) keeps misses short in a table churned near full.

Churn near full uses up the EMPTY slots (a tombstone turns EMPTY only before an
EMPTY slot), so without the bound every miss walks the whole table. What a miss
inspects is observed through a planted copy of an absent key's entry: a probe
that reaches the copy finds the key (``current``, and ``try_acquire`` in C
answers Occupied); a copy one slot past ``max_probe`` is never found.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockLayout, LockLease, LockOwner, LockTable, Occupied
from orbitive.lock._layout import EMPTY, HEADER_SIZE

from .._fleets import new_fleet_name, remove_fleet_files

LAYOUT = LockLayout(
    state_kind=150, event_kind=151, capacity=1024, payload_max=64, ring_capacity=64,
    frame_bytes=128,
)  # fmt: skip
OWNER = LockOwner(b"churn")
STEPS = ["c", "python"]


@pytest.fixture(params=STEPS)
def churned(request: pytest.FixtureRequest) -> Iterator[LockTable]:
    """A SHM table filled to 90% with distinct keys, then churned (release one, acquire one)."""
    name = new_fleet_name()
    with Fleet.join(name, 2) as fleet:
        table = LockTable(fleet, LAYOUT)
        if request.param == "python":
            table._bind(None)
        churn(table, random.Random("churn"))
        yield table
        table.close()
        table.unlink()
    remove_fleet_files(name)


def churn(table: LockTable, rng: random.Random) -> None:
    held: list[LockLease] = []
    for n in range(LAYOUT.capacity * 9 // 10):
        held.append(acquired(table, LockKey("tests.bound", f"fill-{n}")))
    for n in range(4 * LAYOUT.capacity):
        index = rng.randrange(len(held))
        assert table.release(held[index])
        held[index] = acquired(table, LockKey("tests.bound", f"new-{n}"))


def acquired(table: LockTable, key: LockKey) -> LockLease:
    result = table.try_acquire(key, OWNER, 600.0)
    assert isinstance(result, Acquired), key
    return result.lease


def empty_slots(table: LockTable) -> int:
    stride = LAYOUT.slot_size
    return sum(table._buf[HEADER_SIZE + slot * stride] == EMPTY for slot in range(LAYOUT.capacity))


def test_churn_near_full_uses_up_empty_slots_but_the_bound_stays_small(
    churned: LockTable,
) -> None:
    statistics = churned.statistics()
    assert statistics.occupied_count == LAYOUT.capacity * 9 // 10
    assert empty_slots(churned) < LAYOUT.capacity // 100  # a miss would walk (nearly) everything
    # Linear probing at 90% load has long runs (about 230 slots here), yet far fewer
    # than the 1024 a miss walked without the bound; the bound grows only slowly.
    assert 0 < statistics.max_probe < LAYOUT.capacity // 3


def plant(table: LockTable, key: LockKey, past_bound: int) -> int:
    """Write a live entry of ``key`` at ``max_probe + past_bound`` from its home (over
    whatever was there); returns that displacement."""
    lease = acquired(table, key)
    stride, mask = LAYOUT.slot_size, LAYOUT.capacity - 1
    entry = bytes(table._buf[HEADER_SIZE + lease.slot * stride :][:stride])
    assert table.release(lease)
    displacement = table.statistics().max_probe + past_bound
    target = HEADER_SIZE + ((key.digest + displacement) & mask) * stride
    table._buf[target : target + stride] = entry
    return displacement


def chain_open(table: LockTable, key: LockKey, length: int) -> bool:
    """No EMPTY slot among the ``length`` slots from ``key``'s home on."""
    stride, mask = LAYOUT.slot_size, LAYOUT.capacity - 1
    offsets = (HEADER_SIZE + ((key.digest + n) & mask) * stride for n in range(length))
    return all(table._buf[offset : offset + 8] != bytes(8) for offset in offsets)


@pytest.mark.parametrize("steps", STEPS)
def test_a_miss_inspects_at_most_max_probe_plus_one_slots(churned: LockTable, steps: str) -> None:
    table = churned
    if steps == "python":
        table._bind(None)
    key = LockKey("tests.bound", "absent")
    assert table.current(key) is None
    bound = plant(table, key, 1) - 1
    assert table.statistics().max_probe == bound  # the planted copy raised nothing
    assert chain_open(table, key, bound + 1)  # only the bound ends this probe
    assert table.current(key) is None  # one slot past the bound: never inspected
    result = table.try_acquire(key, OWNER, 600.0)
    assert isinstance(result, Acquired)  # nor by try_acquire: the key counts as absent
    assert table.release(result.lease)
    last = plant(table, key, 0)  # the last slot within the bound
    reachable = chain_open(table, key, last)
    assert (table.current(key) is not None) is reachable
    assert isinstance(table.try_acquire(key, OWNER, 600.0), Occupied) is reachable
