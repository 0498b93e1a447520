"""Hostile bytes in a robust mutex: every case is a named error, never a hang or a crash.

glibc reads the mutex's type word on every lock: a foreign value (0, -1, a
priority-inheriting or process-private kind) made it a mutex of another kind,
which no longer excludes processes, wedges or aborts. A futex word naming the
locking thread itself made ``pthread_mutex_lock`` wait for ever. Both twins
(C and ctypes), on the table's C operations and on its Python ones, now refuse
with :class:`LayoutMismatch`. Each case runs in a child, so a regression to a
hang fails by timeout instead of wedging the suite.

A changed mechanism byte let a new peer use flock while the others locked the
mutex (or the reverse): no exclusion between them, silently. A flock object's
mutex bytes are zero, so each direction is now refused.

A type word changed while a peer held the mutex made that peer unlock it as
another kind of mutex, waking no waiter of another process: they waited for
ever. The holder now puts the word back before it unlocks.

A futex word forged to name a thread that is already waiting for the mutex was
checked only before the wait: the waiter then waited, slice after slice, for
itself. It now looks at the word after every slice.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest

from orbitive import Fleet, LayoutMismatch
from orbitive._core._robust import SECTION_MUTEX_AT, SECTION_STRIPE_BYTES
from orbitive._core._section import FLOCK, ROBUST_MUTEX
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable, Occupied, _steps

from .._children import KEY
from .._processes import Channel, Processes
from .conftest import TWINS
from .test_section import use_twin

#: (offset in the mutex, bytes) written over it; "self" is this thread's id as the futex word.
CORRUPTIONS: dict[str, list[tuple[int, bytes]]] = {
    "type word 0 (a plain private mutex)": [(16, struct.pack("<i", 0))],
    "type word -1": [(16, struct.pack("<i", -1))],
    "type word of a robust PI mutex": [(16, struct.pack("<i", 16 | 32 | 128))],
    "every byte 0xff": [(0, b"\xff" * 40)],
    "every byte 0": [(0, bytes(40))],
    "type word 0 and an owner": [(16, struct.pack("<i", 0)), (8, struct.pack("<i", 12345))],
    "futex word of this very thread": [],
}
#: Corruptions glibc tolerates: the next lock works and the table stays usable.
HARMLESS: dict[str, list[tuple[int, bytes]]] = {
    "owner died bit": [(0, struct.pack("<I", 0x40000000))],
    "robust list pointers": [(24, b"\x41" * 16)],
    "owner not recoverable, unlocked": [(8, struct.pack("<i", 0x7FFFFFFF))],
    "owner field a dead thread, unlocked": [(8, struct.pack("<i", 0x3FFFFFF0))],
    "owner field a live foreign pid, unlocked": [(8, struct.pack("<i", 1))],
}


def mutex_of(table: LockTable, key: LockKey) -> int:
    """Where the mutex of the stripe holding ``key``'s home slot starts in the section block."""
    section = table._state.section
    assert section is not None
    capacity = table.layout.capacity
    stripe = (key.digest & (capacity - 1)) // (capacity // section.stripes)
    return SECTION_MUTEX_AT + stripe * SECTION_STRIPE_BYTES


def corrupt(table: LockTable, case: str) -> None:
    """Corrupt the mutex of KEY's home stripe, which every step on KEY locks."""
    writes = {**CORRUPTIONS, **HARMLESS}[case]
    if not writes:
        writes = [(0, struct.pack("<i", threading.get_native_id()))]
    block, mutex = table._state.block, mutex_of(table, KEY)
    for at, data in writes:
        block[mutex + at : mutex + at + len(data)] = data


def try_corrupted(channel: Channel, fleet_name: str, case: str, twin: str, c_steps: bool) -> None:
    use_twin(twin)
    table = LockTable(Fleet.join(fleet_name, 4))
    if not c_steps:
        table._bind(None)
    corrupt(table, case)
    outcomes = []
    for _ in range(2):  # the refusal is lasting, and the harmless cases stay usable
        try:
            result = table.try_acquire(KEY, LockOwner(b"me"), 30.0)
            outcomes.append("acquired" if isinstance(result, Acquired) else "busy")
            if isinstance(result, Acquired):
                table.release(result.lease)
        except LayoutMismatch:
            outcomes.append("LayoutMismatch")
    channel.send(outcomes)


@pytest.mark.parametrize("c_steps", [True, False], ids=["c-steps", "python-steps"])
@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("case", [*CORRUPTIONS, *HARMLESS])
def test_a_corrupt_mutex_is_layout_mismatch_and_a_harmless_one_still_locks(
    fleet_name: str, case: str, twin: str, c_steps: bool
) -> None:
    with Processes("fork") as processes:
        child = processes.start(try_corrupted, fleet_name, case, twin, c_steps)
        outcomes = child.recv(timeout=20.0)
    expected = "LayoutMismatch" if case in CORRUPTIONS else "acquired"
    assert outcomes == [expected, expected]


