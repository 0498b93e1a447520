"""Random bytes over a slot, a header or the ring: LayoutMismatch or an absent key, nothing worse.

Never an IndexError or struct.error, never a key with two holders. The bytes are
written through the SHM object's file, as a stray writer in another process would.
Well-formed lies are out of scope (README, Security): eight zero bytes over a
live slot read as EMPTY, a lowered ``max_probe`` ends probes early, and either
can hide keys further along the chain.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from orbitive import Fleet, OrbitError
from orbitive.lock import (
    Acquired,
    IdExhausted,
    LayoutMismatch,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockTable,
    Occupied,
)
from orbitive.lock._layout import (
    HEADER_SIZE,
    MAX_PROBE_OFFSET,
    OCCUPIED,
    STATE_VERSION,
    TOMBSTONE,
)

from .._fleets import shm_path

#: Sixteen slots and twelve keys: long probe chains, so a broken slot sits inside some.
LAYOUT = LockLayout(
    state_kind=130, event_kind=131, capacity=16, payload_max=64, ring_capacity=16, frame_bytes=128
)
KEYS = [LockKey("tests.corrupt", f"key-{n}") for n in range(12)]
HOLDER = LockOwner(b"holder")
INTRUDER = LockOwner(b"intruder")
#: Header bytes whose change attach must notice: all but max_probe (20..24) and the three
#: counters (64..88: token, revision, conflicts), which change at run time.
VALIDATED_HEADER = [*range(0, 20), *range(24, 64), *range(88, HEADER_SIZE)]


@dataclass
class Scene:
    fleet: Fleet
    table: LockTable
    fd: int

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self.fd, data, offset)

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def fill(self) -> dict[LockKey, LockLease]:
        self.table.reset_transport()
        held = {}
        for key in KEYS:
            result = self.table.try_acquire(key, HOLDER, 60.0)
            assert isinstance(result, Acquired)
            held[key] = result.lease
        return held


@pytest.fixture
def scene(fleet_name: str) -> Iterator[Scene]:
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet, LAYOUT)
        fd = os.open(shm_path(fleet_name, LAYOUT.state_kind), os.O_RDWR)
        try:
            yield Scene(fleet, table, fd)
        finally:
            os.close(fd)
            table.close()
            table.unlink()


def slot_offset(slot: int) -> int:
    return HEADER_SIZE + slot * LAYOUT.slot_size


def check_one_holder_each(
    table: LockTable, held: dict[LockKey, LockLease], broken: int, *, exact: bool = True
) -> None:
    """Keys in other slots are intact, the broken slot's key is absent (or intact when
    ``exact``; else it may read with other owner bytes or ids, which nothing can check),
    and no key ever has two holders.

    Every key is looked up before any is acquired again: an acquire may repair a
    broken probe chain and so hide what the lookups would have found.
    """
    found = {key: table.current(key) for key in held}
    for key, lease in held.items():
        if lease.slot != broken:
            assert found[key] == lease, f"{key} lost although its slot was not touched"
        elif exact:
            assert found[key] in (None, lease), f"{key} reads as half-written: {found[key]}"
    for key, lease in held.items():
        result = table.try_acquire(key, INTRUDER, 60.0)
        if isinstance(result, Acquired):
            assert found[key] is None
            assert table.renew(lease, 60.0) is None, f"{key}: the old holder still renews"
            assert not table.release(lease), f"{key}: the old holder still releases"
            assert table.current(key) == result.lease
        else:
            assert result == Occupied(found[key])  # type: ignore[arg-type]  # None fails it
    listed = table.leases()
    assert len({lease.key for lease in listed}) == len(listed), "a key has two entries"
    assert {lease.key for lease in listed} >= set(KEYS)


@pytest.mark.parametrize("state_byte", ["random", "empty", "occupied", "tombstone"])
def test_random_bytes_over_a_slot_leave_its_key_absent_and_others_intact(
    scene: Scene, state_byte: str
) -> None:
    rng = random.Random(f"slot-{state_byte}")
    forced = {"empty": 0, "occupied": OCCUPIED, "tombstone": TOMBSTONE}.get(state_byte)
    for _ in range(60):
        held = scene.fill()
        broken = rng.choice([lease.slot for lease in held.values()])
        garbage = bytearray(rng.randbytes(LAYOUT.slot_size))
        if forced is not None:
            garbage[0] = forced
        scene.write(slot_offset(broken), bytes(garbage))
        check_one_holder_each(scene.table, held, broken)


def test_random_spans_inside_a_slot_never_give_two_holders(scene: Scene) -> None:
    rng = random.Random("spans")
    for _ in range(400):
        held = scene.fill()
        broken = rng.choice([lease.slot for lease in held.values()])
        start = rng.randrange(LAYOUT.slot_size)
        length = rng.randint(1, min(16, LAYOUT.slot_size - start))
        scene.write(slot_offset(broken) + start, rng.randbytes(length))
        check_one_holder_each(scene.table, held, broken, exact=False)


def test_random_bytes_over_empty_slots_are_ignored_or_reclaimed(scene: Scene) -> None:
    rng = random.Random("empty-slots")
    for _ in range(60):
        held = scene.fill()
        used = {lease.slot for lease in held.values()}
        broken = rng.choice([slot for slot in range(LAYOUT.capacity) if slot not in used])
        scene.write(slot_offset(broken), rng.randbytes(LAYOUT.slot_size))
        check_one_holder_each(scene.table, held, broken)


def attach(fleet_name: str) -> None:
    """Attach a fresh Fleet and LockTable; closing both however it ends."""
    with Fleet.join(fleet_name, 2) as fleet:
        LockTable(fleet, LAYOUT).close()


def test_random_bytes_over_the_header_give_layout_mismatch_on_attach(
    scene: Scene, fleet_name: str
) -> None:
    rng = random.Random("header")
    original = scene.read(0, HEADER_SIZE)
    for _ in range(50):
        scene.write(0, rng.randbytes(HEADER_SIZE))
        with pytest.raises(LayoutMismatch):
            attach(fleet_name)
        with pytest.raises(LayoutMismatch):
            LockTable(scene.fleet, LAYOUT)  # the same Fleet re-validates too
    scene.write(0, original)
    attach(fleet_name)


def test_any_changed_byte_of_a_validated_header_field_gives_layout_mismatch(
    scene: Scene, fleet_name: str
) -> None:
    rng = random.Random("header-bytes")
    original = scene.read(0, HEADER_SIZE)
    for offset in VALIDATED_HEADER:
        scene.write(offset, bytes([original[offset] ^ rng.randint(1, 255)]))
        with pytest.raises(LayoutMismatch):
            attach(fleet_name)
        scene.write(offset, original[offset : offset + 1])
    attach(fleet_name)


def test_random_bytes_over_the_ring_header_give_layout_mismatch_on_attach(
    scene: Scene, fleet_name: str
) -> None:
    rng = random.Random("ring-header")
    fd = os.open(shm_path(fleet_name, LAYOUT.event_kind), os.O_RDWR)
    try:
        original = os.pread(fd, 32, 0)
        for _ in range(30):
            os.pwrite(fd, rng.randbytes(32), 0)  # magic .. kind; 29.. is reserved
            with pytest.raises(LayoutMismatch):
                attach(fleet_name)
        os.pwrite(fd, original, 0)
        attach(fleet_name)
    finally:
        os.close(fd)


def test_random_counters_give_only_named_errors_and_one_holder(scene: Scene) -> None:
    rng = random.Random("counters")
    for _ in range(40):
        held = scene.fill()
        scene.write(24, rng.randbytes(16))
        for key, lease in held.items():
            assert scene.table.current(key) == lease
            assert scene.table.try_acquire(key, INTRUDER, 1.0) == Occupied(lease)
        with contextlib.suppress(IdExhausted):  # the counters may now be at their limit
            scene.table.try_acquire(LockKey("tests.corrupt", "new"), INTRUDER, 1.0)


def test_a_max_probe_above_the_true_bound_only_lengthens_probes(scene: Scene) -> None:
    """Up to 2**32 - 1: read as capacity - 1 (walk the whole table), never used to address."""
    rng = random.Random("max-probe")
    for value in [LAYOUT.capacity - 1, LAYOUT.capacity, 1 << 31, (1 << 32) - 1] + [
        rng.randrange(1 << 32) for _ in range(20)
    ]:
        held = scene.fill()
        true_bound = scene.table.statistics().max_probe
        scene.write(MAX_PROBE_OFFSET, max(value, true_bound).to_bytes(4, "little"))
        assert scene.table.statistics().max_probe == min(
            max(value, true_bound), LAYOUT.capacity - 1
        )
        check_one_holder_each(scene.table, held, -1)
        assert scene.table.current(LockKey("tests.corrupt", "absent")) is None


def test_random_bytes_over_the_ring_never_break_poll_or_state(
    scene: Scene, fleet_name: str
) -> None:
    rng = random.Random("ring")
    ring = shm_path(fleet_name, LAYOUT.event_kind)
    size = ring.stat().st_size
    fd = os.open(ring, os.O_RDWR)
    try:
        for _ in range(100):
            held = scene.fill()
            reader = LockTable.replay_retained(scene.fleet, LAYOUT)
            start = rng.randrange(64, size)  # the ring header is checked on attach
            os.pwrite(fd, rng.randbytes(rng.randint(1, 256)), start)
            try:
                polled = reader.poll()
            finally:
                reader.close()
            assert min(polled.overwritten, polled.unavailable, polled.malformed) >= 0
            for event in polled.events:  # decoded whole; the ring carries no checksum
                assert event.transition in ("acquired", "renewed", "released")
                assert event.state_revision > 0
            for key, lease in held.items():
                assert scene.table.current(key) == lease
            with contextlib.suppress(LayoutMismatch):  # this node's lane head was hit
                assert scene.table.force_release(KEYS[0])
    finally:
        os.close(fd)


def test_corrupt_table_errors_are_orbit_errors(scene: Scene, fleet_name: str) -> None:
    scene.write(0, b"\xff" * 8)
    with pytest.raises(OrbitError) as caught:
        attach(fleet_name)
    assert caught.value.kind == LAYOUT.state_kind


@pytest.mark.parametrize("older", [1, 2, 3])
def test_an_older_state_object_gives_layout_mismatch(
    scene: Scene, fleet_name: str, older: int
) -> None:
    """Version 1 had no probe bound, version 2 its counters at 24, version 3 no conflicts
    counter: each refuses the others."""
    original = scene.read(4, 2)
    assert original == STATE_VERSION.to_bytes(2, "little") == (4).to_bytes(2, "little")
    scene.write(4, older.to_bytes(2, "little"))
    with pytest.raises(LayoutMismatch, match="header"):
        attach(fleet_name)
    scene.write(4, original)
    attach(fleet_name)
