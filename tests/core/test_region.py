"""SHM regions: creation under a temporary name, cleanup of failed creation, unlink and close."""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import signal
import threading
import time

import pytest

from orbitive import Fleet
from orbitive._core import _region
from orbitive._core._access import open_checked
from orbitive._core._errors import AccessDenied, FleetError
from orbitive._core._fleet import members_name
from orbitive._core._region import (
    CLOSE_WAIT,
    CREATING,
    Region,
    leftover_creations,
    object_name,
    read_prefix,
)
from orbitive.lock import LayoutMismatch, LockKey, LockLayout, LockTable

from .._capabilities import NEEDS_SHM_DIR
from .._fleets import fleet_files, shm_path
from .._processes import Channel, Processes

KIND = 150


class InitFailed(Exception):
    pass


def failing_init(buf: mmap.mmap) -> None:
    buf[0:4] = b"half"
    raise InitFailed


def no_check(buf: mmap.mmap) -> None:
    del buf


def slow_create(channel: Channel, fleet_name: str) -> None:
    """In a child: create the object with an init that pauses half-way."""

    def init(buf: mmap.mmap) -> None:
        buf[0:4] = b"half"
        channel.send("half")
        time.sleep(0.5)
        buf[4:8] = b"done"

    region = Region.open_shared(fleet_name, KIND, 4096, init, no_check)
    channel.send(region.created)
    channel.recv()


def test_a_new_object_gets_its_name_only_once_it_is_initialised(
    processes: Processes, fleet_name: str
) -> None:
    child = processes.start(slow_create, fleet_name)
    assert child.recv() == "half"
    assert not shm_path(fleet_name, KIND).exists(), "a half-written object has no name yet"
    assert leftover_creations(fleet_name), "it is written under a temporary name"
    assert child.recv() is True
    assert read_prefix(object_name(fleet_name, KIND), 8) == b"halfdone"
    assert leftover_creations(fleet_name) == []
    region = Region.open_shared(fleet_name, KIND, 4096, failing_init, no_check)
    assert not region.created and region.buf[0:8] == b"halfdone"
    child.send("stop")
    assert child.wait() == 0
    region.close()
    region.unlink()


@NEEDS_SHM_DIR
def test_a_failed_initialisation_unlinks_the_new_object(fleet_name: str) -> None:
    with pytest.raises(InitFailed):
        Region.open_shared(fleet_name, KIND, 4096, failing_init, no_check)
    assert fleet_files(fleet_name) == []
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
def test_table_unlink_removes_its_objects_but_not_the_membership_object(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        layout = table.layout
        table.unlink()
        for kind in (layout.state_kind, layout.event_kind):
            assert not shm_path(fleet_name, kind).exists()
        assert [path.name for path in fleet_files(fleet_name)] == [members_name(fleet_name)]
        assert table.current(LockKey("tests.region", "after-unlink")) is None  # still mapped
        table.close()


def killed_in_init(channel: Channel, fleet_name: str) -> None:
    """In a child: start creating the object, then die before it is linked."""

    def init(buf: mmap.mmap) -> None:
        del buf
        os._exit(3)

    del channel
    Region.open_shared(fleet_name, KIND, 4096, init, no_check)


def test_a_creator_killed_before_the_link_leaves_only_a_temporary_name(
    processes: Processes, fleet_name: str
) -> None:
    assert processes.start(killed_in_init, fleet_name).wait() == 3
    assert not shm_path(fleet_name, KIND).exists()
    assert len(leftover_creations(fleet_name)) == 1
    region = Region.open_shared(fleet_name, KIND, 4096, lambda buf: None, no_check)
    assert region.created
    region.close()
    region.unlink()


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


def hold_section(channel: Channel, fleet_name: str) -> None:
    """In a child: hold the region's section until told to let go."""
    region = _open(fleet_name)
    region.acquire()
    channel.send("held")
    channel.recv()
    region.release()
    channel.send("released")


def test_a_thread_waiting_for_the_section_when_close_gives_up_gets_fleet_error(
    processes: Processes, fleet_name: str
) -> None:
    region = _open(fleet_name)
    holder = processes.start(hold_section, fleet_name)
    outcome: list[BaseException] = []

    def enter() -> None:
        try:
            region.acquire()
        except BaseException as error:  # recorded for the assertion
            outcome.append(error)

    try:
        assert holder.recv() == "held"
        waiter = threading.Thread(target=enter)
        waiter.start()
        time.sleep(0.1)  # the waiter holds the mutex, blocked on the other process's section
        region.close()  # gives up after CLOSE_WAIT and closes anyway
        holder.send("go")
        assert holder.recv() == "released"
        waiter.join(5.0)
        assert len(outcome) == 1 and isinstance(outcome[0], FleetError), outcome
    finally:
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


@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_a_name_planted_under_the_temporary_name_is_access_denied_and_left_alone(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    monkeypatch.setattr(secrets, "token_hex", lambda _: "feedface")
    name = f"{object_name(fleet_name, KIND)}{CREATING}{os.getpid()}-feedface"
    trap = _region.SHM_DIR / name
    if planted == "symlink":
        trap.symlink_to(_region.SHM_DIR / f"orbit-{fleet_name}-target")
    else:
        trap.touch(mode=0o600)
    try:
        with pytest.raises(AccessDenied, match="planted"):
            Region.open_shared(fleet_name, KIND, 4096, lambda buf: None, no_check)
        assert trap.is_symlink() or trap.is_file()
        assert not shm_path(fleet_name, KIND).exists()
    finally:
        trap.unlink()
