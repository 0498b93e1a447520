"""SHM regions: creation under the kind's flock, cleanup of failed creation, unlink and close."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import signal
import threading
import time

import pytest

from orbitive import Fleet
from orbitive._access import open_checked
from orbitive._errors import FleetError
from orbitive._region import CLOSE_WAIT, Region, lock_path
from orbitive.lock import LayoutMismatch, LockKey, LockLayout, LockTable

from .._capabilities import NEEDS_SHM_DIR
from .._children import Server, serve
from .._fleets import fleet_files, shm_path
from .._processes import Processes

KIND = 150


class InitFailed(Exception):
    pass


def failing_init(buf: mmap.mmap) -> None:
    buf[0:4] = b"half"
    raise InitFailed


def no_check(buf: mmap.mmap) -> None:
    del buf


def test_attach_waits_while_another_process_holds_the_kinds_flock(
    processes: Processes, fleet_name: str
) -> None:
    fd = open_checked(lock_path(fleet_name, LockLayout().state_kind), create=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a creator does while it writes the header
        child = processes.start(serve, fleet_name, 4, None, None)
        with pytest.raises(TimeoutError):
            child.recv(timeout=0.3)
        fcntl.flock(fd, fcntl.LOCK_UN)
        server = Server(child)
        assert server.table("leases") == []
        assert server.stop() == 0
    finally:
        os.close(fd)


@NEEDS_SHM_DIR
def test_a_failed_initialisation_unlinks_the_new_object(fleet_name: str) -> None:
    with pytest.raises(InitFailed):
        Region.open_shared(fleet_name, KIND, 4096, failing_init, no_check)
    assert not shm_path(fleet_name, KIND).exists()
    region = Region.open_shared(fleet_name, KIND, 4096, lambda buf: None, no_check)
    assert region.created
    assert region.buf[0:4] == b"\0\0\0\0"
    region.close()
    region.unlink()


@NEEDS_SHM_DIR
def test_an_existing_object_too_small_is_layout_mismatch_and_untouched(fleet_name: str) -> None:
    path = shm_path(fleet_name, KIND)
    fd = open_checked(path, create=True, exclusive=True)
    os.write(fd, b"small")
    os.close(fd)
    with pytest.raises(LayoutMismatch, match="5 bytes"):
        Region.open_shared(fleet_name, KIND, 4096, failing_init, no_check)
    assert path.read_bytes() == b"small"


@NEEDS_SHM_DIR
def test_table_unlink_removes_objects_and_lock_files_but_not_fleet_files(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        layout = table.layout
        table.unlink()
        remaining = {path.name for path in fleet_files(fleet_name)}
        for kind in (layout.state_kind, layout.event_kind):
            assert not shm_path(fleet_name, kind).exists()
            assert lock_path(fleet_name, kind).name not in remaining
        assert remaining, "the fleet's own node and membership files stay"
        assert table.current(LockKey("tests.region", "after-unlink")) is None  # still mapped
        table.close()


@NEEDS_SHM_DIR
@pytest.mark.parametrize("size", [0, LockLayout().state_size], ids=["empty", "zeroed"])
def test_object_left_by_a_creator_killed_before_its_header_is_initialised_again(
    fleet_name: str, size: int
) -> None:
    layout = LockLayout()
    fd = os.open(shm_path(fleet_name, layout.state_kind), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    os.close(fd)
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet, layout)
        try:
            assert table.leases() == []
            assert table.current(LockKey("ns", "a")) is None
            assert shm_path(fleet_name, layout.state_kind).stat().st_size == layout.state_size
        finally:
            table.close()
            table.unlink()


def test_a_table_built_after_unlink_uses_the_new_object(fleet_name: str) -> None:
    key = LockKey("ns", "a")
    with Fleet.join(fleet_name, 2) as fleet:
        first = LockTable(fleet)
        first.try_acquire(key, b"owner", 60.0)
        first.unlink()
        second = LockTable(fleet)
        try:
            assert second.current(key) is None  # a fresh object, not the unlinked mapping
            assert shm_path(fleet_name, LockLayout().state_kind).exists()
        finally:
            second.close()
            second.unlink()
            first.close()


def _open(fleet_name: str) -> Region:
    return Region.open_shared(fleet_name, KIND, mmap.PAGESIZE, lambda buf: None, no_check)


def test_close_waits_for_a_critical_section_another_thread_is_in(fleet_name: str) -> None:
    region = _open(fleet_name)
    try:
        region.acquire()
        closer = threading.Thread(target=region.close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive(), "close must wait for the step in progress"
        region.buf[0:4] = b"done"  # the step finishes on a live mapping, under its flock
        region.release()
        closer.join(5.0)
        assert not closer.is_alive()
        with pytest.raises(FleetError, match="closed"):
            region.acquire()
    finally:
        region.unlink()
        region.close()


def test_close_inside_this_threads_own_section_closes_at_once(fleet_name: str) -> None:
    region = _open(fleet_name)
    try:
        region.acquire()
        started = time.monotonic()
        region.close()  # as a signal handler interrupting a step would
        assert time.monotonic() - started < CLOSE_WAIT / 2
        with pytest.raises(ValueError):
            region.buf[0:4] = b"late"  # the interrupted step ends on the closed mapping
        region.release()  # no descriptor left to unlock; the mutex is free again
        with pytest.raises(FleetError, match="closed"):
            region.acquire()
    finally:
        region.unlink()


def test_a_thread_waiting_for_the_flock_when_close_gives_up_gets_fleet_error(
    fleet_name: str,
) -> None:
    region = _open(fleet_name)
    holder = open_checked(lock_path(fleet_name, KIND), create=True)  # another description
    outcome: list[BaseException] = []

    def enter() -> None:
        try:
            region.acquire()
        except BaseException as error:  # recorded for the assertion
            outcome.append(error)

    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        waiter = threading.Thread(target=enter)
        waiter.start()
        time.sleep(0.1)  # the waiter holds the mutex, blocked in flock
        region.close()  # gives up after CLOSE_WAIT and closes anyway
        fcntl.flock(holder, fcntl.LOCK_UN)
        waiter.join(5.0)
        assert len(outcome) == 1 and isinstance(outcome[0], FleetError), outcome
    finally:
        os.close(holder)
        region.unlink()


def test_close_from_a_signal_handler_never_waits_for_its_own_thread(fleet_name: str) -> None:
    region = _open(fleet_name)
    waits: list[float] = []

    def handler(signum: int, frame: object) -> None:
        started = time.monotonic()
        region.close()
        waits.append(time.monotonic() - started)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.003)
        deadline = time.monotonic() + 10.0
        with contextlib.suppress(FleetError, ValueError):  # the close lands mid-loop
            while time.monotonic() < deadline:
                region.acquire()
                region.release()
        assert len(waits) == 1 and waits[0] < CLOSE_WAIT / 2
        with pytest.raises(FleetError, match="closed"):
            region.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        region.unlink()
