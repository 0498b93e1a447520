"""The C steps (``_fastpath.c``) against the Python steps: same results, same bytes.

Two tables of one small layout (eight slots, twelve keys: long probe chains,
tombstones and reclaimed runs) get the same random operations; one runs
try_acquire and release in C, the other in Python. After every operation the
results, the state bytes (the header with max_probe, and all but each slot's
two timestamps) and the transitions read from the rings must be equal. A
second layout (sixteen slots, forty-eight keys whose homes are four adjacent
slots) churns near full, so max_probe grows, probes stop at it and inserts
walk past it.
"""

from __future__ import annotations

import dataclasses
import mmap
import random
import time
from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive._core import _fork
from orbitive.lock import (
    Acquired,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockTable,
    Occupied,
    StateFull,
    _lock_table,
)
from orbitive.lock._layout import HEADER_SIZE, MAX_PROBE_OFFSET
from orbitive.lock._opening import _TYPES

from .._capabilities import require_c_steps
from .._fleets import new_fleet_name, remove_fleet_files

LAYOUT = LockLayout(
    state_kind=140, event_kind=141, capacity=8, payload_max=48, ring_capacity=64, frame_bytes=96
)
KEYS = [LockKey("tests.fast", f"key-{n}") for n in range(12)]
CHURN = dataclasses.replace(LAYOUT, capacity=16)
#: Keys whose home slots in CHURN are 0..3: chains run far past their homes.
COLLIDING = [
    key for key in (LockKey("tests.fast", f"churn-{n}") for n in range(1000)) if key.digest & 15 < 4
][:48]
OWNERS = [LockOwner(b"alice"), LockOwner(b"bob")]
#: Slot bytes 32..48 hold acquired_at and expires_at, which differ by a clock tick.
TIMES = slice(32, 48)


def tables(layout: LockLayout) -> Iterator[tuple[LockTable, LockTable]]:
    names = [new_fleet_name(), new_fleet_name()]
    fleets = [Fleet.join(name, 2) for name in names]
    fast, slow = (LockTable(fleet, layout) for fleet in fleets)
    slow._bind(None)  # the Python reference
    yield fast, slow
    for fleet, name in zip(fleets, names, strict=True):
        fleet.close()
        remove_fleet_files(name)


@pytest.fixture
def pair() -> Iterator[tuple[LockTable, LockTable]]:
    yield from tables(LAYOUT)


@pytest.fixture
def churn_pair() -> Iterator[tuple[LockTable, LockTable]]:
    yield from tables(CHURN)


def test_the_c_steps_are_built_and_used(pair: tuple[LockTable, LockTable]) -> None:
    require_c_steps(pair[0]._steps, "orbitive.lock._fastpath")


def state_without_times(table: LockTable) -> list[bytes]:
    buf, stride = table._buf, table.layout.slot_size
    slots = [bytes(buf[HEADER_SIZE + n * stride :][:stride]) for n in range(table.layout.capacity)]
    return [bytes(buf[:HEADER_SIZE])] + [s[: TIMES.start] + s[TIMES.stop :] for s in slots]


def without_times(table: LockTable) -> list[object]:
    """The transitions since the last poll, without their deadlines."""
    return [dataclasses.replace(event, expires_at=None) for event in table.poll().events]


def shape(result: object) -> object:
    """A result without its clock readings."""
    if isinstance(result, (Acquired, Occupied)):
        return type(result), shape(result.lease)
    if isinstance(result, LockLease):
        return result._replace(acquired_at=0.0, expires_at=0.0)
    return result


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str
    key: LockKey = KEYS[0]
    owner: LockOwner = OWNERS[0]
    ttl: float = 60.0
    index: int = 0  # of an earlier lease, for release and renew

    @classmethod
    def draw(cls, rng: random.Random, leases: int, keys: list[LockKey] = KEYS) -> Op:
        kind = rng.choice(["acquire"] * 5 + ["release"] * 2 + ["handing", "renew", "force"])
        if kind in ("release", "handing", "renew") and leases:
            return cls(kind, index=rng.randrange(leases))
        if kind == "force":
            return cls(kind, rng.choice(keys))
        ttl = rng.choice([60.0, 60.0, 0.001])
        return cls("acquire", rng.choice(keys), rng.choice(OWNERS), ttl)

    def run(self, table: LockTable, leases: list[LockLease]) -> object:
        if self.kind == "release":
            return table.release(leases[self.index])
        if self.kind == "handing":
            return table._release_handing(leases[self.index])
        if self.kind == "renew":
            return table.renew(leases[self.index], 60.0)
        if self.kind == "force":
            return table.force_release(self.key)
        try:
            result = table.try_acquire(self.key, self.owner, self.ttl)
        except StateFull:
            return StateFull
        if isinstance(result, Acquired):
            leases.append(result.lease)
        return result


