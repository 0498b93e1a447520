"""A section block's mapping outlives every hold and every wait of this process on it.

glibc links each robust mutex a thread holds into that thread's robust list, through
the mutex's own bytes, and writes through the list on the thread's next lock. A
mapping unmapped under a held mutex would leave the list pointing into whatever is
mapped there next (a write into foreign memory, or a fault). These tests drop the
last reference to a region while its section is held, then map read-only pages
where the block was, so that such a write would fault, and lock another section.
"""

from __future__ import annotations

import gc
import mmap
import threading
import time

import pytest

from orbitive._core._errors import FleetError, LayoutMismatch
from orbitive._core._region import Region
from orbitive._core._section import recoveries

from .._processes import Channel, Processes
from .conftest import TWINS
from .test_section import KIND, lock_once, open_region, use_twin

#: Read-only pages mapped after a block went, so that a write through a dangling
#: robust list entry faults instead of landing somewhere unnoticed.
HOLES = 64


def lock_another(fleet_name: str) -> None:
    """Lock and unlock another object's section (glibc writes the robust list's head)."""
    holes = [mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ) for _ in range(HOLES)]
    other = Region.open_shared(fleet_name, KIND + 1, mmap.PAGESIZE, lambda buf: None, print)
    other.acquire()
    other.release()
    other.close()
    for hole in holes:
        hole.close()


def drop_while_held(channel: Channel, fleet_name: str, twin: str) -> None:
    """Hold a section, drop the region in the holding thread, then lock another section."""
    use_twin(twin)
    region = open_region(fleet_name)
    region.acquire()
    del region
    gc.collect()
    lock_another(fleet_name)
    channel.send("survived")


@pytest.mark.parametrize("twin", TWINS)
def test_a_region_dropped_by_the_thread_holding_it_lets_its_section_go(
    fleet_name: str, twin: str
) -> None:
    with Processes("fork") as processes:
        assert processes.start(drop_while_held, fleet_name, twin).recv() == "survived"
        # The abandoned hold was let go: another process locks at once, nothing to repair.
        assert processes.start(lock_once, fleet_name, "c").recv(timeout=5) == ("locked", 0)


def drop_while_another_thread_holds(channel: Channel, fleet_name: str, twin: str) -> None:
    """A thread holds a section whose region another thread drops; then it locks another."""
    use_twin(twin)
    box = [open_region(fleet_name)]
    held, dropped = threading.Event(), threading.Event()

    def hold() -> None:
        region = box[0]
        region.acquire()
        del region
        held.set()
        dropped.wait()
        lock_another(fleet_name)  # its robust list still holds the first section's mutex

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    box.clear()  # the last reference: the region goes in this thread, not the holder
    gc.collect()
    dropped.set()
    holder.join()
    channel.send("survived")


@pytest.mark.parametrize("twin", TWINS)
def test_a_block_another_thread_of_the_process_holds_stays_mapped(
    fleet_name: str, twin: str
) -> None:
    with Processes("fork") as processes:
        assert processes.start(drop_while_another_thread_holds, fleet_name, twin).recv() == (
            "survived"
        )
        # The holder ended holding it: the next locker repairs the mutex the kernel marked.
        locked, repaired = processes.start(lock_once, fleet_name, "c").recv(timeout=5)
        assert locked == "locked" and repaired == 1
    region = open_region(fleet_name)
    assert recoveries(region.block) == 1
    region.close()
    region.unlink()


def hold_until_told(channel: Channel, fleet_name: str) -> None:
    """Hold the region's section until the test says so, then let it go."""
    region = open_region(fleet_name)
    region.acquire()
    channel.send("held")
    channel.recv(timeout=None)
    region.release()
    channel.send("released")


@pytest.mark.parametrize("freed_by", ["release", "kill"])
def test_a_waiter_in_a_region_closed_under_it_gets_fleet_error(
    fleet_name: str, mechanism: str, locking_twin: str, freed_by: str
) -> None:
    """Another process holds the section; a thread waits in it; the region is closed (its
    layout unmapped) and its block cannot be unmapped meanwhile. Once the section is free
    the waiter gets FleetError, holding nothing, and every later entry does too."""
    region = open_region(fleet_name)
    outcome: list[BaseException | None] = []

    def wait_inside() -> None:
        try:
            with region:
                outcome.append(None)
        except BaseException as error:  # recorded for the assertion
            outcome.append(error)

    with Processes("fork") as processes:
        holder = processes.start(hold_until_told, fleet_name)
        assert holder.recv() == "held"
        waiter = threading.Thread(target=wait_inside)
        waiter.start()
        time.sleep(0.2)  # the waiter is inside acquire, waiting for the section
        region.close()
        if mechanism == "mutex":
            with pytest.raises(BufferError):
                region.block.close()  # its mutexes hold the block mapped
        if freed_by == "release":
            holder.send("go")
            assert holder.recv() == "released"
        else:
            holder.kill()
        waiter.join(timeout=20.0)
        assert not waiter.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], FleetError), outcome
        assert not region.holds()
        with pytest.raises(FleetError, match="closed"):
            region.acquire()
        # The section itself is free: another process locks it at once.
        assert processes.start(lock_once, fleet_name, "c").recv(timeout=5)[0] == "locked"
    region.unlink()


#: Regions the test process opened and closed before it forked: each child inherits them
#: (a closed store's objects wait in a reference cycle for the garbage collector).
INHERITED: list[Region] = []


def hold_as_an_inherited_region_goes(channel: Channel, fleet_name: str) -> None:
    """Hold the section through a region of this process, drop the region of the same
    object inherited from the parent meanwhile, then let go when the test says."""
    region = open_region(fleet_name)
    region.acquire()
    INHERITED.clear()  # the last reference in this process: its block goes here
    gc.collect()
    channel.send("held")
    channel.recv(timeout=None)
    try:
        region.release()
    except LayoutMismatch as error:
        channel.send(f"not released: {error}")
        return
    channel.send("released")


def test_a_region_a_forked_child_inherited_never_undoes_the_childs_own_hold(
    fleet_name: str, locking_twin: str
) -> None:
    """The same object mapped twice in one process: the block of a region the parent
    closed before the fork, and the child's own. The futex words name the child's
    thread whichever mapping it locked through; the inherited block, going while the
    child holds the section, must leave that hold alone: the section stays held
    (another process waits for it) and the child's release succeeds (not EPERM).
    The soak of tests/store/test_semaphore_processes.py met it as a StoreError."""
    inherited = open_region(fleet_name)
    inherited.close()
    INHERITED.append(inherited)
    del inherited
    try:
        with Processes("fork") as processes:
            holder = processes.start(hold_as_an_inherited_region_goes, fleet_name)
            assert holder.recv() == "held"
            other = processes.start(lock_once, fleet_name, "c")
            with pytest.raises(TimeoutError):
                other.recv(timeout=0.5)  # excluded while the holder holds the section
            holder.send("go")
            assert holder.recv() == "released"
            assert other.recv(timeout=5) == ("locked", 0)  # nothing to repair either
    finally:
        INHERITED.clear()
