"""wait_word, wake_word and bump: the shared-word primitives of both backends."""

from __future__ import annotations

import mmap
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from orbitive._core import _readiness_futex
from orbitive._core._readiness import Backend, Readiness

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


def test_parked_byte_is_set_only_while_the_driver_sleeps(
    futex: Backend, buf: mmap.mmap, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    wake = futex.wake_word

    def counting_wake(mapping: mmap.mmap, offset: int) -> None:
        calls.append(offset)
        wake(mapping, offset)

    monkeypatch.setattr(futex, "wake_word", counting_wake)
    lock = threading.Lock()
    readiness = Readiness(buf, WORD, PARKED, 2, "test-parked", lock=lock, backend=futex)
    try:
        assert eventually(lambda: buf[PARKED + 2] == 1)  # asleep on the word
        with lock:
            futex.bump(buf, WORD, PARKED, CAPACITY)
        assert len(calls) == 1
        assert eventually(lambda: buf[PARKED + 2] == 0)  # awake, waiting for the drain
        with lock:
            for _ in range(3):
                futex.bump(buf, WORD, PARKED, CAPACITY)
        assert len(calls) == 1  # nobody parked: no syscall
        assert readiness.drain() == 1
        assert eventually(lambda: readiness.drain() == 1)  # the three bumps, coalesced
        assert eventually(lambda: buf[PARKED + 2] == 1)
    finally:
        readiness.close()
    assert buf[PARKED + 2] == 0


def test_two_drivers_of_one_process_share_the_parked_byte(futex: Backend, buf: mmap.mmap) -> None:
    lock = threading.Lock()
    first = Readiness(buf, WORD, PARKED, 1, "test-first", lock=lock, backend=futex)
    second = Readiness(buf, WORD, PARKED, 1, "test-second", lock=lock, backend=futex)
    try:
        assert eventually(lambda: buf[PARKED + 1] == 1)
        first.close()
        time.sleep(0.05)
        assert buf[PARKED + 1] == 1  # the second driver still sleeps on it
    finally:
        first.close()
        second.close()
    assert buf[PARKED + 1] == 0
