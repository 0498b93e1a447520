"""Value types of orbitive.lock: keys, owners, leases, results, layout, and the Fence."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import threading
from typing import Any

import pytest

from orbitive import InvalidArgumentType
from orbitive.lock import (
    Acquired,
    Fence,
    InvalidLayout,
    KeyEmpty,
    LockEvent,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockPoll,
    NamespaceEmpty,
    Occupied,
    OwnerEmpty,
)
from orbitive.lock._types import NODE_SHIFT

from .._processes import ROOT

# -- LockKey, LockOwner ------------------------------------------------------------------------


def test_str_parts_are_utf8_and_bytes_parts_are_kept() -> None:
    key = LockKey("runtime.tasks.pool", "queue:ü")
    assert key.namespace == b"runtime.tasks.pool"
    assert key.label == "queue:ü".encode()
    assert LockKey(b"runtime.tasks.pool", "queue:ü".encode()) == key
    assert str(key) == "runtime.tasks.pool/queue:ü"
    buffers: tuple[Any, Any] = (bytearray(b"ns"), memoryview(b"x"))  # accepted at run time
    assert LockKey(*buffers) == LockKey("ns", "x")


def test_a_lease_repr_shows_its_fencing_token_and_node() -> None:
    lease = LockLease(LockKey("ns", "k"), LockOwner(b"o"), (3 << NODE_SHIFT) | 17, 5, 1.0, 2.5, 7)
    shown = repr(lease)
    assert "fencing_token=17" in shown and "node=3" in shown and "slot=7" in shown


def test_keys_differ_by_where_namespace_ends() -> None:
    assert LockKey("ab", "c") != LockKey("a", "bc")
    assert LockKey("ab", "c").digest != LockKey("a", "bc").digest
    assert hash(LockKey("a", "b")) == hash(LockKey(b"a", b"b"))


def test_key_of_a_type_uses_its_namespace() -> None:
    class Pool:
        NAMESPACE = "runtime.tasks.pool"

    class Raw:
        NAMESPACE = b"raw"

    assert LockKey.of(Pool, "q") == LockKey("runtime.tasks.pool", "q")
    assert LockKey.of(Raw, b"q") == LockKey(b"raw", b"q")
    assert LockKey.of(Pool(), "q") == LockKey.of(Pool, "q")


def test_empty_parts_raise_their_named_errors() -> None:
    with pytest.raises(NamespaceEmpty):
        LockKey("", "label")
    with pytest.raises(KeyEmpty):
        LockKey("ns", b"")
    with pytest.raises(OwnerEmpty):
        LockOwner(b"")
    for error in (NamespaceEmpty, KeyEmpty, OwnerEmpty):
        assert issubclass(error, ValueError)


@pytest.mark.parametrize("bad", [None, 5, 1.5, ["a"], object()], ids=lambda bad: type(bad).__name__)
def test_parts_that_are_not_str_or_bytes_are_type_errors(bad: Any) -> None:
    with pytest.raises(InvalidArgumentType):
        LockKey(bad, "label")
    with pytest.raises(InvalidArgumentType):
        LockKey("ns", bad)
    with pytest.raises(InvalidArgumentType):
        LockOwner(bad)


def test_owner_text_is_printable_utf8_or_hex_and_random_owners_differ() -> None:
    assert LockOwner("worker-1").text() == "worker-1"
    assert LockOwner(b"\xff\x00").text() == "ff00"
    assert LockOwner(b"tab\there").text() == b"tab\there".hex()
    owners = {LockOwner.random() for _ in range(100)}
    assert len(owners) == 100
    assert all(len(owner.value) == 16 for owner in owners)


def test_value_types_are_frozen() -> None:
    key = LockKey("ns", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.label = b"y"  # type: ignore[misc]  # the point of the test
    with pytest.raises(dataclasses.FrozenInstanceError):
        LockOwner(b"o").value = b"p"  # type: ignore[misc]  # the point of the test


def test_values_survive_pickling_for_worker_processes() -> None:
    key, owner = LockKey("ns", "x"), LockOwner(b"o")
    lease = LockLease(key, owner, (228 << 56) | (3 << 40) | 77, 9, 10.0, 40.0, 5)
    event = LockEvent("acquired", key, owner, lease.lock_id, 9, 40.0, 3, 0)
    values = [key, owner, lease, Acquired(lease), Occupied(lease), event, LockPoll((event,), 1)]
    for value in values:
        copy = pickle.loads(pickle.dumps(value))
        assert copy == value
        assert type(copy) is type(value)
    assert pickle.loads(pickle.dumps(key)).digest == key.digest
    assert (lease.fencing_token, lease.node) == (77, 3)
    assert event.fencing_token == 77


def test_lease_remaining_is_never_negative() -> None:
    lease = LockLease(LockKey("ns", "x"), LockOwner(b"o"), 1, 1, 0.0, 1.0)
    assert lease.remaining() == 0.0


def test_poll_is_lost_when_anything_was_missed() -> None:
    assert not LockPoll(()).lost
    assert LockPoll((), overwritten=1).lost
    assert LockPoll((), unavailable=1).lost
    assert LockPoll((), malformed=1).lost


# -- Fence -------------------------------------------------------------------------------------


def test_fence_admits_equal_and_newer_tokens_and_rejects_older_ones() -> None:
    fence = Fence()
    assert fence.high_water == 0
    assert fence.admit(5)
    assert fence.admit(5)  # the same holder again
    assert not fence.admit(4)
    assert fence.high_water == 5
    assert fence.admit(9)
    assert not fence.admit(5)
    assert fence.high_water == 9
    assert repr(fence) == "Fence(high_water=9)"
    assert not Fence(high_water=10).admit(3)


def test_fence_is_consistent_under_threads() -> None:
    fence = Fence()
    admitted: list[int] = []
    lock = threading.Lock()

    def writer(tokens: range) -> None:
        for token in tokens:
            if fence.admit(token):
                with lock:
                    admitted.append(token)

    threads = [threading.Thread(target=writer, args=(range(n, 2000, 4),)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fence.high_water == max(admitted) >= 1996
    assert not fence.admit(fence.high_water - 1)


# -- LockLayout --------------------------------------------------------------------------------


def test_default_layout_is_the_seeds_with_a_ring_of_32_frames() -> None:
    layout = LockLayout()
    assert (layout.state_kind, layout.event_kind, layout.capacity) == (228, 229, 256)
    assert (layout.payload_max, layout.ring_capacity, layout.frame_bytes) == (960, 32, 1024)
    assert layout.slot_size % 64 == 0
    assert layout.slot_size >= 48 + 960


@pytest.mark.parametrize(
    "changes",
    [
        {"state_kind": 256},
        {"state_kind": -1},
        {"event_kind": 300},
        {"state_kind": 5, "event_kind": 5},
        {"state_kind": True},
        {"capacity": 0},
        {"capacity": 100},
        {"capacity": 1 << 17},
        {"capacity": 256.0},
        {"ring_capacity": 3},
        {"ring_capacity": 0},
        {"payload_max": 2},
        {"payload_max": 70000},
        {"frame_bytes": 994},
        {"payload_max": 100, "frame_bytes": 134},
    ],
    ids=repr,
)
def test_invalid_layouts_raise_invalid_layout(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidLayout) as caught:
        LockLayout(**changes)
    assert isinstance(caught.value, ValueError)


def test_smallest_valid_layout() -> None:
    layout = LockLayout(state_kind=0, event_kind=255, capacity=1, payload_max=3, ring_capacity=1)
    assert layout.min_frame_bytes == 38
    LockLayout(payload_max=100, frame_bytes=135)


def test_environment_overrides_the_default_layout_once_per_process() -> None:
    code = (
        "import json, os; from orbitive.lock import LockLayout; a = LockLayout.default();"
        "os.environ['ORBIT_LOCK_STATE_CAPACITY'] = '64'; b = LockLayout.default();"
        "print(json.dumps([a.capacity, a.payload_max, a.ring_capacity, a.frame_bytes,"
        " b.capacity, a is b]))"
    )
    env = dict(
        os.environ,
        ORBIT_LOCK_STATE_CAPACITY="512",
        ORBIT_LOCK_STATE_PAYLOAD_CAPACITY="200",
        ORBIT_LOCK_EVENT_RING_CAPACITY="1_024",
        ORBIT_LOCK_EVENT_RING_PAYLOAD_CAPACITY="512",
    )
    output = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, check=True
    ).stdout
    assert json.loads(output) == [512, 200, 1024, 512, 512, True]


def test_a_bad_environment_override_raises_invalid_layout() -> None:
    code = "from orbitive.lock import LockLayout; LockLayout.default()"
    env = dict(os.environ, ORBIT_LOCK_STATE_CAPACITY="lots")
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "InvalidLayout" in result.stderr
    assert "ORBIT_LOCK_STATE_CAPACITY" in result.stderr


@pytest.mark.parametrize("bad", ["7", None, 1.0, True], ids=repr)
def test_fence_admits_only_int_tokens(bad: Any) -> None:
    fence = Fence(high_water=3)
    with pytest.raises(InvalidArgumentType):
        fence.admit(bad)
    assert fence.high_water == 3
