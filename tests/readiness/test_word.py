"""wait_word, wake_word and bump: the shared-word primitives of both backends."""

from __future__ import annotations

import mmap
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from orbitive._core import _readiness_futex
from orbitive._core._readiness import Backend

from ._shared import CAPACITY, PARKED, SIZE, WORD, Job, child_publish, read_word
from .conftest import Context, Shm, Start

BOUND = 2.0


@pytest.fixture
def buf() -> Iterator[mmap.mmap]:
    mapping = mmap.mmap(-1, SIZE)
    yield mapping
    mapping.close()


def eventually(condition: Callable[[], bool], timeout: float = BOUND) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.001)
    return False


def test_wait_word_returns_false_after_about_its_timeout(backend: Backend, buf: mmap.mmap) -> None:
    start = time.monotonic()
    assert backend.wait_word(buf, WORD, 0, 0.2) is False
    assert 0.15 <= time.monotonic() - start < 0.2 + BOUND


def test_wait_word_returns_true_at_once_when_the_word_differs(
    backend: Backend, buf: mmap.mmap
) -> None:
    start = time.monotonic()
    assert backend.wait_word(buf, WORD, 7, 30.0) is True
    assert time.monotonic() - start < BOUND


@pytest.mark.parametrize("timeout", [1e9, 2.0**33, 1e19, 2**63, 2**64, 1e300])
def test_wait_word_takes_a_timeout_of_any_size(
    backend: Backend, buf: mmap.mmap, timeout: float
) -> None:
    assert backend.wait_word(buf, WORD, 7, timeout) is True  # the word differs: at once


@pytest.mark.parametrize("timeout", [2.0**33, 1e19, 2**63, 2**64 + 5e9, 1e300])
def test_futex_timeouts_past_the_longest_are_the_longest(timeout: float) -> None:
    """Never wrapped by the C long of tv_sec to another (shorter, or negative) timeout."""
    timespec = _readiness_futex._timespec(timeout)
    assert timespec is not None
    assert (timespec.tv_sec, timespec.tv_nsec) == (_readiness_futex.LONGEST_S, 0)


def test_wait_word_with_zero_timeout_is_a_look(backend: Backend, buf: mmap.mmap) -> None:
    assert backend.wait_word(buf, WORD, 0, 0.0) is False
    assert backend.wait_word(buf, WORD, 1, 0.0) is True


def test_wait_word_returns_true_when_another_process_bumps(
    backend: Backend, shm: Shm, context: Context, children: Start
) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, backend.NAME, delay=0.2), ready, go)
    assert ready.wait(30)
    mapping, parked = shm.region.buf, PARKED + shm.fleet.node
    shm.region.acquire()  # the parking protocol bump relies on
    try:
        mapping[parked] = 1
        seen = read_word(mapping)
    finally:
        shm.region.release()
    go.set()
    start = time.monotonic()
    try:
        assert backend.wait_word(mapping, WORD, seen, 30.0) is True
        assert time.monotonic() - start < 0.2 + BOUND
    finally:
        mapping[parked] = 0
    child.join(30)
    assert child.exitcode == 0
    assert read_word(mapping) == seen + 1


def test_wake_word_wakes_a_thread_parked_on_the_word(backend: Backend, buf: mmap.mmap) -> None:
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(backend.wait_word(buf, WORD, 0, 30)))
    waiter.start()
    time.sleep(0.05)
    struct.pack_into("<I", buf, WORD, 1)
    backend.wake_word(buf, WORD)
    waiter.join(BOUND)
    assert results == [True]


def test_bump_wraps_modulo_two_to_the_32(backend: Backend, buf: mmap.mmap) -> None:
    struct.pack_into("<I", buf, WORD, 0xFFFF_FFFF)
    backend.bump(buf, WORD, PARKED, CAPACITY)
    assert read_word(buf) == 0


def test_bump_without_a_parked_node_makes_no_wake_call(
    backend: Backend, buf: mmap.mmap, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(backend, "wake_word", lambda _buf, offset: calls.append(offset))
    for _ in range(3):
        backend.bump(buf, WORD, PARKED, CAPACITY)
    assert read_word(buf) == 3
    assert calls == []
    buf[PARKED + CAPACITY - 1] = 1  # the last node is parked
    backend.bump(buf, WORD, PARKED, CAPACITY)
    assert calls == ([WORD] if backend.PARKED else [])  # polling needs no wake


@pytest.fixture
def futex() -> Backend:
    try:
        _readiness_futex.probe()
    except OSError as exc:
        pytest.skip(f"futex backend cannot run here: {exc}")
    return _readiness_futex


def test_wake_word_wakes_the_longest_sleeper_first_and_says_how_many(futex: Backend) -> None:
    buf = mmap.mmap(-1, SIZE)
    order: list[int] = []

    def sleeper(name: int) -> None:
        futex.wait_word(buf, WORD, 0, 30)
        order.append(name)

    sleepers = []
    for name in range(3):
        thread = threading.Thread(target=sleeper, args=(name,))
        thread.start()
        sleepers.append(thread)
        time.sleep(0.05)  # each is asleep before the next
    struct.pack_into("<I", buf, WORD, 1)
    for name in range(3):
        assert futex.wake_word(buf, WORD, 1) == 1
        woken = name + 1
        assert eventually(lambda: len(order) == woken)  # noqa: B023 - read at once
    assert order == [0, 1, 2]
    assert futex.wake_word(buf, WORD, 1) == 0  # nobody left
    for thread in sleepers:
        thread.join(BOUND)
    buf.close()


def test_two_waiters_of_one_process_share_the_parked_byte(futex: Backend, buf: mmap.mmap) -> None:
    parked = futex.PARKED
    assert parked is not None
    parked.hold(buf, PARKED + 1)
    parked.hold(buf, PARKED + 1)
    assert buf[PARKED + 1] == 1
    parked.release(buf, PARKED + 1)
    assert buf[PARKED + 1] == 1  # the other one still waits
    parked.release(buf, PARKED + 1)
    assert buf[PARKED + 1] == 0