def run_both(
    pair: tuple[LockTable, LockTable], seed: int, keys: list[LockKey], steps: int
) -> list[object]:
    """Run the same random operations on both tables, comparing after each; the results."""
    rng = random.Random(seed)
    fast, slow = pair
    fast_leases: list[LockLease] = []
    slow_leases: list[LockLease] = []
    results = []
    for _ in range(steps):
        op = Op.draw(rng, len(fast_leases), keys)
        result = shape(op.run(fast, fast_leases))
        assert result == shape(op.run(slow, slow_leases)), op
        results.append(result)
        if op.ttl < 1.0:
            time.sleep(0.004)  # a 1 ms tenure is over for both tables before the next step
        assert state_without_times(fast) == state_without_times(slow)
        assert without_times(fast) == without_times(slow)
    return results


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_steps_leave_the_same_table(
    pair: tuple[LockTable, LockTable], seed: int
) -> None:
    run_both(pair, seed, KEYS, 400)


def test_the_churn_keys_collide() -> None:
    assert len(COLLIDING) == 48


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_steps_agree_on_the_probe_bound_under_churn_near_full(
    churn_pair: tuple[LockTable, LockTable], seed: int
) -> None:
    slow = churn_pair[1]
    walked_past: list[int] = []
    free_after = slow._reference.free_after

    def recording(slot: int, count: int, now: int, digest: int) -> int:
        walked_past.append(free_after(slot, count, now, digest))
        return walked_past[-1]

    slow._reference.free_after = recording  # type: ignore[method-assign]
    results = run_both(churn_pair, seed, COLLIDING, 500)
    assert StateFull in results  # the table was full at times
    assert any(slot < CHURN.capacity for slot in walked_past)  # inserts went past the bound
    fast = churn_pair[0]
    bound = int.from_bytes(fast._buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + 4], "little")
    assert 4 < bound < CHURN.capacity  # entries sat past the homes' run, the bound followed


def test_c_and_python_releases_that_find_a_waiter_leave_the_same_key_word(
    pair: tuple[LockTable, LockTable],
) -> None:
    geometry = pair[0]._ring.geometry
    for table in pair:  # node 1 shows a thread waiting for any key: every release wakes
        at = geometry.waiting_offset + 4
        table._ring.buf[at : at + 4] = bytes([255] * 4)
    releases: dict[int, int] = {}  # per key word (offset)
    for n in range(3 * len(KEYS)):
        key = KEYS[n % len(KEYS)]
        word_at = geometry.key_word(key.digest)
        releases[word_at] = releases.get(word_at, 0) + 1
        for table in pair:
            got = table.try_acquire(key, OWNERS[0], 60.0)
            assert isinstance(got, Acquired)
            assert table._release_handing(got.lease) == (1, releases[word_at])
            assert table._release_handing(got.lease) == (-1, 0)


def test_release_of_a_lease_with_impossible_fields_is_false(table: LockTable) -> None:
    key, owner = LockKey("tests.fast", "odd"), LockOwner(b"owner")
    lease = table.try_acquire(key, owner, 60.0)
    assert isinstance(lease, Acquired)
    for odd in (lease.lease._replace(lock_id=-1), lease.lease._replace(lock_id=1 << 70)):
        assert table.release(odd) is False
    assert table.release(lease.lease._replace(slot=-5)) is True  # the slot is only a hint


