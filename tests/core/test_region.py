"""SHM regions: creation under the kind's flock, cleanup of failed creation, unlink and close."""

from __future__ import annotations

import fcntl
import mmap
import os

import pytest

from orbitive import Fleet
from orbitive._access import open_checked
from orbitive._region import Region, lock_path
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
