"""``orbit clear`` racing the first ``Fleet.join`` of a fleet that has no membership object.

A fleet's table objects can outlive its membership object (when that alone was
removed). ``clear`` then found no object to hold exclusively and went on
unlinking, while a first joiner created the membership object, attached to the
table object about to be unlinked and took a key in it: the next joiner made a
fresh table and took the same key again. The test puts the joiner exactly between
clear's check and its first unlink (real processes, clear's unlink wrapped).
Clear now holds a placeholder membership object, so the joiner waits for it.

Clear also removed the temporary names of creators still alive, whose ``link``
then failed with a raw FileNotFoundError.
"""

from __future__ import annotations

import mmap
import os
import threading

import pytest

from orbitive import Fleet, LayoutMismatch
from orbitive._core._fleet import hold_membership, members_name
from orbitive._core._region import CREATING, SHM_DIR, Region, leftover_creations, unlink_object
from orbitive.cli import _lock_commands, main
from orbitive.lock import Acquired, LockOwner, LockTable, Occupied

from .._children import KEY
from .._fleets import fleet_files
from .._processes import Channel, Child, Processes

#: Seconds clear lets the joiner run before its first unlink.
JOINER_CHANCE = 1.5
KIND = 152


def join_and_take(channel: Channel, fleet_name: str) -> None:
    assert channel.recv() == "go"
    table = LockTable(Fleet.join(fleet_name, 4))
    taken = table.try_acquire(KEY, LockOwner(b"first-joiner"), 60.0)
    channel.send("held" if isinstance(taken, Acquired) else "busy")
    threading.Event().wait()


def unlink_after_the_joiner(monkeypatch: pytest.MonkeyPatch, joiner: Child) -> list[str]:
    """Make clear's first unlink wait for the joiner (or JOINER_CHANCE seconds)."""
    replies: list[str] = []

    def unlink(name: str) -> bool:
        if not replies:
            joiner.send("go")
            try:
                replies.append(joiner.recv(timeout=JOINER_CHANCE))
            except TimeoutError:
                replies.append("waited")  # the joiner waits for clear to finish
        return unlink_object(name)

    monkeypatch.setattr(_lock_commands, "unlink_object", unlink)
    return replies


def test_a_first_join_during_clear_never_gives_a_key_two_holders(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        LockTable(fleet).close()
    assert unlink_object(members_name(fleet_name))  # the table objects stay
    with Processes("fork") as processes:
        joiner = processes.start(join_and_take, fleet_name)
        replies = unlink_after_the_joiner(monkeypatch, joiner)
        assert main(["clear", fleet_name, "--all", "--yes"]) == 0
        if replies == ["waited"]:
            assert joiner.recv() == "held"
        with Fleet.join(fleet_name, 4) as fleet:
            table = LockTable(fleet)
            assert isinstance(table.try_acquire(KEY, LockOwner(b"second"), 60.0), Occupied)
            table.close()
    assert fleet_files(fleet_name)


def test_the_placeholder_of_an_interrupted_clear_is_named_and_cleared(fleet_name: str) -> None:
    fd, placeholder = hold_membership(fleet_name)  # a clear killed while it held the fleet
    os.close(fd)
    assert placeholder
    with pytest.raises(LayoutMismatch, match="interrupted"):
        Fleet.join(fleet_name, 4)
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    Fleet.join(fleet_name, 4).close()


def test_clear_keeps_the_temporary_name_of_a_live_creator_and_removes_a_dead_ones(
    fleet_name: str, processes: Processes
) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        LockTable(fleet).close()
    dead = processes.start(join_and_take, fleet_name)
    dead_pid = dead.pid
    dead.kill()
    names = [
        f"{members_name(fleet_name)}{CREATING}{pid}-0badf00d" for pid in (os.getpid(), dead_pid)
    ]
    for name in names:
        (SHM_DIR / name).touch(mode=0o600)
    try:
        assert main(["clear", fleet_name, "--all", "--yes"]) == 0
        assert leftover_creations(fleet_name) == names[:1]
    finally:
        for name in names:
            unlink_object(name)


def test_a_creator_whose_temporary_name_is_cleared_under_it_creates_anew(fleet_name: str) -> None:
    cleared: list[str] = []

    def init(buf: mmap.mmap) -> None:
        if not cleared:  # what orbit clear did to every leftover, live creators' too
            cleared.extend(leftover_creations(fleet_name))
            for name in cleared:
                unlink_object(name)

    region = Region.open_shared(fleet_name, KIND, mmap.PAGESIZE, init, lambda buf: None)
    try:
        assert cleared and region.created
        assert (SHM_DIR / region.name).exists()
        assert leftover_creations(fleet_name) == []
    finally:
        region.close()
        region.unlink()