def test_a_slot_hint_at_the_home_slot_still_finds_a_tenure_further_down(
    pair: tuple[LockTable, LockTable],
) -> None:
    home = {key: key.digest & 7 for key in KEYS}
    first, second = next(
        (a, b) for a in KEYS for b in KEYS if a != b and home[a] == home[b]
    )  # two keys with one home slot: the second lands past it
    for table in pair:
        leases = [table.try_acquire(key, OWNERS[0], 60.0) for key in (first, second)]
        assert all(isinstance(result, Acquired) for result in leases)
        lease = leases[1].lease
        assert lease.slot != home[second]
        assert table.release(lease._replace(slot=home[second])) is True


def test_an_owner_of_a_bytes_subclass_works_on_both_steps(
    pair: tuple[LockTable, LockTable],
) -> None:
    class Token(bytes):
        pass

    for table in pair:
        result = table.try_acquire(KEYS[0], Token(b"worker"), 60.0)
        assert isinstance(result, Acquired)
        assert table.release(result.lease) is True


def test_steps_that_failed_to_initialise_refuse_to_run(table: LockTable) -> None:
    from orbitive.lock._fastpath import Steps  # noqa: PLC0415 - only where it was built

    steps = Steps.__new__(Steps)
    block = mmap.mmap(-1, 4096)
    init = steps.__init__  # type: ignore[misc]
    geometry = (3, 64, 16, 1, 128, 192, 8, 128, 64, 0, 0)
    with pytest.raises(ValueError, match="geometry"):
        init(b"", b"", block, *geometry, print, 1, _TYPES, _fork, table, _lock_table, print)
    valid = (8, 128, 64, 1, 192, 256, 8, 160, 100, 0, 0)
    for types in ((int,) * 5, (int, int, tuple, int, int)):
        with pytest.raises(TypeError, match=r"tuple type|instance slot"):
            init(b"", b"", block, *valid, print, 1, types, _fork, table, _lock_table, print)
    key, owner = LockKey("tests.fast", "never"), LockOwner(b"owner")
    held = table.try_acquire(key, owner, 1.0)
    assert isinstance(held, Acquired)
    for call in (  # never a read through the null mappings
        lambda: steps.try_acquire(key, owner, 1.0),
        lambda: steps.release(held.lease),
        lambda: steps.renew(held.lease, 1.0),
    ):
        with pytest.raises(ValueError, match="not initialised"):
            call()


def test_the_c_operations_take_keywords_and_hand_odd_calls_to_python(
    pair: tuple[LockTable, LockTable],
) -> None:
    fast = pair[0]
    require_c_steps(fast._steps, "orbitive.lock._fastpath")
    assert "try_acquire" in vars(fast), "the C operation is the table's own method"
    key = KEYS[0]
    held = fast.try_acquire(owner=OWNERS[0], ttl=60, key=key)
    assert isinstance(held, Acquired)
    renewed = fast.renew(ttl=30.0, lease=held.lease)
    assert renewed is not None and renewed.fencing_token == held.lease.fencing_token
    with pytest.raises(TypeError):
        fast.try_acquire(key, OWNERS[0], ttl=1.0, extra=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fast.release(renewed, lease=renewed)  # type: ignore[misc]
    assert fast.release(lease=renewed) is True
    assert isinstance(fast.try_acquire(key, "a str owner", 60.0), Acquired)  # via Python


def test_a_call_with_wrong_arguments_fails_as_on_the_python_path(
    pair: tuple[LockTable, LockTable],
) -> None:
    fast, slow = pair
    require_c_steps(fast._steps, "orbitive.lock._fastpath")
    key, owner = KEYS[0], OWNERS[0]
    lease = slow.try_acquire(key, owner, 60.0)
    assert isinstance(lease, Acquired)
    calls: list[Callable[[LockTable], object]] = [
        lambda table: table.try_acquire(),  # type: ignore[call-arg]
        lambda table: table.try_acquire(key, owner, 1.0, key=key),  # type: ignore[misc]
        lambda table: table.try_acquire(key, owner, tll=1.0),  # type: ignore[call-arg]
        lambda table: table.try_acquire(*range(12)),
        lambda table: table.release(lease.lease, lease=lease.lease),  # type: ignore[misc]
        lambda table: table.renew(lease.lease, 1.0, 2.0),  # type: ignore[call-arg]
    ]
    for call in calls:
        messages = []
        for table in pair:
            with pytest.raises(TypeError) as raised:
                call(table)
            messages.append(str(raised.value))
        assert messages[0] == messages[1]