def test_a_mechanism_byte_changed_to_flock_over_a_live_mutex_is_layout_mismatch(
    fleet_name: str,
) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        table._state.block[6] = FLOCK  # its peers keep locking the mutex
        with Fleet.join(fleet_name, 4) as other, pytest.raises(LayoutMismatch, match="mutex"):
            LockTable(other)
        table.close()


def test_a_mechanism_byte_changed_to_the_mutex_over_flock_is_layout_mismatch(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBIT_SECTION", "flock")
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        table._state.block[6] = ROBUST_MUTEX  # its peers keep using flock
        monkeypatch.delenv("ORBIT_SECTION")
        # A lock table's is refused on attach (one stripe recorded, not the layout's),
        # any other region's on its first lock (no mutex in the zeroed bytes).
        with Fleet.join(fleet_name, 4) as other, pytest.raises(LayoutMismatch, match="stripes"):
            LockTable(other).try_acquire(KEY, LockOwner(b"me"), 30.0)
        table.close()


def hold_while_corrupted(channel: Channel, fleet_name: str, twin: str) -> None:
    """Take a key on the Python operations, pausing inside the section until told to go on."""
    use_twin(twin)
    table = LockTable(Fleet.join(fleet_name, 4))
    table._bind(None)

    def hook(point: str) -> None:
        if point == "tombstoned":
            channel.send("inside")
            assert channel.recv() == "go on"

    _steps.crash_hook = hook
    table.try_acquire(KEY, LockOwner(b"holder"), 30.0)
    channel.send("done")
    threading.Event().wait()


@pytest.mark.parametrize("c_steps", [True, False], ids=["c-steps", "python-steps"])
@pytest.mark.parametrize("twin", TWINS)
def test_a_type_word_changed_while_held_is_put_back_and_the_waiters_wake(
    fleet_name: str, twin: str, c_steps: bool
) -> None:
    table = LockTable(Fleet.join(fleet_name, 4))
    if not c_steps:
        table._bind(None)
    outcome: list[object] = []
    other = LockKey("tests.corruption", "waiter")
    waiter = threading.Thread(
        target=lambda: outcome.append(table.try_acquire(other, LockOwner(b"w"), 30.0))
    )
    with Processes("fork") as processes:
        holder = processes.start(hold_while_corrupted, fleet_name, twin)
        assert holder.recv() == "inside"
        waiter.start()
        time.sleep(0.2)  # the waiter waits for the mutex the holder has
        kind = mutex_of(table, other) + 16  # the mutex the waiter waits on
        table._state.block[kind : kind + 4] = bytes(4)
        holder.send("go on")
        assert holder.recv() == "done"
        waiter.join(timeout=10.0)
        assert not waiter.is_alive(), "the holder's unlock woke no waiter"
    assert len(outcome) == 1 and isinstance(outcome[0], Acquired)
    assert isinstance(table.try_acquire(KEY, LockOwner(b"after"), 30.0), Occupied)
    table.close()


def wait_for_the_holder(channel: Channel, fleet_name: str, twin: str, c_steps: bool) -> None:
    """Send this thread's id, then take KEY (waiting for the holder); send the outcome."""
    use_twin(twin)
    table = LockTable(Fleet.join(fleet_name, 4))
    if not c_steps:
        table._bind(None)
    channel.send(threading.get_native_id())
    try:
        table.try_acquire(KEY, LockOwner(b"waiter"), 30.0)
        channel.send("acquired")
    except LayoutMismatch:
        channel.send("LayoutMismatch")


@pytest.mark.parametrize("c_steps", [True, False], ids=["c-steps", "python-steps"])
@pytest.mark.parametrize("twin", TWINS)
def test_a_futex_word_forged_to_name_its_waiter_while_it_waits_is_layout_mismatch(
    fleet_name: str, twin: str, c_steps: bool
) -> None:
    table = LockTable(Fleet.join(fleet_name, 4))
    section = table._state.section
    assert section is not None and section.mechanism == ROBUST_MUTEX
    with Processes("fork") as processes:
        holder = processes.start(hold_while_corrupted, fleet_name, twin)
        assert holder.recv() == "inside"  # it holds every stripe
        waiter = processes.start(wait_for_the_holder, fleet_name, twin, c_steps)
        tid: int = waiter.recv()
        time.sleep(0.2)  # the waiter waits for a stripe the holder has
        for stripe in range(section.stripes):
            at = SECTION_MUTEX_AT + stripe * SECTION_STRIPE_BYTES
            table._state.block[at : at + 4] = struct.pack("<I", tid)
        assert waiter.recv(timeout=5.0) == "LayoutMismatch"
    table.close()
